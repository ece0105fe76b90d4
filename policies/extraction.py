"""Exact values: ids, paths, numbers, versions, dates, emails and names pulled out by regex.

Summaries paraphrase; an order code or a file path must survive verbatim. Extraction is
deterministic, so the structured state next to every summary holds the exact strings whatever
the summary model wrote. Patterns run from most to least specific and each match is blanked
before the next pattern runs, so a UUID is never also reported as a hex hash and a URL is
never also a path.
"""

from __future__ import annotations

import re

from policies.messages import INSTRUCTION_ROLES, call_arguments, call_name, content_text, tool_calls

STATE_KEYS: tuple[str, ...] = ("ids", "paths", "urls", "numbers", "versions", "dates", "emails", "names")

_MONTH = (
    r"(?:Jan(?:uary)?|Feb(?:ruary)?|Mar(?:ch)?|Apr(?:il)?|May|June?|July?|Aug(?:ust)?"
    r"|Sep(?:t(?:ember)?)?|Oct(?:ober)?|Nov(?:ember)?|Dec(?:ember)?)"
)
_UNITS = (
    r"(?:[KMGTP]i?B|bytes?|ms|µs|ns|s|secs?|seconds?|mins?|minutes?|h|hrs?|hours?|days?|weeks?|months?|years?"
    r"|kg|g|mg|lbs?|km|m|cm|mm|mi|miles?|ft|kWh|W|kW|MHz|GHz|Hz|°[CF]|px|pt|tokens?|rpm|rps|qps"
    r"|USD|EUR|GBP|JPY|CHF|CAD|AUD|dollars?|euros?)"
)
_NAME_STOP = frozenset(
    "The A An This That These Those It Its I We You He She They My Our Your Their Please Thanks Thank "
    "Hi Hello Hey Dear If When What Why How Where Who Which Yes No Ok Okay Sure And But Or So Then Also "
    "Note Error Warning Let In On At For From To Of With By As Is Are Was Were Be Do Does Did Can Could "
    "Would Should Will Shall May Might Must Here There Now Today Tomorrow Yesterday Monday Tuesday "
    "Wednesday Thursday Friday Saturday Sunday January February March April June July August September "
    "October November December Step Next First Last Current Open Goal Summary".split()
)

_DIGIT = re.compile(r"\d")

