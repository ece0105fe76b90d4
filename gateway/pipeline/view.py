"""What a view build returns (``View``: what goes upstream and what it hid), what the plan
decided for the request's receipt (``ViewNotes``) and the projection it is fitted from
(``Projection``); built by ``gateway/pipeline/views.py``."""

from __future__ import annotations

from dataclasses import dataclass

import orjson

from gateway.pipeline.request import ChatRequest
from policies import PlanEvent
from policies.holdout import COMPACTED
from store.records import Checkpoint


@dataclass(slots=True)
class View:
    """What the upstream receives. messages None means: forward the client's bytes unchanged."""

    messages: list[dict] | None = None
    tools: list[dict] | None = None
    recall_names: tuple[str, str] | None = None
    client_tokens: int = 0
    upstream_tokens: int = 0
    checkpoint: str | None = None
    hidden: frozenset[str] = frozenset()
    budget: int = 0
    window: int = 0
    policy: object = None
    raw_estimate: int = 0  # uncalibrated estimate of what goes upstream (calibration input)
    truncated_tool_results: int = 0  # tool results cut head/tail in the outgoing copy
    truncated_last_message: bool = False  # the newest user message was cut (policy opted in)
    dropped: int = 0  # messages tailoring left out (a summary fork would not see them)
    arm: str = COMPACTED  # the session's holdout arm (policies/holdout.py)
    notes: "ViewNotes | None" = None  # what the plan decided and why, for the request's receipt
    summary: str | None = None  # the checkpoint's summary, and its entities: session_search expands with them
    entities: tuple[str, ...] = ()

    def body(self, chat: ChatRequest) -> bytes:
        if self.messages is None:
            return chat.raw
        body = dict(chat.body)
        body["messages"] = self.messages
        if self.tools is not None:
            body["tools"] = self.tools
        return orjson.dumps(body)


@dataclass(slots=True)
class ViewNotes:
    """What the view plan decided, gathered where it is decided, for the request's receipt
    (``gateway/ops/receipts.py``). ``origins`` maps each message object the view holds (by
    ``id()``) to where it came from: ``(kind, event id, details)``, kind one of ``verbatim``,
    ``placeholder``, ``truncated`` (a tool result cut head/tail by compaction) and ``cut`` (by
    tailoring); the summary block and the instructions are told by their type and place."""

    origins: dict[int, tuple[str, str | None, dict | None]]
    checkpoint: Checkpoint | None = None
    summarised: list[str] | None = None  # event ids before the checkpoint's boundary
    events: list[PlanEvent] | None = None
    state_only: bool = False  # a summary was due but not ready: deterministic state went instead
    sync_wait: bool = False  # the request waited for a summary (over sync_compaction_ratio)
    dropped: list[str] | None = None  # event ids tailoring left out
    round_starts: list[int] | None = None  # the first message index of each API round on the path


@dataclass(slots=True)
class Projection:
    messages: list[dict]
    tools: list[dict] | None
    recall_names: tuple[str, str] | None
    tokens: int  # calibrated estimate of the whole prompt
    hidden: frozenset[str]
    checkpoint: Checkpoint | None
    compacted: int
    truncated: int
    dropped: int = 0
    raw_tokens: int = 0  # the same estimate before calibration (what calibration learns from)
    truncated_tools: int = 0  # tool results cut by tailoring
    truncated_last: bool = False
    compacted_tokens: int = 0  # rounds before the compaction frontier (uncalibrated)
    raw_tail_tokens: int = 0  # rounds from the frontier on
    notes: ViewNotes | None = None
