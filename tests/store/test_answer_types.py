"""store.answer_types and the answer-type prior of store.ranking.fuse."""

from __future__ import annotations

import pytest

from store.answer_types import DATE, ID, NAME, PATH, QUANTITY, VERSION, expected_type, has_candidate
from store.ranking import Ranking, fuse


@pytest.mark.parametrize(
    ("query", "kind"),
    [
        ("Where did I buy my new bookshelf from?", NAME),
        ("What breed is my dog?", NAME),
        ("Which restaurant in Rome did you recommend?", NAME),
        ("Who reviewed the migration PR?", NAME),
        ("How long did it take me to assemble the bookshelf?", QUANTITY),
        ("How many replicas does staging run?", QUANTITY),
        ("What port does the admin API listen on?", QUANTITY),
        ("When is my sister's wedding?", DATE),
        ("What date did we pick for the launch?", DATE),
        ("Which file holds the migration?", PATH),
        # Plurals ask for the same kind (issue 28: "Which scripts holds the moved?" asked for none).
        ("Which scripts hold the migration?", PATH),
        ("Which directories did the deploy touch?", PATH),
        ("What releases of the server are pinned?", VERSION),
        ("Which tickets track the rotation?", ID),
        ("What uvicorn version is pinned?", VERSION),
        ("What is the customer's reservation code?", ID),
        ("How does the code handle retries?", None),
        ("Can you remind me what you said about front-end development?", None),
        ("Why did the deploy fail?", None),
    ],
)
def test_the_question_word_names_the_answer_type(query, kind):
    assert expected_type(query) == kind


def test_a_candidate_must_be_new_to_the_question():
    query = "How long did the IKEA bookshelf take to assemble?"
    assert has_candidate("It took me 4 hours, not too bad.", QUANTITY, query)
    assert not has_candidate("Assembling furniture is tiring.", QUANTITY, query)
    assert has_candidate("The bookshelf came from IKEA and Target.", NAME, "Where is it from?")
    # The question's own names are its subject, and a sentence's first word is not a name.
    assert not has_candidate("I love the IKEA bookshelf. Books fit well.", NAME, query)
    assert has_candidate("We fly on June 10 to Lisbon.", DATE, "When do we fly?")
    assert not has_candidate("We fly soon, I think.", DATE, "When do we fly?")
    # Digits inside the question are not an answer to it.
    assert not has_candidate("port 8080 is busy", QUANTITY, "What port, 8080 or not?")


def _row(event_id: str, role: str, parent: str, text: str, score: float) -> dict:
    return {"event_id": event_id, "chunk": 0, "role": role, "created": 0.0, "parent": parent,
            "text": text, "_score": score}


def test_the_turn_stating_the_fact_outranks_the_one_that_talks_most_about_the_subject():
    rows = [
        _row("u1", "user", "", "I just love my new bookshelf, my books are all organized now "
             "and the bookshelf fits the room", 9.0),
        _row("a1", "assistant", "u1", "That sounds lovely!", 1.0),
        _row("u2", "user", "a1", "By the way the bookshelf is from IKEA, it was on sale.", 8.0),
    ]
    query = "Where did I buy my new bookshelf?"
    # Phrases off: u1 alone holds the question's "new bookshelf" (Ranking.phrase outweighs the
    # answer type there; store/ranking.py).
    base = Ranking(phrase=0.0)
    off = fuse([rows], query, 3, Ranking(answer_type=0.0, phrase=0.0))
    assert off[0].event_id == "u1"
    on = fuse([rows], query, 3, base)
    assert on[0].event_id == "u2"
    assert on[0].score == pytest.approx(8.0 / 9.0 + Ranking().role_prior + Ranking().answer_type)
    # A question that names no answer type ranks as before.
    plain = "Tell me about my new bookshelf"
    assert [h.event_id for h in fuse([rows], plain, 3, base)] == [
        h.event_id for h in fuse([rows], plain, 3, Ranking(answer_type=0.0, phrase=0.0))]


