"""Answer types: does a passage hold the kind of thing a question asks for?

"Where did I buy my bookshelf?" is answered by a name ("IKEA"), "how long did it take" by a
quantity ("4 hours"), "when is the wedding" by a date, "which file" by a path, "what is the
deploy id" by an identifier. Lexical and vector similarity both prefer the turns that talk most
about the question's subject (bookshelves, deploys), which are often not the ones that state
the fact. Classic question answering ranks passages by whether they contain a candidate of the
expected answer type; `has_candidate` is that signal, used by `store.ranking.fuse` as a small
additive prior among already-retrieved events.

The structured kinds (ids, versions, paths, dates) are the exact values the summary block keeps
(`policies.extraction`), so both agree on what an id or a path is. A candidate must be new: a
name or number the question itself contains is its subject, not the answer. Pure functions.
"""

from __future__ import annotations

import re

from policies.extraction import values_in

__all__ = ["DATE", "ID", "NAME", "PATH", "QUANTITY", "VERSION", "expected_type", "has_candidate"]

DATE, QUANTITY, NAME, PATH, ID, VERSION = "date", "quantity", "name", "path", "id", "version"

_WHICH = r"\b(?:what|which)(?:'s|\s+is|\s+was|\s+are|\s+were)?\s+(?:the\s+)?(?:[\w'-]+\s+){0,3}?"
# In order: the first that matches names the type ("which file ... when" asks for a file).
_ASKS: tuple[tuple[str, re.Pattern[str]], ...] = tuple((kind, re.compile(pattern, re.I)) for kind, pattern in (
    # Plurals too: "which scripts hold ...", "what releases ..." ask for the same kind of value.
    (PATH, _WHICH + r"(?:files?|paths?|director(?:y|ies)|folders?|scripts?)\b"),
    (VERSION, _WHICH + r"(?:versions?|releases?)\b"),
    (ID, _WHICH + r"(?:ids?|identifiers?|codes?|tickets?|references?|refs?|hash(?:es)?|commits?|shas?|"
                  r"uuids?|keys?)\b"),
    (DATE, r"\bwhen\b|\b(?:what|which)\s+(?:date|day|time|year|month|week|weekday)\b"),
    (QUANTITY, r"\bhow\s+(?:long|much|many|old|far|often|big|large|tall|fast|heavy|late|early)\b|"
               r"\b(?:what|which)\s+(?:percentage|percent|number|price|amount|size|port|score|"
               r"total|count|rate|speed|temperature|distance|budget|cost)\b"),
    (NAME, r"\bwhere\b|\bwho(?:m|se)?\b|\bname\b|\bcalled\b|"
           r"\b(?:what|which)\s+(?:\w+\s+)?(?:breed|brand|company|companies|restaurant|store|shop|"
           r"city|country|place|hotel|book|movie|film|song|album|artist|band|author|team|school|"
           r"university|app|tool|library|framework|language|platform|website|airline|game|show|"
           r"series|park|museum|cafe|bar|neighbourhood|neighborhood|street|town|island|region)\b"),
))

# Dates beyond the summary's exact values: weekdays and bare years ("in 2019").
_MORE_DATES = re.compile(
    r"\b(?:monday|tuesday|wednesday|thursday|friday|saturday|sunday)\b|\b(?:19|20)\d{2}\b", re.I)
_NUMBER_WORDS = (r"one|two|three|four|five|six|seven|eight|nine|ten|eleven|twelve|fifteen|"
                 r"twenty|thirty|forty|fifty|hundred|thousand|dozen|half|couple")
_QUANTITY_TOKEN = re.compile(rf"\b\d+(?:[.,]\d+)?\b|\b(?:{_NUMBER_WORDS})\b", re.I)
# A capitalised word that does not open a sentence (or a line, or a list item): a name.
_NAME_TOKEN = re.compile(r"(?<![.!?:\n*#>\-]\s)(?<![.!?:\n*#>\-])(?<!^)\b([A-Z][\w'&-]*[A-Za-z])")
# Capitalised words that are structure, not names: log levels, HTTP, the first person.
_NOT_NAMES = frozenset({
    "I", "I'm", "I've", "I'll", "I'd", "OK", "AI", "INFO", "WARN", "WARNING", "ERROR", "DEBUG",
    "TRACE", "FATAL", "CRITICAL", "NOTE", "TODO", "GET", "POST", "PUT", "PATCH", "DELETE", "HEAD",
    "HTTP", "HTTPS", "JSON", "URL", "API", "ID", "PASS", "PASSED", "FAIL", "FAILED",
})
# A cloud region ("us-east-2", "eu-west-1", "europe-west4", "ap-southeast-1"): the name of a
# place in an agent's logs and configs, lower-case, so `_NAME_TOKEN` misses it; it answers
# "which region" and "where is it hosted" as a city name does.
_REGION = re.compile(
    r"\b(?:us|eu|ap|sa|ca|me|af|il|mx|cn|us-gov|europe|asia|australia|northamerica|southamerica|africa)-"
    r"(?:east|west|north|south|central|northeast|northwest|southeast|southwest)-?\d\b")
_WORD = re.compile(r"[\w']+")
_EXACT_KEYS = {ID: "ids", VERSION: "versions", PATH: "paths", DATE: "dates"}  # policies.extraction's


def expected_type(query: str) -> str | None:
    """The answer type a question asks for, or None when it names none."""
    return next((kind for kind, pattern in _ASKS if pattern.search(query)), None)


def has_candidate(text: str, kind: str, query: str) -> bool:
    """Whether `text` contains an answer candidate of `kind` that `query` does not contain.

    A path also answers "where" (where a script lives), like a name does."""
    lowered = query.lower()
    asked = set(_WORD.findall(lowered))

    def new(value: str) -> bool:
        value = value.lower()
        return value not in lowered and not set(_WORD.findall(value)) <= asked

    # Structured kinds are the summary block's exact values; "where" also takes a path.
    key = _EXACT_KEYS.get(kind) or ("paths" if kind == NAME and "/" in text else None)
    if key and any(new(value) for value in values_in(text)[key]):
        return True
    if kind == DATE:
        return any(new(m.group(0)) for m in _MORE_DATES.finditer(text))
    if kind == QUANTITY:
        return any(new(m.group(0)) for m in _QUANTITY_TOKEN.finditer(text))
    if kind != NAME:
        return False
    if any(new(m.group(0)) for m in _REGION.finditer(text)):
        return True
    return any(m.group(1) not in _NOT_NAMES and m.group(1).lower() not in asked for m in _NAME_TOKEN.finditer(text))
