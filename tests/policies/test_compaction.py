"""Tests for policies/compaction.py."""

import pytest

from policies.compaction import compact_tool_results, compaction_frontier, compaction_frontier_for, truncate_head_tail
from policies.policy import Policy
from policies.rounds import split_rounds, tool_pair_problems
from tests.policies.conversations import agent_round, assistant, ids_for, payload, result, session, user


def tool_indices(messages):
    return [i for i, m in enumerate(messages) if m["role"] == "tool"]


def test_frontier_moves_in_batches():
    policy = Policy(keep_recent_rounds=3, compact_keep_rounds=3, compact_batch_rounds=4)
    assert [compaction_frontier(n, policy) for n in range(3, 16)] == [0, 0, 0, 0, 4, 4, 4, 4, 8, 8, 8, 8, 12]


def test_old_large_results_become_placeholders(counter):
    msgs = session(8, result_words=600)
    ids = ids_for(msgs)
    policy = Policy(keep_recent_rounds=3, compact_keep_rounds=3, compact_batch_rounds=4)
    out, stats = compact_tool_results(msgs, ids, policy, counter)
    rounds = split_rounds(msgs)
    assert len(rounds) == 16  # two API rounds per step: the call with its result, the answer
    eligible_end = rounds[12][0]  # frontier = floor((16-3)/4)*4 = 12
    for i in tool_indices(msgs):
        if i < eligible_end:
            text = out[i]["content"]
            assert "succeeded" in text and "do not run it again" in text
            assert "read_file" in text  # the call id rides in the message's own tool_call_id
            assert ids[i] in text and "session_load" in text
            assert str(counter.count_message(msgs[i], ids[i])) in text
            assert out[i]["tool_call_id"] == msgs[i]["tool_call_id"]
        else:
            assert out[i] is msgs[i]
    assert stats.replaced == 6 and stats.truncated == 0
    assert stats.tokens_after < stats.tokens_before
    assert stats.tokens_after == sum(counter.count_message(m) for m in out)
    assert tool_pair_problems(out) == []


def test_inputs_are_not_mutated(counter):
    msgs = session(8)
    snapshot = [dict(m) for m in msgs]
    out, _ = compact_tool_results(msgs, ids_for(msgs), Policy(compact_batch_rounds=4), counter)
    assert msgs == snapshot and out is not msgs


def test_small_results_stay(counter):
    msgs = session(8, result_words=30)
    out, stats = compact_tool_results(msgs, ids_for(msgs), Policy(compact_batch_rounds=4, compact_min_tokens=300), counter)
    assert stats.replaced == 0 and out == msgs


def test_load_tool_name_is_used(counter):
    msgs = session(8)
    out, _ = compact_tool_results(msgs, ids_for(msgs), Policy(compact_batch_rounds=4), counter, load_tool="palimpsest_session_load")
    assert "palimpsest_session_load" in out[tool_indices(msgs)[0]]["content"]


def test_results_without_event_id_are_not_placeholdered(counter):
    msgs = session(8)
    ids = [None] * len(msgs)
    out, stats = compact_tool_results(msgs, ids, Policy(compact_batch_rounds=4), counter)
    assert stats.replaced == 0 and out == msgs


def test_tool_rules(counter):
    msgs = []
    for r in range(8):
        msgs += agent_round(r, tool_name="keep_me" if r == 0 else "clean_me" if r == 1 else "cut_me" if r == 2 else "other",
                            result_words=600 if r != 1 else 20)
    policy = Policy(compact_batch_rounds=4, tool_rules={"keep_*": {"action": "keep"}, "clean_*": {"action": "clean"},
                                "cut_*": {"action": "truncate", "head_tokens": 20, "tail_tokens": 10}})
    ids = ids_for(msgs)
    out, stats = compact_tool_results(msgs, ids, policy, counter)
    t = tool_indices(msgs)
    assert out[t[0]] is msgs[t[0]]  # keep
    assert "succeeded" in out[t[1]]["content"]  # clean, despite being tiny
    cut = out[t[2]]["content"]  # truncate: head + marker + tail
    assert cut.startswith(msgs[t[2]]["content"][:20]) and cut.endswith(msgs[t[2]]["content"][-20:])
    assert ids[t[2]] in cut and "session_load" in cut and counter.count_text(cut) < 80
    assert "succeeded" in out[t[3]]["content"]  # default rule
    assert stats.replaced == 4 and stats.truncated == 1


