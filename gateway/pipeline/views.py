"""Steps 3-5 of a request: the view the upstream receives (docs/architecture.md, "Views").

Gather -> plan -> effects. This shell gathers the planner's inputs (the session's policy, the
model's window, the calibration factor, the checkpoints on the request's path with their
hidden-context indexes, the pinned standing rules, the recall tools in the client's format),
calls the pure planner (``policies/planner.py``: checkpoint, compaction frontier, projection,
fit) and carries out what the plan needs done: the sync summary wait when the view is over
``sync_compaction_ratio`` of the budget (bounded by ``sync_budget_s``), metrics, and the 400
``context_length_exceeded`` for a request that cannot fit. Proactive recall
(``gateway/recall/auto.py``) searches in the shell and hands its block to ``recalled``, which
fits the planned view again with the block in it, so its tokens are counted like the rest.

Short sessions pay nothing: below both triggers and without a checkpoint, the client's request
goes upstream byte for byte.
"""

from __future__ import annotations

import copy
import logging
import time
from collections.abc import Mapping
from typing import NamedTuple

from gateway.pipeline.request import ChatRequest
from gateway.pipeline.formats import recall_tools_for
from gateway.pipeline.hidden import HiddenIndexes
from gateway.pipeline.view import View
from gateway.pipeline.standing import StandingRules
from gateway.http.errors import ContextLengthExceeded
from gateway.ops.readonly import NoMetrics, NoSummaries
from policies import ContextOverflow, Policy, recall_tool_names, resolve_policy
from policies import planner
from policies.planner import CheckpointInput, Projection, Recalled, ViewRequest
from policies.cost import with_cache_rule
from policies.holdout import HOLDOUT, arm as holdout_arm
from policies.prices import CacheRule, cache_rule, price_of
from store.records import Checkpoint, SessionRef, newest_on_path
from store import call as store_call

log = logging.getLogger("palimpsest.views")
POLICY_MEMO = 1024


class Begun(NamedTuple):
    """What ``ViewBuilder.begin`` gathered for ``finish``."""

    req: ViewRequest
    view: View
    checkpoints: list[Checkpoint]
    positions: dict[str, int] | None  # event id -> index on the path; None: not built yet


