"""The check a new checkpoint passes before it replaces the old one (docs/architecture.md,
"Summary checkpoints").

``validate_summary`` decides whether a model's answer is a summary at all (headings, length, most
exact values). This check decides whether the checkpoint about to be written loses or invents
anything, deterministically, against what the gateway extracted itself:

- **values**: every exact value of the covered span (the structured state of the previous
  checkpoint and of the delta, ``policies/extraction.py``) is in the new summary or in the new
  checkpoint's state. Repair: the missing values go back into the state (the block lists them).
- **rules**: every standing instruction of the covered span that the pinned block cannot hold
  (over its budget, ``policies/pinned.py``) is quoted verbatim in the summary (the pinned ones
  stay pinned: the block is rebuilt from the path on every request). Repair: the missing ones
  are quoted under "Constraints and prohibitions".
- **invented**: no line of the summary claims an instruction the user never gave: every bullet
  under "Constraints and prohibitions", and every bullet elsewhere that reads as a rule or says
  "the user asked / said / wants ...", shares most of its words with one user message of the
  covered span (or with the previous checkpoint's summary, which passed this check). Repair: the
  line is dropped. A summary that invented more than ``MAX_INVENTED`` lines, and more than half
  of its bullets, is refused: the old checkpoint stays.

Pure: texts in, a verdict and the repaired texts out. The shell counts the outcomes.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from policies.pinned import content_words, is_rule

CONSTRAINTS = "Constraints and prohibitions"
MAX_INVENTED = 5
GROUNDED_SHARE = 0.5
_HEADING_LINE = re.compile(r"^[ \t]*#{1,6}[ \t]*(.+?)[ \t#:]*$")
_BULLET = re.compile(r"^\s*(?:[-*+]|\d+[.)])\s+(.*)$")
_CLAIM = re.compile(r"\b(?:user|they|client|customer)\s+(?:has\s+|had\s+)?(?:asked|said|told|instructed|wants?|"
                    r"requires?|required|prefers?|preferred|insist(?:s|ed)?|demand(?:s|ed)?|forbade|forbids?|"
                    r"prohibit(?:s|ed)?)\b", re.I)
_ROLE_WORDS = frozenset({"user", "user's", "users", "assistant", "asked", "said", "told", "instructed", "wants", "want",
                         "requires", "required", "prefers", "preferred", "insisted", "insists", "demanded", "forbade",
                         "prohibited", "approval", "explicit"})


@dataclass(frozen=True, slots=True)
class SummaryCheck:
    outcome: str  # "passed", "repaired" or "refused"
    summary: str
    state: dict
    problems: tuple[str, ...] = field(default=())  # "values", "rules", "invented": what was repaired or refused


def _section_of(line: str) -> str | None:
    heading = _HEADING_LINE.fullmatch(line)
    if heading is None:
        return None
    return re.sub(r"^[\d.)\s*_]+|[*_]+$", "", heading.group(1)).strip().lower()


def _grounded(text: str, sources: list[frozenset[str]]) -> bool:
    words = content_words(text) - _ROLE_WORDS
    if len(words) < 2:
        return True  # nothing specific enough to have been made up
    return any(len(words & source) >= GROUNDED_SHARE * len(words) for source in sources)


def _claims(summary: str, sources: list[frozenset[str]], quoted: list[frozenset[str]]) -> tuple[list[int], int]:
    """(the indexes of lines claiming an instruction no user message gave, bullets in all).
    ``sources``: the user's words; ``quoted``: the whole conversation's (a rule-like line that
    quotes a tool result elsewhere than under the constraints heading claims nothing)."""
    invented: list[int] = []
    section: str | None = None
    bullets = 0
    for i, line in enumerate(summary.splitlines()):
        name = _section_of(line)
        if name is not None:
            section = name
            continue
        bullet = _BULLET.match(line)
        if bullet is None:
            continue
        text = bullet.group(1).strip()
        if not text or text.lower().rstrip(".") in ("none", "(none recorded)", "(none)"):
            continue
        bullets += 1
        in_constraints = section is not None and section.startswith(CONSTRAINTS.lower())
        if in_constraints or _CLAIM.search(text):
            if not _grounded(text, sources):
                invented.append(i)
        elif is_rule(text) and not _grounded(text, sources + quoted):
            invented.append(i)
    return invented, bullets


def _quote_rules(summary: str, rules: list[str]) -> str:
    """``summary`` with ``rules`` quoted at the top of its constraints section (added if absent)."""
    quoted = [f"- {rule}" for rule in rules]
    lines = summary.splitlines()
    for i, line in enumerate(lines):
        name = _section_of(line)
        if name is not None and name.startswith(CONSTRAINTS.lower()):
            rest = lines[i + 1:]
            # A lone "None" under the heading gives way to the quotes.
            if rest and rest[0].strip().lstrip("-*+ ").lower().rstrip(".") == "none":
                rest = rest[1:]
            return "\n".join([*lines[: i + 1], *quoted, *rest]) + "\n"
    return summary.rstrip() + f"\n\n## {CONSTRAINTS}\n" + "\n".join(quoted) + "\n"


def _present(value: str, summary: str, held: set[str]) -> bool:
    return value in held or value in summary


def check_summary(summary: str, state: dict, *, covered_state: dict, overflow_rules: list[str], user_texts: list[str],
                  other_texts: list[str] = (), previous_summary: str | None = None) -> SummaryCheck:
    """Check (and where possible repair) a checkpoint about to be written.

    ``covered_state``: the structured state of the covered span (previous checkpoint's merged
    with the delta's); ``overflow_rules``: the covered span's standing instructions the pinned
    block cannot hold; ``user_texts``: the covered span's user messages; ``other_texts``: its
    other messages (assistant text, tool calls and results).
    """
    problems: list[str] = []
    state = {k: list(v) for k, v in (state or {}).items()}
    held = {v for values in state.values() for v in values}
    missing: dict[str, list[str]] = {}
    for key, values in (covered_state or {}).items():
        lost = [v for v in values if not _present(v, summary, held)]
        if lost:
            missing[key] = lost
    if missing:
        problems.append("values")
        for key, lost in missing.items():
            state[key] = [*state.get(key, []), *lost]
    sources = [content_words(t) for t in [*user_texts, *overflow_rules] if t]
    if previous_summary:
        sources.append(content_words(previous_summary))
    invented, bullets = _claims(summary, sources, [content_words(t) for t in other_texts if t])
    if invented:
        if len(invented) > MAX_INVENTED and 2 * len(invented) > bullets:
            return SummaryCheck("refused", summary, state, (*problems, "invented"))
        problems.append("invented")
        drop = set(invented)
        summary = "\n".join(line for i, line in enumerate(summary.splitlines()) if i not in drop) + "\n"
    unquoted = [rule for rule in dict.fromkeys(overflow_rules) if rule not in summary]
    if unquoted:
        problems.append("rules")
        summary = _quote_rules(summary, unquoted)
    return SummaryCheck("repaired" if problems else "passed", summary, state, tuple(problems))