def test_huge_result_in_protected_round_is_truncated(counter):
    msgs = session(2, result_words=300) + [user("go"), assistant(None, [("big", "dump", {})]),
                                            result("big", payload(12000, seed=9))]
    ids = ids_for(msgs)
    policy = Policy(compact_batch_rounds=4, max_result_tokens=1000, keep_recent_rounds=2, compact_keep_rounds=2)
    out, stats = compact_tool_results(msgs, ids, policy, counter)
    text = out[-1]["content"]
    assert counter.count_text(text) < 1100
    assert ids[-1] in text and "session_load" in text and "omitted" in text
    assert stats.truncated == 1 and stats.replaced == 0
    assert out[:-1] == msgs[:-1]


def test_keep_rule_wins_over_max_result(counter):
    msgs = [user("go"), assistant(None, [("big", "dump", {})]), result("big", payload(3000))]
    policy = Policy(compact_batch_rounds=4, max_result_tokens=500, tool_rules={"dump": {"action": "keep"}})
    out, stats = compact_tool_results(msgs, ids_for(msgs), policy, counter)
    assert out == msgs and stats.truncated == 0


def test_multimodal_tool_content_is_handled(counter):
    msgs = session(8)
    first = tool_indices(msgs)[0]
    msgs[first] = {**msgs[first], "content": [{"type": "text", "text": payload(600)}]}
    out, _ = compact_tool_results(msgs, ids_for(msgs), Policy(compact_batch_rounds=4), counter)
    assert "succeeded" in out[first]["content"]


def test_event_ids_must_be_parallel(counter):
    with pytest.raises(ValueError, match="event_ids"):
        compact_tool_results(session(2), ["a"], Policy(compact_batch_rounds=4), counter)


def test_growing_conversation_keeps_prefix_stable(counter):
    """Prompt-cache stability: between frontier moves each turn only appends; compacted
    messages never change once compacted."""
    policy = Policy(keep_recent_rounds=3, compact_keep_rounds=3, compact_batch_rounds=4)
    full = session(20, tools=2, result_words=500)
    ids = ids_for(full)
    ends = [e for _, e in split_rounds(full)]
    previous, previous_frontier = None, None
    compacted_once: dict[int, dict] = {}
    frontier_moves = 0
    for end in ends:
        msgs = full[:end]
        out, _ = compact_tool_results(msgs, ids[:end], policy, counter)
        frontier = compaction_frontier(len(split_rounds(msgs)), policy)
        if previous is not None:
            if frontier == previous_frontier:
                assert out[: len(previous)] == previous  # pure append
            else:
                frontier_moves += 1
        for i, message in enumerate(out):
            if message is not msgs[i]:
                if i in compacted_once:
                    assert message == compacted_once[i]  # byte-identical on every later turn
                compacted_once[i] = message
        for i in compacted_once:
            assert i < len(out) and out[i] == compacted_once[i]  # never un-compacted
        previous, previous_frontier = out, frontier
    assert frontier_moves == 9  # 40 API rounds: frontier 0 -> 4 -> ... -> 36
    assert len(compacted_once) == 2 * 18


def test_truncate_head_tail(counter):
    text = " ".join(f"token{i}" for i in range(2000))
    out = truncate_head_tail(text, 30, 20, counter, "\n[{omitted} tokens cut]\n")
    head, _, tail = out.partition("\n[")
    assert text.startswith(head) and text.endswith(tail.split("]\n", 1)[1])
    omitted = int(out.split("[")[1].split(" ")[0])
    assert omitted == counter.count_text(text) - 50
    assert truncate_head_tail("short text", 30, 20, counter, "[cut]") == "short text"


def test_truncate_does_not_break_multibyte_characters(counter):
    text = "日本語のテキスト" * 500
    out = truncate_head_tail(text, 7, 7, counter, "[cut]")
    assert "\ufffd" not in out and out.startswith(text[:2]) and out.endswith(text[-2:])


