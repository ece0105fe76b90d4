"""What keeps the recall index's working memory bounded under load: scoped searches
prefilter instead of re-querying deeper and deeper, and embeddings go in bounded batches."""

import asyncio
import random

import numpy as np

import store.embedders as embedders
import store.index_legs as index_module
from store.index import IndexedEvent, SearchIndex


def session_of_many_conversations() -> tuple[list[IndexedEvent], frozenset[str]]:
    """300 events about the garden from other conversations, and one conversation of 6 events
    that match the query only weakly: after retrieval, it sits far below the session's top."""
    rng = random.Random(3)
    others = [IndexedEvent(f"g{n}", n, "user", float(n), f"The garden roses need water {rng.randint(1, 9)} times; "
                                                           f"the garden hose is in shed {n}.") for n in range(300)]
    ours = [IndexedEvent(f"o{n}", 300 + n, "user", 300.0 + n, text) for n, text in enumerate([
        "Let us plan the quarterly budget review.", "The build failed with a KeyError in the loader.",
        "I water the garden on Sundays.", "Remind me to renew my passport.", "Chickpeas and spinach for dinner.",
        "The retrospective moved to Thursday."])]
    return others + ours, frozenset(event.event_id for event in ours)


def count_queries(index: SearchIndex, session_key: str) -> list[int]:
    calls = [0]
    table = index._open[session_key].table
    original = table.query

    def query():
        calls[0] += 1
        return original()

    table.query = query
    return calls


async def test_a_small_scope_is_searched_in_one_round_and_finds_its_weak_match(index):
    events, ours = session_of_many_conversations()
    await index.add("s", events)
    calls = count_queries(index, "s")

    hits = await index.search("s", "when do I water the garden", limit=3, within=ours)

    assert hits and hits[0].event_id == "o2"
    assert {hit.event_id for hit in hits} <= ours
    assert calls[0] == 2  # one text and one vector query: the scope filtered inside LanceDB


async def test_a_scope_over_the_prefilter_limit_is_filtered_after_retrieval(index, monkeypatch):
    events, ours = session_of_many_conversations()
    await index.add("s", events)
    prefiltered = await index.search("s", "when do I water the garden", limit=3, within=ours)
    monkeypatch.setattr(index_module, "PREFILTER_WITHIN", len(ours) - 1)
    calls = count_queries(index, "s")

    hits = await index.search("s", "when do I water the garden", limit=3, within=ours)

    assert hits[0].event_id == prefiltered[0].event_id == "o2"
    assert {hit.event_id for hit in hits} <= ours
    assert calls[0] > 2  # the old path: deeper rounds until the scope filled the list


async def test_scoped_search_with_exclusions_still_never_returns_them(index):
    events, ours = session_of_many_conversations()
    await index.add("s", events)

    hits = await index.search("s", "when do I water the garden", limit=5, within=ours,
                              exclude_event_ids=frozenset({"o2"}))

    assert hits and "o2" not in {hit.event_id for hit in hits}
    assert {hit.event_id for hit in hits} <= ours


async def test_wordllama_embeds_in_bounded_batches_with_the_same_vectors(embedder, monkeypatch):
    rng = random.Random(5)
    texts = [" ".join(rng.choices(["alpha", "beta", "gamma", "delta", "epsilon", "zeta"], k=rng.randint(1, 300)))
             for _ in range(3 * embedders.EMBED_BATCH + 5)]
    alone = np.stack([(await embedder.embed([text]))[0] for text in texts])
    model = embedder._loaded()
    seen: list[int] = []
    original = type(model).embed

    def spy(self, batch, **kwargs):
        seen.append(len(batch))
        return original(self, batch, **kwargs)

    monkeypatch.setattr(type(model), "embed", spy)

    together = await embedder.embed(texts)

    assert max(seen) <= embedders.EMBED_BATCH and sum(seen) == len(texts)
    np.testing.assert_allclose(together, alone, rtol=1e-6, atol=1e-7)  # same rows, in the caller's order


async def test_concurrent_opens_of_a_table_without_its_text_index_build_it_once(index):
    # A crash between creating a session's table and its BM25 index leaves it without one; the
    # next opens (two searches at once, or a search racing an add) each try to build it, and
    # LanceDB refuses the second CreateIndex. Found by bench/lance_memory.py.
    events, ours = session_of_many_conversations()
    await index.add("s", events)
    table = index._open["s"].table
    for built in await table.list_indices():
        await table.drop_index(built.name)
    index._open.clear()

    results = await asyncio.gather(*(index.search("s", "when do I water the garden", limit=3, within=ours)
                                     for _ in range(4)))

    assert all(hits and hits[0].event_id == "o2" for hits in results)
    reopened = await index._session("s")
    assert [i.index_type for i in await reopened.table.list_indices()] == ["FTS"]
