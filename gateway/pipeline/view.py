"""What a view build returns (``View``: what goes upstream and what it hid), built by
``gateway/pipeline/views.py``; what the plan decided for the request's receipt (``ViewNotes``)
and the planned view (``Projection``) are the planner's (``policies/planner.py``)."""

from __future__ import annotations

from dataclasses import dataclass

import orjson

from gateway.pipeline.request import ChatRequest
from policies.holdout import COMPACTED
from policies.planner import ViewNotes


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
    plan: tuple | None = None  # (ViewRequest, Projection) before the fit: proactive recall fits it again
    settle_tokens: float | None = None  # the size the plan's events settle the view at (Projection.settle_tokens)

    def body(self, chat: ChatRequest) -> bytes:
        if self.messages is None:
            return chat.raw
        body = dict(chat.body)
        body["messages"] = self.messages
        if self.tools is not None:
            body["tools"] = self.tools
        return orjson.dumps(body)
