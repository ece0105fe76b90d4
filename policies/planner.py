"""The view planner: what the upstream receives, decided by pure functions (docs/architecture.md, "Views").

The shell (``gateway/pipeline/views.py``) gathers a ``ViewRequest`` — the request's messages and
ids, its policy and budget, the calibration factor, the recall tools as the client's format
declares them, the pinned standing rules and, per checkpoint on the path, a ``CheckpointInput``
(boundary, summary, state, hidden-context index) — and carries out the plan's effects (metrics,
the 400 for a request that cannot fit, the sync summary wait). Everything decided is here:

- ``plan``: which checkpoint the view uses and the compaction frontier (``plan_view``), then the
  projection: summary block, pinned block, compacted tool results, recall note and tools.
- ``fit``: tailoring as the last guarantee; when it hides history the projection did not, the
  recall note and tools are added and the view is fitted again. A proactive recall block
  (``Recalled``) is placed and counted here, before the view is fitted, so the fitted view
  with it is within the budget and its figures are those of what goes upstream.
- ``direct``: a holdout session's view; ``refit``: a view grown by the recall loop.

Nothing here does I/O, reads a clock or knows a wire format. ``ContextOverflow`` (from
``tailor``) tells the shell that nothing fits.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace

from policies.compaction import CheckpointMark, PlanEvent, compact_tool_results, plan_view, round_sizes
from policies.extraction import extract_exact_values, merge_state
from policies.messages import tool_names_by_call_id
from policies.policy import Policy
from policies.projection import project_view, render_summary_block
from policies.recall_tools import recall_note, recall_tools
from policies.rounds import choose_boundary, last_user_index, split_rounds
from policies.tailoring import ContextOverflow, TailorStats, tailor
from policies.tokens import TokenCounter

RECALL_PLACEMENTS = ("message", "user", "system")


def scale(tokens: int, factor: float) -> int:
    """A raw estimate in the provider's tokens (``Calibration.scale`` with the factor given)."""
    return math.ceil(tokens * factor - 1e-9)


def tool_tokens(counter: TokenCounter, tools: list[dict] | None, functions: list | None = None) -> int:
    """What tool definitions cost in the prompt: ``tools`` and legacy ``functions`` (read as tools)."""
    if isinstance(functions, list) and functions:
        tools = [*(tools or []), *({"type": "function", "function": f} for f in functions)]
    return counter.count_tools(tools)


@dataclass(frozen=True, slots=True)
class CheckpointInput:
    """What the planner needs of one checkpoint on the request's path (message indexes)."""

    record: object  # the shell's checkpoint, opaque here: handed back in the plan
    key: str  # its id (caches its summary block's count)
    boundary: int  # index of the last message its summary covers
    after: int  # index of the newest message its job knew (>= boundary)
    summary: str | None
    state: dict
    forced: bool = False  # written because a request on this path did not fit
    index: str | None = None  # its hidden-context index (policies/hidden_index.py), when recall is on
    index_tokens: int = 0


@dataclass(slots=True)
class ViewRequest:
    """Everything a view is planned from, gathered by the shell."""

    instructions: list[dict]
    history: list[dict]
    ids: list[str]
    tools: list[dict] | None  # the client's tools
    functions: list | None  # the client's legacy functions
    policy: Policy
    budget: int  # calibrated tokens the prompt may use
    factor: float  # calibration: provider tokens per counted token
    counter: TokenCounter
    recall_names: tuple[str, str] | None = None  # with policy.recall: the recall tools' names
    recall_tools: list[dict] = field(default_factory=list)  # those tools in the client's format
    checkpoints: list[CheckpointInput] = field(default_factory=list)  # on the path, oldest first
    pinned_block: str | None = None  # the pinned standing instructions (policies/pinned.py)
    pinned_tokens: int = 0
    pinned_overflow: tuple[str, ...] = ()  # rules over the pinned block's budget

    @property
    def raw_budget(self) -> int:
        return int(self.budget / self.factor)

    def tool_tokens(self, tools: list[dict] | None) -> int:
        return tool_tokens(self.counter, tools, self.functions)


