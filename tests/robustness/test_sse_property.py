"""The gateway's SSE decoder and stream assembler under any framing (hypothesis): LF or CRLF,
comments and other fields between events, and the bytes cut into reads anywhere (inside a
multi-byte character, between CR and LF). What the gateway records must not depend on how the
network happened to cut the stream."""

from __future__ import annotations

import orjson
from hypothesis import HealthCheck, given, settings, strategies as st

from gateway.http.sse import SSEDecoder, StreamAssembler

TEXT = st.text(st.characters(codec="utf-8", exclude_characters="\r\n"), max_size=12)


@st.composite
def streams(draw):
    pieces = draw(st.lists(TEXT, min_size=1, max_size=12))
    calls = draw(st.lists(st.tuples(st.integers(0, 1), TEXT), max_size=6))  # (call index, argument piece)
    events = [{"choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}, "finish_reason": None}]}]
    events += [{"choices": [{"index": 0, "delta": {"content": p}, "finish_reason": None}]} for p in pieces]
    for k in sorted({k for k, _ in calls}):
        events.append({"choices": [{"index": 0, "delta": {"tool_calls": [{"index": k, "id": f"call_{k}", "type": "function",
                                                                          "function": {"name": f"tool_{k}", "arguments": ""}}]}}]})
    events += [{"choices": [{"index": 0, "delta": {"tool_calls": [{"index": k, "function": {"arguments": a}}]}}]} for k, a in calls]
    events.append({"choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]})
    newline = draw(st.sampled_from([b"\n", b"\r\n"]))
    raw = b""
    for event in events:
        if draw(st.integers(0, 4)) == 0:
            raw += b": keep-alive" + newline
        if draw(st.integers(0, 4)) == 0:
            raw += b"event: message" + newline
        raw += b"data:" + draw(st.sampled_from([b" ", b""])) + orjson.dumps(event) + newline + newline
    raw += b"data: [DONE]" + newline + newline
    cuts = sorted(set(draw(st.lists(st.integers(0, len(raw)), max_size=20))))
    reads = [raw[a:b] for a, b in zip([0, *cuts], [*cuts, len(raw)])]
    return events, pieces, calls, reads


@settings(derandomize=True, database=None, deadline=None, max_examples=500, suppress_health_check=list(HealthCheck))
@given(streams())
def test_any_framing_decodes_to_the_same_events_and_answer(drawn):
    events, pieces, calls, reads = drawn
    decoder, assembler = SSEDecoder(), StreamAssembler()
    data: list[str] = []
    for read in reads:
        data += decoder.feed(read)
    assert data[-1] == "[DONE]"
    decoded = [orjson.loads(d) for d in data[:-1]]
    assert decoded == events
    for event in decoded:
        assembler.add(event)
    message = assembler.message()
    assert (message.get("content") or "") == "".join(pieces)
    assert assembler.finish_reason == "stop"
    arguments = {k: "".join(a for j, a in calls if j == k) for k, _ in calls}
    got = {int(c["id"].removeprefix("call_")): c["function"]["arguments"] for c in message.get("tool_calls") or ()}
    assert got == arguments