def test_a_tool_log_counts_a_candidate_only_on_the_line_that_holds_the_question():
    """Logs are full of numbers, dates and names; the path must be on the fact's own line."""
    log = "\n".join(f"2024-06-{day:02d}T10:00 INFO migration: worker queue /srv/app/x{day}.py"
                    for day in range(1, 12))
    fact = "\n".join(["2024-06-01T10:00 INFO retry: worker queue cache",
                      "NOTE the file that holds the migration is /srv/app/migrations/0042_add_ledger.py",
                      "2024-06-02T10:00 INFO retry: worker queue cache"])
    prose = "2024-06-01T10:00 INFO the file holds migration settings"
    rows = [_row("t1", "tool", "a0", log, 5.0), _row("t2", "tool", "a1", fact, 3.0),
            _row("t3", "tool", "a2", prose, 3.0)]
    query = "Which file holds the migration?"
    without = {h.event_id: h.score for h in fuse([rows], query, 3, Ranking(answer_type=0.0))}
    hits = {h.event_id: h.score for h in fuse([rows], query, 3, Ranking())}
    assert hits["t2"] == pytest.approx(without["t2"] + Ranking().answer_type)
    # t1 has paths on lines that hold one query word; t3's best line holds no path.
    assert hits["t1"] == pytest.approx(without["t1"])
    assert hits["t3"] == pytest.approx(without["t3"])


@pytest.mark.parametrize(
    ("query", "kind", "text", "found"),
    [
        ("What is the staging deploy id?", ID, "rollbacks use DEP-58213 from now on", True),
        ("Which booking reference did the client have?", ID, "the client booked it last week", False),
        ("Which release of the server are we locked to?", VERSION, "pinned uvicorn 0.30.1 today", True),
        ("What version is pinned?", VERSION, "pinned since 2024", False),
        ("Where is the schema script located?", NAME, "it lives in /srv/app/migrations/0042.py", True),
        ("When does the token expire?", DATE, "the token expires on 2024-09-30", True),
        ("When does the token expire?", DATE, "it expires next Friday", True),
    ],
)
def test_structured_candidates_are_the_summary_blocks_exact_values(query, kind, text, found):
    assert expected_type(query) == kind
    assert has_candidate(text, kind, query) is found


@pytest.mark.parametrize(
    ("query", "text", "found"),
    [
        ("Which region holds the tenant bucket?", "NOTE The tenant bucket lives in region us-east-2.", True),
        ("Where is the app hosted?", "deployed to europe-west4 this morning", True),
        ("Where is the app hosted?", "replicas in ap-southeast-1 and eu-west-1", True),
        ("Which region holds the tenant bucket?", "INFO handler: region bucket tenant field", False),
        ("Which region is the bucket in, still us-east-2?", "the bucket is in us-east-2", False),  # the question's own value
        ("Which region holds the tenant bucket?", "pinned build 2.3-east-1 of the tenant bucket", False),
    ],
)
def test_a_cloud_region_answers_which_region_and_where(query, text, found):
    assert expected_type(query) == NAME
    assert has_candidate(text, NAME, query) is found


def test_a_log_line_naming_the_region_outranks_filler_with_the_same_words():
    """Filler log lines repeat "region", "tenant" and "bucket" as often as the fact's line; the
    fact's line alone holds a region."""
    filler = "2024-06-15T23:14 INFO signal: region bucket tenant field index replica review field"
    fact = "NOTE The tenant bucket lives in region us-east-2."
    rows = [_row("t1", "tool", "a0", filler, 5.2), _row("t2", "tool", "a1", fact, 5.0)]
    query = "Which region holds the tenant bucket?"
    assert fuse([rows], query, 2, Ranking(answer_type=0.0, phrase=0.0))[0].event_id == "t1"
    assert fuse([rows], query, 2, Ranking(phrase=0.0))[0].event_id == "t2"
