"""Ranking recall hits: how the BM25 leg and the vector leg of a search become one list.

Both legs return chunks; `fuse` collapses them to events (an event scores what its best chunk
scores in each leg) and adds the legs by relative score fusion. A question and the answer to
it are one exchange, and the words of a later question usually sit in one half while the fact
sits in the other ("what did you recommend for the trip to Kyoto?" matches the user's turn;
the name of the inn is in the assistant's reply). So when the question points at a role ("you
recommended": the assistant; "did I": the user), an event of that role scores at least what
its exchange partner scores (`Ranking.exchange`, on by default). Borrowing a share of every
neighbour's score regardless of role (`Ranking.neighbour`) measured no better and is off. The
weights were tuned with `bench/ranking.py` on a fixed tuning split and are reported there on
a held-out split.

A turn that asks is not evidence for its own answer. Asked twice, "what is the staging deploy
id?" matches the earlier ask best on both legs (the same words, the same meaning), above the
tool output that states the id. So an *echo* of the query, an event that is a near-duplicate of
it or a user turn asking a question that matches it, keeps only `Ranking.echo` of its score and
none of the pairing and answer-type bonuses, unless it holds a value of the kind asked for. It
is demoted, not dropped: when nothing else matches, the earlier ask is still the best lead
(which events are echoes: store/echoes.py).
"""

from __future__ import annotations

import heapq
import re
from collections.abc import Iterable
from dataclasses import dataclass

from store.answer_types import expected_type, has_candidate
from store.chunking import snippet
from store.echoes import echoed_events, is_echo
from store.kinds import strip
from store.passages import best_line, phrases_in, query_phrases, terms

__all__ = ["REAL_MODEL_RANKING", "Hit", "Ranking", "fuse", "is_echo", "text_query", "vector_query"]

SNIPPET_CHARS = 300

_QUESTION = re.compile(
    r"\b(?:can|could|would|will|do|did|does|you|please|remind|tell|me|what|which|when|where|who|"
    r"whom|whose|why|how|was|were|is|are|the|a|an|again|earlier|previous|previously|"
    r"conversation|chat|mentioned|about|talked|discussed|said|told|recommended|suggested|"
    r"remember|recall|our|we|us|i|my)\b",
    re.I,
)


