"""The plain openai SDK's own tool loop through the gateway, JSON and streamed."""

from __future__ import annotations

import json

import openai
import pytest

from simulator.workloads import TOOL_SPECS
from tests.clients.rig import GATEWAY, MODEL, SYSTEM, Scenario, check, session_id


async def complete(client: openai.AsyncOpenAI, messages: list[dict], stream: bool) -> dict:
    """One chat completion as the assistant message a client appends to its history."""
    if not stream:
        response = await client.chat.completions.create(model=MODEL, messages=messages, tools=TOOL_SPECS)
        return response.choices[0].message.model_dump(exclude_none=True)
    content, calls = "", {}
    async for chunk in await client.chat.completions.create(model=MODEL, messages=messages, tools=TOOL_SPECS, stream=True):
        if not chunk.choices:
            continue
        delta = chunk.choices[0].delta
        content += delta.content or ""
        for call in delta.tool_calls or ():
            slot = calls.setdefault(call.index, {"id": "", "type": "function", "function": {"name": "", "arguments": ""}})
            slot["id"] = call.id or slot["id"]
            slot["function"]["name"] += (call.function and call.function.name) or ""
            slot["function"]["arguments"] += (call.function and call.function.arguments) or ""
    message = {"role": "assistant", "content": content or None}
    if calls:
        message["tool_calls"] = [calls[i] for i in sorted(calls)]
    return message


@pytest.mark.parametrize("stream", [False, True], ids=["json", "stream"])
async def test_openai_sdk_agent_loop(start_gateway, upstream, stream):
    gw = await start_gateway(**GATEWAY)
    scenario, session = Scenario(), session_id("openai")
    client = openai.AsyncOpenAI(base_url=gw.base_url, api_key="sk-client", max_retries=0,
                                default_headers={"X-Session-Id": session})
    messages = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": scenario.task}]
    while True:
        message = await complete(client, messages, stream)
        messages.append(message)
        if not message.get("tool_calls"):
            break
        for call in message["tool_calls"]:
            target = json.loads(call["function"]["arguments"])["target"]
            messages.append({"role": "tool", "tool_call_id": call["id"], "content": scenario.tool(call["function"]["name"], target)})
    answers = []
    for question, _ in scenario.asks:
        messages.append({"role": "user", "content": question})
        message = await complete(client, messages, stream)
        messages.append(message)
        answers.append(message.get("content") or "")
    await check(gw, upstream, scenario, session, answers)
