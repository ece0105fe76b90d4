"""Standing instructions: the user's rules for the rest of a session, kept word for word.

docs/architecture.md, "Pinned standing instructions". A summary paraphrases or drops "from now
on, never run migrations against the X cluster"; a recall tool helps only if the model knows
there is a rule to look for. So rules are found deterministically in the user's own messages and
rendered verbatim in a pinned block of the view.

What counts as a rule (``rule_ops``, per user message):

- an instruction file a coding agent injects into a user turn: Claude Code's CLAUDE.md sections
  (``Contents of PATH (...):`` inside the ``# claudeMd`` ``<system-reminder>``), Codex's
  ``# AGENTS.md instructions for DIR`` with its ``<INSTRUCTIONS>`` and the older
  ``<user_instructions>``; one rule per file, identified by its path, so a newer copy of the same
  file replaces the older one in place;
- a sentence addressed to the assistant that sets a rule for the rest of the session: a scope
  ("from now on", "going forward", "for the rest of this session", "whenever you", ...) with a
  directive; an imperative "Always ..." / "Never ..." opening a sentence; "you must / should /
  are not allowed to ..." with a universal word (always, never, any, unless, without ...); "I
  want you to always / never ..."; "Do not / Don't ..." with a universal word; "All/Every/No X
  must ...". Questions, reported speech and other injected tags are not rules.
- a sentence revoking or changing one ("you may now ...", "you no longer need to ...", "forget
  my rule about ...", or a rule saying "instead") replaces the rule it shares the most words
  with, at that rule's place: the block shows what holds now, ordered by first appearance.

Everything here is pure: texts in, operations and rules out. The shell caches ``rule_ops`` per
event id (an event's text never changes) and folds them along the request's path.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from policies.fences import defuse

PINNED_OPEN = "<standing_instructions>"
PINNED_CLOSE = "</standing_instructions>"


@dataclass(frozen=True, slots=True)
class RuleOp:
    """What one user sentence or injected file does to the session's rules."""

    op: str  # "add" (a rule), "file" (an instruction file), "revoke" (changes or lifts a rule)
    text: str  # verbatim, as the user's message holds it
    key: str = ""  # files: the file's identity; a newer copy replaces the older one


@dataclass(frozen=True, slots=True)
class StandingRule:
    key: str  # "file:<path>" or "rule:<event id>:<n>" (where it first appeared)
    text: str  # verbatim; a revocation or replacement puts its own sentence here
    event: str | None  # the event that set the text now shown


@dataclass(frozen=True, slots=True)
class PinnedRules:
    """The rules in the block (oldest first) and those over its budget, left to the summary."""

    pinned: tuple[StandingRule, ...]
    overflow: tuple[StandingRule, ...]

    @property
    def all(self) -> tuple[StandingRule, ...]:
        return (*self.overflow, *self.pinned)


# -- instruction files -------------------------------------------------------------------------

_REMINDER = re.compile(r"<system-reminder>(.*?)</system-reminder>", re.S)
# Claude Code: "Contents of /repo/CLAUDE.md (project instructions, checked into the codebase):"
_CLAUDE_FILE = re.compile(r"^Contents of (\S[^\n]*?)(?: \([^()\n]*\))?:[ \t]*\n", re.M)
_CLAUDE_END = re.compile(r"\n\s*IMPORTANT: this context may or may not be relevant", re.S)
_AGENTS = re.compile(r"# AGENTS\.md instructions for ([^\n]+)\n+<INSTRUCTIONS>\n?.*?</INSTRUCTIONS>", re.S)
_USER_INSTRUCTIONS = re.compile(r"<user_instructions>.*?</user_instructions>", re.S)
_AGENTS_REPLACED = "These AGENTS.md instructions replace all previously provided AGENTS.md instructions."
_AGENTS_LIFTED = "The previously provided AGENTS.md instructions no longer apply."
# Paired tags clients inject (environment context, reminders, command echoes): never the
# user's own sentences. Code blocks, quoted lines and scripted directives neither.
_TAGGED = re.compile(r"<([A-Za-z][\w-]*(?: [\w-]+)?)(?:\s[^<>]*)?>.*?</\1>", re.S)
_FENCED = re.compile(r"```.*?(?:```|\Z)|~~~.*?(?:~~~|\Z)", re.S)
_QUOTED = re.compile(r"^[ \t]*>.*$", re.M)
_DIRECTIVE = re.compile(r"\[\[[^\]]*\]\]")


