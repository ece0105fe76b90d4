"""Recall search latency and quality on a realistic ~500-event session.

    .venv/bin/python bench/search_latency.py [--cases 10] [--queries 100] [--ranking pre]

Builds one session from a LongMemEval haystack (~500 real chat turns, 5 to 10,000 chars) with
ten planted facts, then reports:

- build time: one bulk `add` (a reindex or a cold catch-up), and the same session grown two
  events per `add` as a live gateway would, with background maintenance running;
- search p50/p99 over `--queries` queries, on both builds, with and without 50 excluded events;
- hit@5 of the planted facts, asked by keyword and by paraphrase;
- hit@5 on `--cases` LongMemEval questions, each over its own ~500-turn session;
- search p50/p99 on a ~500-event agent session (user turn, tool call, 300-2,500-token tool
  output per round: the tool-result line scoring of store/passages.py runs on every search).
"""

from __future__ import annotations

import argparse
import asyncio
import glob
import json
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from simulator.workloads import synthetic_session  # noqa: E402
from store.embedders import WordLlamaEmbedder  # noqa: E402
from store.index import IndexedEvent, Ranking, SearchIndex  # noqa: E402

DATA = "/work/shared/data/longmemeval/*.json"
# --ranking: the default, or the ranking before exchange pairing and tool-result lines.
RANKINGS = {
    "default": None,
    "pre": Ranking(role_prior=0.0, exchange=0.0, tool_lines=0.0, text_extra=0),
}

# (fact planted in a user turn, keyword query, paraphrased query)
PLANTED = [
    ("My reservation code for the Lisbon hotel is ZFA04Y.",
     "reservation code ZFA04Y", "what was the booking reference for the hotel in Portugal"),
    ("My daughter's violin recital is on June 14 at the community hall.",
     "violin recital June 14", "when is the kid's music performance"),
    ("The wifi password at the cabin is tangerine-otter-42.",
     "cabin wifi password tangerine-otter-42", "how do I get online at the holiday lodge"),
    ("I'm allergic to penicillin, it gave me hives as a child.",
     "allergic to penicillin", "which antibiotic can't I take"),
    ("Our landlord said the rent goes up to 2,150 dollars in September.",
     "rent 2,150 September landlord", "how much will my apartment cost after the increase"),
    ("My sister Priya is moving to Wellington next spring for her PhD.",
     "Priya Wellington PhD", "where is my sibling relocating for graduate school"),
    ("The build server's disk filled up because of stale Docker layers in /var/lib/docker.",
     "stale Docker layers /var/lib/docker", "why did the CI machine run out of storage"),
    ("I switched my running shoes to the Hoka Clifton 9 after the knee pain.",
     "Hoka Clifton 9", "what sneakers do I jog in now"),
    ("The quarterly board meeting is moved to the 3rd floor conference room B.",
     "board meeting conference room B", "where will the directors gather this quarter"),
    ("My passport number ends in 7731 and it expires in March 2027.",
     "passport 7731 expires March 2027", "when does my travel document run out"),
]


def load_case(path: str) -> tuple[list[IndexedEvent], dict]:
    case = json.loads(Path(path).read_text())
    turns = [turn for session in case["haystack_sessions"] for turn in session]
    events = [
        IndexedEvent(f"e{seq}", seq, turn["role"], 1_700_000_000.0 + 60 * seq, turn["content"])
        for seq, turn in enumerate(turns)
    ]
    return events, case


def plant(events: list[IndexedEvent]) -> tuple[list[IndexedEvent], dict[str, str]]:
    """Replace spread-out user turns with the planted facts; returns events and fact→event id."""
    events = list(events)
    where: dict[str, str] = {}
    step = len(events) // (len(PLANTED) + 1)
    for n, (fact, _, _) in enumerate(PLANTED):
        seq = step * (n + 1)
        old = events[seq]
        events[seq] = IndexedEvent(old.event_id, old.seq, "user", old.created, fact)
        where[fact] = old.event_id
    return events, where


def percentiles(samples: list[float]) -> str:
    ordered = sorted(samples)
    p99 = ordered[min(len(ordered) - 1, round(0.99 * (len(ordered) - 1)))]
    return f"p50 {statistics.median(ordered) * 1000:6.2f} ms   p99 {p99 * 1000:6.2f} ms"


async def time_searches(
    index: SearchIndex, key: str, queries: list[str], exclude: frozenset[str] = frozenset()
) -> list[float]:
    for query in queries[:5]:  # warm caches; the first query of a process pays for them
        await index.search(key, query, exclude_event_ids=exclude)
    samples = []
    for query in queries:
        start = time.perf_counter()
        await index.search(key, query, exclude_event_ids=exclude)
        samples.append(time.perf_counter() - start)
    return samples


