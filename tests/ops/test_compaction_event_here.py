"""Which request a compaction event belongs to (``gateway/ops/receipts.compaction_event_here``):
the turn log's ``compaction_event`` flag, the inspector's and ``palimpsest replay --html``'s
markers. A turn that ends after tool results brings two rounds (the answer, then the user's next
message), so an event in the older of them is this request's too; an early event (decided on the rounds before its
round) belongs to the request where its round first appeared, not to the next agent step that
grows that round with tool results."""

from __future__ import annotations

from types import SimpleNamespace

from gateway.ops.receipts import compaction_event_here
from policies.compaction import CompactionStats, PlanEvent
from policies.planner import ViewNotes, _notes

CHAT_TURN = [{"role": "system", "content": "s"}, {"role": "user", "content": "a"},
             {"role": "assistant", "content": "b"}, {"role": "user", "content": "c"},
             {"role": "assistant", "content": "d"}, {"role": "user", "content": "e"}]


def notes(starts: list[int], new_from: int, *events: PlanEvent) -> ViewNotes:
    return ViewNotes({}, events=list(events), round_starts=starts, new_from=new_from)


def event(round: int, *, early: bool = False, reason: str = "cost_model") -> PlanEvent:
    return PlanEvent(round, reason, 100, 50, None, early=early)


def test_an_event_in_the_answer_round_of_a_chat_turn_is_this_requests():
    starts = [0, 2, 3, 4, 5]  # rounds: [user, call, result], [answer], [user, call, result], [answer], [user]
    assert compaction_event_here(notes(starts, 3, event(3, early=True)))
    assert compaction_event_here(notes(starts, 3, event(4)))
    assert not compaction_event_here(notes(starts, 3, event(2, early=True)))  # an earlier request's
    assert not compaction_event_here(notes(starts, 3, event(3, reason="deferred")))


def test_an_early_event_is_not_taken_again_when_an_agent_step_grows_its_round():
    starts = [0, 3, 5]  # the newest round holds the previous call and its new tool results
    assert not compaction_event_here(notes(starts, 3, event(2, early=True)))
    assert compaction_event_here(notes(starts, 3, event(2)))  # pushed over by the grown round


def test_the_plan_notes_where_this_requests_rounds_start():
    req = SimpleNamespace(history=CHAT_TURN, ids=[str(i) for i in range(len(CHAT_TURN))], counter=None)
    got = _notes(req, [], [], [], CompactionStats(), None, 0, False)
    # A plain answer joins its user message's round; the user's next message starts the new one.
    assert got.round_starts == [0, 1, 3, 5] and got.new_from == 3
    loop = [*CHAT_TURN[:4], {"role": "assistant", "content": None, "tool_calls": [
        {"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}}]},
        {"role": "tool", "tool_call_id": "c1", "content": "out"}]
    req = SimpleNamespace(history=loop, ids=[str(i) for i in range(len(loop))], counter=None)
    got = _notes(req, [], [], [], CompactionStats(), None, 0, False)
    assert got.round_starts == [0, 1, 3] and got.new_from == 3  # no round starts at the call: none new
