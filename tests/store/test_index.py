import random


from store.index import IndexedEvent, SearchIndex

_TOPICS = [
    "I finally repainted the kitchen cabinets a soft sage green over the weekend.",
    "Can you suggest a good stretching routine after a long run?",
    "The quarterly budget review moved to Thursday afternoon.",
    "Here is the stack trace from the failing build: KeyError in the config loader.",
    "We are thinking about adopting a rescue greyhound this spring.",
    "What is a quick vegetarian dinner that uses chickpeas and spinach?",
    "The team retrospective agreed to shorten stand-ups to ten minutes.",
    "Please summarise the article about coral reef restoration in Indonesia.",
    "My laptop battery drains fast when the external monitor is plugged in.",
    "I have been learning to bake sourdough but the crumb is too dense.",
    "Tool output: 14 files changed, 212 insertions, 37 deletions.",
    "Remind me to renew my passport before the trip to Lisbon.",
]


def noise(count: int, seed: int = 7, start: int = 0) -> list[IndexedEvent]:
    rng = random.Random(seed)
    return [
        IndexedEvent(
            event_id=f"e{seq}",
            seq=seq,
            role=rng.choice(["user", "assistant", "tool"]),
            created=1_700_000_000.0 + seq,
            text=" ".join(rng.sample(_TOPICS, 3)),
        )
        for seq in range(start, start + count)
    ]


def planted(events: list[IndexedEvent], seq: int, text: str) -> list[IndexedEvent]:
    events = list(events)
    old = events[seq]
    events[seq] = IndexedEvent(old.event_id, old.seq, "user", old.created, text)
    return events


async def test_exact_keyword_fact_is_top_hit(index):
    events = planted(noise(300), 3, "Your reservation code is ZFA04Y, keep it for check-in.")
    await index.add("tenant:s1", events)

    hits = await index.search("tenant:s1", "what was the reservation code ZFA04Y?")

    assert hits[0].event_id == "e3"
    assert "ZFA04Y" in hits[0].snippet
    assert len(hits) == 5
    assert [hit.score for hit in hits] == sorted((hit.score for hit in hits), reverse=True)


async def test_paraphrased_question_found_through_vectors(index):
    events = planted(noise(300), 42, "Note that my daughter's violin recital is on June 14.")
    await index.add("tenant:s1", events)

    hits = await index.search("tenant:s1", "when is the kid's music performance")

    assert "e42" in [hit.event_id for hit in hits[:3]]


async def test_sessions_are_isolated(index):
    secret = IndexedEvent("a1", 0, "user", 1.0, "The vault combination is 8812-QUOKKA.")
    await index.add("tenant-a:s", [secret])
    await index.add("tenant-b:s", noise(5))

    assert await index.search("tenant-b:s", "vault combination 8812-QUOKKA") != []
    hits = await index.search("tenant-b:s", "vault combination 8812-QUOKKA", limit=50)
    assert all(hit.event_id != "a1" for hit in hits)
    assert all("QUOKKA" not in hit.snippet for hit in hits)
    assert await index.search("tenant-c:s", "vault combination 8812-QUOKKA") == []
    assert (await index.search("tenant-a:s", "vault combination"))[0].event_id == "a1"


async def test_excluded_events_are_skipped_and_limit_still_filled(index):
    events = [
        IndexedEvent(f"g{seq}", seq, "tool", float(seq), f"gazebo inspection report number {seq}")
        for seq in range(40)
    ] + noise(100, start=40)
    await index.add("s", events)
    excluded = frozenset(f"g{seq}" for seq in range(30))

    hits = await index.search("s", "gazebo inspection report", limit=8, exclude_event_ids=excluded)

    assert len(hits) == 8
    assert not {hit.event_id for hit in hits} & excluded
    assert all(hit.event_id.startswith("g") for hit in hits)