@dataclass(slots=True)
class ViewNotes:
    """What the view plan decided, for the request's receipt (``gateway/ops/receipts.py``).
    ``origins`` maps each message object the view holds (by ``id()``) to where it came from:
    ``(kind, event id, details)``, kind one of ``verbatim``, ``placeholder``, ``truncated`` (a
    tool result cut head/tail by compaction) and ``cut`` (by tailoring); the summary block and
    the instructions are told by their type and place."""

    origins: dict[int, tuple[str, str | None, dict | None]]
    checkpoint: object = None  # the shell's checkpoint record
    summarised: list[str] | None = None  # event ids before the checkpoint's boundary
    events: list[PlanEvent] | None = None
    state_only: bool = False  # a summary was due but not ready: deterministic state went instead
    sync_wait: bool = False  # the request waited for a summary (over sync_compaction_ratio)
    dropped: list[str] | None = None  # event ids tailoring left out
    round_starts: list[int] | None = None  # the first message index of each API round on the path
    # The first round new on this request's path: the rounds from the previous response (the
    # newest assistant message) on, when one starts there (an answer after tool results, then the
    # user's next message); the number of rounds when none does (an agent step only grows the
    # newest round with its tool results).
    new_from: int = 0


@dataclass(slots=True)
class Projection:
    """A planned view: the messages and tools, what they hide and cost, and how it was made."""

    messages: list[dict]
    tools: list[dict] | None
    recall_names: tuple[str, str] | None
    tokens: int  # calibrated estimate of the whole prompt
    hidden: frozenset[str]
    checkpoint: object  # the shell's checkpoint record, or None
    compacted: int
    truncated: int
    dropped: int = 0
    raw_tokens: int = 0  # the same estimate before calibration (what calibration learns from)
    truncated_tools: int = 0  # tool results cut by tailoring
    truncated_last: bool = False
    compacted_tokens: int = 0  # rounds before the compaction frontier (uncalibrated)
    raw_tail_tokens: int = 0  # rounds from the frontier on
    notes: ViewNotes | None = None
    found: CheckpointInput | None = None  # the checkpoint the plan chose
    frontier: int = 0  # the compaction frontier, a message index on the path
    tailored: TailorStats | None = None  # tailoring's stats when the fit cut anything (shell metrics)
    settle_tokens: float | None = None  # the size the plan's events settle at (cost model), uncalibrated


@dataclass(frozen=True, slots=True)
class Recalled:
    """A proactive recall block (``gateway/recall/auto.py``) and where it goes: ``message`` (a
    user message of its own) or ``system`` just before the newest user message, or ``user``
    (at the start of that message)."""

    block: str
    placement: str = "message"


# -- plan: checkpoint, frontier, projection ----------------------------------------------------


def plan(req: ViewRequest) -> Projection:
    """The checkpoint and compaction frontier (``choose``), projected (``project``)."""
    found, frontier, events = choose(req, settled := [])
    projection = project(req, found, frontier)
    projection.settle_tokens = settled[0] if settled else None
    if projection.notes is not None:
        projection.notes.events = events
    return projection


