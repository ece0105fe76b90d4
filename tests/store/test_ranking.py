"""store.ranking: fusion of the two legs, exchange pairing and the asked role."""

from __future__ import annotations

import pytest

from store.ranking import Ranking, asked_role, fuse, is_echo

OFF = Ranking(role_prior=0.0, exchange=0.0, phrase=0.0)


def _row(event_id: str, role: str, parent: str, text: str, **score: float) -> dict:
    return {"event_id": event_id, "chunk": 0, "role": role, "created": 0.0, "parent": parent,
            "text": text, **score}


def _chat() -> list[dict]:
    """A request that repeats the question's words and the reply that holds the answer."""
    return [
        _row("u1", "user", "", "Give me 100 prompt parameters that I can specify", _score=9.0),
        _row("a1", "assistant", "u1", "Sure: 1. Voice 2. Tone ... 27. Register", _score=3.0),
        _row("u2", "user", "a1", "Thanks, that helps", _score=1.0),
    ]


QUESTION = "Can you remind me what the 27th of the prompt parameters you listed was?"


@pytest.mark.parametrize(
    ("query", "role"),
    [
        ("I remember you provided a list of parameters; what was the 27th?", "assistant"),
        ("I'm looking back at our previous conversation about Bandung restaurants", "assistant"),
        ("Where did I meet Sophia?", "user"),
        ("What breed is my dog?", "user"),
        ("Can you remind me of the staging deploy id?", None),
        ("Which file holds the migration?", None),
    ],
)
def test_asked_role_reads_who_said_it_not_the_request_scaffolding(query, role):
    assert asked_role(query) == role


def test_a_question_about_the_assistants_words_ranks_the_reply_above_the_request():
    before = fuse([_chat()], QUESTION, 3, OFF)
    assert [hit.event_id for hit in before][:2] == ["u1", "a1"]
    after = fuse([_chat()], QUESTION, 3, Ranking())
    assert after[0].event_id == "a1"
    # The request holds the question's phrase ("prompt parameters"); the reply takes it too.
    assert after[0].score == pytest.approx(1.0 + Ranking().phrase + Ranking().role_prior)
    assert after[1].event_id == "u1"


def test_a_question_about_the_users_words_ranks_the_user_turn_above_the_reply():
    rows = [
        _row("u1", "user", "", "For Sophia, it was a coffee shop in the city.", _score=2.0),
        _row("a1", "assistant", "u1", "Here is the template with Sophia: how we met ...", _score=6.0),
    ]
    hits = fuse([rows], "Where did I meet Sophia?", 2, Ranking())
    assert [hit.event_id for hit in hits] == ["u1", "a1"]
    assert fuse([rows], "Where did I meet Sophia?", 2, OFF)[0].event_id == "a1"


def test_no_pairing_without_a_role_or_across_unrelated_turns():
    # No role asked: the order is the legs' own.
    assert fuse([_chat()], "prompt parameters 27th", 3, Ranking())[0].event_id == "u1"
    # The partner must be the turn the reply answers: a reply to a tool result borrows nothing.
    rows = [
        _row("u1", "user", "", "prompt parameters you listed", _score=9.0),
        _row("t1", "tool", "u1", "log", _score=0.5),
        _row("a1", "assistant", "t1", "done", _score=1.0),
    ]
    hits = fuse([rows], QUESTION, 3, Ranking())
    assert hits[0].event_id == "u1"
    assert hits[1].score == pytest.approx(1.0 / 9.0 + Ranking().role_prior)


def test_pairing_only_lends_between_retrieved_events():
    rows = _chat()[:1] + _chat()[2:]  # the reply was retrieved by neither leg
    hits = fuse([rows], QUESTION, 3, Ranking())
    assert [hit.event_id for hit in hits] == ["u1", "u2"]