async def test_search_within_a_branch_never_returns_the_other_branch(index):
    # Two conversations in one session share an opening; the other branch holds the best match
    # by far, and many of its events outrank everything on ours.
    opening = [IndexedEvent("hi", 0, "user", 0.0, "Hi"), IndexedEvent("hello", 1, "assistant", 1.0, "Hello!", "hi")]
    theirs = [IndexedEvent(f"t{n}", 2 + n, "user", 2.0 + n, f"my bank PIN is 44{n:02d} for account {n}", "hello")
              for n in range(60)]
    ours = [IndexedEvent("o1", 70, "user", 70.0, "I keep my bank statements in the blue folder.", "hello")]
    await index.add("s", opening + theirs + ours + noise(50, start=100))

    path = frozenset({"hi", "hello", "o1"})
    hits = await index.search("s", "what is my bank PIN", limit=5, within=path)

    assert hits and hits[0].event_id == "o1"
    assert {hit.event_id for hit in hits} <= path
    assert await index.search("s", "what is my bank PIN", within=frozenset()) == []


async def test_neighbour_borrowing_lifts_a_retrieved_answer_to_a_matching_question(index):
    from store.ranking import Ranking

    events = [
        IndexedEvent("q", 0, "user", 0.0, "Which hiking trail did you recommend near Lake Bled?"),
        IndexedEvent("a", 1, "assistant", 1.0, "Try the Vintgar Gorge hiking walk: two hours, gentle.", "q"),
    ] + noise(80, start=2)
    await index.add("s", events)

    # The question turn is an echo of the query, demoted by default: off here, to see borrowing alone.
    plain = await index.search("s", "hiking trail recommended near Lake Bled", limit=5, ranking=Ranking(neighbour=0.0, echo=1.0))
    lifted = await index.search("s", "hiking trail recommended near Lake Bled", limit=5, ranking=Ranking(neighbour=0.5, echo=1.0))

    score = lambda hits, eid: next((h.score for h in hits if h.event_id == eid), 0.0)  # noqa: E731
    assert score(lifted, "a") > score(plain, "a")
    assert [h.event_id for h in lifted][:2] == ["q", "a"]
    demoted = await index.search("s", "hiking trail recommended near Lake Bled", limit=5)
    assert [h.event_id for h in demoted][:2] == ["a", "q"]  # the answer above the question that asked for it


async def test_add_is_idempotent(index):
    events = noise(20)

    assert await index.add("s", events) == 20
    assert await index.add("s", events) == 0
    assert await index.add("s", events[5:10] + noise(2, start=20)) == 2

    hits = await index.search("s", "sourdough crumb", limit=100)
    assert len({hit.event_id for hit in hits}) == len(hits)
    assert len(hits) <= 22


async def test_indexed_seq_survives_reopening(tmp_path, embedder):
    path = str(tmp_path / "index")
    first = SearchIndex(path, embedder)
    assert first.indexed_seq("s") == -1
    await first.add("s", noise(12))
    assert first.indexed_seq("s") == 11
    first.close()

    second = SearchIndex(path, embedder)
    assert second.indexed_seq("s") == 11
    assert second.indexed_seq("other") == -1
    assert await second.add("s", noise(12)) == 0
    assert await second.add("s", noise(3, start=12)) == 3
    assert second.indexed_seq("s") == 14
    second.close()


async def test_long_event_is_chunked_and_found_by_its_end(index):
    filler = " ".join(f"line {n}: status ok, nothing to report." for n in range(400))
    long_text = filler + " Final verdict: the flux capacitor overheated at midnight."
    events = noise(30) + [IndexedEvent("log", 30, "tool", 31.0, long_text)]

    assert await index.add("s", events) > 31

    hits = await index.search("s", "flux capacitor overheated")
    assert hits[0].event_id == "log"
    assert hits[0].chunk > 0
    assert "flux capacitor" in hits[0].snippet
    assert len(hits[0].snippet) <= 320


async def test_search_immediately_after_add_finds_unindexed_rows(index):
    await index.add("s", noise(300))
    for seq in range(300, 305):  # each add is a fresh, not-yet-FTS-indexed fragment
        await index.add("s", [IndexedEvent(f"late{seq}", seq, "user", 0.0, f"late note {seq}")])
    await index.add("s", [IndexedEvent("new", 305, "user", 0.0, "Gate change: flight QX7719.")])

    hits = await index.search("s", "QX7719")

    assert hits[0].event_id == "new"
    assert index.indexed_seq("s") == 305


