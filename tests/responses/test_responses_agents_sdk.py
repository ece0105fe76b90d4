"""The OpenAI Agents SDK with its default model (``OpenAIResponsesModel``) through the gateway.

``Runner`` runs its own agent loop over ``/v1/responses``: 34 tool calls whose outputs force
compaction on a 32k model, then a question about a fact from early in the loop. The SDK must
finish every run; every upstream request must be paired and inside the window.
"""

from __future__ import annotations

import os

import openai
import pytest

from simulator.workloads import agent_loop_session
from tests.chat.test_agent_loops import assert_valid_and_fits, forwarded, is_placeholder
from tests.responses.test_responses import PLACEHOLDER, assert_responses_valid, responses_bodies
from tests.support.agent import settle

try:
    import agents
except ImportError:  # the clients extra (pyproject.toml): required under CI
    if os.environ.get("CI"):
        raise
    agents = None

pytestmark = pytest.mark.skipif(agents is None, reason="openai-agents is not installed")
CALLS = 34


def agent_for(gw, session, name: str):
    client = openai.AsyncOpenAI(base_url=gw.base_url, api_key="sk-a", default_headers={"X-Session-Id": name}, max_retries=0)
    agents.set_tracing_disabled(True)
    outputs = {s["args"]["target"]: s["output"] for t in session.turns for s in t["steps"]}

    def make(tool_name: str):
        async def run(target: str) -> str:
            return outputs.get(target, "no such target")
        return agents.function_tool(run, name_override=tool_name, description_override=f"{tool_name} in the workspace")

    names = sorted({s["tool"] for t in session.turns for s in t["steps"]})
    return agents.Agent(name="coder", instructions=session.system, tools=[make(n) for n in names],
                        model=agents.OpenAIResponsesModel(model="fake-32k", openai_client=client))


@pytest.mark.parametrize("api", ["responses", "chat"])
@pytest.mark.parametrize("stream", [False, True])
async def test_runner_finishes_a_long_tool_loop_through_the_gateway(start_gateway, upstream, stream, api):
    gw = await start_gateway(models={"fake-32k": {"context_window": 32_000, "api": api}})
    session = agent_loop_session(seed=11, turns=1, calls=CALLS)
    agent = agent_for(gw, session, f"agents-{stream}-{api}")
    task = session.turns[0]["user"]
    if stream:
        result = agents.Runner.run_streamed(agent, task, max_turns=CALLS + 5)
        async for _ in result.stream_events():
            pass
    else:
        result = await agents.Runner.run(agent, task, max_turns=CALLS + 5)
    await settle(gw)
    calls = [i for i in result.new_items if i.type == "tool_call_item"]
    assert len(calls) == CALLS
    assert str(result.final_output).startswith("Tool ")
    if api == "chat":
        bodies = forwarded(upstream)
        assert_valid_and_fits(bodies)
        assert any(is_placeholder(m) for m in bodies[-1]["messages"])
    else:
        bodies = responses_bodies(upstream)
        assert_responses_valid(upstream, bodies)
        assert PLACEHOLDER in str(bodies[-1]["input"])
    # A fact from early in the loop comes back, through the gateway's recall.
    fact = session.facts[0]
    follow = await agents.Runner.run(agent, [*result.to_input_list(), {"role": "user", "content": f"RECALL: {fact.question}"}])
    assert fact.answer in str(follow.final_output)
