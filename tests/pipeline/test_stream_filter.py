"""The one stream state machine (gateway/pipeline/stream_filter.py) over a minimal event shape:
each format's stream is checked byte for byte in test_stream_identity.py; here the decisions
themselves, format-blind."""

from __future__ import annotations

import orjson
import pytest

from gateway.http.errors import UpstreamErrorEvent
from gateway.pipeline.stream_filter import Kind, Role, StreamFilter


class Shape:
    """{"t": "open" | "close" | "start" | "part" | "ping" | "error", "i": index, "role": ...}"""

    index_key = "i"

    def __init__(self, hold_one: bool = False, hidden_drops_held: bool = False, keeps_trailing_held: bool = True) -> None:
        self.hold_one, self.hidden_drops_held, self.keeps_trailing_held = hold_one, hidden_drops_held, keeps_trailing_held

    def kind(self, event):
        return {"open": Kind.OPEN, "close": Kind.CLOSE, "start": Kind.START}.get(event["t"], Kind.ITEM)

    def role(self, event):
        return Role(event["role"])

    def opening(self, event):
        return event, event.get("answer")

    def error(self, event):
        return {"message": "boom", "type": "server_error"} if event["t"] == "error" else None

    def encode(self, event):
        return orjson.dumps(event) + b"\n"


def add(total, usage):
    return usage if total is None else {"n": total["n"] + usage["n"]}


def told(raw: bytes) -> list[dict]:
    return [orjson.loads(line) for line in raw.splitlines()]


def item(i: int, role: str) -> list[dict]:
    return [{"t": "start", "i": i, "role": role, "sequence_number": 9}, {"t": "part", "i": i, "sequence_number": 9}]


def run(filter_: StreamFilter, rounds: list[list[dict]]) -> list[dict]:
    out = b""
    for n, events in enumerate(rounds):
        if n:
            filter_.new_round()
        out += b"".join(filter_.feed(e) for e in [{"t": "open", "answer": {"id": n}}, *events, {"t": "close"}])
        out += filter_.end_round({"n": 1}, {}, final=n == len(rounds) - 1)
    return told(out + filter_.finish([{"t": "close", "usage": filter_.usage}]))


def test_a_recall_round_leaves_nothing_but_the_opening_and_indices_stay_gapless():
    f = StreamFilter(Shape(), add)
    seen = run(f, [[*item(0, "shown"), *item(1, "hidden")], [*item(0, "shown")]])
    assert [(e["t"], e.get("i")) for e in seen] == [("open", None), ("start", 0), ("part", 0), ("start", 1), ("part", 1),
                                                    ("close", None)]
    assert [e["sequence_number"] for e in seen if "sequence_number" in e] == [1, 2, 3, 4]
    assert f.first == {"id": 0} and seen[-1]["usage"] == {"n": 2}


@pytest.mark.parametrize("shape,shown", [
    (Shape(), [0, 2]),  # held thinking before a hidden call still binds the shown item after it
    (Shape(hidden_drops_held=True), [2]),  # a hidden call takes the held item with it
])
def test_a_held_item_goes_with_what_follows_it(shape, shown):
    f = StreamFilter(shape, add)
    seen = run(f, [[*item(0, "held"), *item(1, "hidden"), *item(2, "shown")]])
    starts = [e for e in seen if e["t"] == "start"]
    assert [e["role"] for e in starts] == ["held", "shown"][-len(shown):]
    assert [e["i"] for e in starts] == list(range(len(shown))) and f.shown() == shown


def test_held_items_are_told_after_a_final_round_and_dropped_after_a_recall_round():
    f = StreamFilter(Shape(hold_one=True), add)
    seen = run(f, [[*item(0, "held"), *item(1, "hidden")], [*item(0, "held"), *item(1, "held")]])
    assert [(e["t"], e["i"]) for e in seen if "i" in e] == [("start", 0), ("part", 0)]  # one held at a time: the last


def test_held_items_nothing_shown_follows_are_dropped_at_the_end_where_the_format_drops_them():
    """A Responses reasoning item before only a hidden call (or nothing) binds nothing the client
    sees: sent back alone the provider refuses it, and its JSON answer drops it too."""
    f = StreamFilter(Shape(hold_one=True, keeps_trailing_held=False), add)
    seen = run(f, [[*item(0, "held"), *item(1, "hidden")]])
    assert [e for e in seen if "i" in e] == [] and f.shown() == []


def test_the_providers_error_event_raises():
    f = StreamFilter(Shape(), add)
    f.feed({"t": "open"})
    with pytest.raises(UpstreamErrorEvent):
        f.feed({"t": "error"})
