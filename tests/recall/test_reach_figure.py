"""bench/reach.py: the "evidence reaches the model" figure reads what the answer round holds."""

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))

from reach import reaching  # noqa: E402

TURN = ("We spent the weekend on furniture. I just assembled an IKEA bookshelf, it took me 4 hours, "
        "and then we moved on to the desk, which was a lot quicker.")
GOLD = "4 hours"


def search_round(passage: str, event_id: str = "ev_1", complete: bool = False) -> list[dict]:
    result = {"results": [{"event_id": event_id, "role": "user", "passage": passage, "complete": complete}]}
    return [
        {"role": "system", "content": "You are helpful."},
        {"role": "user", "content": "RECALL: How long did the bookshelf take?"},
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "c1", "type": "function", "function": {"name": "session_search", "arguments": "{}"}}]},
        {"role": "tool", "tool_call_id": "c1", "content": json.dumps(result)},
    ]


def test_whole_turn_in_the_view_reaches():
    view = [{"role": "user", "content": "   ".join(TURN.split(" "))}]  # whitespace is folded
    assert reaching(view, {"ev_1": TURN}, GOLD) == {TURN}
    assert reaching(view, {"direct-0": TURN}, GOLD) == {TURN}


def test_passage_of_the_evidence_event_holding_the_answer_part_reaches():
    assert reaching(search_round("… an IKEA bookshelf, it took me 4 hours, and then …"), {"ev_1": TURN}, GOLD)


def test_passage_without_the_answer_part_does_not_reach():
    assert not reaching(search_round("… then we moved on to the desk …"), {"ev_1": TURN}, GOLD)


def test_the_answer_in_another_events_passage_does_not_count():
    assert not reaching(search_round("IKEA bookshelf, 4 hours", event_id="ev_2"), {"ev_1": TURN}, GOLD)


def test_turn_without_the_answer_words_needs_its_whole_text():
    turn = "I bought a second pair of running shoes today."
    assert not reaching(search_round("… a second pair of running …"), {"ev_1": turn}, "3")
    assert reaching(search_round(turn, complete=True), {"ev_1": turn}, "3") == {turn}


def test_recalled_history_block_lines_are_read():
    line = json.dumps({"n": 1, "role": "user", "event_id": "ev_1", "text": "IKEA bookshelf, it took me 4 hours"})
    view = [{"role": "user", "content": f"<recalled_history>\n\nPassages ...\n\n{line}\n\n</recalled_history>"}]
    assert reaching(view, {"ev_1": TURN}, GOLD) == {TURN}
    assert not reaching([{"role": "user", "content": "nothing here"}], {"ev_1": TURN}, GOLD)


def test_content_parts_are_read():
    view = [{"role": "user", "content": [{"type": "text", "text": TURN}]}]
    assert reaching(view, {"ev_1": TURN}, GOLD) == {TURN}