def loop_turn(calls: int, words: int = 900) -> list[dict]:
    """One user task, then ``calls`` tool calls in a row (an agent loop), results of ``words``."""
    msgs = [user("Task: fix the flaky worker")]
    for k in range(calls):
        msgs += [assistant(None, [(f"c{k}", "read_file", {"path": f"/src/m{k}.py"})]), result(f"c{k}", payload(words, seed=k))]
    return msgs


def test_frontier_jumps_to_the_target_when_the_trigger_is_passed():
    policy = Policy(compact_trigger_ratio=0.5, view_target_ratio=0.25, keep_recent_rounds=2, compact_keep_rounds=2, compact_batch_rounds=1)
    raw, compacted = [100] * 30, [10] * 30
    # Budget 1000: the view passes 500 at round 4, and must come down to 250.
    assert compaction_frontier_for(raw[:4], compacted[:4], 50, policy, 1000) == 0
    f = compaction_frontier_for(raw[:5], compacted[:5], 50, policy, 1000)
    assert f == 3  # 550 - 3 * 90 = 280 > 250, but the newest 2 rounds are protected
    frontiers = [compaction_frontier_for(raw[:n], compacted[:n], 50, policy, 1000) for n in range(1, 31)]
    assert frontiers == sorted(frontiers)  # never moves back
    views = [50 + 10 * f + 100 * (n - f) for n, f in zip(range(1, 31), frontiers)]
    assert max(views[:20]) <= 500  # later, placeholders alone add up past it: a summary's job
    moves = sum(b != a for a, b in zip(frontiers[:15], frontiers[1:15]))
    assert moves <= 5  # jumps in batches, not one round per request


def test_long_turn_settles_below_the_trigger_and_only_appends_between_jumps(counter):
    """An agent loop of 60 calls under one user message: results inside the current turn become
    placeholders, in batches, and the view stays between the target and the trigger."""
    budget = 30_000
    policy = Policy(compact_trigger_ratio=0.5, view_target_ratio=0.25, keep_recent_rounds=3, compact_keep_rounds=3)
    full = loop_turn(60)
    ids = ids_for(full)
    previous = None
    breaks, sizes, replaced = 0, [], 0
    for end in range(3, len(full) + 1, 2):  # after every tool result: one request of the loop
        out, stats = compact_tool_results(full[:end], ids[:end], policy, counter, budget=budget, fixed_tokens=500)
        assert tool_pair_problems(out) == []
        assert out[0] is full[0]  # the task stays verbatim
        assert all(out[i] is full[i] for i in range(max(0, end - 6), end))  # newest 3 rounds raw
        size = 500 + sum(counter.count_message(m) for m in out)
        sizes.append(size)
        assert size <= 0.5 * budget
        if previous is not None and out[: len(previous)] != previous:
            breaks += 1
        previous, replaced = out, stats.replaced
    assert replaced > 40  # placeholders inside the one long turn
    assert breaks <= 12  # 60 requests: a jump every five or more
    assert min(sizes[20:]) >= 0.2 * budget  # it settles near the target, not at the minimum


def test_compacted_tokens_count_only_rounds_with_placeholders(counter):
    policy = Policy(compact_trigger_ratio=0.5, view_target_ratio=0.1, keep_recent_rounds=2, compact_keep_rounds=2)
    chat = []
    for k in range(30):
        chat += [user(f"question {k} " + payload(300, seed=k)), assistant(f"answer {k}")]
    _, stats = compact_tool_results(chat, ids_for(chat), policy, counter, budget=5000, fixed_tokens=100)
    assert stats.compacted_tokens == 0 and stats.replaced == 0  # nothing to fold: no summary is due for it
    loop = loop_turn(30)
    _, stats = compact_tool_results(loop, ids_for(loop), policy, counter, budget=20_000, fixed_tokens=100)
    assert stats.replaced > 0 and 0 < stats.compacted_tokens < sum(counter.count_message(m) for m in loop) / 5
    assert stats.raw_tail_tokens > 0


# --- plan_view: a checkpoint is adopted only at a compaction event ------------------------------

from policies.compaction import CheckpointMark, plan_view  # noqa: E402


def _rounds(n: int) -> list[tuple[int, int]]:
    return [(2 * i, 2 * i + 2) for i in range(n)]  # an assistant call and its result per round