def test_line_coverage_counts_query_words_found_together_on_one_line():
    from store.passages import line_coverage, terms

    wanted = terms("Which file holds the migration?")
    assert wanted == ["file", "hold", "migration"]
    log = "INFO migration migration retry\nINFO file cache\nNOTE the file that holds the migrations"
    assert line_coverage([log], wanted) == 1.0
    assert line_coverage(["INFO migration migration retry\nINFO file cache"], wanted) == pytest.approx(1 / 3)
    assert line_coverage(["nothing here"], wanted) == 0.0
    assert line_coverage([log], []) == 0.0


def test_a_tool_log_whose_one_line_holds_the_question_ranks_above_logs_repeating_a_word():
    filler = "\n".join(f"2024-06-{day:02d} INFO migration worker migration queue" for day in range(1, 20))
    fact = "\n".join([filler[:200], "NOTE the file that holds the migration is /srv/app/migrations/0042_add_ledger.py",
                      filler[:200]])
    rows = [
        _row("t1", "tool", "a0", filler, _score=6.0),
        _row("t2", "tool", "a1", fact, _score=3.0),
        _row("u1", "user", "", "Step 3: please read file on /srv/app/index/queue.py", _score=5.0),
    ]
    query = "Which file holds the migration?"
    plain = Ranking(tool_lines=0.0, answer_type=0.0, phrase=0.0)  # the fact line's "holds the migration" is a phrase too
    assert [hit.event_id for hit in fuse([rows], query, 3, plain)] == ["t1", "u1", "t2"]
    hits = fuse([rows], query, 3, Ranking(answer_type=0.0, phrase=0.0))
    assert hits[0].event_id == "t2"
    # A chat turn gets no line bonus: its score is the fused one.
    assert next(hit for hit in hits if hit.event_id == "u1").score == pytest.approx(5.0 / 6.0)


def test_snippet_shows_the_line_holding_every_term_not_the_first_window_that_reaches_it():
    from store.chunking import snippet

    filler = " ".join(f"INFO worker queue step{n}" for n in range(30))
    near = " ".join(f"INFO step{n}" for n in range(12))  # ~130 chars: both fit one 300-char window
    text = (filler + " migration " + near + " NOTE the file holds the migration: /srv/app/migrations/0042.py "
            + filler)
    shown = snippet(text, "Which file holds the migration?", 300)
    assert "/srv/app/migrations/0042.py" in shown
    assert shown.index("NOTE") < 150  # the fact sits in the first half, not cut at the end


def test_a_term_on_most_lines_of_a_long_output_is_structure_not_a_clue():
    from store.passages import line_coverage, terms

    wanted = terms("What is the staging deploy id?")  # staging, deploy, id
    names = ("deploy", "cache", "queue", "worker")
    rows = "\n".join(f'{{"id": {n}, "name": "{names[n % 4]}", "state": "ok"}}' for n in range(20))
    # "id" is on every row: only "deploy" (on a quarter of them) counts, a third of the question.
    assert line_coverage([rows], wanted) == pytest.approx(1 / 3)
    # A short output has no structure to discount.
    assert line_coverage(['{"id": 7, "name": "deploy"}'], wanted) == pytest.approx(2 / 3)
    # The ranking consequence: a user turn stating the fact stays above JSON rows that match
    # two of the three words on every line.
    chat = [
        _row("u1", "user", "", "Note: the staging deploy id is DEP-58213", _score=4.0),
        _row("t1", "tool", "a0", rows, _score=2.4),
    ]
    assert fuse([chat], "What is the staging deploy id?", 2, Ranking())[0].event_id == "u1"


def _listings_and_a_fact() -> list[dict]:
    """BM25 rows for "Which scripts holds the moved?": eight directory listings whose every
    line carries the kind word "script" (store/kinds.py: every .py path), scored alike, and
    the log holding the fact, whose line has "script" among its kind words once."""
    listing = "\n".join(f"-rw-r--r-- 1 app app {n} Jun 1 /srv/app/m{n}/x.py \u27e6python source script kindpath\u27e7"
                         for n in range(30))
    log = "\n".join(f"2024-06-{day:02d} INFO worker queue cache" for day in range(1, 20))
    fact = "\n".join([log, "NOTE the migration lives in /srv/app/migrations/0042_add_ledger.py "
                       "\u27e6python source script database migration schema change kindpath\u27e7", log])
    rows = [_row(f"t{n}", "tool", f"a{n}", listing, _score=1.79 - n * 0.001) for n in range(8)]
    return rows + [_row("fact", "tool", "a9", fact, _score=0.3)]


