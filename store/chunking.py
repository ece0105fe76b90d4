"""Cutting event text into indexable chunks, and cutting result snippets out of them.

Long tool outputs and messages are split into overlapping windows so that a phrase near the end
of a 50 kB log is still embedded and ranked on its own, and the overlap keeps a phrase that
straddles a cut whole in at least one chunk. Cuts prefer whitespace so words stay intact.
"""

from __future__ import annotations

import re
from collections import Counter

__all__ = ["STOP_WORDS", "content_words", "query_terms", "snippet", "split_chunks"]

# How far back from a hard cut we look for whitespace, as a share of the chunk size.
_BOUNDARY_SLACK = 0.2

_TERM = re.compile(r"\w+")
STOP_WORDS = _STOP_WORDS = frozenset(
    "a an and are as at be by did do does for from had has have how i in is it its me my of on "
    "or our so that the their them there they this to was we were what when where which who "
    "why will with you your".split()
)


def split_chunks(text: str, chunk_chars: int = 1200, overlap_chars: int = 200) -> list[str]:
    """Overlapping windows of at most `chunk_chars`; [] for blank text, [text] when it fits."""
    if chunk_chars <= 0 or not 0 <= overlap_chars < chunk_chars:
        raise ValueError(
            f"chunk_chars={chunk_chars}, overlap_chars={overlap_chars}: "
            "need chunk_chars > 0 and 0 <= overlap_chars < chunk_chars"
        )
    if not text.strip():
        return []
    if len(text) <= chunk_chars:
        return [text]
    chunks: list[str] = []
    start = 0
    while True:
        end = start + chunk_chars
        if end >= len(text):
            chunks.append(text[start:])
            return chunks
        floor = end - int(chunk_chars * _BOUNDARY_SLACK)
        space = max(text.rfind(" ", floor, end), text.rfind("\n", floor, end))
        if space > start + overlap_chars:
            end = space
        chunks.append(text[start:end])
        next_start = end - overlap_chars
        # Start the next window at a word boundary, but never stall.
        space = text.find(" ", next_start, end)
        start = space + 1 if space != -1 else next_start


def content_words(text: str) -> list[str]:
    """The words of `text` in order, lower-cased, without stop words (repeats kept)."""
    return [term for term in _TERM.findall(text.lower())
            if term not in _STOP_WORDS and (len(term) > 1 or term.isdigit())]


def query_terms(query: str) -> list[str]:
    """The words of a query worth highlighting: lower-cased, no stop words, no duplicates."""
    return list(dict.fromkeys(content_words(query)))


def snippet(text: str, query: str, width: int = 300) -> str:
    """About `width` characters of `text` around the densest cluster of query terms.

    Terms match at word starts, so "recital" also finds "recitals". With no match the
    snippet is the head of the text. Elisions are marked with an ellipsis.
    """
    text = " ".join(text.split())
    if len(text) <= width:
        return text
    hits: list[tuple[int, str]] = []
    for term in query_terms(query):
        hits.extend((m.start(), term) for m in re.finditer(rf"\b{re.escape(term)}", text, re.I))
    hits.sort()
    # The tightest run of hits holding the most distinct terms (the earliest on ties), shown
    # from a third of the width before it. A run spans at most two thirds of the width, so it
    # fits; tightest, so a fact's line holding every term beats a stretch of filler where the
    # terms merely fall within one window (the earliest such stretch would win and leave the
    # fact cut off at the window's end).
    start = 0
    best: tuple[int, int] = (0, 0)
    inside: Counter[str] = Counter()
    low = 0
    for position, term in hits:
        inside[term] += 1
        while position - hits[low][0] > width * 2 // 3 or inside[hits[low][1]] > 1:
            inside[hits[low][1]] -= 1
            if not inside[hits[low][1]]:
                del inside[hits[low][1]]
            low += 1
        if (len(inside), hits[low][0] - position) > best:
            best, start = (len(inside), hits[low][0] - position), max(0, hits[low][0] - width // 3)
    start = min(start, len(text) - width)
    end = start + width
    if start > 0:
        space = text.find(" ", start, start + 30)
        start = space + 1 if space != -1 else start
    if end < len(text):
        space = text.rfind(" ", end - 30, end)
        end = space if space != -1 else end
    return ("…" if start > 0 else "") + text[start:end] + ("…" if end < len(text) else "")
