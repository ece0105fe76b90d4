"""litellm as a client (`acompletion(model="openai/...", api_base=gateway)`) in its tool loop,
JSON and streamed (chunks rebuilt by `litellm.stream_chunk_builder`)."""

from __future__ import annotations

import json
import os

import pytest

from tests.clients.rig import GATEWAY, MODEL, SYSTEM, Scenario, check, require, session_id

require("litellm")

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")  # no fetch of the price list at import
import litellm  # noqa: E402

from simulator.workloads import TOOL_SPECS  # noqa: E402


async def complete(gw, session: str, messages: list[dict], stream: bool) -> dict:
    kwargs = dict(model=f"openai/{MODEL}", api_base=gw.base_url, api_key="sk-client", messages=messages,
                  tools=TOOL_SPECS, extra_headers={"X-Session-Id": session}, num_retries=0)
    if not stream:
        response = await litellm.acompletion(**kwargs)
    else:
        chunks = [chunk async for chunk in await litellm.acompletion(**kwargs, stream=True)]
        response = litellm.stream_chunk_builder(chunks, messages=messages)
    return response.choices[0].message.model_dump()


@pytest.mark.parametrize("stream", [False, True], ids=["json", "stream"])
async def test_litellm_client_loop(start_gateway, upstream, stream):
    gw = await start_gateway(**GATEWAY)
    scenario, session = Scenario(), session_id("litellm")
    messages = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": scenario.task}]
    while True:
        message = await complete(gw, session, messages, stream)
        messages.append(message)  # as litellm returns it, every field it adds included
        if not message.get("tool_calls"):
            break
        for call in message["tool_calls"]:
            target = json.loads(call["function"]["arguments"])["target"]
            messages.append({"role": "tool", "tool_call_id": call["id"], "content": scenario.tool(call["function"]["name"], target)})
    answers = []
    for question, _ in scenario.asks:
        messages.append({"role": "user", "content": question})
        message = await complete(gw, session, messages, stream)
        messages.append(message)
        answers.append(message.get("content") or "")
    await check(gw, upstream, scenario, session, answers)
