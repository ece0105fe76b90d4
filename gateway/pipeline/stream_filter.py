"""The one stream state machine: one turn's upstream streams as the client's one stream.

The recall loop (``gateway/pipeline/recall_loop.py``) may call the upstream several times in a
turn; the client must see one answer with the gateway's recall calls left out. Every format's
stream is a run of *items* addressed by an upstream index (Responses' output items, Messages'
content blocks, chat's tool calls), plus events of the whole answer. What is decided here, once
for every format:

- an item is **shown** (told as it comes, under the next client index: indices stay gapless
  across rounds), **hidden** (a recall call: none of its events reach the client), or **held**
  (reasoning / thinking: kept until the item after it shows what it belongs to: told first,
  bound to a shown item; dropped with a recall call, or when the round turns out to be a recall
  round, or, where the format says so (Responses), when no shown item follows it at all);
- the opening event is told once, from the first call (the first call's object names the
  answer); the closing events are held back: after a recall round nothing closes, after the
  last one the format writes one close with the turn's usage, summed here over every call;
- a provider error event inside a stream raises ``UpstreamErrorEvent`` (the recall loop ends
  the client's stream with the format's error event);
- a ``sequence_number`` field, where a format has one, is renumbered so the client's stream is
  one gapless sequence.

A format supplies only its event shapes (``StreamShape``): which event opens or closes the
answer, which starts an item and what that item is, its error event, how an event is encoded
and how its usage adds up. Chat, whose chunks carry several items' deltas at once, routes each
tool-call delta through ``open`` / ``place`` itself.
"""

from __future__ import annotations

from collections.abc import Callable
from enum import Enum
from typing import Any, Protocol

from gateway.http.errors import UpstreamErrorEvent


class Role(Enum):
    SHOWN = "shown"
    HIDDEN = "hidden"
    HELD = "held"


class Kind(Enum):
    """What one upstream event is, to the state machine."""

    OPEN = "open"  # the answer's opening (response.created, message_start)
    CLOSE = "close"  # the answer's closing (response.completed, message_delta / message_stop)
    START = "start"  # starts the item at its index
    ITEM = "item"  # belongs to the item at its index


class StreamShape(Protocol):
    """A format's event shapes."""

    index_key: str  # the field that addresses an item ("output_index", "index")
    hold_one: bool  # a held item is dropped when another held item starts before a shown one
    hidden_drops_held: bool  # a hidden item takes the held items before it with it
    # Held items no shown item followed reach the client at the end of the answer (thinking
    # blocks, kept in JSON too); else they are dropped, as the JSON answer drops them (a
    # reasoning item binds the items after it: alone, the provider refuses it sent back).
    keeps_trailing_held: bool

    def kind(self, event: dict) -> Kind: ...

    def role(self, event: dict) -> Role:
        """The role of the item a ``START`` event starts."""

    def opening(self, event: dict) -> tuple[dict, dict | None]:
        """(the opening event as the client gets it, the answer object it carries or None)."""

    def error(self, event: dict) -> dict | None:
        """The provider's error of an error event (None: not one)."""

    def encode(self, event: dict) -> bytes: ...