class ViewBuilder:
    def __init__(self, *, settings, windows, counter, calibration, checkpoints, metrics, summarizer=None) -> None:
        self.settings = settings
        self.windows = windows
        self.counter = counter
        self.calibration = calibration
        self.checkpoints = checkpoints
        self.metrics = metrics
        self.summarizer = summarizer
        self.standing = StandingRules(counter)
        self.hidden = HiddenIndexes(counter)  # the hidden-context index per checkpoint (gateway/pipeline/hidden.py)
        self._policies: dict[tuple[int, str, bool], tuple[Policy, Policy]] = {}  # (policy, model) -> with its cache rule

    def copy_with(self, **parts) -> "ViewBuilder":
        """This builder with some collaborators replaced (caches, windows, counter and
        calibration shared): a worker thread's (gateway/pipeline/offload.py), ``readonly``."""
        builder = copy.copy(self)
        for name, part in parts.items():
            setattr(builder, name, part)
        return builder

    def readonly(self, **parts) -> "ViewBuilder":
        """A copy that cannot start summary jobs and moves no counter (count_tokens, the inspector)."""
        return self.copy_with(summarizer=NoSummaries(), metrics=NoMetrics(), **parts)

    def policy_for(self, model: str, ref: SessionRef, long_cache: bool = False) -> Policy:
        """The session's policy, its unset cost-model inputs taken from the model's cache rule
        (writes at the long TTL's rate when the client asks for it: ``ChatRequest.long_cache``)."""
        policy = self.settings.policy
        if self.settings.policies:
            policy = resolve_policy(policy, self.settings.policies, model, ref.session_id)
        key = (id(policy), model, long_cache)
        found = self._policies.get(key)
        if found is None or found[0] is not policy:
            if len(self._policies) >= POLICY_MEMO:  # model names are the client's: bounded
                self._policies.clear()
            found = self._policies[key] = (policy, with_cache_rule(policy, self.cache_rule(model), long_ttl=long_cache))
        return found[1]

    def cache_rule(self, model: str) -> CacheRule | None:
        """The provider's cache rule for `model` (policies/prices.py), rates from its price."""
        configured = self.settings.models.get(model)
        overrides = {model: configured.price_fields()} if configured is not None else None
        return cache_rule(model, price_of(model, overrides))

    # -- gather -> plan -> effects --------------------------------------------------------------

    async def build(self, chat: ChatRequest, ref: SessionRef, auth: Mapping[str, str] | None = None):
        begun = await self.begin(chat, ref, auth)
        return begun if isinstance(begun, View) else await self.finish(chat, ref, auth, begun)

    async def begin(self, chat: ChatRequest, ref: SessionRef, auth: Mapping[str, str] | None = None) -> "View | Begun":
        """The first, cheap half of ``build`` (policy, window, the request's token estimate, the
        checkpoints): the view when that decides it (a short session, or a holdout session that
        fits, goes upstream untouched), else what ``finish`` goes on from. Split so that a big
        request whose history is already counted is decided on the event loop, without a thread
        hop (gateway/pipeline/offload.py)."""
        policy = self.policy_for(chat.model, ref, chat.long_cache)
        window = await self.windows.window(chat.model, auth)
        budget = max(1, window - chat.max_output_tokens - policy.reserve_tokens)
        req = ViewRequest(chat.instructions, chat.history, chat.ids, chat.body.get("tools"), chat.body.get("functions"),
                          policy, budget, self.calibration.factor(chat.model), self.counter)
        # The history's sum comes from the counter's path sums (policies/tokens.py count_path):
        # an agent resending its history costs a count of what it added, not a lookup per message.
        raw_estimate = (self.counter.count_messages(chat.instructions) + self.counter.count_path(chat.history, chat.ids)
                        + req.tool_tokens(req.tools))
        client_tokens = self.calibration.scale(chat.model, raw_estimate)
        checkpoints = await store_call(self.checkpoints.list, ref.key)
        # The path's positions only matter against checkpoints: none (a session that has not
        # been summarized) needs no dict of the whole path here; finish builds it if it plans.
        positions = {eid: i for i, eid in enumerate(chat.ids)} if checkpoints else None
        view = View(client_tokens=client_tokens, upstream_tokens=client_tokens, budget=budget, policy=policy,
                    window=window, raw_estimate=raw_estimate, arm=holdout_arm(ref.key, policy.holdout_share))
        if view.arm == HOLDOUT:
            return view if view.client_tokens <= view.budget else Begun(req, view, checkpoints, positions)
        if _untouched(bool(checkpoints) and newest_on_path(checkpoints, positions) is not None, client_tokens, policy, budget):
            return view  # short session: untouched, forwarded byte for byte
        return Begun(req, view, checkpoints, positions)

    async def finish(self, chat: ChatRequest, ref: SessionRef, auth: Mapping[str, str] | None, begun: "Begun") -> View:
        """The rest of ``build`` after ``begin``: gather, plan, the sync summary wait, fit, effects."""
        req, view, checkpoints, positions = begun
        if positions is None:
            positions = {eid: i for i, eid in enumerate(chat.ids)}
        policy, budget, client_tokens = req.policy, req.budget, view.client_tokens
        if view.arm == HOLDOUT:
            return self._direct(chat, req, view)
        self._gather(chat, req, checkpoints, positions)
        projection = planner.plan(req)
        sync_wait = False
        if self.summarizer is not None and planner.sync_due(req, projection, client_tokens):
            started, sync_wait = time.perf_counter(), True
            checkpoint = await self.summarizer.sync(ref, chat, policy, auth, deadline=started + policy.sync_budget_s, budget=budget)
            self.metrics.sync_wait_seconds.observe(time.perf_counter() - started)
            if checkpoint is not None:
                req.checkpoints = self._on_path(chat, req, await store_call(self.checkpoints.list, ref.key), positions)
                projection = planner.plan(req)
            if planner.over_sync(req, projection):
                # Out of time (or the summary failed): go ahead with the deterministic state
                # of everything the summary has not covered yet; tailoring and recall do the rest.
                events = projection.notes.events
                projection = planner.project(req, projection.found, projection.frontier, state_only=True)
                projection.notes.events = events
        projection.notes.sync_wait = sync_wait
        if projection.notes.events and self._previous_untouched(chat, req, checkpoints, positions):
            # The previous request went as the client sent it, so every event of this plan (an
            # early one may lie in a round that request had already) is new to the upstream here.
            projection.notes.new_from = 0
        view.plan, view.settle_tokens = (req, projection), projection.settle_tokens
        fitted = self._fit(chat, req, projection)
        view.policy = planner.settling_policy(policy, fitted, budget)
        self._apply(chat, view, fitted)
        if projection.compacted or projection.truncated:
            self.metrics.compaction_replacements.labels("placeholder").inc(projection.compacted)
            self.metrics.compaction_replacements.labels("truncate").inc(projection.truncated)
        if view.truncated_tool_results:
            self.metrics.truncated_tool_results.inc(view.truncated_tool_results)
        if view.truncated_last_message:
            self.metrics.truncated_last_messages.inc()
        return view

    def _previous_untouched(self, chat: ChatRequest, req: ViewRequest, checkpoints: list[Checkpoint],
                            positions: dict[str, int]) -> bool:
        """Was the previous request of this path (the history before its answer, the newest
        assistant message) forwarded untouched by ``begin``'s short-session rule?"""
        history = chat.history
        answer = next((i for i in range(len(history) - 1, -1, -1) if history[i].get("role") == "assistant"), None)
        if answer is None:
            return False
        on_path = any(positions.get(cp.boundary, answer) < answer for cp in checkpoints)
        raw = (self.counter.count_messages(chat.instructions) + self.counter.count_path(history[:answer], chat.ids[:answer])
               + req.tool_tokens(req.tools))
        return _untouched(on_path, self.calibration.scale(chat.model, raw), req.policy, req.budget)

    def _gather(self, chat: ChatRequest, req: ViewRequest, checkpoints: list[Checkpoint], positions: dict[str, int]) -> None:
        """The planner's inputs besides the request's own: recall tools in the client's format,
        the pinned standing rules, the checkpoints on the path."""
        policy = req.policy
        if policy.recall:
            req.recall_names = recall_tool_names(req.tools)
            req.recall_tools = recall_tools_for(chat.format, req.recall_names)
        rules = self.standing.rules(chat.history, chat.ids, policy, req.budget)
        req.pinned_block = self.standing.block(rules)
        req.pinned_tokens = self.standing.tokens(rules)
        req.pinned_overflow = tuple(r.text for r in rules.overflow) if rules else ()
        req.checkpoints = self._on_path(chat, req, checkpoints, positions)

    def _on_path(self, chat: ChatRequest, req: ViewRequest, checkpoints: list[Checkpoint],
                 positions: dict[str, int]) -> list[CheckpointInput]:
        found = []
        for cp in checkpoints:
            pos = positions.get(cp.boundary)
            if pos is None:
                continue
            index, index_tokens = self.hidden.index(chat, cp, pos, req.policy, req.budget, req.recall_names)
            # Adopted at the first compaction event after the summarised request and after every
            # event the session held when the checkpoint was stored ("known_at" is the head alone,
            # as checkpoints stored before "known_since" have it).
            meta = cp.meta or {}
            known = max(pos, positions.get(meta.get("after"), pos), positions.get(meta.get("known_at"), pos),
                        *(positions.get(eid, pos) for eid in meta.get("known_since", ())))
            found.append(CheckpointInput(cp, cp.id, pos, known,
                                         cp.summary, cp.state, cp.mode == "sync", index, index_tokens))
        return found

    def _fit(self, chat: ChatRequest, req: ViewRequest, projection: Projection) -> Projection:
        try:
            fitted = planner.fit(req, projection)
        except ContextOverflow as exc:
            self._rejected(chat, View(budget=req.budget), exc.needed, req.policy.truncate_last_message)
        self._tailored(fitted.tailored)
        return fitted

    def _apply(self, chat: ChatRequest, view: View, projection: Projection) -> None:
        """The fitted plan into the view the pipeline sends."""
        view.notes = projection.notes
        view.messages = projection.messages
        view.tools = projection.tools
        view.recall_names = projection.recall_names
        view.upstream_tokens = projection.tokens
        view.raw_estimate = projection.raw_tokens
        view.hidden = projection.hidden
        view.checkpoint = projection.checkpoint.id if projection.checkpoint else None
        if projection.checkpoint is not None and view.recall_names:
            view.summary = projection.checkpoint.summary
            view.entities = self.hidden.entities(projection.checkpoint)
        view.truncated_tool_results = projection.truncated + projection.truncated_tools
        view.truncated_last_message = projection.truncated_last
        view.dropped = projection.dropped

    def recalled(self, chat: ChatRequest, view: View, block: str, placement: str) -> bool:
        """The view planned again with a proactive recall block (gateway/recall/auto.py) in it:
        fitted with the block, its figures (tokens, hidden, notes) those of what goes upstream.
        False, and the view unchanged, when the block does not fit."""
        if view.plan is None:
            return False
        req, projection = view.plan
        fitted = planner.fit(req, projection, Recalled(block, placement))
        if fitted is None:
            return False
        self._tailored(fitted.tailored)
        self._apply(chat, view, fitted)
        return True

    def _direct(self, chat: ChatRequest, req: ViewRequest, view: View) -> View:
        """A holdout session's view: what a client sending direct gets. Untouched while it fits;
        else the oldest rounds cut (tailoring), no summary, no compaction, no recall tools."""
        if view.client_tokens <= view.budget:
            return view
        try:
            messages, stats = planner.direct(req)
        except ContextOverflow as exc:
            self._rejected(chat, view, exc.needed, req.policy.truncate_last_message)
        self._tailored(stats)
        view.messages, view.tools = messages, None
        view.upstream_tokens = self.calibration.scale(chat.model, stats.tokens_after)
        view.raw_estimate = stats.tokens_after
        view.dropped = stats.dropped_messages
        return view

    def _rejected(self, chat: ChatRequest, view: View, needed: int, truncate_last: bool):
        """400 context_length_exceeded with the numbers: nothing fits the window."""
        self.metrics.context_rejections.inc()
        self.metrics.arm_rejections.labels(view.arm).inc()
        needed = self.calibration.scale(chat.model, needed)
        raise ContextLengthExceeded(
            f"This request needs at least {needed} prompt tokens after compaction, but model "
            f"'{chat.model}' allows {view.budget} (window minus max_tokens and reserve). "
            "Shorten the system prompt, tools or last message, or lower max_tokens"
            + ("." if truncate_last else "; policy 'truncate_last_message' lets the gateway cut the last message."),
            param="messages",
        ) from None

    def _tailored(self, stats) -> None:
        if stats is not None:
            self.metrics.tailoring_drops.labels("dropped").inc(stats.dropped_messages)
            self.metrics.tailoring_drops.labels("truncated").inc(stats.truncated_messages)

    def refit(self, chat: ChatRequest, messages: list[dict], tools: list[dict] | None, budget: int) -> list[dict] | None:
        """`messages` fitted to `budget` again (the recall loop grows the view each round);
        None when even tailoring cannot make them fit."""
        found = planner.refit(messages, self.tool_tokens(chat, tools), budget, self.calibration.factor(chat.model),
                              self.counter)
        if found is None:
            return None
        self._tailored(found[1])
        return found[0]

    def tool_tokens(self, chat: ChatRequest, tools: list[dict] | None) -> int:
        """What `tools` (and the request's legacy `functions`) cost in the prompt."""
        return planner.tool_tokens(self.counter, tools, chat.body.get("functions"))


def _untouched(checkpoint_on_path: bool, client_tokens: int, policy, budget: int) -> bool:
    """The short-session rule: no checkpoint on the path and the request under both triggers.
    With the cost model on, also under ``view_target_ratio``: a conversation bigger than the
    size an event settles at is planned, so the cost model's early events can price it (and
    take none where none pays) instead of waiting for the trigger."""
    gate = min(policy.summary_trigger_ratio, policy.compact_trigger_ratio)
    if policy.cost_model:
        gate = min(gate, policy.view_target_ratio)
    return not checkpoint_on_path and client_tokens <= gate * budget
