"""The OpenAI Agents SDK's default model (Responses API) runs a 30-call tool loop on the puppet,
in JSON and streamed: the simulator's /v1/responses is what the SDK's Runner expects."""

from __future__ import annotations

import agents
import openai
import orjson
import pytest

from simulator.puppet import RECEIVED

CALLS = 30


@agents.function_tool
def step(n: int) -> str:
    """Run build step n; its output names the next step."""
    return f"step {n} done. " + (f'[[call step {{"n": {n + 1}}}]]' if n < CALLS else "ALL DONE")


@pytest.fixture
def agent(puppet):
    agents.set_tracing_disabled(True)
    client = openai.AsyncOpenAI(base_url=puppet[1], api_key="sk-test", max_retries=0)
    model = agents.OpenAIResponsesModel(model="fake-128k", openai_client=client)
    return agents.Agent(name="builder", instructions="Run every step.", tools=[step], model=model)


def sent(puppet) -> list[dict]:
    return [orjson.loads(r["body"]) for r in puppet[0][RECEIVED] if r["path"] == "/v1/responses"]


@pytest.mark.parametrize("streamed", [False, True])
async def test_runner_completes_a_30_call_loop(puppet, agent, streamed):
    if streamed:
        run = agents.Runner.run_streamed(agent, 'go [[call step {"n": 1}]]', max_turns=CALLS + 5)
        async for _ in run.stream_events():
            pass
    else:
        run = await agents.Runner.run(agent, 'go [[call step {"n": 1}]]', max_turns=CALLS + 5)
    assert run.final_output == "Tool step returned: step 30 done. ALL DONE"
    bodies = sent(puppet)
    assert len(bodies) == CALLS + 1
    outputs = [i for i in bodies[-1]["input"] if i.get("type") == "function_call_output"]
    assert len(outputs) == CALLS and bodies[-1]["instructions"] == "Run every step."
