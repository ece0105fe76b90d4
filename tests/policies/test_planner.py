"""Tests for policies/planner.py: the view planned from plain message lists, no gateway, no I/O.

The planner gets everything the shell gathers (checkpoints on the path, the calibration factor,
the recall tools in the client's format, the pinned rules) and returns the plan; these check
what it decides: the checkpoint and what it hides, the recall note and the tools it was handed,
the fit to the budget, recall offered when tailoring hides history, and a proactive recall
block placed and counted before the view is fitted.
"""

import math

import pytest

from policies import Policy
from policies.planner import (
    CheckpointInput,
    Recalled,
    ViewRequest,
    fit,
    plan,
    project,
    refit,
    scale,
    settling_policy,
    sync_due,
)
from policies.projection import SummaryBlock
from policies.recall_tools import recall_note
from policies.tailoring import ContextOverflow
from tests.policies.conversations import ids_for, session, user

SYSTEM = {"role": "system", "content": "You are a careful assistant."}
NAMES = ("session_search", "session_load")
# Recall tools as some wire format declares them: the planner passes them on, never builds them.
FORMAT_TOOLS = [{"name": "session_search", "input_schema": {}}, {"name": "session_load", "input_schema": {}}]
BLOCK = "<recalled_history>\n\n" + " ".join(f"passage{i} about the artifact" for i in range(150)) + "\n\n</recalled_history>"


def request(counter, history, *, budget=100_000, factor=1.0, checkpoints=(), recall=True, **policy) -> ViewRequest:
    return ViewRequest([SYSTEM], history, ids_for(history), None, None, Policy(**policy), budget, factor, counter,
                       recall_names=NAMES if recall else None, recall_tools=FORMAT_TOOLS if recall else [],
                       checkpoints=list(checkpoints))


def checkpoint(history, boundary, summary="The user inspected the first modules.") -> CheckpointInput:
    return CheckpointInput(record=object(), key=f"cp{boundary}", boundary=boundary, after=boundary,
                           summary=summary, state={})


def total(counter, projection, req) -> int:
    return counter.count_messages(projection.messages) + req.tool_tokens(projection.tools)


def test_a_short_conversation_is_planned_as_it_came(counter):
    history = session(2, result_words=60)
    req = request(counter, history)
    planned = plan(req)
    assert planned.messages == [SYSTEM, *history]
    assert planned.hidden == frozenset() and planned.recall_names is None and planned.tools is None
    assert planned.raw_tokens == total(counter, planned, req) and planned.tokens == planned.raw_tokens
    assert fit(req, planned) is planned  # it fits: nothing to do


def test_the_calibration_factor_scales_the_estimate(counter):
    history = session(2, result_words=60)
    planned = plan(request(counter, history, factor=1.25))
    assert planned.tokens == math.ceil(planned.raw_tokens * 1.25 - 1e-9) == scale(planned.raw_tokens, 1.25)


def test_a_checkpoint_hides_what_it_covers_and_the_format_s_recall_tools_are_offered(counter):
    history = session(8, result_words=600)
    boundary = 15  # the last message of round 3
    req = request(counter, history, budget=12_000, checkpoints=[checkpoint(history, boundary)], compact_trigger_ratio=0.3)
    planned = plan(req)
    # The plan adopted the checkpoint: its summary block replaces what it covers.
    assert planned.found is req.checkpoints[0] and planned.checkpoint is req.checkpoints[0].record
    blocks = [m for m in planned.messages if isinstance(m, SummaryBlock)]
    assert len(blocks) == 1 and "The user inspected the first modules." in blocks[0]["content"]
    assert recall_note(*NAMES) in blocks[0]["content"]
    assert set(req.ids[:boundary + 1]) <= planned.hidden
    assert not any(m is history[i] for m in planned.messages for i in range(boundary + 1))
    # The recall tools are the ones handed in, as they came; the names are the request's.
    assert planned.tools == FORMAT_TOOLS and planned.recall_names == NAMES
    assert planned.notes.summarised == req.ids[:boundary + 1]
    assert planned.tokens == total(counter, planned, req)


def test_without_recall_nothing_is_offered(counter):
    history = session(8, result_words=600)
    req = request(counter, history, budget=12_000, checkpoints=[checkpoint(history, 15)], recall=False,
                  compact_trigger_ratio=0.3)
    planned = plan(req)
    assert planned.hidden and planned.recall_names is None and planned.tools is None


