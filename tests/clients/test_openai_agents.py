"""openai-agents' Runner with `OpenAIChatCompletionsModel` through the gateway, JSON and streamed.
Tracing is off: it would export spans to the provider, and tests talk only to loopback."""

from __future__ import annotations

import openai
import pytest

from tests.clients.rig import GATEWAY, MODEL, SYSTEM, TOOL_NAMES, Scenario, check, require, session_id

require("agents")
from agents import Agent, OpenAIChatCompletionsModel, Runner, function_tool, set_tracing_disabled  # noqa: E402


set_tracing_disabled(True)


def tools_for(scenario: Scenario) -> list:
    def tool(name: str):
        async def run(target: str) -> str:
            """Run the tool on a target in the workspace."""
            return scenario.tool(name, target)

        return function_tool(run, name_override=name)

    return [tool(name) for name in TOOL_NAMES]


@pytest.mark.parametrize("stream", [False, True], ids=["json", "stream"])
async def test_openai_agents_chat_completions_model(start_gateway, upstream, stream):
    gw = await start_gateway(**GATEWAY)
    scenario, session = Scenario(), session_id("agents")
    client = openai.AsyncOpenAI(base_url=gw.base_url, api_key="sk-client", max_retries=0,
                                default_headers={"X-Session-Id": session})
    agent = Agent(name="coder", instructions=SYSTEM, tools=tools_for(scenario),
                  model=OpenAIChatCompletionsModel(model=MODEL, openai_client=client))

    async def run(items):
        if not stream:
            return await Runner.run(agent, items, max_turns=60)
        result = Runner.run_streamed(agent, items, max_turns=60)
        async for _ in result.stream_events():
            pass
        return result

    result = await run(scenario.task)
    answers = []
    for question, _ in scenario.asks:
        result = await run(result.to_input_list() + [{"role": "user", "content": question}])
        answers.append(str(result.final_output))
    await check(gw, upstream, scenario, session, answers)