def _files(text: str) -> list[RuleOp]:
    ops: list[RuleOp] = []
    for reminder in _REMINDER.finditer(text):
        body = reminder.group(1)
        if "# claudeMd" not in body:
            continue
        end = _CLAUDE_END.search(body)
        body = body[: end.start()] if end else body
        heads = list(_CLAUDE_FILE.finditer(body))
        for i, head in enumerate(heads):
            stop = heads[i + 1].start() if i + 1 < len(heads) else len(body)
            section = body[head.start():stop].strip()
            if section:
                ops.append(RuleOp("file", section, "file:" + head.group(1).strip()))
    for match in _AGENTS.finditer(text):
        ops.append(RuleOp("file", match.group(0), "file:AGENTS.md:" + match.group(1).strip()))
    for match in _USER_INSTRUCTIONS.finditer(text):
        ops.append(RuleOp("file", match.group(0), "file:user_instructions"))
    return ops


# -- sentences ---------------------------------------------------------------------------------

_SPLIT = re.compile(r"(?<=[.!?])[\"')\]]*\s+(?=[\"'(\[]?[A-Z0-9])")
_BULLET = re.compile(r"^\s*(?:[-*+•]|\d+[.)])\s+")
_LEAD = r"^(?:(?:please|also|and|but|so|ok(?:ay)?|important|note|rule|reminder|one more thing|remember)[,:!]?\s+)*"
_SCOPE = re.compile(
    r"\b(?:from now on|going forward|for the rest of (?:this|the|our) (?:session|conversation|chat|project|task|work)"
    r"|from (?:here|this point) on(?:wards?)?|until i say otherwise|for (?:all|every) future"
    r"|in (?:all|every) (?:future|subsequent|later) (?:answers?|responses?|replies|messages|commits?|changes?)"
    r"|as a (?:general |standing )?rule|under no circumstances|whenever you|every time you|each time you"
    r"|in this (?:session|conversation|chat) (?:always|never))\b", re.I)
_DIRECTIVE_WORD = re.compile(
    r"\b(?:you|your|please|never|always|don't|do not|must|only|avoid|make sure|stop|keep|use|reply|respond|answer"
    r"|write|call|ask|include|sign|run|prefix|end|start)\b", re.I)
_NOT_VERB = (
    r"mind|again|before|ever|been|had|have|has|thought|knew|seen|heard|say|said|a|an|the|in|on|at|for|with|was|is|are"
    r"|were|too|more|less|enough|so|very|happy|glad|good|great|nice|fun|ready|welcome|easy|the|my|our|his|her|their|i"
    r"|we|it|that|this|sure|fails?|works?|late|alone|forget|forgot|once|really|quite"
)
_ALWAYS_NEVER = re.compile(_LEAD + rf"(?:always|never)(?:,)?\s+(?!(?:{_NOT_VERB})\b)(?![a-z]+ed\b)[a-z]+", re.I)
_UNIVERSAL = re.compile(
    r"\b(?:always|never|ever|every|each|any|anything|anyone|anywhere|all|only|unless|without|whenever|no matter"
    r"|at all|under any)\b", re.I)
_YOU_MUST = re.compile(
    r"\byou (?:must|should|shall|are (?:required|expected|not allowed|never allowed|forbidden|not "
    r"permitted|not to)|may not|may never|can never|are to)\b", re.I)