async def test_search_stays_correct_across_background_maintenance(index):
    for seq in range(60):  # enough appends to trigger optimize() more than once
        await index.add("s", [IndexedEvent(f"m{seq}", seq, "user", 0.0, f"memo {seq} walrus{seq}")])
    while index._maintenance:
        await next(iter(index._maintenance.values()))

    for seq in (0, 31, 59):
        hits = await index.search("s", f"walrus{seq}")
        assert hits[0].event_id == f"m{seq}"


async def test_empty_events_query_and_unknown_session(index):
    assert await index.add("s", [IndexedEvent("blank", 0, "assistant", 0.0, "  ")]) == 0
    assert index.indexed_seq("s") == 0
    assert await index.search("s", "anything") == []
    await index.add("s", noise(3, start=1))
    assert await index.search("s", "   ") == []


async def test_drop_session_and_reset(index):
    await index.add("a", noise(5))
    await index.add("b", noise(5))

    await index.drop_session("a")
    assert index.indexed_seq("a") == -1
    assert await index.search("a", "sourdough") == []
    assert await index.search("b", "sourdough") != []

    await index.reset()
    assert index.indexed_seq("b") == -1
    assert await index.search("b", "sourdough") == []
    assert await index.add("b", noise(5)) == 5


def _listings_and_a_log(listings: int) -> list[IndexedEvent]:
    """Asks for directory listings and the listings (each naming .py paths, so their kind words
    hold "script"), and one build log whose one line names a migration file."""
    rng = random.Random(3)
    dirs = ("worker", "cache", "queue", "render", "shard", "client", "stream", "parser")
    events = []
    for seq in range(listings):
        text = "\n".join(f"-rw-r--r-- 1 app app {rng.randint(100, 99999):>6} Jun {rng.randint(1, 28):>2} "
                         f"/srv/app/{rng.choice(dirs)}/{rng.choice(dirs)}_{n}.py" for n in range(60))
        # An agent's short asks name a .py path too: rows as short as the fact's line.
        ask = f"Step {seq}: please list dir on /srv/app/{rng.choice(dirs)}/{rng.choice(dirs)}.py."
        events.append(IndexedEvent(f"u{seq}", 2 * seq, "user", 1_700_000_000.0 + 2 * seq, ask))
        events.append(IndexedEvent(f"l{seq}", 2 * seq + 1, "tool", 1_700_000_001.0 + 2 * seq, text))
    log = [f"2024-06-{n % 28 + 1:02d} INFO build worker queue stage {n % 7} ok" for n in range(40)]
    log.insert(20, "NOTE the migration lives in /srv/app/migrations/0042_add_ledger.py")
    events.insert(listings, IndexedEvent("fact", 2 * listings, "tool", 1_700_000_000.0 + 2 * listings, "\n".join(log)))
    return events


async def test_a_bm25_leg_flat_down_to_its_depth_is_read_once_deeper(index, monkeypatch):
    import store.index_legs as legs

    await index.add("tenant:s1", _listings_and_a_log(60))
    query = "which scripts carry the relocation?"  # only "script" (a kind word) is in the session
    import store.index as index_module

    # Never flat, and no deeper read for a missing answer type: one read at the usual depth.
    monkeypatch.setattr(legs, "FLAT_LEG", 2.0)
    monkeypatch.setattr(index_module, "deeper_by", lambda rows, depth, hits, query: legs.deeper_by(rows, depth, hits, ""))
    shallow = await index.search("tenant:s1", query)
    monkeypatch.setattr(legs, "FLAT_LEG", 0.9)
    deep = await index.search("tenant:s1", query)
    # At the usual depth the BM25 leg holds listing chunks only, all matching "script" alike.
    assert "fact" not in [hit.event_id for hit in shallow]
    assert deep[0].event_id == "fact"
    assert "0042_add_ledger.py" in deep[0].line