def choose(req: ViewRequest, settled: list[float] | None = None) -> tuple[CheckpointInput | None, int, list[PlanEvent]]:
    """The checkpoint on the path the view uses and the compaction frontier (a message index),
    replayed by ``plan_view``: a new checkpoint is adopted only at a compaction event, so the
    prefix changes once, not twice; one written for a request that did not fit (sync) is
    adopted at that request. Returns the plan's compaction events too."""
    policy, counter = req.policy, req.counter
    names = req.recall_names
    load_tool = names[1] if names else "session_load"
    rounds, raw, compacted = round_sizes(req.history, req.ids, policy, counter, load_tool)
    fixed = counter.count_messages(req.instructions) + req.tool_tokens(req.tools)
    if names:
        fixed += recall_cost(counter, names)
    # A view with a summary also carries the pinned standing instructions, just before it.
    pinned = req.pinned_tokens if req.checkpoints else 0
    marks = [CheckpointMark(cp.boundary, cp.after, block_tokens(counter, cp, policy.exact_values_limit) + pinned
                            + cp.index_tokens, forced=cp.forced) for cp in req.checkpoints]
    events: list[PlanEvent] = []
    index, frontier = plan_view(rounds, raw, compacted, fixed, marks, policy, req.budget, events, settled)
    found = req.checkpoints[index] if index is not None else None
    return found, rounds[frontier][0] if frontier < len(rounds) else len(req.history), events


def recall_cost(counter: TokenCounter, names: tuple[str, str]) -> int:
    """Tokens the recall note and tools add once anything is hidden (format-neutral: the tools
    counted as Chat Completions declares them)."""
    return counter.count_text(recall_note(*names)) + counter.count_tools(recall_tools(*names))


def block_tokens(counter: TokenCounter, checkpoint: CheckpointInput, limit: int) -> int:
    """What a checkpoint's summary block costs in the view (cached by checkpoint id)."""
    def build() -> dict:
        return {"role": "system", "content": render_summary_block(checkpoint.summary, checkpoint.state, limit)}
    return counter.count_built(f"block|{checkpoint.key}|{limit}", build)


def sync_due(req: ViewRequest, projection: Projection, client_tokens: int) -> bool:
    """Whether the view is over ``sync_compaction_ratio`` of the budget so that a summary must
    fold it now. With the cost model, a conversation that fits as it came never waits."""
    policy = req.policy
    must_fold = not policy.cost_model or client_tokens > req.budget
    return must_fold and projection.tokens > policy.sync_compaction_ratio * req.budget


def over_sync(req: ViewRequest, projection: Projection) -> bool:
    return projection.tokens > req.policy.sync_compaction_ratio * req.budget


def project(req: ViewRequest, found: CheckpointInput | None, frontier: int, *, state_only: bool = False) -> Projection:
    """The view from ``found`` on: instructions, pinned and summary blocks (with the hidden-context
    index), the tail with tool results compacted before ``frontier``, the recall note and tools
    when anything is hidden. ``state_only``: what a summary would cover but none does yet goes
    as its exact values (a summary was due and not ready)."""
    policy, counter, history, ids = req.policy, req.counter, req.history, req.ids
    pos = found.boundary if found else -1
    start = pos + 1
    tail, tail_ids = history[start:], ids[start:]
    shift = -start
    if tail and tail[0].get("role") != "user":
        # The checkpoint covers part of the current turn: its user message (the task) stays.
        task = last_user_index(history[:start])
        if task is not None:
            tail, tail_ids = [history[task], *tail], [ids[task], *tail_ids]
            shift += 1
    names = req.recall_names
    load_tool = names[1] if names else "session_load"
    summary = found.summary if found else None
    state = found.state if found else {}
    if state_only:  # the exact values of what the summary job would cover (summarizer._bounds), not the task's
        end = choose_boundary(history[start:], counter, policy.for_budget(req.budget), keys=ids[start:]) or 0
        state = merge_state(state, extract_exact_values(history[start:start + end]))
    pinned = block = None
    if found or state_only:
        # Once a summary hides part of the path, the user's standing instructions ride verbatim
        # in their own block; those over its budget are quoted in the summary block when the
        # summary does not quote them itself.
        pinned = req.pinned_block
        unquoted = [text for text in req.pinned_overflow if text not in (summary or "")]
        block = render_summary_block(summary, state, policy.exact_values_limit, unquoted)
    if found is not None and names and found.index:
        block = f"{block}\n\n{found.index}"
    compacted, stats = compact_tool_results(tail, tail_ids, policy, counter, load_tool=load_tool,
                                            frontier_at=max(0, frontier + shift))
    hidden = set(ids[:start]) - set(tail_ids)
    hidden.update(i for i, old, new in zip(tail_ids, tail, compacted) if old is not new)
    tools = req.tools
    if hidden and names:
        note = recall_note(*names)
        block = f"{block}\n\n{note}" if block else note
        tools = [*(tools or []), *req.recall_tools]
    else:
        names = None
    messages = project_view(req.instructions, compacted, block, policy.injection, pinned)
    tokens = _view_tokens(counter, messages, req.instructions, compacted, stats.tokens_after) + req.tool_tokens(tools)
    record = found.record if found else None
    return Projection(messages, tools, names, scale(tokens, req.factor), frozenset(hidden), record,
                      stats.replaced, stats.truncated, raw_tokens=tokens, compacted_tokens=stats.compacted_tokens,
                      raw_tail_tokens=stats.raw_tail_tokens, found=found, frontier=frontier,
                      notes=_notes(req, tail, tail_ids, compacted, stats, record, start, state_only))