_WANT_YOU = re.compile(
    r"\bi(?: always)? (?:want|need|expect|prefer|would prefer|'d prefer|would like|'d like|would rather|'d rather)"
    r"(?: for| that)? you(?: to)? (?:always|never|not|only|stop|keep|don't|do not)\b"
    r"|\bi (?:don't|do not) want you to ever\b", re.I)
_DONT = re.compile(
    _LEAD + r"(?:do not|don't|never ever)\s+(?!(?:worry|forget|mind|know|have|think|want|need|care|remember|see|"
    r"understand|get|feel|hesitate|be|like|believe|panic)\b)[a-z]+", re.I)
_DONT_SCOPE = re.compile(
    r"\b(?:ever|any|anything|anyone|unless|without (?:my|asking|checking|explicit|written|prior|first|approval|"
    r"permission|confirmation)|again|in this (?:project|repo|repository|codebase|session|conversation|chat)"
    r"|under any|at any)\b", re.I)
# "All commit messages must ...": only about the work (a pasted charter's "No one shall" is not).
_ARTEFACT = (r"(?:answers?|responses?|replies|outputs?|messages?|commits?|code|files?|changes?|tests?|functions?|emails?"
             r"|queries|migrations?|deploy(?:s|ments?)?|releases?|PRs?|pull requests?|branches|scripts?|comments?|docs?)")
_ALL_MUST = re.compile(rf"^(?:every|all|each|any|no)\b[^.?!]{{0,40}}?\b{_ARTEFACT}\b[^.?!]{{0,30}}?\b(?:must|shall|should always"
                       r"|should never)\b", re.I)
# Weak scopes ("whenever you ...") make a rule only with a directive of their own.
_WEAK_SCOPE = re.compile(r"\b(?:whenever you|every time you|each time you)\b", re.I)
_MODAL = re.compile(r"\b(?:please|always|never|don't|do not|make sure|must|should|try to)\b|^(?:whenever|every time|each time)\b",
                    re.I)
# The user speaking of themselves ("I'll make sure to ... from now on") sets no rule for the assistant.
_SELF = re.compile(r"^\W*(?:i|i'll|i'm|i've|i'd|i will|we|we'll|we're|we've|my|our|it|it's|this|that|there)\b", re.I)
_REPORTED = re.compile(r"\b(?:said|says|told (?:me|him|her|us|them)|tells me|my (?:mom|dad|mother|father|boss|"
                       r"teacher|friend|doctor|coach)|quote|saying)\b", re.I)
_REVOKE = re.compile(
    r"\b(?:you (?:can|may) now|you(?:'re| are) now allowed to|you no longer (?:need|have) to|no longer (?:applies|apply|"
    r"holds?|stands?)|(?:forget|ignore|disregard|drop|cancel|lift|remove|revoke|scrap) (?:about )?(?:my|the|that|this|"
    r"our) (?:earlier |previous |old |last |first )?(?:rule|instruction|request|restriction|constraint|preference)s?"
    r"|scratch that rule|you don't (?:need|have) to \w+(?: \w+){0,6} (?:anymore|any more)|(?:it'?s|it is) now "
    r"(?:fine|ok(?:ay)?|allowed) (?:for you )?to|(?:it'?s|it is) (?:fine|ok(?:ay)?|allowed) for you to)\b", re.I)
# A request about the current answer only ("this time", "for now") is not a standing rule.
_THIS_TIME = re.compile(r"\b(?:this time|for now|this once|just this|right now|for this (?:one|answer|question|reply))\b", re.I)
_CHANGE = re.compile(r"\b(?:instead|rather than|actually|change|changed|update|updated|switch|no longer|anymore|"
                     r"any more|correction|replace)\b", re.I)
