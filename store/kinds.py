"""What a line is: kind words derived from the values it holds, indexed beside it (issue 28).

A question often names the *kind* of the thing it asks for, not the thing: "where is the
schema change script?" for a line naming `/srv/app/migrations/0042_add_ledger.py`, "which
release are we on?" for `uvicorn 0.30.1`, "which test fails?" for `test_refund_partial_amount`.
Neither BM25 nor a small static embedding links the two: the line never says what its value is.
`annotate` appends to each line that holds a structured value a few plain words naming its kind,
read from the value's own shape (a version's dots, a path's directories and extension, a
pytest name's prefix, a ticket key's letters-dash-digits), never from the question. The index
stores the annotated text for BM25 (the vector leg embeds the text as written), so a question
about the kind matches the line that holds one, and `strip` removes the annotations wherever
text is shown (snippets, the best line of a tool result). Pure functions.

The vocabulary is generic, one entry per common kind of value in coding-agent and personal
sessions; it reads no benchmark question. A kind that fills a whole log (a `.py` path on every
line of a listing) only lowers its words' weight in BM25, as any common word does.
"""

from __future__ import annotations

import re
from bisect import bisect_right

from policies.extraction import values_in

__all__ = ["CLOSE", "KIND_TOKENS", "LINE_ROW", "OPEN", "annotate", "index_rows", "kind_token", "kinds_of",
           "notable_lines", "strip"]

# Marks around a line's kind words: punctuation to the BM25 tokenizer, so only the words count.
OPEN, CLOSE = " \u27e6", "\u27e7"
_ANNOTATION = re.compile(re.escape(OPEN) + r"[^\u27e7\n]*" + CLOSE)

# A path's directory names or file names -> what the file is.
_MIGRATION_DIRS = frozenset({"migrations", "migrate", "alembic", "flyway", "liquibase", "changesets"})
_TEST_DIRS = frozenset({"tests", "test", "spec", "specs", "__tests__", "testing"})
_DOC_DIRS = frozenset({"docs", "doc", "documentation"})
_CI_DIRS = frozenset({"workflows", ".circleci", ".gitlab-ci", "ci", ".buildkite"})
_SECRET_WORDS = ("secret", "credential", "password", "passwd", ".pem", ".key", "id_rsa", ".env")
_BY_EXTENSION = {
    "py": "python source script", "rb": "ruby source script", "js": "javascript source script",
    "ts": "typescript source", "tsx": "typescript react component", "jsx": "react component",
    "go": "go source", "rs": "rust source", "java": "java source", "kt": "kotlin source",
    "c": "c source", "h": "c header", "cpp": "c++ source", "cs": "c# source", "php": "php source script",
    "sh": "shell script", "bash": "shell script", "ps1": "powershell script",
    "sql": "sql database query", "yaml": "config settings", "yml": "config settings",
    "toml": "config settings", "ini": "config settings", "cfg": "config settings",
    "conf": "config settings", "json": "json data config", "xml": "xml data", "csv": "csv data table",
    "md": "markdown documentation", "rst": "documentation", "txt": "text", "log": "log output",
    "html": "html page template", "css": "stylesheet", "ipynb": "notebook",
    "lock": "dependency lockfile", "tf": "terraform infrastructure", "proto": "protobuf schema",
}
_BY_NAME = {
    "dockerfile": "docker container image build", "makefile": "make build", "requirements.txt": "dependencies",
    "pyproject.toml": "python project dependencies config", "package.json": "node package dependencies",
    "docker-compose.yml": "docker compose services", "docker-compose.yaml": "docker compose services",
    "go.mod": "go module dependencies", "cargo.toml": "rust crate dependencies", "gemfile": "ruby dependencies",
}
# One made-up word per rare kind of value, added to a line holding one: a question that asks for
# that kind (store/answer_types.expected_type: "which release ...", "which ticket ...") searches
# it as a leg of its own (`Ranking.kind_weight`), so the few lines holding such a value are
# retrieved even when the question shares no other word with them.
KIND_TOKENS = {"version": "kindversion", "id": "kindid", "path": "kindpath"}