def _view_tokens(counter: TokenCounter, messages: list[dict], instructions: list[dict], tail: list[dict],
                 tail_tokens: int) -> int:
    """``counter.count_messages(messages)`` for a view made of ``instructions``, ``tail`` (whose
    tokens compaction summed by event id: ``tail_tokens``) and blocks between them: only the
    instructions and the blocks are counted again (fingerprinting every message of a long
    history's view cost more than the rest of the projection)."""
    known = {id(m) for m in (*instructions, *tail)}
    extra = [m for m in messages if id(m) not in known]
    if len(known) != len(instructions) + len(tail) or len(messages) != len(known) + len(extra):
        return counter.count_messages(messages)  # a message twice: count the list as it is
    return counter.count_messages(instructions) + tail_tokens + sum(counter.count_message(m) for m in extra)


def _grown_tokens(counter: TokenCounter, messages: list[dict], base: list[dict], base_tokens: int) -> int:
    """``counter.count_messages(messages)`` given ``count_messages(base) == base_tokens``: only
    the messages one list holds and the other does not (by identity) are counted."""
    had, now = {id(m) for m in base}, {id(m) for m in messages}
    if len(had) != len(base) or len(now) != len(messages):
        return counter.count_messages(messages)
    added = sum(counter.count_message(m) for m in messages if id(m) not in had)
    gone = sum(counter.count_message(m) for m in base if id(m) not in now)
    return base_tokens + added - gone


def _notes(req: ViewRequest, tail, tail_ids, compacted, stats, record, start: int, state_only: bool) -> ViewNotes:
    """Where each message of a projection came from (the receipt itemises the view by it)."""
    origins: dict[int, tuple[str, str | None, dict | None]] = {id(m): ("verbatim", eid, None) for m, eid in zip(tail, tail_ids)}
    if stats.placeholders or stats.cut:
        names = tool_names_by_call_id(tail)
        for kind, indexes in (("placeholder", stats.placeholders), ("truncated", stats.cut)):
            for i in indexes:
                tool = names.get(str(tail[i].get("tool_call_id") or ""), "")
                origins[id(compacted[i])] = (kind, tail_ids[i], {
                    "tool": tool, "tokens_before": req.counter.count_message(tail[i], tail_ids[i])})
    summarised = list(req.ids[:start]) if record is not None else None
    starts = [a for a, _ in split_rounds(req.history)]
    answer = next((i for i in range(len(req.history) - 1, -1, -1) if req.history[i].get("role") == "assistant"), None)
    new_from = 0 if answer is None else next((r for r, a in enumerate(starts) if a >= answer), len(starts))
    return ViewNotes(origins, record, summarised, state_only=state_only, round_starts=starts, new_from=new_from)


