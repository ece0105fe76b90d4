"""Passage-level evidence inside a retrieved chunk: the best line of a tool result.

A tool result (a log, a listing, query rows) is a stack of independent records, one per line,
and a fact in it is usually one line: "NOTE the migration lives in /srv/app/migrations/...".
Chunk-level BM25 cannot tell that line from filler that repeats one query word many times
("migration" in every other log line). What sets the fact apart is that its one line holds
most of the query's words at once. `line_coverage` measures that: the share of the query's
content words found together on the chunk's best line. `store.ranking.fuse` adds it, weighted
by `Ranking.tool_lines`, to the events whose role is "tool"; chat turns are prose, where the
sentence boundaries do not separate records, and keep their chunk scores.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from functools import lru_cache

from store.chunking import STOP_WORDS, content_words, query_terms

__all__ = ["best_line", "line_coverage", "numbered_item", "phrases_in", "query_phrases", "stem", "terms"]

_WORD = re.compile(r"\w+")
_SUFFIXES = ("ing", "ed", "es", "s")
# From this many lines on, an output has a structure: terms on most of its lines are not clues.
STRUCTURE_LINES = 8


@lru_cache(maxsize=1 << 15)  # a search stems the same few thousand words request after request
def stem(word: str) -> str:
    """A crude suffix strip ("holds" -> "hold", "migrations" -> "migration"), enough to match
    a question's words against a line's; words of four letters or fewer stay whole."""
    for suffix in _SUFFIXES:
        if len(word) > len(suffix) + 3 and word.endswith(suffix):
            return word[: -len(suffix)]
    return word


def terms(query: str) -> list[str]:
    """The query's content words, stemmed, without stop words or duplicates."""
    return list(dict.fromkeys(stem(term) for term in query_terms(query)))


def line_coverage(texts: Iterable[str], wanted: list[str]) -> float:
    """Largest share of `wanted` found together on one line of any of `texts` (0..1)."""
    return best_line(texts, wanted)[0]


def best_line(texts: Iterable[str], wanted: list[str]) -> tuple[float, str]:
    """The line of `texts` holding the largest share of `wanted` together, and that share.

    A line's word matches a wanted stem when it is the stem plus at most one of the suffixes
    `stem` strips. A term on most lines of a long output is its structure ("id" in every JSON
    row, "INFO" in every log line), not a clue to one line, and is not counted (the share is
    still of all of `wanted`). Substring tests (C speed) bound each line's count first, and
    only a line that could match or beat the best so far is matched word by word; of lines
    holding as many terms, the one whose terms are on the fewest lines wins. The line is returned
    as written (its case kept); "" when no line holds a wanted term.
    """
    if not wanted:
        return 0.0, ""
    wanted_all = wanted
    # Each line once: chunks overlap, and a notable line is also a row of its own (store/kinds.py);
    # a copy is not a second line holding the term.
    lines = list(dict.fromkeys(line for text in texts for line in text.split("\n")))
    lowered = [line.lower() for line in lines]
    spread = {term: sum(term in line for line in lowered) for term in wanted}
    if len(lines) >= STRUCTURE_LINES:
        wanted = [term for term in wanted if spread[term] * 2 <= len(lines)]
        if not wanted:
            return 0.0, ""
    pattern = _pattern(tuple(wanted))
    best, rarity, where = 0, 0.0, -1
    for n, line in enumerate(lowered):
        if sum(term in line for term in wanted) < max(best, 1):
            continue
        matched = {match.group(1) for match in pattern.finditer(line)}
        # Lines holding as many terms: the one whose terms the output repeats least
        # ("booked" once beats "client" on thirty lines).
        score = sum(1.0 / max(1, spread[term]) for term in matched)
        if (len(matched), score) > (best, rarity):
            best, rarity, where = len(matched), score, n
    return best / len(wanted_all), lines[where] if where >= 0 else ""


