"""bench/prefix_breaks.py: each pair of consecutive upstream prompts is put in the class that
explains its lost prefix, and the decomposition adds up to the stability the benches report."""

from __future__ import annotations

import orjson
import pytest

from bench.common import prefix_stats
from bench.prefix_breaks import chat_elements, classify, decompose, describe
from policies.compaction import placeholder_text

TOOLS = [{"type": "function", "function": {"name": "run_tests", "parameters": {"type": "object"}}}]
RECALL = [{"type": "function", "function": {"name": "session_search", "parameters": {"type": "object"}}}]


def call(n: int) -> dict:
    return {"role": "assistant", "content": None,
            "tool_calls": [{"id": f"c{n}", "type": "function", "function": {"name": "run_tests", "arguments": "{}"}}]}


def result(n: int, text: str | None = None) -> dict:
    return {"role": "tool", "tool_call_id": f"c{n}", "content": text or f"line {n} " * 300}


def placeholder(n: int, tokens: int = 600) -> dict:
    return {"role": "tool", "tool_call_id": f"c{n}",
            "content": placeholder_text("run_tests", f"c{n}", tokens, f"ev_{n}", "session_load")}


BASE = [{"role": "system", "content": "You are a coding agent."}, {"role": "user", "content": "fix it"}]


def body(messages: list[dict], tools: list[dict] = TOOLS) -> dict:
    return {"model": "m", "messages": messages, "tools": tools}


def test_an_append_loses_only_its_new_tokens():
    a = body([*BASE, call(1), result(1)])
    b = body([*BASE, call(1), result(1), call(2), result(2)])
    pair = classify(chat_elements(a), chat_elements(b))
    assert pair["class"] == "growth" and pair["rewritten"] == 0
    assert pair["shared"] + pair["new"] == pair["total"]


def test_a_result_turned_placeholder_is_an_event_and_only_the_rewrite_counts_beyond_growth():
    a = body([*BASE, call(1), result(1), call(2), result(2)])
    b = body([*BASE, call(1), placeholder(1), call(2), result(2), call(3), result(3)])
    pair = classify(chat_elements(a), chat_elements(b))
    assert pair["class"] == "event" and pair["tag"] == "result->placeholder"
    new = sum(t for _, t in chat_elements(body([call(3), result(3)]))[1:])
    assert pair["new"] == new  # the client's new round
    assert pair["rewritten"] == pair["total"] - pair["shared"] - new > 0  # the placeholder and the round after it


def test_a_placeholder_whose_text_changes_is_churn():
    a = body([*BASE, call(1), placeholder(1, 600), call(2), result(2)])
    b = body([*BASE, call(1), placeholder(1, 601), call(2), result(2), call(3), result(3)])
    pair = classify(chat_elements(a), chat_elements(b))
    assert pair["class"] == "churn" and pair["tag"] == "placeholder->placeholder"


def test_recall_tools_joining_the_head_are_the_first_event_and_other_tool_changes_churn():
    a = body([*BASE, call(1), result(1)])
    b = body([*BASE, call(1), placeholder(1), call(2), result(2)], TOOLS + RECALL)
    assert classify(chat_elements(a), chat_elements(b))["class"] == "event"
    other = body([*BASE, call(1), result(1), call(2), result(2)], [{**TOOLS[0], "function": {"name": "other"}}])
    assert classify(chat_elements(a), chat_elements(other))["class"] == "churn"


def test_a_summary_block_with_the_same_summary_and_other_values_is_churn_a_new_summary_an_event():
    def block(summary: str, values: str) -> dict:
        return {"role": "system", "content": f"<session_summary>\n\n{summary}\n\n"
                f"Exact values from the earlier conversation (verbatim):\n- dates: {values}\n\n</session_summary>"}
    a = body([BASE[0], block("Ran steps 1-4.", "2030-01-01"), BASE[1], call(5), result(5)])
    rerendered = body([BASE[0], block("Ran steps 1-4.", "2030-01-01 | 2030-01-05"), BASE[1], call(5), result(5)])
    pair = classify(chat_elements(a), chat_elements(rerendered))
    assert pair["class"] == "churn" and pair["tag"] == "summary block re-rendered"
    adopted = body([BASE[0], block("Ran steps 1-5.", "2030-01-01 | 2030-01-05"), BASE[1], call(6), result(6)])
    assert classify(chat_elements(a), chat_elements(adopted))["class"] == "event"


def test_recall_rounds_are_their_own_class():
    a = body([*BASE, call(1), result(1), {"role": "user", "content": "RECALL: a"}])
    b = body([*BASE, call(1), result(1), {"role": "user", "content": "RECALL: b"}])
    assert classify(chat_elements(a), chat_elements(b), recall=True)["class"] == "recall"


@pytest.mark.parametrize("key, kind", [
    (b'user:{"type":"tool_result","tool_use_id":"t1","content":"[Tool result compacted by the gateway] x"}', "placeholder"),
    (b'user:{"type":"tool_result","tool_use_id":"t1","content":"raw"}', "result"),
    (b'tool:{"name":"Bash"}', "head"),
    (b'system:{"type":"text","text":"<session_summary>\\nx"}', "summary"),
    (orjson.dumps({"type": "function_call_output", "call_id": "c1", "output": "raw"}), "result"),
])
def test_every_format_s_elements_are_described(key, kind):
    assert describe(key)[0] == kind


def test_the_decomposition_adds_up_to_the_reported_stability():
    bodies = [body([*BASE, call(1), result(1)]),
              body([*BASE, call(1), result(1), call(2), result(2)]),
              body([*BASE, call(1), placeholder(1), call(2), result(2), call(3), result(3)], TOOLS + RECALL),
              body([*BASE, call(1), placeholder(1), call(2), placeholder(2), call(3), result(3), call(4), result(4)],
                   TOOLS + RECALL)]
    d = decompose([chat_elements(b) for b in bodies])
    assert d["pairs"] == 3 and (d["n_growth"], d["n_event"], d["n_churn"]) == (1, 2, 0)
    assert d["stability"] / 3 == pytest.approx(prefix_stats(bodies)["cur_share"])
    lost = sum(d[f"loss_{c}"] for c in ("growth", "event", "churn", "recall"))
    assert 1 - d["stability"] / 3 == pytest.approx(lost / 3)