def test_a_bm25_leg_flat_over_many_events_does_not_outvote_the_line_that_holds_the_question():
    query = "Which scripts holds the moved?"
    rows = _listings_and_a_fact()
    # As before (issue 28): the best listing took the leg's full 1.0, above the fact.
    assert fuse([rows], query, 3, Ranking(text_margin=0.0))[0].event_id == "t0"
    # The leg's best is barely above its 5th event: it tells the listings apart from nothing
    # and counts little; the fact's line holding a query word (a path, as asked) wins.
    hits = fuse([rows], query, 3, Ranking())
    assert hits[0].event_id == "fact"
    assert "0042_add_ledger.py" in hits[0].line
    assert hits[1].score < 0.1


def test_a_bm25_leg_with_a_clear_winner_keeps_its_full_weight():
    rows = [_row("u1", "user", "", "the staging deploy id is DEP-58213", _score=9.0)]
    rows += [_row(f"t{n}", "tool", f"a{n}", "deploy queue worker", _score=3.0) for n in range(8)]
    hits = fuse([rows], "What is the staging deploy id?", 2, Ranking(tool_lines=0.0, answer_type=0.0, phrase=0.0))
    # (9 - 3) / 9 x 4 > 1: the margin caps at the full weight.
    assert hits[0].event_id == "u1" and hits[0].score == pytest.approx(1.0)


def _asked_twice() -> list[list[dict]]:
    """Both legs for the tool output that states the deploy id and the earlier ask of the same
    question, which matches the question's words and meaning best."""
    answer = "INFO staging deploy finished\nNOTE the staging deploy id is DEP-77123"
    ask = "RECALL: What is the staging deploy id?"
    text_leg = [_row("u9", "user", "a8", ask, _score=9.0), _row("t1", "tool", "a0", answer, _score=4.0)]
    vector_leg = [_row("u9", "user", "a8", ask, _distance=0.05), _row("t1", "tool", "a0", answer, _distance=0.45)]
    return [text_leg, vector_leg]


def test_a_repeated_question_ranks_the_answer_above_the_earlier_ask():
    query = "What is the staging deploy id?"
    assert [hit.event_id for hit in fuse(_asked_twice(), query, 2, Ranking())] == ["t1", "u9"]  # demoted, not dropped
    assert fuse(_asked_twice(), query, 2, Ranking(echo=1.0))[0].event_id == "u9"


@pytest.mark.parametrize(
    ("text", "role", "query", "echo"),
    [
        ("RECALL: What is the staging deploy id?", "user", "What is the staging deploy id?", True),
        ("what's the staging deploy id again?", "user", "What is the staging deploy id?", True),
        ("Quick one: what is the staging deploy id for the eu cluster?", "user", "What is the staging deploy id?", True),
        ("cabin wifi password tangerine-otter-42", "user", "cabin wifi password tangerine-otter-42", True),
        # Statements of the answer are not echoes, even when they repeat the query's words.
        ("The wifi password at the cabin is tangerine-otter-42.", "user", "cabin wifi password tangerine-otter-42", False),
        ("My passport number ends in 7731 and it expires in March 2027.", "user", "passport 7731 expires March 2027", False),
        ("The staging deploy id is DEP-77123.", "assistant", "What is the staging deploy id?", False),
        # An assistant asking back is not the user's question.
        ("Which staging deploy id do you mean, the old one or the new one?", "assistant", "What is the staging deploy id?", False),
    ],
)
def test_what_counts_as_an_echo_of_the_query(text, role, query, echo):
    assert is_echo(text, role, query) is echo