_MAY_HOLD = re.compile(r"[\d/\\@$€£¥_]")  # every kind below needs one of these characters
_NUMBERED = re.compile(r"^(?:\d{3,}|V\d+(?:\.\d+)*__)")  # 0042_add_ledger.py, V3__init.sql
_TEST_FILE = re.compile(r"^test_|_test\.|\.(?:test|spec)\.|Test\.|Tests\.")
_TEST_NAME = re.compile(r"\b(?:test_\w+|Test[A-Z]\w+|\w+_test)\b")
_TICKET = re.compile(r"^[A-Z][A-Z0-9]{1,9}-\d+$")
_IP = re.compile(r"^\d{1,3}(?:\.\d{1,3}){3}$")
_MONEY = re.compile(r"[$€£¥]|\b(?:USD|EUR|GBP|dollars?|euros?)\b")
_DURATION = re.compile(r"\d\s?(?:ms|µs|ns|s|secs?|seconds?|mins?|minutes?|h|hrs?|hours?|days?|weeks?)\b")
_SIZE = re.compile(r"\d\s?(?:[KMGTP]i?B|bytes?)\b")


def _path_kinds(path: str) -> list[str]:
    parts = [p for p in re.split(r"[\\/]", path) if p]
    if not parts:
        return []
    name, dirs = parts[-1], [p.lower() for p in parts[:-1]]
    lowered = name.lower()
    words: list[str] = []
    if lowered in _BY_NAME:
        words.append(_BY_NAME[lowered])
    elif "." in lowered:
        words.append(_BY_EXTENSION.get(lowered.rsplit(".", 1)[1], ""))
    if _MIGRATION_DIRS & set(dirs) or (any("migrat" in d for d in dirs) and _NUMBERED.match(name)):
        words.append("database migration schema change")
    if _TEST_DIRS & set(dirs) or _TEST_FILE.search(name):
        words.append("test suite check")
    if _DOC_DIRS & set(dirs):
        words.append("documentation")
    if _CI_DIRS & set(dirs):
        words.append("ci pipeline workflow")
    if any(word in lowered for word in _SECRET_WORDS):
        words.append("secret credentials")
    return words


def _value_kinds(key: str, value: str) -> list[str]:
    """Kind phrases of one exact value of `policies.extraction.values_in`'s kind `key`."""
    if key == "paths":
        return _path_kinds(value) + [KIND_TOKENS["path"]]
    if key == "versions":
        return ["version release " + KIND_TOKENS["version"]]
    if key == "ids":
        return ["ip address host" if _IP.match(value) else
                "ticket issue key identifier" if _TICKET.match(value) else "identifier code", KIND_TOKENS["id"]]
    if key == "urls":
        return ["url link web address"]
    if key == "emails":
        return ["email address contact"]
    if key == "dates":
        return ["date"]
    if key == "numbers":
        return (["amount money cost price"] if _MONEY.search(value) else []) + \
            (["duration time"] if _DURATION.search(value) else []) + (["size"] if _SIZE.search(value) else [])
    return []


def _line_kinds(text: str) -> list[list[str]]:
    """Kind phrases of each line of `text`, in line order. The values are read from the whole
    text at once (each line on its own cost ~20 regex passes per log line) and placed on the
    lines that hold them."""
    lines = text.split("\n")
    found: list[list[str]] = [[] for _ in lines]
    if not _MAY_HOLD.search(text):
        return found
    starts, at = [], 0
    for line in lines:
        starts.append(at)
        at += len(line) + 1
    for key, values in values_in(text).items():
        for value in values:
            phrases = _value_kinds(key, value)
            if not phrases:
                continue
            at = text.find(value)
            while at != -1:
                found[bisect_right(starts, at) - 1].extend(phrases)
                at = text.find(value, at + len(value))
    for match in _TEST_NAME.finditer(text):
        found[bisect_right(starts, match.start()) - 1].append("test case check")
    return found


