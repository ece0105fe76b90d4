"""Messages clients on a model served only as Chat Completions (``[models."x"] api = "chat"``,
gateway/messages/chat_upstream.py), with the official anthropic SDK against the strict simulator:
the request reaches the upstream as a chat completion, the answer comes back as a Messages
message or event stream (tool calls as tool_use blocks), thinking blocks are left out and named
in x-palimpsest-dropped, the upstream's errors arrive in Anthropic's envelope, and a long tool
loop compacts with recall resolved through the translation."""

from __future__ import annotations

import anthropic
import pytest

from tests.messages.test_messages import BASH, SYSTEM, step_output
from tests.support.agent import settle

CHAT_ONLY = {"fake-32k": {"api": "chat"}, "fake-8k": {"api": "chat"}}
THOUGHT = {"type": "thinking", "thinking": "plan the call", "signature": "sig-abc"}


def client_for(gw) -> anthropic.AsyncAnthropic:
    return anthropic.AsyncAnthropic(base_url=gw.root, api_key="sk-client", max_retries=0, timeout=60)


def history_with_thinking() -> list[dict]:
    return [
        {"role": "user", "content": "Run the build. [[call Bash {\"command\": \"make\"}]]"},
        {"role": "assistant", "content": [THOUGHT, {"type": "tool_use", "id": "toolu_1", "name": "Bash", "input": {"command": "make"}}]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_1", "content": "built ok"},
                                     {"type": "text", "text": "now the tests [[call Bash {\"command\": \"make test\"}]]"}]},
    ]


@pytest.mark.parametrize("stream", [False, True])
async def test_a_messages_tool_round_goes_as_chat_and_comes_back_as_messages(upstream, start_gateway, stream):
    gw = await start_gateway(models=CHAT_ONLY)
    client = client_for(gw)
    kw = dict(model="fake-32k", max_tokens=256, system=SYSTEM, tools=[BASH], messages=history_with_thinking(),
              extra_headers={"X-Session-Id": f"chat-only-{stream}"})
    if stream:
        async with client.messages.stream(**kw) as s:
            events = [e async for e in s]
            message = await s.get_final_message()
        raw = None
        kinds = [e.type for e in events]
        assert kinds[0] == "message_start" and "message_stop" in kinds
    else:
        raw = await client.messages.with_raw_response.create(**kw)
        message = await raw.parse()
    assert message.stop_reason == "tool_use"
    (call,) = [b for b in message.content if b.type == "tool_use"]
    assert call.name == "Bash" and call.input == {"command": "make test"}
    if raw is not None:
        assert raw.headers["x-palimpsest-dropped"] == "thinking=1"
    assert message.usage.input_tokens > 0 and message.usage.output_tokens > 0
    assert not [r for r in upstream.received if r["path"].startswith("/v1/messages")]
    sent = upstream.chat_requests()[-1]["json"]
    roles = [m["role"] for m in sent["messages"]]
    assert roles == ["system", "user", "assistant", "tool", "user"]
    assert sent["messages"][2]["tool_calls"][0]["id"] == "toolu_1" and sent["messages"][3]["tool_call_id"] == "toolu_1"
    assert "plan the call" not in str(sent)  # the thinking block stayed behind
    assert sent["tools"][0]["function"]["name"] == "Bash" and sent["max_tokens"] == 256


async def test_the_dropped_header_is_sent_on_a_stream_too(upstream, start_gateway):
    import aiohttp

    gw = await start_gateway(models=CHAT_ONLY)
    body = {"model": "fake-32k", "max_tokens": 64, "stream": True, "messages": history_with_thinking(), "tools": [BASH]}
    async with aiohttp.ClientSession() as http:
        async with http.post(gw.root + "/v1/messages", json=body,
                             headers={"x-api-key": "k", "anthropic-version": "2023-06-01", "X-Session-Id": "s-h"}) as r:
            assert r.status == 200
            assert r.headers["x-palimpsest-dropped"] == "thinking=1"
            text = (await r.read()).decode()
    assert text.startswith("event: message_start") and text.rstrip().endswith('{"type":"message_stop"}')


async def test_the_chat_upstreams_errors_arrive_in_anthropics_envelope(upstream, start_gateway):
    gw = await start_gateway(models={"no-such-model": {"api": "chat"}})
    with pytest.raises(anthropic.NotFoundError) as caught:
        await client_for(gw).messages.create(model="no-such-model", max_tokens=64,
                                             messages=[{"role": "user", "content": "hi"}])
    assert caught.value.body["type"] == "error" and caught.value.body["error"]["type"] == "not_found_error"
    assert "no-such-model" in caught.value.body["error"]["message"]


@pytest.mark.parametrize("stream", [False, True])
async def test_a_long_loop_on_a_chat_only_model_compacts_and_recalls(upstream, start_gateway, stream):
    # No cache discount and 36 steps: the loop's piled-up placeholders are worth a summary (with a
    # cache, or fewer steps, the cost model settles over them instead: the summary block would be
    # about as big, policies/cost.settle_size), so the summary path runs.
    gw = await start_gateway(models=CHAT_ONLY, policy={"profile": "economy", "summary_trigger_ratio": 0.3,
                                                      "cached_input_rate": 1.0})
    client = client_for(gw)
    history = [{"role": "user", "content": "Run the chain. [[call Bash {\"command\": \"step 1\"}]]"}]
    for step in range(1, 37):
        kw = dict(model="fake-32k", max_tokens=1024, system=SYSTEM, tools=[BASH], messages=history,
                  extra_headers={"X-Session-Id": f"loop-{stream}"})
        if stream:
            async with client.messages.stream(**kw) as s:
                message = await s.get_final_message()
        else:
            message = await client.messages.create(**kw)
        (call,) = [b for b in message.content if b.type == "tool_use"]
        history += [{"role": "assistant", "content": [b.model_dump(exclude_none=True) for b in message.content]},
                    {"role": "user", "content": [{"type": "tool_result", "tool_use_id": call.id, "content": step_output(step)}]}]
        await settle(gw)
    history[-1]["content"][0]["content"] = step_output(36).rsplit("\n", 1)[0]
    history += [{"role": "assistant", "content": "Chain done."},
                {"role": "user", "content": "RECALL: where is the artifact for step 2?"}]
    kw = dict(model="fake-32k", max_tokens=1024, system=SYSTEM, tools=[BASH], messages=history,
              extra_headers={"X-Session-Id": f"loop-{stream}"})
    if stream:
        async with client.messages.stream(**kw) as s:
            message = await s.get_final_message()
    else:
        message = await client.messages.create(**kw)
    text = "".join(b.text for b in message.content if b.type == "text")
    assert "/srv/out/step2.bin" in text and all(b.type != "tool_use" for b in message.content)
    sent = [r["json"] for r in upstream.chat_requests() if r["headers"].get("x-palimpsest-purpose") != "summary"]
    assert any("<session_summary>" in str(b["messages"]) for b in sent)
    assert any(t["function"]["name"] == "session_search" for t in sent[-2].get("tools") or ())
    assert not [r for r in upstream.received if r["path"].startswith("/v1/messages")]
