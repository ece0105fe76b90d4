"""langchain-openai's `ChatOpenAI.bind_tools` in a hand-written loop, and langgraph's prebuilt
ReAct agent, through the gateway: JSON and streamed. LangChain sends a tool call's arguments
back re-serialised (`json.dumps` of the parsed value), which must not fork the session."""

from __future__ import annotations

import pytest

from tests.clients.rig import GATEWAY, MODEL, SYSTEM, TOOL_NAMES, Scenario, check, require, session_id

require("langchain_openai", "langgraph")
from langchain_core.messages import AIMessage, HumanMessage, SystemMessage, ToolMessage  # noqa: E402
from langchain_core.tools import StructuredTool  # noqa: E402
from langchain_openai import ChatOpenAI  # noqa: E402
from langgraph.prebuilt import create_react_agent  # noqa: E402



def tools_for(scenario: Scenario) -> list[StructuredTool]:
    def tool(name: str) -> StructuredTool:
        async def run(target: str) -> str:
            return scenario.tool(name, target)

        return StructuredTool.from_function(coroutine=run, name=name, description=f"{name.replace('_', ' ')} in the workspace")

    return [tool(name) for name in TOOL_NAMES]


def chat_model(gw, session: str, stream: bool) -> ChatOpenAI:
    return ChatOpenAI(model=MODEL, base_url=gw.base_url, api_key="sk-client", max_retries=0, streaming=stream,
                      default_headers={"X-Session-Id": session})


async def answer(model, messages: list, stream: bool) -> AIMessage:
    if not stream:
        return await model.ainvoke(messages)
    message = None
    async for chunk in model.astream(messages):
        message = chunk if message is None else message + chunk
    return message


@pytest.mark.parametrize("stream", [False, True], ids=["json", "stream"])
async def test_langchain_bind_tools_loop(start_gateway, upstream, stream):
    gw = await start_gateway(**GATEWAY)
    scenario, session = Scenario(), session_id("langchain")
    tools = {t.name: t for t in tools_for(scenario)}
    model = chat_model(gw, session, stream).bind_tools(list(tools.values()))
    messages: list = [SystemMessage(SYSTEM), HumanMessage(scenario.task)]
    while True:
        message = await answer(model, messages, stream)
        messages.append(message)
        if not message.tool_calls:
            break
        for call in message.tool_calls:
            output = await tools[call["name"]].ainvoke(call["args"])
            messages.append(ToolMessage(output, tool_call_id=call["id"]))
    answers = []
    for question, _ in scenario.asks:
        messages.append(HumanMessage(question))
        message = await answer(model, messages, stream)
        messages.append(message)
        answers.append(message.text if isinstance(message.text, str) else message.text())
    await check(gw, upstream, scenario, session, answers)


@pytest.mark.parametrize("stream", [False, True], ids=["json", "stream"])
async def test_langgraph_prebuilt_agent(start_gateway, upstream, stream):
    gw = await start_gateway(**GATEWAY)
    scenario, session = Scenario(), session_id("langgraph")
    agent = create_react_agent(chat_model(gw, session, stream), tools_for(scenario), prompt=SYSTEM)
    config = {"recursion_limit": 200}

    async def run(messages: list) -> list:
        if not stream:
            return (await agent.ainvoke({"messages": messages}, config))["messages"]
        state = None
        async for state in agent.astream({"messages": messages}, config, stream_mode="values"):
            pass
        return state["messages"]

    messages = await run([HumanMessage(scenario.task)])
    answers = []
    for question, _ in scenario.asks:
        messages = await run(messages + [HumanMessage(question)])
        answers.append(messages[-1].content)
    await check(gw, upstream, scenario, session, answers)