def settling_policy(policy: Policy, projection: Projection, budget: int) -> Policy:
    """The policy the view's summary job runs with. Placeholders piled up past the settle size
    (the plan's, ``settle_tokens``, else the profile's) keep the view from settling there: the
    summary that folds them is due now, below the usual trigger, and covers just them. A view
    tailoring had to cut is left to the usual trigger (its figures were not kept)."""
    settle = projection.settle_tokens or policy.view_target_ratio * budget
    if projection.tailored is not None or projection.compacted_tokens <= settle:
        return policy
    return policy.model_copy(update={"summary_trigger_ratio": settle / budget, "keep_recent_share": 1.0,
                                     "keep_recent_tokens": max(projection.raw_tail_tokens, 1)})


# -- fit: tailoring, recall offered for what it hid, proactive recall counted -------------------


def fit(req: ViewRequest, projection: Projection, recalled: Recalled | None = None) -> Projection:
    """``projection`` fitted to the budget. Raises ``ContextOverflow`` when nothing fits.

    With ``recalled``, the block is placed first and the whole is fitted with it; the block is
    optional: when it does not fit (or tailoring would drop it) the result is None, and the
    caller keeps the view fitted without it. The newest user message is never cut for it."""
    if recalled is None:
        return _fit(req, projection, projection.messages, req.policy.truncate_last_message)
    messages, at = place_recalled(projection.messages, recalled)
    try:
        fitted = _fit(req, projection, messages, False)
    except ContextOverflow:
        return None
    kept = {id(m) for m in fitted.messages}
    if id(messages[at]) not in kept and not any(_carries(m, recalled.block) for m in fitted.messages):
        return None  # tailoring dropped the block: the view goes without it
    return fitted


def place_recalled(messages: list[dict], recalled: Recalled) -> tuple[list[dict], int]:
    """``messages`` with the block just before the newest user message (or at the start of it,
    ``user`` placement), and the block's position. The prefix before it stays byte-stable."""
    messages = list(messages)
    at = next((i for i in range(len(messages) - 1, -1, -1) if messages[i].get("role") == "user"), len(messages))
    if recalled.placement == "user" and at < len(messages):
        messages[at] = with_block(messages[at], recalled.block)
    else:
        messages.insert(at, {"role": "system" if recalled.placement == "system" else "user", "content": recalled.block})
    return messages, at


def with_block(message: dict, block: str) -> dict:
    """The user message with the block ahead of its own text ("user" placement: for chat
    templates that allow a system message only first, or that require turns to alternate)."""
    content = message.get("content")
    if isinstance(content, list):
        return {**message, "content": [{"type": "text", "text": block}, *content]}
    return {**message, "content": f"{block}\n\n{content or ''}"}


def _carries(message: dict, block: str) -> bool:
    """Whether ``message`` still starts with the block's opening (a block tailoring cut)."""
    content = message.get("content")
    if isinstance(content, list):
        content = next((p.get("text") for p in content if isinstance(p, dict) and p.get("type") == "text"), "")
    head = block.split("\n", 1)[0]
    return isinstance(content, str) and bool(head) and content.startswith(head)