def test_the_fit_keeps_the_view_within_the_budget(counter):
    history = session(12, result_words=400)
    req = request(counter, history, budget=3_000, recall=False)
    planned = project(req, None, 0)
    assert planned.tokens > req.budget
    fitted = fit(req, planned)
    assert fitted.tokens <= req.budget and fitted.tokens == total(counter, fitted, req)
    assert fitted.dropped > 0 and fitted.tailored is not None
    assert planned.messages != fitted.messages and len(planned.messages) == len(history) + 1  # the plan is kept


def test_tailoring_that_hides_history_offers_recall_and_fits_again(counter):
    history = session(12, result_words=400)
    req = request(counter, history, budget=3_000)
    planned = project(req, None, 0)
    assert planned.recall_names is None  # the projection hid nothing
    fitted = fit(req, planned)
    assert fitted.recall_names == NAMES and fitted.tools == FORMAT_TOOLS
    assert any(m.get("content") == recall_note(*NAMES) for m in fitted.messages)
    assert fitted.hidden and fitted.tokens <= req.budget


def test_nothing_fits_raises(counter):
    history = [user("please " * 5_000)]
    req = request(counter, history, budget=500)
    with pytest.raises(ContextOverflow):
        fit(req, plan(req))


@pytest.mark.parametrize("placement", ["message", "system", "user"])
def test_a_recalled_block_is_placed_before_the_newest_question_and_counted(counter, placement):
    history = [*session(8, result_words=600), user("Where was module 2?")]
    req = request(counter, history, budget=12_000, checkpoints=[checkpoint(history, 15)], compact_trigger_ratio=0.3)
    planned = plan(req)
    before = fit(req, planned)
    with_block = fit(req, planned, Recalled(BLOCK, placement))
    assert with_block is not None
    messages = with_block.messages
    if placement == "user":
        assert messages[-1]["content"] == f"{BLOCK}\n\nWhere was module 2?"
    else:
        assert messages[-2] == {"role": "system" if placement == "system" else "user", "content": BLOCK}
        assert messages[-1] is history[-1]
    # Counted in the view's figures, within the budget; the view without it is untouched.
    assert with_block.raw_tokens == total(counter, with_block, req) > before.raw_tokens
    assert with_block.tokens <= req.budget
    assert before.messages == fit(req, planned).messages and all(BLOCK not in str(m) for m in before.messages)


def test_a_recalled_block_is_fitted_with_the_view_not_after_it(counter):
    # The view alone fits; with the block it must drop old rounds, and the fitted whole is within the budget.
    history = [*session(10, result_words=300), user("Where was module 2?")]
    req = request(counter, history, recall=False)
    planned = project(req, None, 0)  # nothing compacted
    req.budget = planned.tokens + 200
    assert fit(req, planned) is planned
    fitted = fit(req, planned, Recalled(BLOCK))
    assert fitted is not None and fitted.tokens <= req.budget and fitted.tokens == total(counter, fitted, req)
    assert fitted.dropped > 0 and fitted.hidden  # what it dropped is hidden (recall may search it)
    assert any(m.get("content") == BLOCK for m in fitted.messages)


def test_a_recalled_block_that_cannot_fit_is_left_out(counter):
    history = [*session(2, result_words=60), user("Where was module 2?")]
    req = request(counter, history, recall=False)
    req.budget = plan(req).tokens + 50
    planned = plan(req)
    assert fit(req, planned, Recalled(BLOCK)) is None
    assert fit(req, planned) is planned


def test_a_sync_summary_is_due_only_over_the_ratio_and_when_the_cost_model_says_it_must(counter):
    history = session(12, result_words=400)
    req = request(counter, history, budget=3_000, sync_compaction_ratio=0.9)
    planned = project(req, None, 0)
    assert sync_due(req, planned, client_tokens=planned.tokens)
    req.policy = Policy(sync_compaction_ratio=0.9, cost_model=True)
    assert not sync_due(req, planned, client_tokens=req.budget)  # fits as it came: never waits
    req.policy, req.budget = Policy(sync_compaction_ratio=0.9, cost_model=False), planned.tokens * 2
    assert not sync_due(req, planned, client_tokens=planned.tokens)  # under the ratio