@dataclass(frozen=True)
class Ranking:
    """Knobs of `fuse`; the defaults are the tuned ones (see bench/ranking.py)."""

    # Cosine below which WordLlama vectors say "unrelated": its background similarity between
    # unrelated texts is ~0.25-0.3, and above the floor a clear BM25 winner is not outvoted.
    vector_floor: float = 0.3
    text_weight: float = 1.0
    # BM25 scores are divided by max(the leg's best, text_scale): a best match on common words
    # only (a paraphrase's) then stays below 1 instead of outvoting the vector leg (0 = off).
    text_scale: float = 0.0
    # > 0: the BM25 leg counts in proportion to its margin, min(1, k * (best - other) / best),
    # `other` the score of the `margin_rank`-th best other event: a flat leg counts little.
    # A leg whose best rows matched only a word found on many events is flat down to its 5th
    # event: "Which scripts hold ...?" matched "script", the kind word of every .py path of
    # every directory listing (store/kinds.py), and its arbitrary best listing scored a full
    # 1.0, above the fact whose line held the question's words (issue 28; the runner-up alone,
    # margin_rank 1, also damps the few turns of one conversation that share a question's
    # words). Tuned with bench/ranking.py: k 4 and rank 5 left every workload's hit@1 and
    # hit@5 unchanged on the tune split (k 2 or rank 3 lost a LongMemEval hit@5 and a tool-log
    # hit@1) and turned the rule-made "Which scripts holds the moved?" from rank None to 1.
    text_margin: float = 4.0
    margin_rank: int = 5
    # Tuned: 1.5 took LongMemEval hit@1 from 0.67 to 0.75 on the tuning split (0.69 to 0.71
    # held out); 2.0 measured the same, neighbour borrowing and query cleaning did not help.
    vector_weight: float = 1.5
    # Share of the best adjacent event's fused score an event borrows (0 = off). Only events
    # either leg retrieved are re-scored; a neighbour no leg found is not added.
    neighbour: float = 0.0
    # Embed the query without question scaffolding ("can you remind me what ...").
    clean_vector_query: bool = False
    # Same for the BM25 leg (LanceDB already drops English stop words and stems).
    clean_text_query: bool = False
    # Bonus for the role a question points at: "what did you suggest" asks about the assistant's
    # turns, "where did I meet Sophia" about the user's (0 = off). Tuned with `exchange` as the
    # tie-break between a turn and its partner (alone, 0.1-0.4 did not help).
    role_prior: float = 0.05
    # Exchange pairing: when a question points at a role, an event of that role scores at least
    # `exchange` x its exchange partner's score (a user turn's partner is the assistant reply to
    # it, an assistant turn's partner the user turn it answers; 0 = off). Tuned: 1.0 with
    # role_prior 0.05 took LongMemEval hit@1 0.750 -> 0.792 tuning, 0.714 -> 0.743 held out.
    exchange: float = 1.0
    # Tool results: add this x the share of the query's words found together on the best line
    # of the event's retrieved chunks (store/passages.py; 0 = off). Tuned: 1.0 (0.75 measured
    # the same, 1.5 worse) took facts in tool logs (bench/ranking.py `toollog`) 0.375 -> 0.425
    # tuning, 0.286 -> 0.304 held out, and the simulator's agent facts 0.667 -> 0.833 held out.
    tool_lines: float = 1.0
    # The BM25 leg fetches this many rows more than the vector leg (20 + 20 for 5 hits): a fact
    # line's chunk often ranks 20-40th among logs that repeat a query word, and `tool_lines`
    # can only lift what was fetched. Additive, so a search with many exclusions (depth 120)
    # does not pay for twice the rows.
    text_extra: int = 20
    # Bonus for an event whose best chunk holds a candidate of the answer type the question
    # asks for (a name for "where"/"which restaurant", a quantity for "how long", a date for
    # "when") that the question does not contain (store/answer_types.py; 0 = off). 0.2 took
    # LongMemEval hit@1 0.743 -> 0.829 held out (0.792 tuning, unchanged: only one of its
    # misses asks for a type) and changed no hit@1 of the agent, tool-log or planted facts
    # (0.05-0.2 measured alike there; 0.3 and 0.5 lost a planted fact).
    answer_type: float = 0.2
    # An echo of the query (see the module docstring) keeps this share of its fused score
    # (1 = off). Tuned with `bench/ranking.py`'s repeated asks: see bench/README.md, Recall.
    echo: float = 0.1
    # A query's expansion (the summary's entities linked to it, store/query_expansion.py) is a
    # BM25 leg of its own with this weight, beside the query's (0 = not searched). In the
    # query's own leg, an entity outvoted what the question's words matched: the best match of
    # an id the summary put next to the word "file" scored 1.0 and the event holding the answer
    # to "which file holds the migration?" came second.
    expansion_weight: float = 1.0
    # A question asking for a rare kind of value (store/kinds.py) retrieves the rows holding one
    # as a leg of its own, each worth this much (0 = not searched). The leg says only "holds a
    # value of that kind": each row counts alike, and a leg that filled its depth (the kind is
    # everywhere) counts for nothing.
    kind_weight: float = 1.5
    # Phrases: the best holder of the query's adjacent word pairs ("IKEA bookshelf", "back-end
    # programming languages") adds this, others in proportion (`_phrases`; 0 = off). Chosen on
    # bench/ranking.py's tune split (0.3 measured alike on LongMemEval, 0.5 also lifted a
    # tool-log fact): LongMemEval hit@1 0.792 -> 0.875 tune, 0.829 unchanged held out; tool-log
    # 0.425 -> 0.450 tune, 0.339 -> 0.357 held out; agent and planted facts unchanged.
    phrase: float = 0.5


# A real sentence model's cosines carry meaning (unrelated texts sit near 0-0.2, paraphrases
# well above), so its vector leg is trusted over a BM25 leg that matched common words only:
# BM25 scores are divided by max(best, 60), so only a leg with a strong lexical match counts in
# full. Tuned with all-MiniLM-L6-v2 (bench/ranking.py --embedder minilm --cases 12, a 36-point
# grid of floor x weight x text_scale, chosen by mean hit@1 then hit@5 over the workloads' tune
# splits): mean hit@1 tune 0.733 -> 0.821, held-out 0.677 -> 0.751 over WordLlama's weights
# (planted personal facts incl. paraphrases 0.60 -> 0.90 tune, 0.60 -> 0.82 held out). The
# weights before (floor 0.1, weight 3, text_scale 20): 0.775 / 0.734. Used by the built-in
# MiniLM embedder (store/minilm.py) and any configured /v1/embeddings model.
REAL_MODEL_RANKING = Ranking(vector_floor=0.3, vector_weight=1.5, text_scale=60.0)


