"""Query expansion with the summary's entity names: recall that bridges a paraphrase.

A later question rarely repeats the words of the turn that holds its answer ("which issue did I
open for changing the staging DB credentials?" for "OPS-4411 tracks the staging database
password rotation"), but the summary, written by a model that read both, often states the
fact in words that overlap the question and names the entity: "- Opened OPS-4411 to rotate
the staging credentials". So the text leg of a search also looks for the entities (names,
ids, versions, e-mails) of the summary units (lines, sentences) that share
content words with the query: the entity is rare and exact, and the event that holds it
matches it strongly. The vector leg embeds the query alone, and ranking (echoes, answer types)
reads the query alone: expansion only lets BM25 find the event by its entity.

Pure functions; the gateway passes the checkpoint's summary and state in.
"""

from __future__ import annotations

import re

from policies.extraction import values_in
from store.passages import terms

__all__ = ["expand_query", "summary_entities"]

MAX_TERMS = 3  # entities added to a query, most related first
# Not paths or urls: BM25 splits them into words, and their words ("srv", "app", "src") are in
# every path of the session, so they would pull the ranking towards any file listing.
ENTITY_KINDS = ("names", "ids", "versions", "emails")
_UNITS = re.compile(r"(?<=[.!?])\s+|\n+")


def summary_entities(summary: str | None, state: dict | None) -> tuple[str, ...]:
    """The entities of a checkpoint: its state's values of ENTITY_KINDS that the summary names,
    and those the summary itself holds, in order of appearance in the summary."""
    if not summary:
        return ()
    found = values_in(summary)
    named = [v for kind in ENTITY_KINDS for v in found.get(kind, ())]
    named += [v for kind in ENTITY_KINDS for v in (state or {}).get(kind) or () if v in summary]
    named = list(dict.fromkeys(named))
    # The summary's raw capitalised runs ("Booked Ryokan Sakura") hold the cleaner name: keep that.
    named = [v for v in named if not any(o != v and o in v for o in named)]
    return tuple(sorted(named, key=summary.find))


def expand_query(query: str, summary: str | None, entities: tuple[str, ...], limit: int = MAX_TERMS) -> str:
    """Entity names the summary links to `query`, space-separated ("" when none): each from a
    summary unit (a line or sentence) sharing a content word with the query, most shared first,
    never one the query already holds. One shared word is enough: a paraphrase shares few."""
    wanted = set(terms(query))
    if not wanted or not summary or not entities or limit <= 0:
        return ""
    lowered = query.lower()
    scored: dict[str, int] = {}
    for unit in _UNITS.split(summary):
        shared = len(wanted & set(terms(_prose(unit))))
        if not shared:
            continue
        for entity in entities:
            if entity in unit and entity.lower() not in lowered:
                scored[entity] = max(scored.get(entity, 0), shared)
    order = {e: i for i, e in enumerate(entities)}
    best = sorted(scored, key=lambda e: (-scored[e], order[e]))[:limit]
    return " ".join(best)


# Values whose words are not the unit's own: a path's folders, a url's host.
_WORDY_VALUES = ("paths", "urls", "emails", "ids", "versions", "dates", "numbers")


def _prose(unit: str) -> str:
    """The unit without its exact values: what it *says*. "- DEP-58213, OPS-7731,
    /srv/app/release/migration.py, ..." (a list of values) says nothing, though its paths hold
    "release" and "migration"; linking it to every question that uses one of those words
    expanded each with the list's first entities."""
    found = values_in(unit)
    for kind in _WORDY_VALUES:
        for value in sorted(found.get(kind, ()), key=len, reverse=True):
            unit = unit.replace(value, " ")
    return unit