MAX_RULE_WORDS = 80
# Every rule and revocation pattern above needs one of these words: a text without any (a pasted
# log, most chat) is skipped with a few substring scans instead of a dozen regexes per sentence.
_CUES = ("always", "never", "don't", "do not", "must", "shall", "should", "you", "from now on", "going forward",
         "rest of", "from here", "from this point", "until i say", "as a rule", "as a general", "as a standing",
         "under no", "no longer", "rule", "instruction", "restriction", "constraint", "preference", "it's now",
         "it is now", "future", "in every", "in all")


def _cued(text: str) -> bool:
    low = text.lower()
    return any(cue in low for cue in _CUES)


def _prose(text: str) -> str:
    """``text`` without what is not the user's own prose (each cut leaves a line break, so
    sentences never join across it and what is left stays a substring of the original)."""
    for pattern in (_REMINDER, _AGENTS, _USER_INSTRUCTIONS, _TAGGED, _FENCED, _QUOTED, _DIRECTIVE):
        text = pattern.sub("\n", text)
    return text


def sentences(text: str) -> list[str]:
    """The sentences of the user's prose in ``text``, verbatim (bullet markers dropped)."""
    out = []
    for line in _prose(text).splitlines():
        line = _BULLET.sub("", line).strip()
        if line:
            out.extend(s.strip() for s in _SPLIT.split(line) if s.strip())
    return out


def is_rule(sentence: str) -> bool:
    """Does this sentence set a rule for the rest of the session?"""
    if sentence.rstrip("\"')]").endswith("?") or len(sentence.split()) > MAX_RULE_WORDS or _REPORTED.search(sentence) \
            or _THIS_TIME.search(sentence):
        return False
    scope = _SCOPE.search(sentence)
    if scope and _DIRECTIVE_WORD.search(sentence) and not _SELF.match(sentence) and (
            not _WEAK_SCOPE.fullmatch(scope.group()) or _MODAL.search(sentence)):
        return True
    if _ALWAYS_NEVER.match(sentence) or _WANT_YOU.search(sentence) or _ALL_MUST.match(sentence):
        return True
    if _YOU_MUST.search(sentence) and _UNIVERSAL.search(sentence):
        return True
    return bool(_DONT.match(sentence) and _DONT_SCOPE.search(sentence))


def is_revocation(sentence: str) -> bool:
    return not sentence.rstrip().endswith("?") and _REVOKE.search(sentence) is not None


def rule_ops(text: str) -> tuple[RuleOp, ...]:
    """What one user message does to the session's rules, in the order it does it."""
    if not text:
        return ()
    ops = _files(text)
    if not _cued(text):
        return tuple(ops)
    for sentence in sentences(text):
        if not _cued(sentence):
            continue
        if is_revocation(sentence):
            ops.append(RuleOp("revoke", sentence))
        elif is_rule(sentence):
            ops.append(RuleOp("add", sentence))
    if _AGENTS_LIFTED in text:
        ops.append(RuleOp("revoke", _AGENTS_LIFTED, "file:AGENTS.md:"))
    return tuple(ops)


# -- folding along a path ----------------------------------------------------------------------

_WORD = re.compile(r"[a-z0-9][a-z0-9_./-]*", re.I)
_STOP = frozenset(
    "a an the and or but to of in on at for with by from as is are be it its this that these those you your i me my we "
    "our us please always never ever not no don't do does must should shall can may now from on off any all every each "
    "only without unless again anymore more instead rather actually just also then than so if when whenever rule "
    "rules instruction instructions going forward rest session conversation chat need have has allowed longer "
    "make sure forget ignore disregard about earlier previous will would".split())


def content_words(text: str) -> frozenset[str]:
    return frozenset(w.lower().strip("./-") for w in _WORD.findall(text) if w.lower() not in _STOP and len(w) > 2)