@dataclass(frozen=True)
class Hit:
    event_id: str
    role: str
    created: float
    score: float
    snippet: str
    chunk: int
    # A tool result's best line (`_tool_lines`): what ranked it, so its passage shows that line.
    line: str = ""


def _cleaned(query: str) -> str:
    cleaned = " ".join(_QUESTION.sub(" ", query).split())
    return cleaned if len(cleaned) >= 3 else query


def vector_query(query: str, ranking: Ranking) -> str:
    """What the vector leg embeds: the query, or its content words when it still has some."""
    return _cleaned(query) if ranking.clean_vector_query else query


def text_query(query: str, ranking: Ranking) -> str:
    """What the BM25 leg matches: the query, or its content words when it still has some."""
    return _cleaned(query) if ranking.clean_text_query else query


def fuse(
    legs: Iterable[list[dict]], query: str, limit: int, ranking: Ranking = Ranking()
) -> list[Hit]:
    """Relative score fusion at event level; each event keeps its best-scoring chunk.

    Each leg's scores are put on a 0..1 scale and added: BM25 divided by the leg's best score,
    vector similarity as the cosine above `vector_floor`, rescaled (rows are unit vectors,
    LanceDB's "dot" distance is 1 - cosine). Unlike rank fusion this keeps the *margin*: a
    chunk that is the only one holding a rare query word (a reservation code, a ticket number)
    scores far above the rest of the BM25 leg, and a vector leg where every row is about
    equally (un)related adds almost the same to everyone instead of promoting its arbitrary
    first row. On the synthetic agent sessions this took top-1 recall of planted facts from
    19/36 to 30/36 over reciprocal rank fusion.

    Rows carry `seq` (the ledger's order) and, when indexed with it, `parent`: an event's
    neighbours are its parent and the events whose parent it is. Rows of the kind leg (marked `_kind`)
    each add `Ranking.kind_weight`.
    """
    legs = [rows for rows in legs if rows]
    kind = expected_type(query) if ranking.answer_type else None
    echoed = echoed_events(legs, query, kind) if ranking.echo < 1.0 else set()
    chunk_scores: dict[tuple[str, int], float] = {}
    chunk_rows: dict[tuple[str, int], dict] = {}
    event_scores: dict[str, float] = {}
    for rows in legs:
        if rows[0].get("_kind"):
            scores = [ranking.kind_weight] * len(rows)
        elif "_score" in rows[0]:
            # An echo matches the query's words best of all: the scale is the best other row's.
            fair = [row["_score"] for row in rows if row["event_id"] not in echoed] or [row["_score"] for row in rows]
            top = max(max(fair), ranking.text_scale) or 1.0
            weight = (ranking.expansion_weight if rows[0].get("_expansion") else ranking.text_weight) \
                * _margin([row for row in rows if row["event_id"] not in echoed] or rows,
                          ranking.text_margin, ranking.margin_rank)
            scores = [weight * row["_score"] / top for row in rows]
        else:
            floor = ranking.vector_floor
            scores = [
                ranking.vector_weight * max(0.0, (1.0 - row["_distance"] - floor) / (1.0 - floor))
                for row in rows
            ]
        leg_best: dict[str, float] = {}
        for row, score in zip(rows, scores):
            key = (row["event_id"], row["chunk"])
            chunk_scores[key] = chunk_scores.get(key, 0.0) + score
            chunk_rows.setdefault(key, row)
            leg_best[row["event_id"]] = max(leg_best.get(row["event_id"], 0.0), score)
        for event_id, score in leg_best.items():
            event_scores[event_id] = event_scores.get(event_id, 0.0) + score
    best_chunk: dict[str, tuple[str, int]] = {}
    for key, score in chunk_scores.items():
        current = best_chunk.get(key[0])
        if current is None or score > chunk_scores[current]:
            best_chunk[key[0]] = key
    echoes = {event_id: ranking.echo * event_scores[event_id] for event_id in echoed if event_id in event_scores}
    event_scores.update(echoes)
    if ranking.phrase:  # before pairing: a reply takes its request's phrase, as its words
        event_scores = _phrases(event_scores, chunk_rows, query, ranking.phrase, limit)
    if ranking.role_prior or ranking.exchange:
        wanted = asked_role(query)
        if wanted:
            rows = {event_id: chunk_rows[key] for event_id, key in best_chunk.items()}
            event_scores = _pair(event_scores, rows, wanted, ranking)
    if kind:  # a tool result's candidate must be on its best line (`_tool_lines`)
        for event_id, key in best_chunk.items():
            row = chunk_rows[key]
            if (row["role"] != "tool" or not ranking.tool_lines) and has_candidate(strip(row["text"]), kind, query):
                event_scores[event_id] += ranking.answer_type
    lines: dict[str, str] = {}
    if ranking.tool_lines:
        event_scores = _tool_lines(event_scores, chunk_rows, query, ranking.tool_lines, limit,
                                   kind, ranking.answer_type, lines)
    if ranking.neighbour:
        event_scores = _borrow(event_scores, {e: chunk_rows[k] for e, k in best_chunk.items()},
                               ranking.neighbour)
    event_scores.update(echoes)  # an echo takes none of the bonuses it may have been given
    hits = []
    for event_id, score in sorted(event_scores.items(), key=lambda item: -item[1])[:limit]:
        row = chunk_rows[best_chunk[event_id]]
        hits.append(
            Hit(
                event_id=event_id,
                role=row["role"],
                created=row["created"],
                score=score,
                snippet=snippet(strip(row["text"]), query, SNIPPET_CHARS),
                chunk=row["chunk"],
                line=lines.get(event_id, ""),
            )
        )
    return hits


