"""The client's view of several upstream Messages streams as one (gateway/messages/recall.py over
the one stream state machine, gateway/pipeline/stream_filter.py)."""

from __future__ import annotations

from types import SimpleNamespace

import orjson

from gateway.messages.recall import MessagesRecallStream
from gateway.messages.stream import visible_blocks

NAMES = ("session_search", "session_load")


def turn_stream() -> MessagesRecallStream:
    """The recall loop's stream for a turn whose view offers the recall tools."""
    return MessagesRecallStream(SimpleNamespace(view=SimpleNamespace(recall_names=NAMES), chat=SimpleNamespace(body={})))


def events(blocks: list[dict], usage: dict, stop: str) -> list[dict]:
    out = [{"type": "message_start", "message": {"id": "msg_1", "type": "message", "role": "assistant", "content": [],
                                                 "usage": {**usage, "output_tokens": 1}}}, {"type": "ping"}]
    for i, block in enumerate(blocks):
        if block["type"] == "thinking":
            out += [{"type": "content_block_start", "index": i, "content_block": {"type": "thinking", "thinking": "", "signature": ""}},
                    {"type": "content_block_delta", "index": i, "delta": {"type": "thinking_delta", "thinking": block["thinking"]}},
                    {"type": "content_block_delta", "index": i, "delta": {"type": "signature_delta", "signature": block["signature"]}}]
        elif block["type"] == "text":
            out += [{"type": "content_block_start", "index": i, "content_block": {"type": "text", "text": ""}},
                    {"type": "content_block_delta", "index": i, "delta": {"type": "text_delta", "text": block["text"]}}]
        else:
            out += [{"type": "content_block_start", "index": i, "content_block": {**block, "input": {}}},
                    {"type": "content_block_delta", "index": i, "delta": {"type": "input_json_delta", "partial_json": orjson.dumps(block["input"]).decode()}}]
        out.append({"type": "content_block_stop", "index": i})
    out += [{"type": "message_delta", "delta": {"stop_reason": stop, "stop_sequence": None}, "usage": usage},
            {"type": "message_stop"}]
    return out


def told(raw: bytes) -> list[tuple[str, dict]]:
    out = []
    for chunk in raw.decode().split("\n\n"):
        if chunk:
            name, data = chunk.split("\n", 1)
            out.append((name.removeprefix("event: "), orjson.loads(data.removeprefix("data: "))))
    return out


def test_two_rounds_read_as_one_message_without_the_recall_call():
    usage1 = {"input_tokens": 10, "output_tokens": 5, "cache_read_input_tokens": 100, "cache_creation_input_tokens": 20}
    usage2 = {"input_tokens": 30, "output_tokens": 7, "cache_read_input_tokens": 110, "cache_creation_input_tokens": 0}
    thinking = {"type": "thinking", "thinking": "look it up", "signature": "sig-1"}
    first = [{"type": "text", "text": "Let me check."}, thinking,
             {"type": "tool_use", "id": "toolu_r", "name": "session_search", "input": {"query": "x"}}]
    second = [{"type": "thinking", "thinking": "answer", "signature": "sig-2"}, {"type": "text", "text": "It is 42."}]
    relay = turn_stream()
    out = b"".join(relay.feed(e) for e in events(first, usage1, "tool_use"))
    out += relay.end_round(final=False)
    relay.new_round()
    out += b"".join(relay.feed(e) for e in events(second, usage2, "end_turn"))
    out += relay.end_round(final=True) + relay.finish()
    seen = told(out)
    assert [n for n, _ in seen].count("message_start") == 1
    assert all(n == d["type"] for n, d in seen)  # every event keeps its event: name
    starts = [d for n, d in seen if n == "content_block_start"]
    assert [d["index"] for d in starts] == [0, 1, 2]
    assert [d["content_block"]["type"] for d in starts] == ["text", "thinking", "text"]
    assert "session_search" not in out.decode() and "sig-1" not in out.decode()  # the recall call and its thinking
    delta = next(d for n, d in seen if n == "message_delta")
    assert delta["delta"]["stop_reason"] == "end_turn"
    assert delta["usage"] == {"input_tokens": 40, "output_tokens": 12, "cache_read_input_tokens": 210,
                              "cache_creation_input_tokens": 20}
    assert seen[-1][0] == "message_stop"
    assert [b["type"] for b in relay.filter.visible] == ["text", "thinking", "text"]
    assert relay.filter.visible[1]["signature"] == "sig-2"


def test_visible_blocks_drop_recall_calls_and_the_thinking_bound_to_them():
    blocks = [{"type": "thinking", "thinking": "a", "signature": "s1"},
              {"type": "tool_use", "id": "1", "name": "session_load", "input": {}},
              {"type": "thinking", "thinking": "b", "signature": "s2"},
              {"type": "tool_use", "id": "2", "name": "Bash", "input": {}}]
    assert [b.get("signature") or b["name"] for b in visible_blocks(blocks, NAMES)] == ["s2", "Bash"]


def test_malformed_provider_events_are_read_as_far_as_they_go():
    relay = turn_stream()
    odd = [{"type": "message_start", "message": []}, {"type": "content_block_start", "index": 0, "content_block": ["x"]},
           {"type": "content_block_delta", "index": 0, "delta": "text"},
           {"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": 5}},
           {"type": "content_block_start", "index": 1, "content_block": {"type": "text", "text": ""}},
           {"type": "content_block_delta", "index": 1, "delta": {"type": "text_delta", "text": "fine"}},
           {"type": "message_delta", "delta": None, "usage": {"output_tokens": "7"}}, {"type": "message_stop"}]
    out = b"".join(relay.feed(e) for e in odd) + relay.end_round(final=True) + relay.finish()
    assert b"fine" in out and relay.round.stopped
