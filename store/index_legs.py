"""The two legs of a recall search as LanceDB queries, and the filter that scopes them.

`store.index.SearchIndex.search` runs both at the same depth (BM25 a little deeper, see
`Ranking.text_extra`) and fuses them with `store.ranking.fuse`.
"""

from __future__ import annotations

import asyncio

import lancedb

from store.answer_types import expected_type, has_candidate

__all__ = ["FLAT_LEG", "PREFILTER_WITHIN", "flat_to_depth", "retrieve", "scope_filter", "sql_string"]

# A search scope (`within`) up to this size is a prefilter inside LanceDB, a larger one a
# post-filter: filtered after retrieval, a few events' scope made each leg re-query deeper and
# deeper, reading the whole session's rows, text included, several times.
PREFILTER_WITHIN = 512


# A BM25 leg whose last row still scores this share of its best is flat down to its depth: its
# rows matched one word that many events hold alike ("script", the kind word of every .py path in
# a directory listing), and the row holding the question's other words may sit just below the cut
# (issue 28: a fact line at BM25 rank 40-60 behind listing chunks). Such a search reads once
# twice as deep; a leg with a clear head (nearly every search) costs nothing more.
FLAT_LEG = 0.9


def flat_to_depth(rows: list[dict], depth: int) -> bool:
    """Whether a BM25 leg filled `depth` rows whose last scores at least FLAT_LEG of its first."""
    return len(rows) >= depth > 0 and rows[-1].get("_score", 0.0) >= FLAT_LEG * rows[0].get("_score", 0.0) > 0


def deeper_by(rows: list[dict], depth: int, hits: list, query: str) -> int:
    """How much deeper a first search reads once: 4x for a full leg of mostly tool-output rows
    when `query` asks for a type of answer and no tool hit's best line holds a candidate of it
    (log filler repeats the question's words, and the fact's line sat at BM25 rank 40-100,
    bench/ranking.py toollog); else 2x for a flat BM25 leg (`flat_to_depth`); else 1, not
    again. An empty `query` (answer types off) never reads 4x deeper."""
    if len(rows) < depth or depth <= 0:
        return 1
    kind = expected_type(query) if query else None
    if kind and 2 * sum(row.get("role") == "tool" for row in rows) >= len(rows) and not any(
            hit.role == "tool" and hit.line and has_candidate(hit.line, kind, query) for hit in hits):
        return 4
    return 2 if flat_to_depth(rows, depth) else 1


def sql_string(value: str) -> str:
    return "'" + value.replace("'", "''") + "'"


def scope_filter(session_key: str, within: frozenset[str] | None) -> str:
    """The WHERE clause of both legs: the session (a second lock beside the per-session table)
    and, when small enough, the scope."""
    where = f"session_key = {sql_string(session_key)}"
    if within is not None and len(within) <= PREFILTER_WITHIN:
        where += f" AND event_id IN ({', '.join(sql_string(event_id) for event_id in sorted(within))})"
    return where


async def retrieve(
    table: lancedb.table.AsyncTable,
    where: str,
    text: str,
    vector,
    columns: list[str],
    depth: int,
    text_depth: int,
    expansion: str = "",
    kind: str = "",
) -> tuple[list[dict], ...]:
    """(BM25 rows with `_score`, vector rows with `_distance`), best first, run concurrently;
    with an `expansion`, a leg more: BM25 rows for its words alone, each marked `_expansion`;
    with a `kind` (a made-up kind word, store/kinds.py), a leg more: the rows holding a value of
    that kind, each marked `_kind`."""

    def text_leg(words: str, limit: int):
        return (table.query().nearest_to_text(words, columns="text").where(where)
                .select([*columns, "_score"]).limit(limit).to_list())

    legs = [
        text_leg(text, text_depth),
        table.query()
        .nearest_to(vector)
        .distance_type("dot")
        .where(where)
        .select([*columns, "_distance"])
        .limit(depth)
        .to_list(),
    ]
    marks = []
    if expansion.strip():
        legs.append(text_leg(expansion, depth))
        marks.append("_expansion")
    if kind:
        legs.append(text_leg(kind, depth))
        marks.append("_kind")
    found = await asyncio.gather(*legs)
    for rows, mark in zip(found[2:], marks):
        for row in rows:
            row[mark] = True
    return tuple(found)