def test_plan_adopts_a_new_checkpoint_at_the_next_event_not_before():
    # The trigger alone decides here (no early events, tests below): cost_model off.
    policy = Policy(compact_trigger_ratio=0.6, view_target_ratio=0.1, keep_recent_rounds=2, compact_keep_rounds=2, compact_batch_rounds=1,
                    cost_model=False)
    raw, compacted = [100] * 30, [10] * 30
    mark = CheckpointMark(boundary=9, after=11, tokens=50)  # covers rounds 0-4, known from round 5
    seen = []
    for n in range(1, 31):
        index, frontier = plan_view(_rounds(n), raw[:n], compacted[:n], 0, [mark], policy, 1000)
        seen.append((index, frontier))
    # Events: the view passes 600 tokens at round 5 (0..5 = 600 + fixed 0 is not over; round 6 is).
    first_event = next(n for n, (i, f) in enumerate(seen) if f > 0)
    assert all(i is None for i, _ in seen[:first_event])
    assert seen[first_event][0] == 0  # adopted at the event, the same request whose prefix changes
    # Between events nothing changes: checkpoint and frontier stay until the view passes the trigger again.
    changes = [n for n in range(1, 30) if seen[n] != seen[n - 1]]
    assert all(b - a >= 2 for a, b in zip(changes, changes[1:])) and len(changes) < 15
    # The checkpoint switched at a request whose frontier jumped too: one prefix change, not two.
    assert all(seen[n][1] != seen[n - 1][1] for n in changes if seen[n][0] != seen[n - 1][0])
    # Monotone: never back to an older checkpoint or an earlier frontier.
    assert all(seen[n][1] >= seen[n - 1][1] for n in range(1, 30))


def test_plan_keeps_an_unadopted_checkpoint_out_of_the_view_below_the_trigger():
    policy = Policy(compact_trigger_ratio=0.9, view_target_ratio=0.1, keep_recent_rounds=2, compact_keep_rounds=2, cost_model=False)
    mark = CheckpointMark(boundary=3, after=5, tokens=50)
    assert plan_view(_rounds(5), [100] * 5, [10] * 5, 0, [mark], policy, 1000) == (None, 0)


def test_plan_adopts_a_sync_checkpoint_at_its_own_round():
    policy = Policy(compact_trigger_ratio=0.9, view_target_ratio=0.1, keep_recent_rounds=2, compact_keep_rounds=2)
    forced = CheckpointMark(boundary=3, after=9, tokens=50, forced=True)  # the request ending in round 4
    index, frontier = plan_view(_rounds(5), [100] * 5, [10] * 5, 0, [forced], policy, 1000)
    assert index == 0 and frontier >= 2


def test_plan_never_compacts_the_newest_rounds():
    policy = Policy(compact_trigger_ratio=0.2, view_target_ratio=0.01, keep_recent_rounds=3, compact_keep_rounds=3)
    for n in range(1, 20):
        _, frontier = plan_view(_rounds(n), [500] * n, [10] * n, 0, [], policy, 1000)
        assert frontier <= max(0, n - 3)


def test_the_bisected_frontier_jump_moves_as_the_round_by_round_walk():
    """``_jump`` with prefix sums of the gains (issue 29: the plan asks it of every round) lands
    where walking the rounds one by one does, batch floor and protected rounds included."""
    import random
    from itertools import accumulate

    from policies.compaction import _jump

    rng = random.Random(29)
    for _ in range(2000):
        n = rng.randint(0, 40)
        raw = [rng.randint(10, 3000) for _ in range(n + 1)]
        compacted = [min(r, rng.randint(10, 200)) for r in raw]
        gains = list(accumulate((r - c for r, c in zip(raw, compacted)), initial=0))
        policy = Policy(profile=rng.choice(["economy", "balanced", "fidelity"]), compact_batch_rounds=rng.randint(1, 4))
        frontier = rng.randint(0, n)
        view = rng.randint(0, 60_000)  # a sum of token counts, as in plan_view
        low = rng.uniform(0, 20_000)
        walked = _jump(raw, compacted, frontier, view, n, low, policy)
        assert _jump(raw, compacted, frontier, view, n, low, policy, gains) == walked