# (state key, pattern, hints) in priority order: earlier patterns claim their text first.
# Hints are substrings of which at least one must occur ("0" stands for any digit): a cheap
# `in` test skips most of the ~20 regex scans on text that cannot match, which is most text.
_RULES: tuple[tuple[str, str, tuple[str, ...]], ...] = (
    ("urls", r"\b(?:https?|ftp|wss?)://[^\s<>\"'`)\]}]+[^\s<>\"'`)\]}.,;:!?]", ("://",)),
    ("emails", r"\b[A-Za-z0-9._%+-]+@[A-Za-z0-9-]+(?:\.[A-Za-z0-9-]+)*\.[A-Za-z]{2,}\b", ("@",)),
    ("ids", r"\b[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}\b", ("-",)),
    ("dates", r"\b\d{4}-\d{2}-\d{2}(?:[T ]\d{2}:\d{2}(?::\d{2}(?:\.\d+)?)?(?:Z|[+-]\d{2}:?\d{2})?)?\b", ("0", "-")),
    ("paths", r"\b[A-Za-z]:\\(?:[^\\\s:*?\"<>|]+\\)*[^\\\s:*?\"<>|,;]*", (":\\",)),
    ("paths", r"(?<![\w/.:~-])(?:~|\.{1,2})?/(?:[\w.@+-]+/)*[\w.@+-]*[\w@+-]", ("/",)),
    ("paths", r"\b(?:[\w.-]+/)+[\w-]+(?:\.[\w-]+)*\.[A-Za-z0-9]{1,8}\b", ("/",)),
    ("dates", rf"\b{_MONTH}\.? \d{{1,2}}(?:st|nd|rd|th)?(?:,? \d{{4}})?\b", ("0",)),
    ("dates", rf"\b\d{{1,2}}(?:st|nd|rd|th)? {_MONTH}(?:,? \d{{4}})?\b", ("0",)),
    ("dates", r"\b\d{1,2}/\d{1,2}/\d{2,4}\b", ("0", "/")),
    ("dates", r"\b(?:[01]?\d|2[0-3]):[0-5]\d(?::[0-5]\d)?(?:\s?[AaPp]\.?[Mm]\b)?", ("0", ":")),
    ("versions", r"\bv\d+(?:\.\d+){1,3}(?:[-+][0-9A-Za-z.]+)?\b", ("0", ".")),
    ("ids", r"\b(?:25[0-5]|2[0-4]\d|1?\d?\d)(?:\.(?:25[0-5]|2[0-4]\d|1?\d?\d)){3}\b", ("0", ".")),
    ("versions", r"(?<![\w.])\d+\.\d+\.\d+(?:[-+][0-9A-Za-z.]+)?\b(?!\.\d)", ("0", ".")),
    ("ids", r"\b[A-Z][A-Z0-9]{1,9}-\d{1,10}\b", ("0", "-")),
    ("numbers", r"[$€£¥]\s?\d[\d,]*(?:\.\d+)?(?:\s?(?:[kKMB]\b|million\b|billion\b))?", ("$", "€", "£", "¥")),
    ("numbers", r"(?<![\w.])\d[\d,]*(?:\.\d+)?\s?(?:%|percent\b)", ("%", "percent")),
    ("numbers", rf"(?<![\w.])\d[\d,]*(?:\.\d+)?\s?{_UNITS}(?![\w])", ("0",)),
    ("numbers", r"(?<![\w.,])\d{1,3}(?:,\d{3})+(?:\.\d+)?(?![\w,])", ("0", ",")),
    ("ids", r"\b(?=[0-9a-f]*[a-f])(?=[0-9a-f]*\d)[0-9a-f]{7,64}\b", ("0",)),
    ("ids", r"\b(?=[A-Z0-9]*\d)(?=[A-Z0-9]*[A-Z])[A-Z0-9]{5,10}\b", ("0",)),
    ("ids", r"(?<![\w&])#\d{2,}\b", ("#",)),
    ("names", r"\b[A-Z][a-z]+(?:[ ](?:(?:de|van|von|der|da|del|la|le|bin|al)[ ])?[A-Z][a-z]+){1,3}\b", ()),
)
_PATTERNS: tuple[tuple[str, re.Pattern[str], tuple[str, ...], bool], ...] = tuple(
    (key, re.compile(pattern), tuple(h for h in hints if h != "0"), "0" in hints) for key, pattern, hints in _RULES
)


# Kinds that are rare and costly to lose: read everywhere. The others (paths, dates, numbers,
# names) fill `ls` listings and logs by the hundred; in tool results they are read only where
# the summarizer also sees them (head and tail), and the middle stays recallable.
_RARE_KEYS = frozenset({"ids", "urls", "versions", "emails"})


def _values_in(text: str, found: dict[str, dict[str, None]], head: int | None = None, tail: int = 0) -> None:
    """Record values of ``text``; with ``head`` set, common kinds only within head/tail chars."""
    has_digit = _DIGIT.search(text) is not None
    tail_from = len(text) - tail

    def wanted(key: str, match: re.Match[str]) -> bool:
        return head is None or key in _RARE_KEYS or match.start() < head or match.end() > tail_from

    for key, pattern, hints, needs_digit in _PATTERNS:
        if (needs_digit and not has_digit) or (hints and not any(h in text for h in hints)):
            continue
        bucket = found[key]
        if key == "names":
            for match in pattern.finditer(text):
                name = _proper_name(match.group()) if wanted(key, match) else None
                if name:
                    bucket.setdefault(name, None)
            continue

        def claim(match: re.Match[str], key: str = key, bucket: dict[str, None] = bucket) -> str:
            if wanted(key, match):
                # Sentence punctuation is not part of a value ("see C:\a.txt." ends at "txt").
                bucket.setdefault(match.group().strip().rstrip(".,;:!?"), None)
            # Blank even unrecorded matches so lower-priority patterns cannot re-read them.
            return " " * (match.end() - match.start())

        text = pattern.sub(claim, text)


