"""Summaries: the headings the request asked for, filled from the transcript it carries."""

from __future__ import annotations

import re
from typing import Any

from simulator.counting import content_text

SUMMARY_WORD_LIMIT = 700  # when the request names no limit
_WORD_LIMIT = re.compile(r"\b(?:under|at most|max(?:imum)?|within|no more than)\s+(\d{2,5})\s+words\b", re.I)

_HEADING = re.compile(r"^\s*##\s+(.+?)\s*$", re.M)
# Transcript lines rendered into one prompt: "[user] ...", "[tool x result | event e] ...",
# "[assistant -> tool f(args)]", or "user: ...".
_ROLE_LINE = re.compile(r"^\s*\[(user|assistant|tool)\b([^\n]*?)\]\s*(.*)$"
                        r"|^\s*(user|assistant|tool)\b[^:\n]{0,40}:\s*(.+)$", re.I)
# A block of values the request asks to keep verbatim, "- key: v1 | v2" per line.
_VALUE_BLOCK = re.compile(r"<(\w*exact_values\w*)>(.*?)</\1>", re.S)
_VALUE_PATTERNS = [
    r"\b\d{4}-\d{2}-\d{2}(?:[T ]\d{2}:\d{2}(?::\d{2})?)?\b",                      # dates
    r"(?<![<\w])(?:~|\.{1,2})?/(?:[\w.\-]+/)*[\w.\-]+|\b[\w\-]+(?:/[\w.\-]+)+",     # paths
    r"\bv?\d+\.\d+(?:\.\d+)+(?:[-+][\w.]+)?\b|\bv\d+(?:\.\d+)?\b",                # versions
    r"[$€£]\s?\d[\d,]*(?:\.\d+)?|\b\d+(?:\.\d+)?\s?(?:ms|s|min|h|kb|mb|gb|tb|%|k|km|kg|"
    r"usd|eur|tokens|rps|req/s)\b",                                              # numbers+units
    r"\b[\w.+-]+@[\w-]+\.[\w.]+\b",                                               # emails
    r"\b(?=[A-Za-z0-9_\-]*\d)(?=[A-Za-z0-9_\-]*[A-Za-z])[A-Za-z][A-Za-z0-9]*(?:[_\-][A-Za-z0-9]+)+\b",
    r"\b(?=[A-Z0-9]*\d)(?=[A-Z0-9]*[A-Z])[A-Z0-9]{4,}\b",                          # codes
]
_VALUE = re.compile("|".join(f"(?:{p})" for p in _VALUE_PATTERNS))
_TOPICS = [
    (("goal", "objective", "intent"), None),
    (("constraint", "prohibit", "rules", "preference"),
     r"\b(must|never|don't|do not|always|only|avoid|require[sd]?|prefer)\b"),
    (("decision", "ruled out", "decided"),
     r"\b(decid\w*|chose|choose|go with|instead|ruled out|rejected|won't|agreed)\b"),
    (("error", "fix", "problem", "issue"),
     r"\b(error|fail\w*|exception|traceback|bug|fix\w*|broken|crash\w*)\b"),
    (("file", "resource", "path"),
     r"[\w.\-]+/[\w.\-]+|\b[\w\-]+\.(?:py|js|ts|md|json|ya?ml|toml|txt|log|csv|sql|sh|go|rs|"
     r"java|c|h|cpp|html|css|ini|cfg|conf)\b|https?://"),
    (("task", "todo", "open", "pending"),
     r"\b(todo|need to|needs|should|pending|remaining|later|still)\b"),
    (("user message",), "__user__"),
    (("entit", "people", "name"), "__values__"),
]