def _words(phrases: list[str]) -> str:
    return " ".join(dict.fromkeys(w for phrase in phrases if phrase for w in phrase.split()))


def kinds_of(line: str) -> str:
    """The kind words of the values `line` holds, deduplicated, or "" when it holds none."""
    return _words([p for phrases in _line_kinds(line) for p in phrases])


def kind_token(kind: str | None) -> str:
    """The made-up word of an answer type (store/answer_types.py), or "" for a common kind."""
    return KIND_TOKENS.get(kind or "", "")


def annotate(text: str, known: dict[str, list[str]] | None = None) -> str:
    """`text` with each line that holds a value followed by its kind words, between marks.
    `known`: kind phrases of whole lines already read (a chunk's lines are its event's)."""
    lines = text.split("\n")
    if known is not None and all(line in known for line in lines[1:-1]):
        edges = {n: _line_kinds(lines[n])[0] for n in {0, len(lines) - 1} if lines[n] not in known}
        kinds_by_line = [edges[n] if n in edges else known[line] for n, line in enumerate(lines)]
    else:
        kinds_by_line = _line_kinds(text)
    out = []
    for line, phrases in zip(lines, kinds_by_line):
        kinds = _words(phrases)
        out.append(f"{line}{OPEN}{kinds}{CLOSE}" if kinds else line)
    return "\n".join(out)


def strip(text: str) -> str:
    """`text` without the annotations `annotate` added."""
    return _ANNOTATION.sub("", text) if CLOSE in text else text


# A tool output of at least this many lines is a stack of records (store/passages.py).
RECORD_LINES = 8
# At most this many of an output's lines are indexed as rows of their own.
MAX_NOTABLE = 8
# Kinds every line of a log or listing may hold: they do not set a line apart.
_PLAIN = frozenset({KIND_TOKENS["path"], "python source script", "date"})


def notable_lines(text: str, line_kinds: list[list[str]] | None = None) -> list[tuple[int, str]]:
    """(line number, line) of the lines of a tool output that stand apart from its structure:
    a line holding a kind of value (a test name, a version, an amount, a migration file) that
    at most one other line of the output holds. Such a line is usually one record stating one
    fact ("NOTE the failing test is test_x ..."), and a row of its own gives it a vector of its
    own: inside a 1,200-character chunk of log lines, its meaning is averaged away. At most
    `MAX_NOTABLE`, the rarest first; none for an output of fewer than `RECORD_LINES` lines."""
    lines = text.split("\n")
    if len(lines) < RECORD_LINES:
        return []
    line_kinds = _line_kinds(text) if line_kinds is None else line_kinds
    signatures = [frozenset(phrases) - _PLAIN for phrases in line_kinds]
    counts: dict[frozenset[str], int] = {}
    for signature in signatures:
        counts[signature] = counts.get(signature, 0) + 1
    found = [(counts[signature], n) for n, signature in enumerate(signatures)
             if signature and counts[signature] <= 2 and lines[n].strip()]
    return [(n, lines[n]) for _, n in sorted(found)[:MAX_NOTABLE]]


LINE_ROW = 100_000  # chunk number of a tool output's notable line: LINE_ROW + its line number


def index_rows(text: str, role: str, chunks: list[str]) -> list[tuple[int, str, str]]:
    """(chunk number, text as written, text as BM25 indexes it) of one event whose text is cut
    into `chunks`: each chunk with its lines' kind words, and for a tool output each notable
    line as a row of its own (chunk `LINE_ROW` + its line number), so it gets a vector of its
    own. The event's values are read once for all of them."""
    line_kinds = _line_kinds(text)
    known = dict(zip(text.split("\n"), line_kinds))
    rows = [(number, chunk, annotate(chunk, known)) for number, chunk in enumerate(chunks)]
    if role == "tool":
        rows += [(LINE_ROW + n, line, annotate(line, known)) for n, line in notable_lines(text, line_kinds)]
    return rows