class StreamFilter:
    """The client's stream across the upstream calls of one turn (see the module docstring)."""

    def __init__(self, shape: StreamShape | None, add_usage: Callable[[dict | None, Any], dict | None]) -> None:
        self.shape = shape
        self._add_usage = add_usage
        self.rounds = 0
        self.first: dict | None = None  # the first call's answer object (its id names the answer)
        self.usage: dict | None = None  # summed over the turn's calls, in the format's shape
        self.closing: dict | None = None  # the round's closing event, once it came
        self.visible: list[dict] = []  # the items the client was shown, whole, in its order
        self._seq = 0
        self._next = 0  # the next client index (gapless across rounds)
        self._round()

    def _round(self) -> None:
        self._map: dict[int, int] = {}  # upstream index -> client index, in the order shown
        self._hidden: set[int] = set()
        self._held: list[tuple[int, list[dict]]] = []  # held items and their events, in order

    def new_round(self) -> None:
        """The next upstream call of the turn begins (after a recall round)."""
        self.rounds += 1
        self.closing = None
        self._round()

    # -- items ---------------------------------------------------------------------------------

    def open(self, index: int, role: Role) -> bytes:
        """The item at `index` starts with `role`: what is told before it (held items it binds)."""
        if role is Role.HELD:
            if self.shape is not None and self.shape.hold_one and self._held:
                self._drop_held()
            self._held.append((index, []))
            return b""
        if role is Role.HIDDEN:
            self._hidden.add(index)
            if self.shape is not None and self.shape.hidden_drops_held:
                self._drop_held()
            return b""
        out = self._flush_held()
        self._show(index)
        return out

    def place(self, index: int) -> int | None:
        """The client index of the item at `index`; None when the client does not see it (yet)."""
        return self._map.get(index)

    def hidden(self, index: int) -> bool:
        return index in self._hidden

    def shown(self) -> list[int]:
        """The round's shown upstream indices, in the client's order."""
        return sorted(self._map, key=self._map.get)

    def _show(self, index: int) -> None:
        self._map[index] = self._next
        self._next += 1

    def _flush_held(self) -> bytes:
        held, self._held = self._held, []
        out = bytearray()
        for index, events in held:
            self._show(index)
            out += b"".join(self._out(e) for e in events)
        return bytes(out)

    def _drop_held(self) -> None:
        self._hidden.update(index for index, _ in self._held)
        self._held = []

    # -- events --------------------------------------------------------------------------------

    def feed(self, event: dict) -> bytes:
        """Bytes for the client for one upstream event (b"" when nothing is told)."""
        shape = self.shape
        error = shape.error(event)
        if error is not None:
            raise UpstreamErrorEvent(error)  # told to the client as the provider said it
        kind = shape.kind(event)
        if kind is Kind.OPEN:
            event, answer = shape.opening(event)
            if self.first is None and answer is not None:
                self.first = answer
            return self._out(event) if self.rounds == 0 else b""
        if kind is Kind.CLOSE:
            self.closing = event
            return b""  # the caller decides: another round, or the end (`finish`)
        index = event.get(shape.index_key)
        if not isinstance(index, int):
            return self._out(event)  # ping, and events the gateway does not know
        if kind is Kind.START:
            role = shape.role(event)
            out = self.open(index, role)
            if role is Role.HELD:
                self._held[-1][1].append(event)
                return b""
            return b"" if role is Role.HIDDEN else out + self._out(event)
        if index in self._hidden:
            return b""
        for held, events in self._held:
            if held == index:
                events.append(event)
                return b""
        return self._out(event)

    def _out(self, event: dict) -> bytes:
        if "sequence_number" in event:
            event = {**event, "sequence_number": self._seq}
        self._seq += 1
        key = self.shape.index_key
        if isinstance(event.get(key), int) and event[key] in self._map:
            event = {**event, key: self._map[event[key]]}
        return self.shape.encode(event)

    def end_round(self, usage: Any, items: dict[int, dict], *, final: bool) -> bytes:
        """The round's stream ended: its usage counts; what is still held goes to the client
        after the final round, and with the recall calls after a recall round; the shown ones
        of the round's whole `items` (by upstream index) are kept as the client's."""
        self.add_usage(usage)
        out = self._flush_held() if final and self.shape is not None and self.shape.keeps_trailing_held else b""
        self._drop_held()
        self.visible += [items[i] for i in self.shown() if i in items]
        return out

    def add_usage(self, usage: Any) -> None:
        self.usage = self._add_usage(self.usage, usage)

    def finish(self, events: list[dict]) -> bytes:
        """The client's closing events, as the format wrote them from the turn."""
        return b"".join(self._out(e) for e in events)
