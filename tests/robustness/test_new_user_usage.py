"""A provider whose ``usage`` is not what the spec says: numbers as strings, negative counts,
a string instead of an object, details that are not objects.

The client's answer must not depend on it. The gateway relays the provider's bytes as they
came when it does not rewrite the answer; when it does (the recall loop sums usage over its
calls), it reports what it could read and drops the rest. Metrics and calibration never take a
negative or non-numeric count (a Prometheus counter raises on a negative increment: that was a
500 for the client, or a stream cut before its end).
"""

from __future__ import annotations

import pytest
from aiohttp import ClientSession

from gateway.pipeline.turn import clean_usage
from tests.robustness.scripted import answer, client

FILLER = "lorem ipsum dolor sit amet " * 100
LONG = [{"role": "user" if i % 2 == 0 else "assistant", "content": f"turn {i}: {FILLER}"} for i in range(24)]
USAGES = {
    "strings": {"prompt_tokens": "10", "completion_tokens": "2", "total_tokens": "12"},
    "negative": {"prompt_tokens": -5, "completion_tokens": 1, "total_tokens": -4},
    "details_not_object": {"prompt_tokens": 10, "completion_tokens": 2, "total_tokens": 12, "prompt_tokens_details": "x"},
    "detail_string": {"prompt_tokens": 10, "completion_tokens": 2, "total_tokens": 12, "prompt_tokens_details": {"cached_tokens": "5"}},
    "null_counts": {"prompt_tokens": None, "completion_tokens": None},
}


async def _metric(gw, name: str) -> list[str]:
    async with ClientSession() as http, http.get(gw.root + "/metrics") as response:
        text = await response.text()
    return [line for line in text.splitlines() if line.startswith(name + "{")]


@pytest.mark.parametrize("stream", [False, True], ids=["json", "stream"])
@pytest.mark.parametrize("usage", sorted(USAGES))
async def test_odd_usage_never_fails_a_recall_turn(scripted, scripted_gateway, usage, stream):
    gw = await scripted_gateway()

    def script(body: dict):
        if body["messages"][-1]["role"] != "tool":  # a recall round first: the gateway sums usage over both calls
            call = {"id": "call_r", "type": "function", "function": {"name": "session_search", "arguments": '{"query": "turn 3"}'}}
            return answer(body, {"content": None, "tool_calls": [call]}, finish="tool_calls", usage=USAGES[usage])
        return answer(body, {"content": "fine"}, usage=USAGES[usage])

    scripted.script = script
    sdk = client(gw)
    messages = [*LONG, {"role": "user", "content": "what was turn 3?"}]
    if stream:
        text, reported = "", None
        async for event in await sdk.chat.completions.create(model="m-8k", messages=messages, stream=True,
                                                             stream_options={"include_usage": True}):
            reported = event.usage or reported
            text += "".join(choice.delta.content or "" for choice in event.choices)
    else:
        reply = await sdk.chat.completions.create(model="m-8k", messages=messages)
        text, reported = reply.choices[0].message.content, reply.usage
    assert text == "fine"
    assert len(scripted.chats()) == 2  # the recall round really ran
    if usage == "strings":
        assert (reported.prompt_tokens, reported.completion_tokens) == (20, 4)
    assert await _metric(gw, "palimpsest_requests_total") == ['palimpsest_requests_total{model="m-8k",route="chat",status="200",upstream="default"} 1.0']


@pytest.mark.parametrize("stream", [False, True], ids=["json", "stream"])
@pytest.mark.parametrize("usage", sorted(USAGES))
async def test_odd_usage_is_relayed_as_it_came_and_counts_nothing_wrong(scripted, scripted_gateway, usage, stream):
    gw = await scripted_gateway()
    scripted.script = lambda body: answer(body, {"content": "fine"}, usage=USAGES[usage])
    sdk = client(gw)
    if stream:
        text = ""
        async for event in await sdk.chat.completions.create(model="m-8k", messages=[{"role": "user", "content": "hi"}], stream=True):
            text += "".join(choice.delta.content or "" for choice in event.choices)
    else:
        reply = await sdk.chat.completions.with_raw_response.create(model="m-8k", messages=[{"role": "user", "content": "hi"}])
        assert reply.http_response.json()["usage"] == USAGES[usage]  # the provider's bytes, untouched
        text = reply.parse().choices[0].message.content
    assert text == "fine"
    assert await _metric(gw, "palimpsest_requests_total") == ['palimpsest_requests_total{model="m-8k",route="chat",status="200",upstream="default"} 1.0']
    for line in await _metric(gw, "palimpsest_upstream_usage_prompt_tokens_total"):
        assert float(line.rsplit(" ", 1)[1]) in (0.0, 10.0)


def test_clean_usage_keeps_what_it_can_read():
    assert clean_usage({"prompt_tokens": "10", "completion_tokens": 2.0, "total_tokens": -1, "x": "y",
                        "prompt_tokens_details": {"cached_tokens": 3, "audio_tokens": "a"}, "completion_tokens_details": []}) == \
        {"prompt_tokens": 10, "completion_tokens": 2, "prompt_tokens_details": {"cached_tokens": 3}}
    assert clean_usage("n/a") is None and clean_usage([]) is None and clean_usage(None) is None
    assert clean_usage({"prompt_tokens": True}) == {}
