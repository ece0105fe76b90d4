"""pydantic-ai's Agent with `OpenAIChatModel` through the gateway, JSON and streamed."""

from __future__ import annotations

import openai
import pytest

from tests.clients.rig import GATEWAY, MODEL, SYSTEM, TOOL_NAMES, Scenario, check, require, session_id

require("pydantic_ai")
from pydantic_ai import Agent, Tool  # noqa: E402
from pydantic_ai.models.openai import OpenAIChatModel  # noqa: E402
from pydantic_ai.providers.openai import OpenAIProvider  # noqa: E402



def tools_for(scenario: Scenario) -> list[Tool]:
    def tool(name: str) -> Tool:
        async def run(target: str) -> str:
            """Run the tool on a target in the workspace."""
            return scenario.tool(name, target)

        return Tool(run, name=name, takes_ctx=False)

    return [tool(name) for name in TOOL_NAMES]


@pytest.mark.parametrize("stream", [False, True], ids=["json", "stream"])
async def test_pydantic_ai_agent(start_gateway, upstream, stream):
    gw = await start_gateway(**GATEWAY)
    scenario, session = Scenario(), session_id("pydantic-ai")
    client = openai.AsyncOpenAI(base_url=gw.base_url, api_key="sk-client", max_retries=0,
                                default_headers={"X-Session-Id": session})
    agent = Agent(OpenAIChatModel(MODEL, provider=OpenAIProvider(openai_client=client)),
                  system_prompt=SYSTEM, tools=tools_for(scenario))

    async def run(prompt: str, history: list | None) -> tuple[str, list]:
        if not stream:
            result = await agent.run(prompt, message_history=history)
            return result.output, result.all_messages()
        async with agent.run_stream(prompt, message_history=history) as result:
            output = await result.get_output()
        return output, result.all_messages()

    _, history = await run(scenario.task, None)
    answers = []
    for question, _ in scenario.asks:
        output, history = await run(question, history)
        answers.append(output)
    await check(gw, upstream, scenario, session, answers)
