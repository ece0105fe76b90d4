"""One chat request on its way through the gateway, and what is written down about it.

``Turn`` carries a request from the pipeline into the recall loop and back; ``TurnRecorder`` is
the one place that records its outcome: the answer into the ledger (only a complete one), the
recall loop's side events, the summariser and indexer nudges, and the request's metrics. Both
the pipeline and the recall loop use it, so neither reaches into the other
(docs/architecture.md, "A request's path").
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from typing import Any

from gateway.pipeline.request import ChatRequest
from gateway.pipeline.request_form import stored as stored_form
from gateway.pipeline.views import View
from gateway.http.errors import GatewayError, UpstreamTimeout
from gateway.http.upstream import Timing
from gateway.ops.basis import of_turn as request_basis
from gateway.ops.receipts import billed_units, build_receipt, compaction_event_here, stored as stored_receipt
from policies.cost import cost_rates
from policies.prices import CacheUsage
from store import call as store_call
from store.records import SessionRef

log = logging.getLogger("palimpsest.chat")
ROUTE = "chat"


USAGE_DETAILS = ("prompt_tokens_details", "completion_tokens_details")


def _count(value) -> int | None:
    if isinstance(value, bool):
        return None
    if isinstance(value, (int, float)) and value >= 0 and value == value and value != float("inf"):
        return int(value)
    if isinstance(value, str) and value.strip().isdigit():
        return int(value)
    return None


def clean_usage(usage) -> dict | None:
    """A provider's ``usage`` as counts the gateway can add and count: non-negative integers
    only (numbers sent as strings read as numbers), the two details objects likewise; anything
    else dropped. None when it is not an object at all."""
    if not isinstance(usage, dict):
        return None
    out: dict = {}
    for key, value in usage.items():
        if key in USAGE_DETAILS:
            if isinstance(value, dict):
                details = {k: n for k, v in value.items() if (n := _count(v)) is not None}
                if details:
                    out[key] = details
        elif (n := _count(value)) is not None:
            out[key] = n
    return out


def add_usage(total: dict | None, usage) -> dict | None:
    """`usage` added into `total` (a copy on the first call), over every upstream call of a turn."""
    usage = clean_usage(usage)  # a provider's odd counts (strings, negatives) never break the sum
    if not usage:
        return total
    if total is None:
        return usage
    for key in ("prompt_tokens", "completion_tokens", "total_tokens"):
        total[key] = (total.get(key) or 0) + (usage.get(key) or 0)
    for group in ("prompt_tokens_details", "completion_tokens_details"):
        for key, value in (usage.get(group) or {}).items():
            if isinstance(value, int):
                bucket = total.setdefault(group, {})
                bucket[key] = (bucket.get(key) or 0) + value
    return total


@dataclass(slots=True)
class Turn:
    """One chat request on its way through the pipeline."""

    chat: ChatRequest
    ref: SessionRef | None
    model_label: str
    timing: Timing
    view: View
    headers: dict[str, str] = field(default_factory=dict)
    answer: dict | None = None  # set only when the upstream's answer arrived complete
    answer_id: str | None = None  # the answer's event id, once the ledger recorded it
    recorded: Any = None  # the answer's event, until ``TurnRecorder.booked`` has run on it
    usage: dict | None = None
    auth: dict[str, str] | None = None  # the client's credential headers, kept in memory for summary calls
    recall_calls: int = 0
    recall_rounds: int = 0
    recall_matches: dict[str, str] = field(default_factory=dict)  # this turn's search hits
    recall_refused: bool = False  # the upstream refuses tools for this model: the view goes without recall tools
    billed: CacheUsage | None = None  # every upstream call of the turn, as the provider billed it
    answer_output: int = 0  # output tokens of the call that answered the client
    status: int = 502  # what the client was told (the error's status after a failed stream)
    failure: GatewayError | None = None  # a failure told inside an already-started stream
    route: str = ROUTE  # the API the client spoke: chat, responses, messages
    upstream: str = "default"  # the name of the upstream that served it (gateway/http/routing.py)
    receipt: str | None = None  # the receipt id the client was told (x-palimpsest-receipt)
    bypass: str | None = None  # why the request went untouched: "header" or "tenant" (None: it did not)
    direct: CacheUsage | None = None  # the request sent direct, as the provider would have billed it
    first_prompt_tokens: int | None = None  # the prompt tokens the first upstream call reported
    # The format's peer (pipeline/adapter.FormatPeer): its cache fork of this view for a summary call
    # (pipeline/fork.py), its count of the first upstream body, its request form for `palimpsest replay`.
    peer: Any = None
    via_chat: bool = False  # the view went to a chat-only upstream as Chat Completions
    fork_headers: dict[str, str] | None = None  # the request's headers its format's fork repeats
    query: str = ""  # the request's query string (with fork_headers)
    # Set for a request relayed to another path of the format's API (/v1/responses/compact without
    # a session, Pipeline.forward): its answer is relayed as it came, neither read nor recorded.
    path: str = ""


class TurnRecorder:
    """Writes down what became of a turn; failures here never fail the client's request."""

    def __init__(self, *, ledger, metrics, summaries, indexer, calibration, turns, views=None, receipts=None) -> None:
        self.ledger = ledger
        self.turns = turns
        self.views = views  # the view builder: its counter itemises a receipt's prompt
        self.receipts = receipts  # store.interfaces.ReceiptStore (None: no receipts kept)
        self.metrics = metrics
        self.summaries = summaries
        self.indexer = indexer
        self.calibration = calibration

    async def answer(self, turn: Turn) -> None:
        """Record the complete answer as the child of the request's last message: committed
        before the client has it. What follows from it waits for ``booked``."""
        if turn.ref is None or turn.answer is None:
            return
        parent = turn.chat.ids[-1] if turn.chat.ids else None
        try:
            event = await store_call(self.ledger.append, turn.ref, parent, turn.answer, defer=True)
        except Exception:
            log.exception("recording the answer failed")
            self.metrics.store_write_errors.labels("answer").inc()
            return
        turn.answer_id = event.id
        turn.recorded = event

    def booked(self, turn: Turn) -> None:
        """What follows from a recorded answer: the summary decision, the turn log's entry, the
        indexer's note; once per turn. The pipeline calls it right after the response's last
        byte is handed to the socket, with no await in between, so no other request or task of
        the process runs before it (a summary wait or an inspection sees the turn as before)."""
        event, turn.recorded = turn.recorded, None
        if event is None:
            return
        self.summaries.after_turn(turn, event)
        self.bill(turn)
        price = self.metrics.costs.price(turn.chat.model)
        cost = price.cost(turn.billed) if price is not None and turn.billed is not None else None
        rates = cost_rates(turn.view.policy) if turn.view.policy is not None else None
        self.turns.add(request_basis(turn, event, cost, compaction_event=compaction_event_here(turn.view.notes),
                                     billed_units=billed_units(turn.billed, rates),
                                     form=self.request_form(turn)))  # what inspect shows, replay rebuilds (store/turns.py)
        if turn.view.messages is not None:
            self.indexer.schedule(turn.ref.key)  # sessions that hide history will search it

    def request_form(self, turn: Turn) -> str | None:
        """The turn's request form for the turn log, its parts kept for the session; None when
        the format keeps none or it failed (a replay then rebuilds the request approximately)."""
        if turn.peer is None or turn.ref is None:
            return None
        try:
            document, parts = stored_form(turn.peer.request_form(turn.chat))
            self.turns.add_parts(turn.ref.key, parts)
        except Exception as exc:
            log.warning("keeping a request form failed", extra={"fields": {"session": turn.ref.key, "error": type(exc).__name__}})
            return None
        return document

    async def side_events(self, turn: Turn, messages: list[dict]) -> None:
        """The recall loop's calls and results, hung off the request's last message. Best
        effort: the recall still answers, but a lost audit trail is logged and counted."""
        if turn.ref is None:
            return
        node = turn.chat.ids[-1] if turn.chat.ids else None
        try:
            await store_call(self.ledger.add_side_events, turn.ref, node, messages)
        except Exception as exc:
            # The type only: the messages are conversation text and never reach the logs.
            log.warning("recording recall calls failed", extra={"fields": {"session": turn.ref.key, "error": type(exc).__name__}})
            self.metrics.store_write_errors.labels("recall_side_events").inc()
            return
        self.metrics.ledger_events.labels("side").inc(len(messages))

    def failed_in_stream(self, turn: Turn, error: GatewayError) -> None:
        """The stream had started when `error` happened: the answer is incomplete (not
        recorded), and the request counts with the error's status and kind."""
        turn.failure = error
        turn.status = error.status
        turn.answer = None
        kind = "timeout" if isinstance(error, UpstreamTimeout) else (error.code or "unreachable").removeprefix("upstream_")
        self.metrics.upstream_error(kind=kind)
        self.metrics.incomplete_answers.labels(kind).inc()

    def bill(self, turn: Turn) -> None:
        """Count a plain relay's one upstream call (the recall loop counts each of its own)."""
        if turn.billed is None and turn.usage:
            turn.billed = self.metrics.costs.call(turn.chat.model, turn.model_label, "client", turn.usage)
            turn.answer_output = turn.billed.output
            turn.first_prompt_tokens = turn.billed.prompt

    def direct(self, turn: Turn) -> None:
        """The request's direct counterfactual: its own prompt, the session's previous one cached."""
        if turn.billed is None or turn.status != 200:
            return
        costs = self.metrics.costs
        if turn.ref is None or not turn.view.client_tokens:  # forwarded as it came: direct is the same
            turn.direct = costs.direct(turn.chat.model, turn.model_label, None, [], turn.billed.prompt, turn.billed.output,
                                       cached=turn.billed.cached)
            return
        turn.direct = costs.direct(turn.chat.model, turn.model_label, turn.ref.key, turn.chat.ids,
                                   turn.view.client_tokens, turn.answer_output)

    def receipt(self, turn: Turn) -> None:
        """Keep the turn's receipt (gateway/ops/receipts.py); a failure here never fails the request."""
        if turn.receipt is None or turn.ref is None or self.receipts is None or self.views is None:
            return
        try:
            price = self.metrics.costs.price(turn.chat.model)
            receipt = build_receipt(turn, turn.receipt, self.views.counter, self.views, self.calibration, price)
            self.receipts.add_receipt(stored_receipt(receipt, turn.ref.key, turn.ref.tenant))
        except Exception as exc:
            log.warning("keeping a receipt failed", extra={"fields": {"session": turn.ref.key, "error": type(exc).__name__}})
            self.metrics.store_write_errors.labels("receipt").inc()

    def observe_arm(self, turn: Turn, direct: CacheUsage | None) -> None:
        """The request in its holdout arm's figures (policies/holdout.py); sessions only."""
        if turn.ref is None:
            return
        m, view, arm = self.metrics, turn.view, turn.view.arm
        rate = getattr(view.policy, "output_rate", 4.0)
        m.arm_requests.labels(arm, str(turn.status)).inc()
        m.arm_prompt_tokens.labels(arm, "client").inc(view.client_tokens)
        m.arm_prompt_tokens.labels(arm, "upstream").inc(view.upstream_tokens)
        if turn.recall_calls:
            m.arm_recall_calls.labels(arm).inc(turn.recall_calls)
        if turn.billed is not None:
            m.arm_billed(arm, turn.chat.model, turn.billed, "billed", rate)
        if direct is not None:
            m.arm_billed(arm, turn.chat.model, direct, "direct", rate)

    def observe(self, turn: Turn) -> None:
        self.booked(turn)  # a turn whose response did not end normally (the write failed)
        m = self.metrics
        if turn.status == 200:
            m.model_answered(turn.chat.model)
            turn.model_label = m.model_label(turn.chat.model)
        self.bill(turn)
        self.direct(turn)
        self.observe_arm(turn, turn.direct)
        self.receipt(turn)
        elapsed = time.perf_counter() - turn.timing.started
        m.requests.labels(turn.route, turn.model_label, str(turn.status), turn.upstream).inc()
        m.request_seconds.labels(turn.route, turn.model_label).observe(elapsed)
        m.upstream_seconds.labels(turn.route, turn.model_label, turn.upstream).observe(turn.timing.upstream)
        m.overhead_seconds.labels(turn.route).observe(max(0.0, elapsed - turn.timing.upstream))
        view = turn.view
        if view.client_tokens:
            m.client_prompt_tokens.labels(turn.model_label).inc(view.client_tokens)
            m.upstream_prompt_tokens.labels(turn.model_label).inc(view.upstream_tokens)
            m.tokens_saved.labels(turn.model_label).inc(max(0, view.client_tokens - view.upstream_tokens))
        usage = turn.usage
        if usage and view.raw_estimate and not turn.recall_calls:
            self.calibration.observe(turn.chat.model, view.raw_estimate, usage.get("prompt_tokens") or 0)
        if usage:
            m.upstream_usage_prompt_tokens.labels(turn.model_label).inc(usage.get("prompt_tokens") or 0)
            m.upstream_usage_completion_tokens.labels(turn.model_label).inc(usage.get("completion_tokens") or 0)
            cached = (usage.get("prompt_tokens_details") or {}).get("cached_tokens") or 0
            m.upstream_usage_cached_tokens.labels(turn.model_label).inc(cached)