async def wait_for_maintenance(index: SearchIndex) -> None:
    while index._maintenance:
        await asyncio.gather(*index._maintenance.values(), return_exceptions=True)


async def main(cases: int, query_count: int, ranking: Ranking | None = None) -> None:
    paths = sorted(glob.glob(DATA))
    embedder = WordLlamaEmbedder()
    await embedder.embed(["warm up"])  # model load is a one-off, not part of build time
    events, case = load_case(paths[0])
    events, fact_event = plant(events)
    lengths = sorted(len(event.text) for event in events)
    print(f"session: {len(events)} events, text length median {lengths[len(lengths) // 2]}, "
          f"max {lengths[-1]} chars; {case['question_id']}")

    rng = random.Random(1)
    other_questions = [json.loads(Path(p).read_text())["question"] for p in paths[1:]]
    queries = [q for _, keyword, paraphrase in PLANTED for q in (keyword, paraphrase)]
    queries += [rng.choice(other_questions) for _ in range(query_count - len(queries))]
    excluded = frozenset(event.event_id for event in events[-50:])

    with tempfile.TemporaryDirectory() as root:
        index = SearchIndex(str(Path(root) / "index"), embedder, ranking=ranking)

        start = time.perf_counter()
        chunks = await index.add("bulk", events)
        print(f"build, one bulk add: {time.perf_counter() - start:.2f} s for {chunks} chunks")

        add_times = []
        start = time.perf_counter()
        for n in range(0, len(events), 2):
            t0 = time.perf_counter()
            await index.add("live", events[n : n + 2])
            add_times.append(time.perf_counter() - t0)
        grown = time.perf_counter() - start
        print(f"build, {len(add_times)} adds of 2 events: {grown:.2f} s, add {percentiles(add_times)}")

        print(f"search ({len(queries)} queries, limit 5):")
        print(f"  bulk-built session           {percentiles(await time_searches(index, 'bulk', queries))}")
        print(f"  grown, maintenance pending   {percentiles(await time_searches(index, 'live', queries))}")
        await wait_for_maintenance(index)
        print(f"  grown, after maintenance     {percentiles(await time_searches(index, 'live', queries))}")
        print(f"  bulk, 50 events excluded     "
              f"{percentiles(await time_searches(index, 'bulk', queries, excluded))}")

        for label, column in (("keyword", 1), ("paraphrase", 2)):
            found = 0
            for planted in PLANTED:
                hits = await index.search("bulk", planted[column], limit=5)
                found += fact_event[planted[0]] in [hit.event_id for hit in hits]
            print(f"planted facts hit@5, {label:<10} {found}/{len(PLANTED)}")

        found = 0
        for path in paths[:cases]:
            case_events, case = load_case(path)
            key = f"case:{case['question_id']}"
            await index.add(key, case_events)
            evidence = {
                f"e{seq}"
                for seq, turn in enumerate(t for s in case["haystack_sessions"] for t in s)
                if turn.get("has_answer")
            }
            hits = await index.search(key, case["question"], limit=5)
            found += bool(evidence & {hit.event_id for hit in hits})
        if cases:
            print(f"LongMemEval questions hit@5 (evidence turn in top 5): {found}/{cases}")

        agent = agent_events(rounds=170)
        await index.add("agent", agent)
        asked = [q for fact in synthetic_session(1, rounds=170).facts for q in (fact.question, fact.paraphrase)]
        asked = (asked * (len(queries) // len(asked) + 1))[: len(queries)]
        print(f"agent session: {len(agent)} events; search {percentiles(await time_searches(index, 'agent', asked))}")
        index.close()


def agent_events(rounds: int) -> list[IndexedEvent]:
    """simulator.workloads' synthetic agent session as ledger events (user, tool call, tool)."""
    events: list[IndexedEvent] = []
    for r in synthetic_session(1, rounds=rounds).rounds:
        for role, text in (("user", r["user"]), ("assistant", f"[called {r['tool']}({json.dumps(r['args'])})]"),
                           ("tool", r["output"])):
            seq = len(events)
            events.append(IndexedEvent(f"g{seq}", seq, role, 1_700_000_000.0 + 60 * seq, text,
                                       events[-1].event_id if events else ""))
    return events


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cases", type=int, default=10, help="LongMemEval questions to score")
    parser.add_argument("--queries", type=int, default=100, help="timed queries per run")
    parser.add_argument("--ranking", choices=sorted(RANKINGS), default="default")
    arguments = parser.parse_args()
    asyncio.run(main(arguments.cases, arguments.queries, RANKINGS[arguments.ranking]))
