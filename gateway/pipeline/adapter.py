"""What a wire format gives the shared request path (docs/architecture.md, "Wire formats").

A format's pipeline (a ``WirePipeline`` subclass in its own room) is its adapter: it parses,
renders, reads answers and streams, and ends a started stream with its error event. For the
recall loop (``gateway/pipeline/recall_loop.py``) it also reads each upstream answer of a turn
into a ``Reply`` and merges the turn's answers into the one the client sees, in JSON
(``JsonTurn``) and in streams (``RecallStream``, built on the one stream state machine,
``stream_filter.StreamFilter``, over the format's event shapes). The loop itself knows no format.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

from aiohttp import web


@dataclass(slots=True)
class Reply:
    """One upstream answer of a turn, read by its format."""

    recall: list[dict]  # its recall calls, as neutral tool calls
    client: bool  # it also calls a tool of the client's
    complete: bool  # it ended as a round of calls ends (its calls are whole)
    assistant: dict  # the neutral assistant item a recall round appends to the view
    usage: dict | None  # this call's usage, chat-shaped (what the recorder and metrics read)


class JsonTurn(Protocol):
    """The non-streamed answers of one turn, merged into the client's one."""

    def read(self, data: dict) -> Reply | None:
        """One answer (its usage and id taken); None when it cannot be read: it goes to the
        client as it came."""

    def recalled(self, reply: Reply) -> None:
        """`reply` was a recall round: what of it the client still sees is kept."""

    def final(self, data: dict) -> tuple[dict, dict | None, dict | None]:
        """(the client's answer, the neutral item to record or None, the turn's chat usage)."""


class RecallStream(Protocol):
    """The streams of one turn's upstream calls as one stream for the client."""

    def feed(self, event: dict) -> bytes:
        """Bytes for the client for one event (b"" when nothing is told); the provider's error
        event raises it as an ``UpstreamErrorEvent``."""

    def done(self) -> None:
        """The stream's ``[DONE]`` sentinel."""

    def round_end(self) -> Reply | None:
        """The round's answer once its stream ended; None when it was cut short."""

    def end_round(self, *, final: bool) -> bytes:
        """What the round still owes the client: nothing after a recall round."""

    def new_round(self) -> None: ...

    def finish(self) -> bytes:
        """The client's closing events (summed usage, the first call's id)."""

    def answer(self) -> dict | None:
        """The neutral item of what the client was sent, to record (None: nothing complete)."""

    def usage(self) -> dict | None:
        """The turn's usage, chat-shaped."""


@dataclass(frozen=True, slots=True)
class RecallFormat:
    """A format's answers for the recall loop: its ``recall.py`` names them once."""

    body: Callable[..., bytes]  # (turn, messages, with_recall, stream): the upstream body of a round
    json_turn: Callable[[Any], JsonTurn]  # (turn)
    stream: Callable[[Any], RecallStream]  # (turn)


class RecallAdapter(Protocol):
    """What the recall loop asks of a format's pipeline."""

    def recall_body(self, turn, messages: list[dict], with_recall: bool, stream: bool) -> bytes: ...

    def transport(self, model: str) -> Any: ...

    def upstream_path(self, request: web.Request) -> str: ...

    def json_turn(self, turn) -> JsonTurn: ...

    def recall_stream(self, turn) -> RecallStream: ...

    async def record(self, turn, tenant: str | None = None) -> None: ...

    async def stream_failed(self, response: web.StreamResponse | None, turn, error) -> web.StreamResponse: ...