def test_piled_up_placeholders_make_the_summary_due_for_just_them(counter):
    history = session(12, result_words=400)
    req = request(counter, history, view_target_ratio=0.5)
    planned = plan(req)
    planned.compacted_tokens, planned.raw_tail_tokens = 60_000, 7_000
    settled = settling_policy(req.policy, planned, req.budget)
    assert settled.summary_trigger_ratio == 0.5 and settled.keep_recent_tokens == 7_000
    planned.compacted_tokens = 10
    assert settling_policy(req.policy, planned, req.budget) is req.policy


def test_refit_grows_nothing_that_fits_and_cuts_what_does_not(counter):
    messages = [SYSTEM, *session(6, result_words=400)]
    size = counter.count_messages(messages)
    assert refit(messages, 0, size, 1.0, counter) == (messages, None)
    fitted, stats = refit(messages, 0, size // 2, 1.0, counter)
    assert counter.count_messages(fitted) <= size // 2 and stats.dropped_messages > 0
    assert refit([user("x " * 9_000)], 0, 100, 1.0, counter) is None


@pytest.mark.parametrize("injection", ["system", "user"])
@pytest.mark.parametrize("placement", ["message", "user"])
def test_the_view_s_count_is_its_messages_count_with_placeholders_blocks_and_a_recalled_block(counter, injection,
                                                                                               placement):
    # The projection counts the tail from compaction's per-event sums and only the rest afresh, and
    # the recalled view only what the block changed: the figures must equal a plain count of the
    # messages sent (a fresh counter: no cache shared with the plan).
    history = [*session(10, result_words=600), user("Where was module 2?")]
    req = request(counter, history, budget=14_000, checkpoints=[checkpoint(history, 7)], compact_trigger_ratio=0.3,
                  injection=injection)
    req.pinned_block, req.pinned_tokens = "Always answer in English.", 8
    planned = plan(req)
    assert planned.found is not None and planned.compacted > 0  # a summary block and placeholders
    fresh = type(counter)()
    assert planned.raw_tokens == total(fresh, planned, req)
    with_block = fit(req, planned, Recalled(BLOCK, placement))
    assert with_block is not None and with_block.tailored is None
    assert with_block.raw_tokens == total(fresh, with_block, req)


def test_a_state_only_view_lists_what_the_summary_job_would_cover_and_nothing_more(counter):
    """A summary was due and not ready (``state_only``): the block carries the exact values of
    the span the summary job would cover, the path after the checkpoint
    (gateway/jobs/summarizer._bounds), not of the task message the view keeps from before the
    checkpoint. Where the job would cover nothing, the view is the one without ``state_only``,
    byte for byte: an agent's chain whose tail just fits the raw-tail cap once the task is left
    out (Qwen Code's, issue 25) got the task's first round's values in its block on such a
    request and lost them on the next, rewriting the prompt from the block on twice."""
    from policies.rounds import choose_boundary
    from tests.policies.conversations import assistant, payload, result

    cap = Policy().for_budget(20_000).keep_recent_tokens
    steps = [[assistant(None, [(f"c{i}", "run_shell_command", {"command": f"step {i}"})]),
              result(f"c{i}", f"2030-01-0{i + 1} " + payload(cap // 10, seed=i))] for i in range(4)]
    tail = [m for step in steps[1:] for m in step]
    task_words = cap - counter.count_messages(tail) + 40  # the task tips the tail over the cap
    history = [user("2031-02-03 run the chain " + payload(task_words, seed=9)), *steps[0], *tail]
    req = request(counter, history, budget=20_000, checkpoints=[checkpoint(history, 2)])
    policy, start = req.policy.for_budget(req.budget), 3
    assert choose_boundary(history[start:], counter, policy) is None  # the job would cover nothing
    assert choose_boundary([history[0], *history[start:]], counter, policy)  # with the task kept: a cut
    planned = plan(req)
    assert planned.found is req.checkpoints[0]
    state_only = project(req, planned.found, planned.frontier, state_only=True)
    assert state_only.messages == project(req, planned.found, planned.frontier).messages
    assert "2031-02-03" not in str(state_only.messages[1]["content"])
