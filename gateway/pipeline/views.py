"""Steps 3-5 of a request: the view the upstream receives (docs/architecture.md).

Projection from the newest checkpoint on the request's path, sync compaction when the view is
over ``sync_compaction_ratio`` of the budget (bounded by ``sync_budget_s``), tool-result
compaction that settles the view at ``view_target_ratio``, recall tools when anything is
hidden, and tailoring as the last guarantee. The functional work is in ``policies``; this
module only gathers its inputs (ledger ids, checkpoints, windows, calibration) and decides when
to call what.

A checkpoint may cover part of the current user turn (an agent loop of dozens of tool calls);
the user message that started the turn then stays in the view, verbatim, right after the
summary block. Short sessions pay nothing: below both triggers and without a checkpoint, the
client's request goes upstream byte for byte.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping

from gateway.pipeline.request import ChatRequest
from gateway.pipeline.formats import recall_tools_for
from gateway.pipeline.hidden import HiddenIndexes
from gateway.pipeline.view import Projection, View, ViewNotes  # noqa: F401 (View: this module's result)
from gateway.pipeline.standing import StandingRules
from gateway.http.errors import ContextLengthExceeded
from policies import (
    CheckpointMark,
    ContextOverflow,
    PlanEvent,
    choose_boundary,
    last_user_index,
    Policy,
    compact_tool_results,
    extract_exact_values,
    merge_state,
    plan_view,
    project_view,
    recall_note,
    recall_tool_names,
    render_summary_block,
    resolve_policy,
    round_sizes,
    tailor,
)
from policies.cost import with_cache_rule
from policies.holdout import HOLDOUT, arm as holdout_arm
from policies.prices import CacheRule, cache_rule, price_of
from policies.messages import tool_names_by_call_id
from policies.rounds import split_rounds
from store.records import Checkpoint, SessionRef, newest_on_path
from store import call as store_call

log = logging.getLogger("palimpsest.views")
POLICY_MEMO = 1024



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
        self._recall_costs: dict[tuple[str, str], int] = {}
        # By checkpoint: its hidden-context index and that index's tokens, and its entities.
        self.hidden = HiddenIndexes(counter)  # the hidden-context index per checkpoint (gateway/pipeline/hidden.py)
        self._policies: dict[tuple[int, str], tuple[Policy, Policy]] = {}  # (policy, model) -> with its cache rule

    def policy_for(self, model: str, ref: SessionRef) -> Policy:
        """The session's policy, its unset cost-model inputs taken from the model's cache rule."""
        policy = self.settings.policy
        if self.settings.policies:
            policy = resolve_policy(policy, self.settings.policies, model, ref.session_id)
        key = (id(policy), model)
        found = self._policies.get(key)
        if found is None or found[0] is not policy:
            if len(self._policies) >= POLICY_MEMO:  # model names are the client's: bounded
                self._policies.clear()
            found = self._policies[key] = (policy, with_cache_rule(policy, self.cache_rule(model)))
        return found[1]

    def cache_rule(self, model: str) -> CacheRule | None:
        """The provider's cache rule for `model` (policies/prices.py), rates from its price."""
        configured = self.settings.models.get(model)
        overrides = {model: configured.price_fields()} if configured is not None else None
        return cache_rule(model, price_of(model, overrides))

    async def build(self, chat: ChatRequest, ref: SessionRef, auth: Mapping[str, str] | None = None):
        policy = self.policy_for(chat.model, ref)
        window = await self.windows.window(chat.model, auth)
        budget = max(1, window - chat.max_output_tokens - policy.reserve_tokens)
        tools_tokens = self._tool_tokens(chat, chat.body.get("tools"))
        keys = [None] * len(chat.instructions) + list(chat.ids)
        raw_estimate = self.counter.count_messages(chat.instructions + chat.history, keys) + tools_tokens
        client_tokens = self.calibration.scale(chat.model, raw_estimate)
        positions = {eid: i for i, eid in enumerate(chat.ids)}
        checkpoints = await store_call(self.checkpoints.list, ref.key)
        newest = newest_on_path(checkpoints, positions)
        view = View(client_tokens=client_tokens, upstream_tokens=client_tokens, budget=budget, policy=policy,
                    window=window, raw_estimate=raw_estimate, arm=holdout_arm(ref.key, policy.holdout_share))
        if view.arm == HOLDOUT:
            return self._direct(chat, view)
        if newest is None and client_tokens <= min(policy.summary_trigger_ratio, policy.compact_trigger_ratio) * budget:
            return view  # short session: untouched, forwarded byte for byte

        events: list[PlanEvent] = []
        found, frontier = self._plan(chat, policy, checkpoints, positions, budget, events)
        projection = self._project(chat, policy, found, budget=budget, frontier=frontier)
        sync_wait = False
        # With the cost model, a conversation that fits as it came never waits for a summary.
        must_fold = not policy.cost_model or client_tokens > budget
        if projection.tokens > policy.sync_compaction_ratio * budget and self.summarizer is not None and must_fold:
            started, sync_wait = time.perf_counter(), True
            checkpoint = await self.summarizer.sync(ref, chat, policy, auth, deadline=started + policy.sync_budget_s, budget=budget)
            self.metrics.sync_wait_seconds.observe(time.perf_counter() - started)
            if checkpoint is not None:
                checkpoints = await store_call(self.checkpoints.list, ref.key)
                events.clear()
                found, frontier = self._plan(chat, policy, checkpoints, positions, budget, events)
                projection = self._project(chat, policy, found, budget=budget, frontier=frontier)
            if projection.tokens > policy.sync_compaction_ratio * budget:
                # Out of time (or the summary failed): go ahead with the deterministic state
                # of everything the summary has not covered yet; tailoring and recall do the rest.
                projection = self._project(chat, policy, found, state_only=True, budget=budget, frontier=frontier)
        projection = self._fit(chat, policy, projection, budget)
        if projection.notes is not None:
            projection.notes.events, projection.notes.sync_wait = events, sync_wait
        view.notes = projection.notes
        view.messages = projection.messages
        view.tools = projection.tools
        view.recall_names = projection.recall_names
        view.upstream_tokens = projection.tokens
        view.hidden = projection.hidden
        view.checkpoint = projection.checkpoint.id if projection.checkpoint else None
        if projection.checkpoint is not None and view.recall_names:
            view.summary = projection.checkpoint.summary
            view.entities = self.hidden.entities(projection.checkpoint)
        view.raw_estimate = projection.raw_tokens
        if projection.compacted_tokens > policy.view_target_ratio * budget:
            # Placeholders have piled up (a long loop): they keep the view from settling at its
            # target, so the summary that folds them is due now, below the usual trigger, and it
            # covers just them: the rounds still raw stay raw.
            view.policy = policy.model_copy(update={
                "summary_trigger_ratio": policy.view_target_ratio, "keep_recent_share": 1.0,
                "keep_recent_tokens": max(projection.raw_tail_tokens, 1)})
        view.truncated_tool_results = projection.truncated + projection.truncated_tools
        view.truncated_last_message = projection.truncated_last
        view.dropped = projection.dropped
        if projection.compacted or projection.truncated:
            self.metrics.compaction_replacements.labels("placeholder").inc(projection.compacted)
            self.metrics.compaction_replacements.labels("truncate").inc(projection.truncated)
        if view.truncated_tool_results:
            self.metrics.truncated_tool_results.inc(view.truncated_tool_results)
        if view.truncated_last_message:
            self.metrics.truncated_last_messages.inc()
        return view

    def _direct(self, chat: ChatRequest, view: View) -> View:
        """A holdout session's view: what a client sending direct gets. Untouched while it fits;
        else the oldest rounds cut (tailoring), no summary, no compaction, no recall tools."""
        if view.client_tokens <= view.budget:
            return view
        raw_budget = int(view.budget / self.calibration.factor(chat.model))
        try:
            messages, stats = tailor([*chat.instructions, *chat.history], raw_budget, self.counter,
                                     fixed_tokens=self._tool_tokens(chat, chat.body.get("tools")),
                                     truncate_last=view.policy.truncate_last_message)
        except ContextOverflow as exc:
            self._rejected(chat, view, exc.needed, view.policy.truncate_last_message)
        self.metrics.tailoring_drops.labels("dropped").inc(stats.dropped_messages)
        self.metrics.tailoring_drops.labels("truncated").inc(stats.truncated_messages)
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

    def refit(self, chat: ChatRequest, messages: list[dict], tools: list[dict] | None, budget: int) -> list[dict] | None:
        """`messages` fitted to `budget` again (the recall loop grows the view each round);
        None when even tailoring cannot make them fit."""
        fixed = self._tool_tokens(chat, tools)
        if self.calibration.scale(chat.model, self.counter.count_messages(messages) + fixed) <= budget:
            return messages
        raw_budget = int(budget / self.calibration.factor(chat.model))
        try:
            fitted, stats = tailor(messages, raw_budget, self.counter, fixed_tokens=fixed)
        except ContextOverflow:
            return None
        self.metrics.tailoring_drops.labels("dropped").inc(stats.dropped_messages)
        self.metrics.tailoring_drops.labels("truncated").inc(stats.truncated_messages)
        return fitted

    # -- the pure steps, wired ---------------------------------------------------------------

    def _plan(self, chat: ChatRequest, policy: Policy, checkpoints: list[Checkpoint], positions: dict[str, int],
              budget: int, events: list[PlanEvent] | None = None) -> tuple[tuple[Checkpoint, int] | None, int]:
        """The checkpoint on the path the view uses (with its boundary index) and the compaction
        frontier (a message index on the path), replayed by ``plan_view``: a new checkpoint is
        adopted only at a compaction event, so the prefix changes once, not twice; one written
        for a request that did not fit (sync) is adopted at that request."""
        on_path = [(cp, positions[cp.boundary]) for cp in checkpoints if cp.boundary in positions]
        names = recall_tool_names(chat.body.get("tools")) if policy.recall else None
        load_tool = names[1] if names else "session_load"
        rounds, raw, compacted = round_sizes(chat.history, chat.ids, policy, self.counter, load_tool)
        fixed = self.counter.count_messages(chat.instructions) + self._tool_tokens(chat, chat.body.get("tools"))
        if names:
            fixed += self._recall_cost(names)
        # A view with a summary also carries the pinned standing instructions, just before it.
        pinned = self.standing.tokens(self.standing.rules(chat.history, chat.ids, policy, budget)) if on_path else 0
        marks = [CheckpointMark(pos, max(pos, positions.get((cp.meta or {}).get("after"), pos)),
                                self._block_tokens(cp, policy.exact_values_limit) + pinned
                                + self.hidden.index(chat, cp, pos, policy, budget, names)[1], forced=cp.mode == "sync")
                 for cp, pos in on_path]
        index, frontier = plan_view(rounds, raw, compacted, fixed, marks, policy, budget, events)
        found = on_path[index] if index is not None else None
        return found, rounds[frontier][0] if frontier < len(rounds) else len(chat.history)

    def _block_tokens(self, checkpoint: Checkpoint, limit: int) -> int:
        """What a checkpoint's summary block costs in the view (cached by checkpoint id)."""
        def build() -> dict:
            return {"role": "system", "content": render_summary_block(checkpoint.summary, checkpoint.state, limit)}
        return self.counter.count_built(f"block|{checkpoint.id}|{limit}", build)

    def _project(self, chat: ChatRequest, policy: Policy, found, *, frontier: int, state_only: bool = False,
                 budget: int = 0) -> Projection:
        checkpoint, pos = found if found else (None, -1)
        start = pos + 1
        tail, tail_ids = chat.history[start:], chat.ids[start:]
        shift = -start
        if tail and tail[0].get("role") != "user":
            # The checkpoint covers part of the current turn: its user message (the task) stays.
            task = last_user_index(chat.history[:start])
            if task is not None:
                tail, tail_ids = [chat.history[task], *tail], [chat.ids[task], *tail_ids]
                shift += 1
        names = recall_tool_names(chat.body.get("tools")) if policy.recall else None
        load_tool = names[1] if names else "session_load"
        summary = checkpoint.summary if checkpoint else None
        state = checkpoint.state if checkpoint else {}
        if state_only:
            # What a summary would cover but none does yet: its exact values ride along, so they
            # survive the tailoring that follows.
            end = choose_boundary(tail, self.counter, policy.for_budget(budget), keys=tail_ids) or 0
            state = merge_state(state, extract_exact_values(tail[:end]))
        pinned = None
        if checkpoint or state_only:
            # Once a summary hides part of the path, the user's standing instructions ride
            # verbatim in their own block; those over its budget are quoted in the summary block
            # when the summary does not quote them itself.
            rules = self.standing.rules(chat.history, chat.ids, policy, budget)
            pinned = self.standing.block(rules)
            unquoted = [r.text for r in rules.overflow if r.text not in (summary or "")] if rules else []
            block = render_summary_block(summary, state, policy.exact_values_limit, unquoted)
        else:
            block = None
        if checkpoint is not None and names:
            index, _ = self.hidden.index(chat, checkpoint, pos, policy, budget, names)
            block = f"{block}\n\n{index}" if index else block
        # The frontier comes from the view plan (``_plan``), in message indexes of the path.
        compacted, stats = compact_tool_results(tail, tail_ids, policy, self.counter, load_tool=load_tool,
                                                frontier_at=max(0, frontier + shift))
        hidden = set(chat.ids[:start]) - set(tail_ids)
        hidden.update(i for i, old, new in zip(tail_ids, tail, compacted) if old is not new)
        tools = chat.body.get("tools")
        if hidden and names:
            note = recall_note(*names)
            block = f"{block}\n\n{note}" if block else note
            tools = [*(tools or []), *recall_tools_for(chat.format, names)]
        else:
            names = None
        messages = project_view(chat.instructions, compacted, block, policy.injection, pinned)
        tokens = self.counter.count_messages(messages) + self._tool_tokens(chat, tools)
        return Projection(messages, tools, names, self.calibration.scale(chat.model, tokens), frozenset(hidden),
                          checkpoint, stats.replaced, stats.truncated, raw_tokens=tokens, compacted_tokens=stats.compacted_tokens,
                          raw_tail_tokens=stats.raw_tail_tokens,
                          notes=self._notes(chat, tail, tail_ids, compacted, stats, checkpoint, start, state_only))

    def _notes(self, chat: ChatRequest, tail, tail_ids, compacted, stats, checkpoint, start: int,
               state_only: bool) -> ViewNotes:
        """Where each message of a projection came from (the receipt itemises the view by it)."""
        origins: dict[int, tuple[str, str | None, dict | None]] = {id(m): ("verbatim", eid, None) for m, eid in zip(tail, tail_ids)}
        if stats.placeholders or stats.cut:
            names = tool_names_by_call_id(tail)
            for kind, indexes in (("placeholder", stats.placeholders), ("truncated", stats.cut)):
                for i in indexes:
                    tool = names.get(str(tail[i].get("tool_call_id") or ""), "")
                    origins[id(compacted[i])] = (kind, tail_ids[i], {
                        "tool": tool, "tokens_before": self.counter.count_message(tail[i], tail_ids[i])})
        summarised = list(chat.ids[:start]) if checkpoint is not None else None
        return ViewNotes(origins, checkpoint, summarised, state_only=state_only,
                         round_starts=[a for a, _ in split_rounds(chat.history)])

    def tool_tokens(self, chat: ChatRequest, tools: list[dict] | None) -> int:
        """What `tools` (and the request's legacy `functions`) cost in the prompt."""
        return self._tool_tokens(chat, tools)

    def _tool_tokens(self, chat: ChatRequest, tools: list[dict] | None) -> int:
        """What the request's tool definitions cost: `tools`, and legacy `functions`, which the
        provider reads as tools too."""
        functions = chat.body.get("functions")
        if isinstance(functions, list) and functions:
            tools = [*(tools or []), *({"type": "function", "function": f} for f in functions)]
        return self.counter.count_tools(tools)

    def _recall_cost(self, names: tuple[str, str]) -> int:
        """Tokens the recall note and tools add once anything is hidden (constant per name pair)."""
        cost = self._recall_costs.get(names)
        if cost is None:
            cost = self.counter.count_text(recall_note(*names)) + self.counter.count_tools(recall_tools_for("chat", names))
            self._recall_costs[names] = cost
        return cost

    def _fit(self, chat: ChatRequest, policy: Policy, projection: Projection, budget: int) -> Projection:
        if projection.tokens <= budget:
            return projection
        factor = self.calibration.factor(chat.model)
        raw_budget = int(budget / factor)
        fixed = self._tool_tokens(chat, projection.tools)
        truncate_last = policy.truncate_last_message
        try:
            messages, stats = tailor(projection.messages, raw_budget, self.counter, fixed_tokens=fixed,
                                     truncate_last=truncate_last)
        except ContextOverflow as exc:
            self._rejected(chat, View(budget=budget), exc.needed, truncate_last)
        kept = {id(m) for m in messages}
        dropped_ids = {eid for eid, m in zip(chat.ids, chat.history) if id(m) not in kept}
        hidden = projection.hidden | dropped_ids
        notes = projection.notes
        if notes is not None:
            notes.dropped = [eid for eid, m in zip(chat.ids, chat.history)
                             if eid in dropped_ids and id(m) in notes.origins]
            _note_cuts(notes, projection.messages, messages, stats)
        self.metrics.tailoring_drops.labels("dropped").inc(stats.dropped_messages)
        self.metrics.tailoring_drops.labels("truncated").inc(stats.truncated_messages)
        if hidden and projection.recall_names is None and policy.recall:
            # Tailoring hid history the projection did not: offer recall, and fit again with it.
            names = recall_tool_names(chat.body.get("tools"))
            tools = [*(projection.tools or []), *recall_tools_for(chat.format, names)]
            lead = next((i for i, m in enumerate(messages) if m.get("role") not in ("system", "developer")), len(messages))
            with_note = [*messages[:lead], {"role": "system", "content": recall_note(*names)}, *messages[lead:]]
            try:
                fitted, more = tailor(with_note, raw_budget, self.counter, fixed_tokens=self._tool_tokens(chat, tools),
                                      truncate_last=truncate_last)
            except ContextOverflow:
                fitted = None  # recall does not fit as well: send the tailored view without it
            if fitted is not None:
                if notes is not None:
                    kept = {id(m) for m in fitted}
                    notes.dropped += [eid for eid, m in zip(chat.ids, chat.history)
                                      if id(m) in notes.origins and id(m) not in kept and eid not in dropped_ids]
                    _note_cuts(notes, with_note, fitted, more)
                return Projection(fitted, tools, names, self.calibration.scale(chat.model, more.tokens_after),
                                  frozenset(hidden), projection.checkpoint, projection.compacted,
                                  projection.truncated, stats.dropped_messages + more.dropped_messages,
                                  raw_tokens=more.tokens_after,
                                  truncated_tools=stats.truncated_tool_results + more.truncated_tool_results,
                                  truncated_last=stats.truncated_last_message or more.truncated_last_message,
                                  notes=notes)
        return Projection(messages, projection.tools, projection.recall_names,
                          self.calibration.scale(chat.model, stats.tokens_after), frozenset(hidden),
                          projection.checkpoint, projection.compacted, projection.truncated, stats.dropped_messages,
                          raw_tokens=stats.tokens_after, truncated_tools=stats.truncated_tool_results,
                          truncated_last=stats.truncated_last_message, notes=notes)


def _note_cuts(notes: ViewNotes, before: list[dict], after: list[dict], stats) -> None:
    """The messages tailoring cut, noted as ``cut`` copies of what they were."""
    for j in stats.cut:
        source = before[stats.kept[j]] if stats.kept is not None else before[j]
        kind, eid, _ = notes.origins.get(id(source), ("instructions", None, None))
        notes.origins[id(after[j])] = ("cut", eid, {"was": kind})