def _target(rules: list[StandingRule], sentence: str, *, need: float) -> int | None:
    """The rule ``sentence`` is about: the most shared content words, at least two and at
    least ``need`` of the smaller set."""
    words = content_words(sentence)
    best, best_score = None, 0.0
    for i, rule in enumerate(rules):
        if rule.key.startswith("file:"):
            continue
        other = content_words(rule.text)
        shared = len(words & other)
        if shared < 2:
            continue
        score = shared / max(1, min(len(words), len(other)))
        if score >= need and score > best_score:
            best, best_score = i, score
    return best


def fold_rules(entries: Iterable[tuple[str | None, Iterable[RuleOp]]]) -> list[StandingRule]:
    """The rules in force after ``entries`` ((event id, ops) in path order), ordered by
    first appearance; a replacement or revocation keeps the place of the rule it changes."""
    rules: list[StandingRule] = []
    for event, ops in entries:
        for n, op in enumerate(ops):
            if op.op == "file":
                if _AGENTS_REPLACED in op.text:
                    rules = [r for r in rules if not r.key.startswith("file:AGENTS.md:") or r.key == op.key]
                at = next((i for i, r in enumerate(rules) if r.key == op.key), None)
                if at is None:
                    rules.append(StandingRule(op.key, op.text, event))
                elif rules[at].text != op.text:
                    rules[at] = StandingRule(op.key, op.text, event)
                continue
            if op.op == "revoke" and op.key:  # an agent lifting its instruction files
                rules = [r for r in rules if not r.key.startswith(op.key)]
                continue
            normal = " ".join(op.text.lower().split())
            if any(" ".join(r.text.lower().split()) == normal for r in rules):
                continue  # said again: the first statement keeps its place
            at = _target(rules, op.text, need=0.34 if op.op == "revoke" else 0.5)
            if at is not None and (op.op == "revoke" or _CHANGE.search(op.text)):
                rules[at] = StandingRule(rules[at].key, op.text, event)
            elif op.op == "add":
                rules.append(StandingRule(f"rule:{event}:{n}", op.text, event))
    return rules


def partition_rules(rules: list[StandingRule], budget_tokens: int, count: Callable[[str], int]) -> PinnedRules:
    """The newest rules that fit ``budget_tokens`` stay pinned; the oldest beyond it overflow."""
    kept: list[StandingRule] = []
    used = count(_block_frame(1))
    for rule in reversed(rules):
        cost = count(rule.text) + 4
        if used + cost > budget_tokens:
            break
        kept.append(rule)
        used += cost
    cut = len(rules) - len(kept)
    return PinnedRules(tuple(rules[cut:]), tuple(rules[:cut]))


# -- the block ---------------------------------------------------------------------------------

_INTRO = (
    "The user set these standing instructions earlier in this session, for the rest of it. The gateway keeps them "
    "here word for word, in the order given, because the messages that held them may no longer be in view. They are "
    "quoted from the user; a newer message from the user overrides them."
)
def _block_frame(overflow: int) -> str:
    note = (f"\n\n({overflow} older standing instruction{'s' if overflow != 1 else ''} did not fit in this block: "
            "the session summary below keeps them word for word.)") if overflow else ""
    return f"{PINNED_OPEN}\n{_INTRO}{note}\n{PINNED_CLOSE}"


def render_pinned_block(rules: PinnedRules) -> str | None:
    """The pinned block's text, or None when there is no rule. Deterministic: the same rules
    give the same bytes, so the block stays in the provider's cached prefix."""
    if not rules.pinned and not rules.overflow:
        return None
    parts = [PINNED_OPEN, _INTRO, ""]
    parts.extend(f"[{i}] {defuse(rule.text)}" for i, rule in enumerate(rules.pinned, 1))
    if rules.overflow:
        n = len(rules.overflow)
        parts += ["", f"({n} older standing instruction{'s' if n != 1 else ''} did not fit in this block: "
                      "the session summary below keeps them word for word.)"]
    parts.append(PINNED_CLOSE)
    return "\n".join(parts)