def _fit(req: ViewRequest, projection: Projection, messages: list[dict], truncate_last: bool) -> Projection:
    counter, history, ids = req.counter, req.history, req.ids
    grown = messages is not projection.messages
    notes = projection.notes
    if grown:
        tool_tokens = req.tool_tokens(projection.tools)  # untailored, raw_tokens is project's count: messages + tools
        raw = tool_tokens + (_grown_tokens(counter, messages, projection.messages, projection.raw_tokens - tool_tokens)
                             if projection.tailored is None else counter.count_messages(messages))
        if notes is not None:
            notes = replace(notes, origins=dict(notes.origins))
        if scale(raw, req.factor) <= req.budget:
            return replace(projection, messages=messages, tokens=scale(raw, req.factor), raw_tokens=raw, notes=notes)
    elif projection.tokens <= req.budget:
        return projection
    raw_budget = req.raw_budget
    fixed = req.tool_tokens(projection.tools)
    fitted, stats = tailor(messages, raw_budget, counter, fixed_tokens=fixed, truncate_last=truncate_last)
    kept = {id(m) for m in fitted}
    dropped_ids = {eid for eid, m in zip(ids, history) if id(m) not in kept}
    hidden = projection.hidden | dropped_ids
    if notes is not None:
        notes.dropped = [eid for eid, m in zip(ids, history) if eid in dropped_ids and id(m) in notes.origins]
        _note_cuts(notes, messages, fitted, stats)
    if hidden and projection.recall_names is None and req.policy.recall and req.recall_names:
        # Tailoring hid history the projection did not: offer recall, and fit again with it.
        names = req.recall_names
        tools = [*(projection.tools or []), *req.recall_tools]
        lead = next((i for i, m in enumerate(fitted) if m.get("role") not in ("system", "developer")), len(fitted))
        with_note = [*fitted[:lead], {"role": "system", "content": recall_note(*names)}, *fitted[lead:]]
        try:
            refitted, more = tailor(with_note, raw_budget, counter, fixed_tokens=req.tool_tokens(tools),
                                    truncate_last=truncate_last)
        except ContextOverflow:
            refitted = None  # recall does not fit as well: send the tailored view without it
        if refitted is not None:
            if notes is not None:
                kept = {id(m) for m in refitted}
                notes.dropped += [eid for eid, m in zip(ids, history)
                                  if id(m) in notes.origins and id(m) not in kept and eid not in dropped_ids]
                _note_cuts(notes, with_note, refitted, more)
            return replace(projection, messages=refitted, tools=tools, recall_names=names,
                           tokens=scale(more.tokens_after, req.factor), hidden=frozenset(hidden),
                           dropped=stats.dropped_messages + more.dropped_messages, raw_tokens=more.tokens_after,
                           truncated_tools=stats.truncated_tool_results + more.truncated_tool_results,
                           truncated_last=stats.truncated_last_message or more.truncated_last_message,
                           notes=notes, tailored=stats)
    return replace(projection, messages=fitted, tokens=scale(stats.tokens_after, req.factor), hidden=frozenset(hidden),
                   dropped=stats.dropped_messages, raw_tokens=stats.tokens_after,
                   truncated_tools=stats.truncated_tool_results, truncated_last=stats.truncated_last_message,
                   notes=notes, tailored=stats)


def _note_cuts(notes: ViewNotes, before: list[dict], after: list[dict], stats: TailorStats) -> None:
    """The messages tailoring cut, noted as ``cut`` copies of what they were."""
    for j in stats.cut:
        source = before[stats.kept[j]] if stats.kept is not None else before[j]
        kind, eid, _ = notes.origins.get(id(source), ("instructions", None, None))
        notes.origins[id(after[j])] = ("cut", eid, {"was": kind})


# -- other views ------------------------------------------------------------------------------


def direct(req: ViewRequest) -> tuple[list[dict], TailorStats]:
    """A holdout session's view over its budget: what a client sending direct gets, the oldest
    rounds cut (tailoring), no summary, no compaction, no recall tools. Raises ContextOverflow."""
    return tailor([*req.instructions, *req.history], req.raw_budget, req.counter,
                  fixed_tokens=req.tool_tokens(req.tools), truncate_last=req.policy.truncate_last_message)


def refit(messages: list[dict], fixed_tokens: int, budget: int, factor: float,
          counter: TokenCounter) -> tuple[list[dict], TailorStats | None] | None:
    """``messages`` fitted to ``budget`` again (the recall loop grows the view each round), and
    tailoring's stats when it cut anything; None when even tailoring cannot make them fit."""
    if scale(counter.count_messages(messages) + fixed_tokens, factor) <= budget:
        return messages, None
    try:
        return tailor(messages, int(budget / factor), counter, fixed_tokens=fixed_tokens)
    except ContextOverflow:
        return None