def _tool_lines(
    scores: dict[str, float],
    chunk_rows: dict[tuple[str, int], dict],
    query: str,
    weight: float,
    keep: int,
    kind: str | None = None,
    answer: float = 0.0,
    lines: dict[str, str] | None = None,
) -> dict[str, float]:
    """Each tool event adds `weight` x the best line coverage of its retrieved chunks, and
    `answer` when that line holds a candidate of the answer type `kind` (a log's other lines
    are full of numbers, dates and names that answer nothing). `lines` receives each visited
    event's best line.

    Events are visited best first and the visit stops once even a full bonus could not lift an
    event into the best `keep`: the scan of a log's lines is the costly part, and the events
    past that point keep their fused score (they are not returned anyway).
    """
    wanted = terms(query)
    texts: dict[str, list[str]] = {}
    for (event_id, _), row in chunk_rows.items():
        if row["role"] == "tool":
            texts.setdefault(event_id, []).append(row["text"])
    if not wanted or not texts:
        return scores
    most = weight + (answer if kind else 0.0)
    lifted = dict(scores)
    best: list[float] = []  # min-heap of the `keep` best final scores so far
    for event_id, score in sorted(scores.items(), key=lambda item: -item[1]):
        if len(best) >= keep and score + most <= best[0]:
            break
        if event_id in texts:
            share, line = best_line(texts[event_id], wanted)
            line = strip(line)  # the line as the event holds it, without its kind words
            if lines is not None and line:
                lines[event_id] = line
            score += weight * share
            if kind and line and has_candidate(line, kind, query):
                score += answer
            lifted[event_id] = score
        if len(best) < keep:
            heapq.heappush(best, score)
        elif score > best[0]:
            heapq.heapreplace(best, score)
    return lifted


def _phrases(scores: dict[str, float], chunk_rows: dict[tuple[str, int], dict], query: str,
             weight: float, keep: int) -> dict[str, float]:
    """Each event that a full bonus could lift into the best `keep` adds `weight` x the share of
    the query's word pairs found adjacent in its retrieved chunks: of turns about one subject,
    the one naming the thing asked ("the IKEA bookshelf", "back-end programming languages")."""
    phrases = query_phrases(query)
    if not phrases or len(scores) <= 1:
        return scores
    bar = sorted(scores.values(), reverse=True)[min(keep, len(scores)) - 1] - weight
    texts: dict[str, list[str]] = {}
    for (event_id, _), row in chunk_rows.items():
        if scores.get(event_id, 0.0) > bar:
            texts.setdefault(event_id, []).append(strip(row["text"]))
    found = {event_id: phrases_in(chunks, phrases) for event_id, chunks in texts.items()}
    # A pair counts 1 / the number of those events holding it: the pair every turn of the
    # conversation repeats ("front-end", "back-end") tells none of them apart.
    held = [pair for pairs in found.values() for pair in pairs]
    if not held:
        return scores
    spread = {pair: held.count(pair) for pair in set(held)}
    worth = {event_id: sum(1 / spread[pair] for pair in pairs) for event_id, pairs in found.items()}
    best = max(worth.values())  # the best holder takes the full weight, as a leg's best row does
    return {event_id: score + weight * worth.get(event_id, 0.0) / best for event_id, score in scores.items()}