def values_in(text: str) -> dict[str, list[str]]:
    """The exact values of one text by kind (``STATE_KEYS``), in order of appearance."""
    found: dict[str, dict[str, None]] = {key: {} for key in STATE_KEYS}
    _values_in(text, found)
    return {key: list(values) for key, values in found.items()}


def _proper_name(candidate: str) -> str | None:
    # Conservative: drop leading stop words ("Thanks John Smith" -> "John Smith") and keep
    # only what still has two capitalised words.
    words = candidate.split(" ")
    while words and words[0] in _NAME_STOP:
        words.pop(0)
    if sum(1 for w in words if w[:1].isupper() and w not in _NAME_STOP) < 2:
        return None
    return " ".join(words)


def _cap(values: list[str], cap: int) -> list[str]:
    """Keep the earliest half and the newest half when over ``cap``.

    Early values carry the task's fixed facts (the order code named in the first message);
    the newest carry the current work. The middle is what recall is for.
    """
    if len(values) <= cap:
        return values
    if cap <= 0:
        return []
    head = cap - cap // 2
    return values[:head] + values[len(values) - cap // 2 :] if cap // 2 else values[:head]


def extract_exact_values(
    messages: list[dict],
    cap: int = 200,
    max_chars_per_message: int = 100_000,
    tool_head_chars: int = 600,
    tool_tail_chars: int = 300,
) -> dict[str, list[str]]:
    """Exact values from user/assistant/tool text and tool-call arguments.

    Keys are ``STATE_KEYS``; each list is in order of first appearance, deduplicated and capped
    (earliest and newest kept). System/developer messages are instructions, not history.
    In tool results, ids/urls/versions/emails are read everywhere but paths, dates, numbers and
    names only in the first ``tool_head_chars`` and last ``tool_tail_chars`` (the defaults match
    the policy's summary_tool_head/tail_chars, so the summary can be held to the same values).
    Texts longer than ``max_chars_per_message`` (a dumped log) are read at their head and tail
    only: regex over megabytes would stall the sync path, and the middle stays recallable.
    """
    found: dict[str, dict[str, None]] = {key: {} for key in STATE_KEYS}
    half = max(1, max_chars_per_message // 2)
    for message in messages:
        role = message.get("role")
        if role in INSTRUCTION_ROLES:
            continue
        texts = [content_text(message.get("content"))]
        # JSON escapes backslashes and quotes; unescape so Windows paths come out as typed.
        texts += [call_arguments(c).replace("\\\\", "\\").replace('\\"', '"') for c in tool_calls(message)]
        for text in texts:
            if len(text) > 2 * half:
                text = f"{text[:half]}\n{text[-half:]}"
            if text:
                if role == "tool":
                    _values_in(text, found, tool_head_chars, tool_tail_chars)
                else:
                    _values_in(text, found)
    return {key: _cap(list(values), cap) for key, values in found.items()}


def merge_state(old: dict | None, new: dict, cap: int = 200) -> dict:
    """Union of two states: old values first, then new ones, deduplicated and capped per key.

    Over the cap the earliest half and the newest half survive (see ``_cap``): the facts that
    framed the task and the ones the current work uses.
    """
    old = old or {}
    merged: dict[str, list[str]] = {}
    for key in [*STATE_KEYS, *sorted(k for k in {*old, *new} if k not in STATE_KEYS)]:
        values = dict.fromkeys([*(old.get(key) or []), *(new.get(key) or [])])
        if key in old or key in new:
            merged[key] = _cap(list(values), cap)
    return merged


def format_exact_values(state: dict | None, common_limit: int | None = None) -> str:
    """A compact, deterministic listing of a state, one ``- key: v1 | v2`` line per key.

    ``common_limit`` caps paths, dates, numbers and names (earliest and newest kept); the rare
    kinds are always listed whole.
    """
    if not state:
        return ""
    lines = []
    for key in [*STATE_KEYS, *sorted(k for k in state if k not in STATE_KEYS)]:
        values = list(state.get(key) or [])
        if common_limit is not None and key not in _RARE_KEYS:
            values = _cap(values, common_limit)
        if values:
            lines.append(f"- {key}: " + " | ".join(str(v) for v in values))
    return "\n".join(lines)


# --- notes: what the user asked and decided, for a summary made without a model --------------

NOTE_KEYS: tuple[str, ...] = ("requests", "constraints", "decisions", "errors", "actions")

_SENTENCE = re.compile(r"[^.!?\n]+[.!?]?")
_CONSTRAINT = re.compile(
    r"\b(?:must(?:n't| not)?|never|don't|do not|always|only|avoid|should(?:n't| not)?|prefer|require[sd]?|"
    r"not allowed|forbidden|make sure)\b", re.IGNORECASE,
)
_DECISION = re.compile(
    r"\b(?:decid\w*|chose|choose|go(?:ing)? with|switch(?:ed)? to|instead|ruled out|rejected|won't|agreed|"
    r"settled on|we(?:'ll| will) use|i(?:'ll| will) use|plan is)\b", re.IGNORECASE,
)
_ERROR = re.compile(r"\b(?:error|exception|traceback|failed|failure|failing|fatal|panic|denied|timed out)\b", re.IGNORECASE)
_ERROR_SCAN_CHARS = 2000
# Scripted directives some clients and test harnesses put in messages ([[call x {...}]]) are noise.
_DIRECTIVE = re.compile(r"\[\[[^\]]*\]\]")


def _clip_words(text: str, words: int) -> str:
    parts = text.split()
    return " ".join(parts) if len(parts) <= words else " ".join(parts[:words]) + " …"


def _sentences(text: str, pattern: re.Pattern[str], words: int, limit: int) -> list[str]:
    found = []
    for match in _SENTENCE.finditer(text):
        sentence = match.group().strip()
        if sentence and pattern.search(sentence):
            found.append(_clip_words(sentence, words))
            if len(found) >= limit:
                break
    return found


def extract_notes(messages: list[dict], words: int = 40, per_message: int = 3) -> dict[str, list[str]]:
    """User requests, constraints, decisions, errors and tool actions, found without a model.

    Keys are ``NOTE_KEYS``, each list in order of appearance and deduplicated:
    ``requests`` every user message (clipped to ``words``), ``constraints`` user sentences
    with must/never/always/only/avoid..., ``decisions`` assistant sentences with
    decided/instead/ruled out..., ``errors`` tool-result and assistant lines naming an
    error (at most ``per_message`` each), ``actions`` the tool calls made (name and clipped
    arguments). The summary that degraded mode writes is rendered from these and the exact
    values (``render_state_summary``); nothing is paraphrased, so nothing can be invented.
    """
    notes: dict[str, dict[str, None]] = {key: {} for key in NOTE_KEYS}
    for message in messages:
        role = message.get("role")
        if role in INSTRUCTION_ROLES:
            continue
        text = _DIRECTIVE.sub(" ", content_text(message.get("content"))).strip()
        if role == "user" and text:
            notes["requests"].setdefault(_clip_words(text, words), None)
            for sentence in _sentences(text, _CONSTRAINT, words, per_message):
                notes["constraints"].setdefault(sentence, None)
        elif role == "assistant":
            for sentence in _sentences(text, _DECISION, words, per_message):
                notes["decisions"].setdefault(sentence, None)
            for call in tool_calls(message):
                args = _clip_words(call_arguments(call), words // 2)
                notes["actions"].setdefault(f"{call_name(call) or 'tool'}({args})", None)
        if role in ("tool", "assistant") and text:
            if len(text) > 3 * _ERROR_SCAN_CHARS:  # a dumped log: its head and its tail say what failed
                text = f"{text[:_ERROR_SCAN_CHARS]}\n{text[-2 * _ERROR_SCAN_CHARS:]}"
            lines = [line.strip() for line in text.splitlines() if _ERROR.search(line)]
            for line in lines[:per_message]:
                notes["errors"].setdefault(_clip_words(line, words // 2), None)
    return {key: list(values) for key, values in notes.items()}
