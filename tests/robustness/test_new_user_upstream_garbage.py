"""A provider that sends chunks or completions of the wrong shape while the recall loop is on.

Through the plain relay the client gets the provider's bytes as they came (its SDK makes of
them what it would without the gateway). The recall loop rewrites the answer, so it must read
it without falling over: a chunk it cannot read is left out and the stream goes on to its end
(the connection is never cut, which the SDK would raise as APIConnectionError), and a completion
of the wrong shape is relayed as it came (never a 500 "the gateway failed").
"""

from __future__ import annotations

import orjson
import pytest

from tests.robustness.scripted import Reply, chunk, client

FILLER = "lorem ipsum dolor sit amet " * 100
LONG = [{"role": "user" if i % 2 == 0 else "assistant", "content": f"turn {i}: {FILLER}"} for i in range(24)]

BAD_CHUNKS = {
    "choices_a_string": {"choices": "x"},
    "choice_a_number": {"choices": [5]},
    "delta_a_string": {"choices": [{"delta": "str"}]},
    "tool_call_a_number": {"choices": [{"delta": {"tool_calls": [5]}}]},
    "tool_calls_a_string": {"choices": [{"delta": {"tool_calls": "x"}}]},
    "content_a_number": {"choices": [{"delta": {"content": 5}}]},
    "function_a_string": {"choices": [{"delta": {"tool_calls": [{"index": 0, "function": "x"}]}}]},
    "name_a_number": {"choices": [{"delta": {"tool_calls": [{"index": 0, "function": {"name": 5}}]}}]},
}
BAD_COMPLETIONS = {
    "message_null": [{"message": None, "finish_reason": "stop"}],
    "message_a_string": [{"message": "str", "finish_reason": "stop"}],
    "second_choice_a_number": [{"message": {"content": "a"}, "finish_reason": "stop"}, 5],
    "choices_an_object": {"0": {"message": {"content": "a"}}},
}


@pytest.mark.parametrize("bad", sorted(BAD_CHUNKS))
async def test_a_chunk_the_recall_loop_cannot_read_is_left_out(scripted, scripted_gateway, bad):
    gw = await scripted_gateway()
    scripted.script = lambda body: Reply(events=[chunk({"role": "assistant", "content": "hi "}), BAD_CHUNKS[bad],
                                                 chunk({"content": "there"}), chunk({}, finish="stop"), "[DONE]"])
    text, finish = "", None
    stream = await client(gw).chat.completions.create(model="m-8k", messages=[*LONG, {"role": "user", "content": "q"}], stream=True)
    async for event in stream:
        for choice in event.choices:
            text += choice.delta.content if isinstance(choice.delta.content, str) else ""
            finish = choice.finish_reason or finish
    assert "session_search" in orjson.dumps(scripted.chats()[0]).decode()  # through the recall loop
    assert (text, finish) == ("hi there", "stop")


@pytest.mark.parametrize("bad", sorted(BAD_COMPLETIONS))
async def test_a_completion_the_recall_loop_cannot_read_is_relayed_as_it_came(scripted, scripted_gateway, bad):
    gw = await scripted_gateway()
    payload = {"id": "x", "object": "chat.completion", "created": 1, "model": "m", "choices": BAD_COMPLETIONS[bad]}
    scripted.script = lambda body: Reply(json=payload)
    raw = await client(gw).chat.completions.with_raw_response.create(model="m-8k", messages=[*LONG, {"role": "user", "content": "q"}])
    assert "session_search" in orjson.dumps(scripted.chats()[0]).decode()
    assert (raw.status_code, raw.http_response.json()) == (200, payload)
    assert len(scripted.chats()) == 1
