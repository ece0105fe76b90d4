"""Echoes of a query: the earlier asks that match a question best and answer nothing.

Asked twice, "what is the staging deploy id?" matches the earlier ask best on both legs (the
same words, the same meaning), above the tool output that states the id. `store.ranking.fuse`
keeps an echo's score low (`Ranking.echo`); this module says which retrieved events are echoes.
"""

from __future__ import annotations

import re
from functools import lru_cache

from store.answer_types import has_candidate
from store.kinds import strip
from store.chunking import STOP_WORDS
from store.passages import terms

__all__ = ["echoed_events", "is_echo"]


# Near-duplicate: a text holding this share of the query's content words and none of its own
# (one word more may be the answer: "I water the garden on *Sundays*" for "when do I water the
# garden"). A question that matches: a user turn with a question mark holding QUESTION_OVERLAP
# of the query's content words, in at most QUESTION_EXTRA_TERMS more words than the query has.
ECHO_OVERLAP = 0.7
QUESTION_OVERLAP = 0.6
QUESTION_EXTRA_TERMS = 8
STEM_FORMS = 5  # store.passages.stem: a word, or it with one of four suffixes


def echoed_events(legs: list[list[dict]], query: str, kind: str | None) -> set[str]:
    """Events of which a retrieved chunk echoes the query and holds no value of the kind asked."""
    asked = set(terms(query))
    found: set[str] = set()
    if not asked:
        return found
    for rows in legs:
        for row in rows:
            text = strip(row["text"])  # without its kind words (store/kinds.py)
            if (row["event_id"] not in found and is_echo(text, row["role"], query, asked)
                    and not (kind and has_candidate(text, kind, query))):
                found.add(row["event_id"])
    return found


# A question: a question mark, or a question word first (after a "label:" such as "RECALL:").
_ASKING = re.compile(r"\?|^\W*(?:\w+:\s*)?(?:what|which|when|where|who|whom|whose|why|how|is|are|was|"
                     r"were|do|does|did|can|could|would|will|should|have|has)\b", re.I)


_LABEL = re.compile(r"^\W*[A-Z]+:\s*")  # "RECALL: ...", the simulator's scripted asks


def _words(text: str) -> list[str]:
    return re.findall(r"\w+", text[:2000].lower())


# What `is_echo` reads of a retrieved chunk depends on its text alone, and a recall search on a
# long history retrieves the same chunks request after request: each is worked out once per text
# (the text is the key; chunks are short, so a few thousand of them are a few MB at most).
_KEPT = 2048


@lru_cache(maxsize=_KEPT)
def _written_count(text: str) -> int:
    """How many distinct written words of two letters or more, stop words aside, the text opens with."""
    return len({word for word in _words(_LABEL.sub("", text[:2000])) if len(word) > 1} - STOP_WORDS)


@lru_cache(maxsize=_KEPT)
def _own_terms(text: str) -> frozenset[str]:
    return frozenset(terms(_LABEL.sub("", text[:4000])))


@lru_cache(maxsize=_KEPT)
def _unlabelled_words(text: str) -> tuple[str, ...]:
    return tuple(_words(_LABEL.sub("", text)))


@lru_cache(maxsize=_KEPT)
def _asks(text: str) -> bool:
    return _ASKING.search(text[:2000]) is not None


def is_echo(text: str, role: str, query: str, asked: set[str] | None = None) -> bool:
    """Whether a retrieved chunk repeats the query (`asked`: the query's `terms`) rather than
    answering it: a near-duplicate of a question, or a user turn asking a matching question.
    A near-duplicate of a keyword query that holds the value ("cabin wifi password
    tangerine-otter-42") may be the statement of it, and is an echo only when it asks or is the
    query word for word (an upper-case label such as "RECALL:" aside)."""
    asked = set(terms(query)) if asked is None else asked
    if not asked:
        return False
    # Every echo has at most len(asked) + QUESTION_EXTRA_TERMS stems, and a stem at most
    # STEM_FORMS written forms: a text with more distinct words than that is none, told by set
    # operations before stemming its words (stemming every retrieved chunk was most of a
    # search's fusion time).
    if _written_count(text) > STEM_FORMS * (len(asked) + QUESTION_EXTRA_TERMS) + 1:  # +1: a word cut at 2,000
        return False
    own = _own_terms(text)
    if not own or not asked:
        return False
    if list(_unlabelled_words(text)) == _words(query):  # the query itself, resent
        return True
    asks = _asks(text)
    shared = len(own & asked)
    if ((asks or _ASKING.search(query)) and shared / len(asked) >= ECHO_OVERLAP
            and not own - asked):
        return True
    return (role == "user" and asks and shared / len(asked) >= QUESTION_OVERLAP
            and len(own) <= len(asked) + QUESTION_EXTRA_TERMS)