@lru_cache(maxsize=256)
def _pattern(wanted: tuple[str, ...]) -> re.Pattern[str]:
    alternatives = "|".join(re.escape(term) for term in sorted(wanted, key=len, reverse=True))
    suffixes = "|".join(_SUFFIXES)
    return re.compile(rf"\b({alternatives})(?:{suffixes})?\b")


# Words that frame a question about the conversation rather than name its subject ("I was going
# through our previous chat and wondering ..."): a pair holding one is no phrase of it.
_FRAME = frozenset(
    "about again can chat checking conversation could discussed earlier follow going just "
    "know let like looking mentioned planning please previous previously recall remember remind "
    "said talked tell thinking through told up want wanted wondering would".split()
)


def _phrase_word(word: str) -> str:
    """`stem`, and a final "e" off ("assemble" and "assembled" both give "assembl")."""
    word = stem(word)
    return word[:-1] if len(word) > 4 and word.endswith("e") else word


def query_phrases(query: str) -> frozenset[tuple[str, str]]:
    """The query's adjacent content-word pairs ("IKEA bookshelf", "back-end programming"),
    stop words skipped; a framing word ("previous conversation about") is in none of them."""
    words = content_words(query)
    return frozenset((_phrase_word(a), _phrase_word(b)) for a, b in zip(words, words[1:])
                     if a not in _FRAME and b not in _FRAME and a != b)


def phrases_in(texts: Iterable[str], phrases: frozenset[tuple[str, str]]) -> set[tuple[str, str]]:
    """The query's `phrases` found as adjacent content words in any of `texts`: BM25 counts
    words apart, so a turn naming "back-end programming languages" and one saying "front-end
    and back-end development" many times look alike to it.

    A pair is looked for only in a text holding both its stems (substring tests, C speed), then
    by one regular expression: the words with the suffixes `_phrase_word` takes off, only stop
    words and single letters between them (searching a few dozen retrieved chunks word by word
    cost ~50 ms a search)."""
    found: set[tuple[str, str]] = set()
    patterns = _phrase_patterns(phrases)
    for text in texts:
        lowered = text.lower()
        for pair, pattern in patterns:
            if pair not in found and pair[0] in lowered and pair[1] in lowered and pattern.search(lowered):
                found.add(pair)
    return found


_BETWEEN = "|".join(sorted(STOP_WORDS, key=len, reverse=True))


@lru_cache(maxsize=64)
def _phrase_patterns(phrases: frozenset[tuple[str, str]]) -> list[tuple[tuple[str, str], re.Pattern[str]]]:
    return [(pair, _phrase_pattern(pair)) for pair in sorted(phrases)]


@lru_cache(maxsize=1024)  # by pair: a new question shares most of its pairs with earlier ones
def _phrase_pattern(pair: tuple[str, str]) -> re.Pattern[str]:
    def word(stemmed: str) -> str:
        return rf"\b{re.escape(stemmed)}(?:e|ing|ed|es|s)?\b"

    gap = rf"(?:\W+(?:{_BETWEEN}|[^\W\d])\b)*\W+"
    return re.compile(word(pair[0]) + gap + word(pair[1]))


# "the 27th parameter", "item 27", "number 27", "#27": a question asking for one entry of a
# numbered list by its position.
_POSITION = re.compile(r"\b(\d{1,3})(?:st|nd|rd|th)\b|(?:\b(?:item|number|no\.|step|point)\s*|#)(\d{1,3})\b", re.I)


def numbered_item(text: str, query: str) -> str:
    """The entry of a numbered list in `text` ("27. Sound effects (e.g. ...)") at the position
    the query asks for, up to the line's end; "" when the query names no position or the text
    has no such entry. The number must start a line or follow white space and be followed by
    "." or ")" and a space, so "in 2027." or "v1.27)" are no entry."""
    asked = _POSITION.search(query)
    if not asked:
        return ""
    number = asked.group(1) or asked.group(2)
    found = re.search(rf"(?:^|(?<=\s)){int(number)}[.)][ \t]+[^\n]+", text, re.M)
    return found.group(0) if found else ""
