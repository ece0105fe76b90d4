"""Kind words (store/kinds.py): a line holding a value is indexed with plain words naming the
value's kind, read from its shape, so a question naming the kind finds the line; the words
never show in what a search returns."""

from __future__ import annotations

import random
from dataclasses import replace

from store.index import LINE_ROW, IndexedEvent
from store.kinds import CLOSE, annotate, kind_token, kinds_of, notable_lines, strip

LOG_WORDS = "harbour lantern meadow copper violet thunder pebble orchard canyon glacier saffron compass".split()


def log(fact: str, seed: int, at: int = 40) -> str:
    rng = random.Random(seed)
    lines = [f"2024-06-01T10:{n % 60:02d} INFO worker: " + " ".join(rng.choices(LOG_WORDS, k=8)) for n in range(80)]
    lines.insert(at, fact)
    return "\n".join(lines)


def session(fact: str, where: int = 7) -> list[IndexedEvent]:
    return [IndexedEvent(f"e{n}", n, "tool", 1_700_000_000.0 + n, log(fact if n == where else "", n)) for n in range(20)]


def test_kinds_are_read_from_the_values_shape():
    assert "migration" in kinds_of("the change is in db/migrate/20240101_add_users.rb").split()
    assert "test" in kinds_of("FAILED test_payment_rounding (suite billing)").split()
    assert "test" in kinds_of("see spec/models/user_spec.rb and tests/test_api.py").split()
    assert {"version", "release", kind_token("version")} <= set(kinds_of("running gunicorn 21.2.0").split())
    assert {"ticket", kind_token("id")} <= set(kinds_of("tracked in INFRA-2231").split())
    assert "config" in kinds_of("edit /etc/nginx/nginx.conf").split()
    assert "amount" in kinds_of("the refund was $12.40 short").split()
    assert kinds_of("nothing to see here, just words") == ""
    assert kind_token("name") == "" and kind_token(None) == ""  # common kinds get no leg


def test_annotations_are_stripped_back_to_the_text():
    text = "first line\nrunning gunicorn 21.2.0 on tests/test_api.py\nlast line"
    annotated = annotate(text)
    assert annotated != text and CLOSE in annotated
    assert strip(annotated) == text
    assert annotated.split("\n")[0] == "first line"  # a line without values is left alone


async def test_a_question_naming_the_kind_finds_the_line_holding_one(index):
    await index.add("t:k", session("NOTE deployed with gunicorn 21.2.0 behind the balancer"))

    hits = await index.search("t:k", "which release of the web server do we run?")

    assert hits[0].event_id == "e7"
    assert "21.2.0" in hits[0].line and CLOSE not in hits[0].line and CLOSE not in hits[0].snippet


async def test_a_question_about_a_schema_change_finds_the_migration_file(index):
    await index.add("t:m", session("NOTE the users table lives in db/migrate/20240101_add_users.rb"))

    hits = await index.search("t:m", "where did we put the schema change for accounts?")

    assert hits[0].event_id == "e7"
    assert "20240101_add_users.rb" in hits[0].line


async def test_a_kind_held_by_every_row_lifts_none(index):
    # Every log holds a version: holding one says nothing, and the leg that would fetch an
    # arbitrary first few of them is dropped; the scores are those of a search without it.
    events = [IndexedEvent(f"e{n}", n, "tool", 1_700_000_000.0 + n,
                           log(f"build {n}.0.1 done" + (" for the invoice reconciler" if n == 3 else ""), n, at=n))
              for n in range(60)]
    await index.add("t:all", events)
    question = "which release of the invoice reconciler shipped?"

    hits = await index.search("t:all", question, limit=5)
    without = await index.search("t:all", question, limit=5, ranking=replace(index.ranking, kind_weight=0.0))

    assert hits[0].event_id == "e3"
    assert [(h.event_id, h.score) for h in hits] == [(h.event_id, h.score) for h in without]


def test_a_line_that_stands_apart_from_its_output_is_notable():
    output = log("NOTE the nightly job failed in test_vat_rounding, off by $0.02", 1)
    lines = output.split("\n")

    assert notable_lines(output) == [(40, lines[40])]
    assert notable_lines("a short output\nwith test_x in it") == []  # not a stack of records
    listing = "\n".join(f"-rw-r--r-- 1 app app {n} Jun 1 /srv/app/m{n}/v{n}.py" for n in range(30))
    assert notable_lines(listing) == []  # every line holds a path: that is its structure


async def test_a_notable_line_is_a_row_with_a_vector_of_its_own(index):
    # Inside a 1,200-character chunk of log lines the fact's meaning is averaged away; the
    # line's own row ranks the event, and the hit names that line.
    fact = "NOTE the nightly job failed in test_vat_rounding, off by $0.02"
    await index.add("t:n", session(fact))

    hits = await index.search("t:n", "which exam failed?")

    assert (hits[0].event_id, hits[0].chunk) == ("e7", LINE_ROW + 40) and hits[0].score > 0
    assert hits[0].line == fact
    assert ("e7", LINE_ROW + 40) in await index.chunk_keys("t:n")
