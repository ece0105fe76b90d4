"""store.passages phrases and their place in store.ranking.fuse (`Ranking.phrase`, issue 28):
of turns about one subject, the one naming the thing asked in the question's own word order."""

from __future__ import annotations

import pytest

from store.passages import phrases_in, query_phrases
from store.ranking import Ranking, fuse

OFF = Ranking(phrase=0.0)


def _row(event_id: str, text: str, score: float, role: str = "assistant") -> dict:
    return {"event_id": event_id, "chunk": 0, "role": role, "created": 0.0, "parent": "", "text": text,
            "_score": score}


def test_query_phrases_are_adjacent_content_words_without_the_framing():
    phrases = query_phrases("I wanted to follow up on our previous conversation. Can you remind me of the "
                            "specific back-end programming languages you recommended?")
    assert {("back", "end"), ("end", "programm"), ("programm", "languag")} <= phrases
    # Framing words ("previous conversation", "remind") are in no pair; stop words are skipped.
    assert not any({"previous", "conversation", "remind", "follow", "up"} & set(pair) for pair in phrases)


def test_a_phrase_matches_across_stop_words_and_inflections():
    phrases = query_phrases("How long did it take me to assemble the IKEA bookshelf?")
    assert phrases_in(["I just assembled an IKEA bookshelf and it took me 4 hours."], phrases) == {
        ("assembl", "ikea"), ("ikea", "bookshelf")}
    # The same words apart are no phrase.
    assert phrases_in(["The bookshelf was easy; I will check IKEA's tables and assemble them."], phrases) == set()


DEV = "How long did it take me to assemble the IKEA bookshelf?"


def _bookshelf() -> list[dict]:
    """BM25 prefers the turn that repeats the subject's words; the other states the fact."""
    return [
        _row("talk", "IKEA coffee tables are easy to assemble, like a bookshelf: IKEA bookshelves and IKEA "
                     "tables come with assembly guides.", 9.0),
        _row("fact", "By the way, I just assembled an IKEA bookshelf and it took me 4 hours.", 6.0, "user"),
    ]


def test_the_turn_holding_the_questions_phrase_outranks_the_one_repeating_its_words():
    # The role asked ("take me": the user's) and the quantity it holds ("4 hours") are not enough.
    assert fuse([_bookshelf()], DEV, 2, OFF)[0].event_id == "talk"
    hits = fuse([_bookshelf()], DEV, 2, Ranking())
    assert [hit.event_id for hit in hits] == ["fact", "talk"]
    # The best holder takes the full weight.
    off = {hit.event_id: hit.score for hit in fuse([_bookshelf()], DEV, 2, OFF)}
    assert hits[0].score == pytest.approx(off["fact"] + Ranking().phrase)


def test_a_phrase_every_retrieved_turn_holds_tells_none_apart():
    rows = [_row(f"e{i}", f"front-end and back-end development, part {i}", 9.0 - i) for i in range(4)]
    query = "What did we say about front-end and back-end development?"
    assert [h.score for h in fuse([rows], query, 4, Ranking())] == pytest.approx(
        [h.score + Ranking().phrase for h in fuse([rows], query, 4, OFF)])
    # Each holds every pair alike: the order is the legs' own.
    assert [h.event_id for h in fuse([rows], query, 4, Ranking())] == ["e0", "e1", "e2", "e3"]


def test_no_phrase_in_the_query_changes_nothing():
    query = "bookshelf?"
    assert [(h.event_id, h.score) for h in fuse([_bookshelf()], query, 2, Ranking())] == \
        [(h.event_id, h.score) for h in fuse([_bookshelf()], query, 2, OFF)]
