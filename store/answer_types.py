"""Answer types: does a passage hold the kind of thing a question asks for?

"Where did I buy my bookshelf?" is answered by a name ("IKEA"), "how long did it take" by a
quantity ("4 hours"), "when is the wedding" by a date. Lexical and vector similarity both
prefer the turns that talk most about the question's subject (bookshelves), which are often
not the ones that state the fact. Classic question answering ranks passages by whether they
contain a candidate of the expected answer type; `answer_bonus` is that signal, used by
`store.ranking.fuse` as a small additive prior among already-retrieved events.

A candidate must be new: a name or number the question itself contains is the subject, not
the answer. Pure functions, no I/O.
"""

from __future__ import annotations

import re

__all__ = ["DATE", "NAME", "PATH", "QUANTITY", "expected_type", "has_candidate"]

DATE, QUANTITY, NAME, PATH = "date", "quantity", "name", "path"

_ASKS_DATE = re.compile(
    r"\bwhen\b|\b(?:what|which)\s+(?:date|day|time|year|month|week|weekday)\b", re.I)
_ASKS_QUANTITY = re.compile(
    r"\bhow\s+(?:long|much|many|old|far|often|big|large|tall|fast|heavy|late|early)\b|"
    r"\b(?:what|which)\s+(?:percentage|percent|number|price|amount|size|version|port|score|"
    r"total|count|rate|speed|temperature|distance|budget|cost)\b", re.I)
_ASKS_PATH = re.compile(
    r"\b(?:what|which)\s+(?:\w+\s+)?(?:file|files|path|directory|folder|script|module)\b", re.I)
_ASKS_NAME = re.compile(
    r"\bwhere\b|\bwho(?:m|se)?\b|\bname\b|\bcalled\b|"
    r"\b(?:what|which)\s+(?:\w+\s+)?(?:breed|brand|company|companies|restaurant|store|shop|"
    r"city|country|place|hotel|book|movie|film|song|album|artist|band|author|team|school|"
    r"university|app|tool|library|framework|language|platform|website|airline|game|show|"
    r"series|park|museum|cafe|bar|neighbourhood|neighborhood|street|town|island|region)\b",
    re.I)

_MONTHS = (r"jan(?:uary)?|feb(?:ruary)?|mar(?:ch)?|apr(?:il)?|may|jun(?:e)?|jul(?:y)?|"
           r"aug(?:ust)?|sep(?:t(?:ember)?)?|oct(?:ober)?|nov(?:ember)?|dec(?:ember)?")
_DATE_TOKEN = re.compile(
    rf"\b(?:{_MONTHS})\s+\d{{1,2}}\b|\b\d{{1,2}}(?:st|nd|rd|th)?\s+(?:of\s+)?(?:{_MONTHS})\b|"
    r"\b(?:monday|tuesday|wednesday|thursday|friday|saturday|sunday)\b|"
    r"\b\d{4}-\d{2}-\d{2}\b|\b\d{1,2}/\d{1,2}(?:/\d{2,4})?\b|\b(?:19|20)\d{2}\b|"
    r"\b\d{1,2}(?::\d{2})?\s*(?:am|pm)\b|\b\d{1,2}:\d{2}\b", re.I)
_NUMBER_WORDS = (r"one|two|three|four|five|six|seven|eight|nine|ten|eleven|twelve|fifteen|"
                 r"twenty|thirty|forty|fifty|hundred|thousand|dozen|half|couple")
_QUANTITY_TOKEN = re.compile(rf"\b\d+(?:[.,]\d+)?\b|\b(?:{_NUMBER_WORDS})\b", re.I)
# A capitalised word that does not open a sentence (or a line, or a list item): a name.
_NAME_TOKEN = re.compile(r"(?<![.!?:\n*#>\-]\s)(?<![.!?:\n*#>\-])(?<!^)\b([A-Z][\w'&-]*[A-Za-z])")
# Capitalised words that are structure, not names: log levels, HTTP, the first person.
_NOT_NAMES = frozenset({
    "I", "I'm", "I've", "I'll", "I'd", "OK", "AI", "INFO", "WARN", "WARNING", "ERROR", "DEBUG",
    "TRACE", "FATAL", "CRITICAL", "NOTE", "TODO", "GET", "POST", "PUT", "PATCH", "DELETE", "HEAD",
    "HTTP", "HTTPS", "JSON", "URL", "API", "ID", "PASS", "PASSED", "FAIL", "FAILED", "OK",
})
# A file system path: absolute ("/srv/app", "~/.config/x", "./run.sh") or relative with an
# extension ("src/app.ts"); not "and/or" or "3/4".
_PATH_TOKEN = re.compile(
    r"(?<![\w/.~])(?:~|\.{1,2})?/[A-Za-z_.][\w.\-]*(?:/[\w.\-]+)*|"
    r"\b[\w.\-]+(?:/[\w.\-]+)+\.[A-Za-z][A-Za-z0-9]{0,5}\b")
_WORD = re.compile(r"[\w']+")


def expected_type(query: str) -> str | None:
    """The answer type a question asks for, or None when it names none."""
    if _ASKS_PATH.search(query):
        return PATH
    if _ASKS_DATE.search(query):
        return DATE
    if _ASKS_QUANTITY.search(query):
        return QUANTITY
    if _ASKS_NAME.search(query):
        return NAME
    return None


def has_candidate(text: str, kind: str, query: str) -> bool:
    """Whether `text` contains an answer candidate of `kind` that `query` does not contain.

    A path answers "which file" and, like a name, "where" (where a script lives)."""
    asked = {w.lower() for w in _WORD.findall(query)}
    if kind == DATE:
        pattern = _DATE_TOKEN
    elif kind == QUANTITY:
        pattern = _QUANTITY_TOKEN
    else:
        if any(m.group(0) not in query for m in _PATH_TOKEN.finditer(text)):
            return True
        if kind == PATH:
            return False
        for match in _NAME_TOKEN.finditer(text):
            word = match.group(1)
            if word not in _NOT_NAMES and word.lower() not in asked:
                return True
        return False
    return any(
        not set(_WORD.findall(m.group(0).lower())) <= asked for m in pattern.finditer(text)
    )