def render_summary(messages: list[dict[str, Any]]) -> str:
    """A deterministic state-recovery document with the headings the prompt lists.

    Bullets come from the transcript the request carries, merged with the previous summary's
    (when the request includes one); the exact-values section lists the values the request asks
    to keep, then identifier-like tokens found anywhere in it, within the word limit the
    instruction names ("Stay under 400 words"), as a model following it would.
    """
    all_text = "\n".join(content_text(m.get("content")) for m in messages)
    # The instruction is the system prompt, or the last message when it is appended to a
    # conversation (summary_cache_fork).
    system = "\n".join(content_text(m.get("content")) for m in messages if m.get("role") in ("system", "developer"))
    named = _WORD_LIMIT.search(system) or _WORD_LIMIT.search(content_text((messages or [{}])[-1].get("content")))
    limit = int(named.group(1)) if named else SUMMARY_WORD_LIMIT
    for m in messages:
        for call in m.get("tool_calls") or ():
            all_text += "\n" + call["function"]["name"] + " " + call["function"]["arguments"]
    headings = list(dict.fromkeys(_HEADING.findall(all_text))) or ["Summary"]
    lines = _transcript_lines(messages)
    previous = _previous_sections(messages)
    values = list(dict.fromkeys([*_listed_values(all_text),
                                 *(v.strip() for v in _VALUE.findall(all_text) if v.strip())]))
    out: list[str] = []
    value_headings = []
    for heading in headings:
        out.append(f"## {heading}")
        if "exact value" in heading.lower():
            value_headings.append(len(out))
            continue
        picked = _pick(heading.lower(), lines)
        earlier = previous.get(heading.lower(), [])
        if earlier and any(k in heading.lower() for k in ("goal", "objective")):
            picked = earlier[:1]
        elif earlier:
            picked = list(dict.fromkeys([p for p in picked if not p.startswith("(")] + earlier))[:3]
        out.extend(f"- {_clip(text)}" for text in picked or ["(none recorded)"])
        out.append("")
    used = sum(len(line.split()) for line in out)
    budget = max(40, limit - used)
    for offset, at in enumerate(value_headings):
        chosen, words = [], 0
        for value in values:
            # One bullet marker per 12 values; an identifier costs as much as the ~4 characters
            # a token holds, as a model writing to a word limit would weigh it: "/srv/app/x/y.py"
            # is one word but five tokens of a summary that rides on every request.
            words += max(len(value.split()), len(value) // 4) + (1 if len(chosen) % 12 == 0 else 0)
            if words > budget:
                break
            chosen.append(value)
        bullets = [f"- {', '.join(chosen[k:k + 12])}" for k in range(0, len(chosen), 12)]
        out[at + offset:at + offset] = (bullets or ["- (none)"]) + [""]
        budget = 0
    return "\n".join(out).strip() + "\n"


def _listed_values(text: str) -> list[str]:
    values = []
    for _, block in _VALUE_BLOCK.findall(text):
        for line in block.splitlines():
            line = re.sub(r"^\s*-\s*(?:[\w ]{1,40}:\s)?", "", line).strip()
            values += [v.strip() for v in line.split(" | ") if v.strip()]
    return values


def _previous_sections(messages: list[dict[str, Any]]) -> dict[str, list[str]]:
    """Bullets under each '## Heading' of a previous summary carried in the request."""
    sections: dict[str, list[str]] = {}
    for m in messages:
        if m.get("role") in ("system", "developer"):
            continue
        current = None
        for line in content_text(m.get("content")).splitlines():
            if heading := _HEADING.match(line):
                current = sections.setdefault(heading.group(1).lower(), [])
            elif current is not None and line.strip().startswith("- "):
                bullet = line.strip()[2:].strip()
                if bullet and not bullet.startswith("(") and bullet.lower() != "none":
                    current.append(bullet)
            elif line.strip().startswith("<"):
                current = None
    return sections


def _transcript_lines(messages: list[dict[str, Any]]) -> list[tuple[str, str]]:
    """(role, text) lines of the conversation that the summary request carries."""
    labelled: list[tuple[str, str]] = []
    raw: list[tuple[str, str]] = []
    for m in messages:
        if m.get("role") in ("system", "developer"):
            continue
        text = content_text(m.get("content"))
        for line in text.splitlines():
            if match := _ROLE_LINE.match(line):
                role = (match.group(1) or match.group(4)).lower()
                said = (match.group(3) if match.group(1) else match.group(5)).strip()
                # "[assistant -> tool f(args)]" says everything inside its brackets
                said = said or f"{role}{match.group(2) or ''}".strip()
                labelled.append((role, said))
        # The instruction itself (the message listing the headings) is not conversation.
        if not _HEADING.search(text):
            raw += [(m.get("role", "user"), line.strip()) for line in text.splitlines()
                    if line.strip()]
    return labelled or raw


def _pick(heading: str, lines: list[tuple[str, str]]) -> list[str]:
    if not lines:
        return []
    texts = [text for _, text in lines]
    user = [text for role, text in lines if role == "user"] or texts
    if any(k in heading for k in ("goal", "objective", "intent")):
        return [user[0]]
    if "current" in heading:
        return texts[-2:]
    if "next" in heading:
        return [user[-1], texts[-1]] if user[-1] != texts[-1] else [texts[-1]]
    for keys, pattern in _TOPICS:
        if not any(k in heading for k in keys) or pattern is None:
            continue
        if pattern == "__user__":
            return user[-3:]
        if pattern == "__values__":
            found = [t for t in texts if _VALUE.search(t)]
        else:
            found = [t for t in texts if re.search(pattern, t, re.I)]
        return list(dict.fromkeys(found))[-3:]
    return texts[-2:]


def _clip(text: str, words: int = 30) -> str:
    parts = text.split()
    return " ".join(parts[:words]) + (" ..." if len(parts) > words else "")


# ---------------------------------------------------------------------------------------------