def _margin(rows: list[dict], k: float, rank: int = 1) -> float:
    """min(1, k x (best - the `rank`-th best other event's score) / best): how much a BM25 leg
    tells apart its best event from the rest (1 = fully)."""
    if k <= 0:
        return 1.0
    ranked = sorted(rows, key=lambda row: -row["_score"])
    best = ranked[0]
    seen = {best["event_id"]}
    other = 0.0
    for row in ranked:
        if row["event_id"] not in seen:
            seen.add(row["event_id"])
            if len(seen) > rank:
                other = row["_score"]
                break
    return min(1.0, k * (best["_score"] - other) / best["_score"]) if best["_score"] > 0 else 1.0


# "you recommended", "your list", "our previous conversation": what the assistant said. The
# request scaffolding ("can you remind me", "I was wondering") points at nobody.
_ASSISTANT_ASKED = re.compile(
    r"\byou\s+(?:\w+\s+){0,2}?(?:mentioned|provided|recommended|suggested|created|wrote|gave|"
    r"told|listed|shared|said|made|described|explained|offered|proposed|generated|came\s+up|"
    r"put\s+together)\b|\b(?:our|the)\s+(?:previous|earlier|last)\s+(?:conversation|chat|discussion)\b",
    re.I,
)
# "did I", "my dog", "I bought", "gave me": what the user said about themselves.
_USER_ASKED = re.compile(
    r"\b(?:did|do|have|had|was|am|were)\s+I\b|\bmy\b|\bI\s+(?:created|bought|got|made|met|took|"
    r"gave|went|had|spent|paid|tried|used|started|finished|replaced|upgraded)\b|"
    r"\b(?:gave|give|take|took|cost|sent)\s+me\b",
    re.I,
)


def asked_role(query: str) -> str | None:
    """The role whose turns a question about the conversation points at, if any."""
    if _ASSISTANT_ASKED.search(query):
        return "assistant"
    if _USER_ASKED.search(query):
        return "user"
    return None


def _pair(
    scores: dict[str, float], rows: dict[str, dict], wanted: str, ranking: Ranking
) -> dict[str, float]:
    """Exchange pairing for a question pointing at `wanted` (see `Ranking.exchange`).

    A question and its answer are one exchange, but their words split: "the 27th of the 100
    prompt parameters you listed" matches the user's request, the list is in the reply. Each
    retrieved event of the wanted role takes the larger of its own score and `exchange` x its
    retrieved partner's, plus `role_prior`, so the turn that holds the answer outranks the one
    that only asked for it. Scores come from before pairing, so nothing is counted twice.
    """
    other = "user" if wanted == "assistant" else "assistant"
    partners: dict[str, list[str]] = {}
    for event_id, row in rows.items():
        parent = row.get("parent")
        if not parent or parent not in rows:
            continue
        if wanted == "assistant" and row["role"] == "assistant" and rows[parent]["role"] == other:
            partners.setdefault(event_id, []).append(parent)
        elif wanted == "user" and row["role"] == other and rows[parent]["role"] == "user":
            partners.setdefault(parent, []).append(event_id)
    paired = dict(scores)
    for event_id, row in rows.items():
        if row["role"] != wanted:
            continue
        lent = max((scores[p] for p in partners.get(event_id, ())), default=0.0)
        paired[event_id] = max(scores[event_id], ranking.exchange * lent) + ranking.role_prior
    return paired


def _borrow(scores: dict[str, float], rows: dict[str, dict], share: float) -> dict[str, float]:
    """Each event adds `share` of its best-scoring neighbour's score (computed from the scores
    before borrowing, so nothing is counted twice)."""
    parent_of = {event_id: row.get("parent") for event_id, row in rows.items()}
    neighbours: dict[str, list[str]] = {event_id: [] for event_id in scores}
    for event_id, parent in parent_of.items():
        if parent and parent in neighbours:
            neighbours[event_id].append(parent)
            neighbours[parent].append(event_id)
    return {
        event_id: score + share * max((scores[n] for n in neighbours[event_id]), default=0.0)
        for event_id, score in scores.items()
    }
