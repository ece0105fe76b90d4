"""Tests for policies/rounds.py."""

from policies.policy import Policy
from policies.rounds import choose_boundary, split_rounds, tool_pair_problems
from tests.policies.conversations import agent_round, assistant, payload, result, session, user


def test_split_rounds_at_user_messages():
    msgs = [assistant("welcome"), user("a"), assistant("b"), user("c"), assistant(None, [("x", "f", {})]),
            result("x", "r"), assistant("d")]
    assert split_rounds(msgs) == [(0, 1), (1, 3), (3, 7)]
    assert split_rounds([]) == []
    assert split_rounds([user("only")]) == [(0, 1)]


def test_valid_tool_pairs_have_no_problems():
    assert tool_pair_problems(session(3, tools=2)) == []


def test_orphan_result_is_a_problem():
    problems = tool_pair_problems([user("a"), result("x", "r")])
    assert len(problems) == 1 and "'x'" in problems[0]


def test_unanswered_call_is_a_problem():
    msgs = [user("a"), assistant(None, [("x", "f", {}), ("y", "f", {})]), result("x", "r"), user("b")]
    problems = tool_pair_problems(msgs)
    assert problems and "y" in problems[0]
    assert tool_pair_problems(msgs[:3]) and "end" in tool_pair_problems(msgs[:3])[0]


def test_result_after_intervening_message_is_a_problem():
    msgs = [user("a"), assistant(None, [("x", "f", {})]), assistant("oops"), result("x", "r")]
    assert len(tool_pair_problems(msgs)) == 2


def test_result_for_another_assistants_call_and_duplicates():
    msgs = [user("a"), assistant(None, [("x", "f", {})]), result("x", "r"), result("x", "again")]
    assert any("twice" in p for p in tool_pair_problems(msgs))
    msgs = [user("a"), assistant(None, [("x", "f", {})]), result("z", "r")]
    assert any("'z'" in p for p in tool_pair_problems(msgs))


def test_boundary_keeps_newest_rounds(counter):
    msgs = session(6, result_words=30)
    policy = Policy(keep_recent_rounds=3, keep_recent_tokens=100_000)
    boundary = choose_boundary(msgs, counter, policy)
    rounds = split_rounds(msgs)
    assert boundary == rounds[3][0]
    assert tool_pair_problems(msgs[boundary:]) == [] and msgs[boundary]["role"] == "user"


def test_boundary_none_when_nothing_to_cover(counter):
    policy = Policy(keep_recent_rounds=3)
    assert choose_boundary(session(3, result_words=10), counter, policy) is None
    assert choose_boundary(session(1, result_words=10), counter, policy) is None
    assert choose_boundary([], counter, policy) is None


def test_token_cap_keeps_fewer_rounds_but_at_least_one(counter):
    msgs = session(6, result_words=1000)
    rounds = split_rounds(msgs)
    per_round = sum(counter.count_message(m) for m in msgs[rounds[-1][0]:])
    cap = int(per_round * 2.5)
    few = choose_boundary(msgs, counter, Policy(keep_recent_rounds=3, keep_recent_tokens=cap))
    assert few == rounds[4][0]  # two rounds fit under the cap, three do not
    one = choose_boundary(msgs, counter, Policy(keep_recent_rounds=3, keep_recent_tokens=10))
    assert one == rounds[5][0]


def test_boundary_uses_keys_for_counting(counter):
    msgs = session(5, result_words=30)
    keys = [f"k{i}" for i in range(len(msgs))]
    policy = Policy(keep_recent_rounds=2)
    assert choose_boundary(msgs, counter, policy, keys) == choose_boundary(msgs, counter, policy)


def test_boundary_moves_before_an_incomplete_round(counter):
    # The round before the cut has a call whose result never came (malformed history).
    broken = [user("broken"), assistant(None, [("lost", "f", {})]), assistant("gave up")]
    msgs = agent_round(0) + agent_round(1) + broken + agent_round(3) + agent_round(4)
    boundary = choose_boundary(msgs, counter, Policy(keep_recent_rounds=2))
    assert boundary == msgs.index(broken[0])


def test_boundary_never_splits_a_pair_that_spans_rounds(counter):
    # A result arriving after a user message (malformed) ties both rounds together.
    msgs = [user("a"), assistant(None, [("x", "f", {})]), user("b"), result("x", payload(10)),
            assistant("c"), user("d"), assistant("e"), user("f"), assistant("g")]
    assert choose_boundary(msgs, counter, Policy(keep_recent_rounds=2)) == 5
    # Keeping three rounds would cut between call and result: nothing can be covered.
    assert choose_boundary(msgs, counter, Policy(keep_recent_rounds=3)) is None
