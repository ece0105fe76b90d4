"""Tests for policies/rounds.py."""

from policies.policy import Policy
from policies.rounds import choose_boundary, last_user_index, split_rounds, tool_pair_problems
from tests.policies.conversations import agent_round, assistant, payload, result, session, user


def test_split_rounds_at_user_messages_and_after_tool_results():
    msgs = [assistant("welcome"), user("a"), assistant("b"), user("c"), assistant(None, [("x", "f", {})]),
            result("x", "r"), assistant("d")]
    assert split_rounds(msgs) == [(0, 1), (1, 3), (3, 6), (6, 7)]
    assert split_rounds([]) == []
    assert split_rounds([user("only")]) == [(0, 1)]


def test_an_agent_loop_is_one_api_round_per_call():
    loop = [user("task")]
    for k in range(60):
        loop += [assistant(None, [(f"c{k}", "f", {}), (f"d{k}", "g", {})]), result(f"c{k}", "r"), result(f"d{k}", "s")]
    loop.append(assistant("done"))
    rounds = split_rounds(loop)
    assert len(rounds) == 61
    assert rounds[0] == (0, 4) and rounds[1] == (4, 7) and rounds[-1] == (181, 182)
    # Parallel calls and their results share a round; every round end is a valid cut.
    for start, end in rounds:
        assert tool_pair_problems(loop[start:end]) == [] or loop[start]["role"] == "user"
        assert tool_pair_problems(loop[end:]) == []
    assert last_user_index(loop) == 0 and last_user_index([assistant("x")]) is None


def test_boundary_falls_inside_a_long_turn(counter):
    loop = [user("task")]
    for k in range(40):
        loop += [assistant(None, [(f"c{k}", "f", {})]), result(f"c{k}", payload(300, seed=k))]
    per_round = counter.count_message(loop[1]) + counter.count_message(loop[2])
    cut = choose_boundary(loop, counter, Policy(keep_recent_rounds=3, keep_recent_tokens=per_round * 10))
    assert cut is not None and 1 < cut < len(loop) - 6
    assert loop[cut]["role"] == "assistant" and tool_pair_problems(loop[cut:]) == []


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


def test_boundary_keeps_the_newest_rounds_that_fit_the_cap(counter):
    msgs = session(6, result_words=30)
    rounds = split_rounds(msgs)
    tail = sum(counter.count_message(m) for m in msgs[rounds[-3][0]:])
    boundary = choose_boundary(msgs, counter, Policy(keep_recent_rounds=3, keep_recent_tokens=tail))
    assert boundary == rounds[-3][0]
    assert tool_pair_problems(msgs[boundary:]) == []
    # Fit first: a larger cap keeps more rounds raw, whatever keep_recent_rounds says.
    more = choose_boundary(msgs, counter, Policy(keep_recent_rounds=3, keep_recent_tokens=tail * 2))
    assert more < boundary
    # Everything fits the cap: no summary at all.
    assert choose_boundary(msgs, counter, Policy(keep_recent_rounds=3, keep_recent_tokens=100_000)) is None


def test_small_deltas_wait_for_a_batch(counter):
    msgs = session(6, result_words=300)
    total = sum(counter.count_message(m) for m in msgs)
    last = sum(counter.count_message(m) for m in msgs[split_rounds(msgs)[-1][0]:])
    # The raw tail holds all but the first round: covering one small round is not worth a summary.
    cap = total - counter.count_message(msgs[0]) - 10
    assert choose_boundary(msgs, counter, Policy(keep_recent_tokens=cap)) is None
    assert choose_boundary(msgs, counter, Policy(keep_recent_tokens=last)) is not None


def test_boundary_none_when_nothing_to_cover(counter):
    policy = Policy(keep_recent_rounds=3, keep_recent_tokens=8000)
    assert choose_boundary(session(3, result_words=10), counter, policy) is None
    assert choose_boundary(session(1, result_words=10), counter, policy) is None
    assert choose_boundary([], counter, policy) is None


def test_token_cap_keeps_fewer_rounds_but_at_least_one(counter):
    msgs = session(6, result_words=1000)
    rounds = split_rounds(msgs)
    per_round = sum(counter.count_message(m) for m in msgs[rounds[-1][0]:])
    big = sum(counter.count_message(m) for m in msgs[rounds[-2][0]:rounds[-1][0]])
    few = choose_boundary(msgs, counter, Policy(keep_recent_rounds=3, keep_recent_tokens=per_round + big + 5))
    assert few == rounds[-2][0]  # two rounds fit under the cap, three do not
    one = choose_boundary(msgs, counter, Policy(keep_recent_rounds=3, keep_recent_tokens=10))
    assert one == rounds[-1][0]


def test_boundary_uses_keys_for_counting(counter):
    msgs = session(5, result_words=30)
    keys = [f"k{i}" for i in range(len(msgs))]
    policy = Policy(keep_recent_rounds=2)
    assert choose_boundary(msgs, counter, policy, keys) == choose_boundary(msgs, counter, policy)


def test_boundary_moves_before_an_incomplete_round(counter):
    # The round before the cut has a call whose result never came (malformed history).
    broken = [user("broken"), assistant(None, [("lost", "f", {})]), assistant("gave up")]
    msgs = agent_round(0) + agent_round(1) + broken + agent_round(3) + agent_round(4)
    cap = sum(counter.count_message(m) for m in broken[1:] + agent_round(3) + agent_round(4))
    boundary = choose_boundary(msgs, counter, Policy(keep_recent_rounds=2, keep_recent_tokens=cap))
    assert boundary == msgs.index(broken[0])


def test_boundary_never_splits_a_pair_that_spans_rounds(counter):
    # A result arriving after a user message (malformed) ties both rounds together.
    msgs = [user("a"), assistant(None, [("x", "f", {})]), user("b"), result("x", payload(10)),
            assistant("c"), user("d"), assistant("e"), user("f"), assistant("g")]
    size = lambda ms: sum(counter.count_message(m) for m in ms)  # noqa: E731
    assert choose_boundary(msgs, counter, Policy(keep_recent_tokens=size(msgs[5:]))) == 5
    # Keeping more would cut between call and result: nothing can be covered.
    assert choose_boundary(msgs, counter, Policy(keep_recent_tokens=size(msgs[4:]))) == 4
    assert choose_boundary(msgs, counter, Policy(keep_recent_tokens=size(msgs[2:]))) is None