def test_flat_to_depth_needs_a_full_leg_whose_last_row_scores_near_its_first():
    from store.index_legs import flat_to_depth

    rows = [{"_score": 1.79 - n * 0.001} for n in range(40)]
    assert flat_to_depth(rows, 40)
    assert not flat_to_depth(rows[:30], 40)  # the leg had no more rows: deeper finds none
    assert not flat_to_depth([{"_score": 9.0}] + rows[1:], 40)  # a clear head
    assert not flat_to_depth([], 0)


def _logs_repeating_the_question(logs: int) -> list[IndexedEvent]:
    """Tool logs whose every line repeats "region", "tenant" and "bucket" without naming a region,
    and one log whose one line does ("region us-east-2 holds the tenant bucket")."""
    rng = random.Random(4)
    words = ("handler", "latency", "field", "module", "render", "socket", "session", "commit")
    events = []
    for seq in range(logs):
        text = "\n".join(f"2024-06-{n % 28 + 1:02d}T10:{n:02d} INFO {rng.choice(words)}: region tenant bucket "
                         f"{rng.choice(words)} bucket region" for n in range(30))
        events.append(IndexedEvent(f"log{seq}", seq, "tool", 1_700_000_000.0 + seq, text))
    fact = [f"2024-06-{n % 28 + 1:02d}T11:{n:02d} INFO worker: {rng.choice(words)} {rng.choice(words)} ok"
            for n in range(30)]
    fact.insert(15, "NOTE region us-east-2 holds the tenant bucket.")
    events.append(IndexedEvent("fact", logs, "tool", 1_700_000_000.0 + logs, "\n".join(fact)))
    return events


async def test_a_tool_log_leg_without_the_asked_answer_is_read_deeper(index, monkeypatch):
    """No filler log names a region, so when the first read's hits hold no answer to "which
    region" the search reads once more, four times as deep (100 BM25 rows for 5 hits, not 40);
    once a hit's line names one, it reads once."""
    import store.index as index_module

    depths: list[int] = []
    original = index_module.retrieve

    async def recorded(table, where, text, vector, columns, depth, text_depth, *rest):
        depths.append(text_depth)
        return await original(table, where, text, vector, columns, depth, text_depth, *rest)

    monkeypatch.setattr(index_module, "retrieve", recorded)
    events = _logs_repeating_the_question(30)
    await index.add("tenant:filler", events[:-1])
    await index.add("tenant:fact", events)
    query = "Which region holds the tenant bucket?"
    await index.search("tenant:filler", query)
    assert depths == [40, 100]
    depths.clear()
    hits = await index.search("tenant:fact", query)
    assert depths == [40]
    assert hits[0].event_id == "fact" and "us-east-2" in hits[0].line
    depths.clear()  # no answer type asked: only the flat leg's read twice as deep, as before
    await index.search("tenant:filler", "Tell me about the tenant bucket region")
    assert depths == [40, 60]


def test_deeper_by_reads_a_tool_log_leg_four_times_deeper_when_no_hit_holds_the_answer():
    from types import SimpleNamespace

    from store.index_legs import deeper_by

    rows = [{"event_id": f"e{n}", "role": "tool", "_score": 9.0 - n * 0.1} for n in range(40)]
    filler = [SimpleNamespace(role="tool", line="INFO handler: region tenant bucket")]
    answered = [SimpleNamespace(role="tool", line="The tenant bucket lives in region us-east-2.")]
    query = "Which region holds the tenant bucket?"
    assert deeper_by(rows, 40, filler, query) == 4
    assert deeper_by(rows, 40, answered, query) == 1  # a hit's line holds a region
    assert deeper_by(rows, 40, filler, "Tell me about the tenant bucket") == 1  # no answer type asked
    assert deeper_by(rows, 40, filler, "") == 1  # answer types off
    assert deeper_by(rows[:30], 40, filler, query) == 1  # the leg had no more rows
    chat = [{**row, "role": "user"} for row in rows]
    assert deeper_by(chat, 40, filler, query) == 1  # not a tool-log leg
    flat = [{**row, "_score": 1.79 - n * 0.001} for n, row in enumerate(rows)]
    assert deeper_by(flat, 40, answered, query) == 2  # a flat leg reads twice as deep, as before
