"""Policy: every knob of the context pipeline, declared once with its default and its reason.

A ``Policy`` is an immutable value. Per-model or per-session variations are ``PolicyOverride``
entries (TOML ``[[policies]]`` tables) matched by glob and applied in order by
``resolve_policy``; nothing here reads the environment or the clock.
"""

from __future__ import annotations

import re
from fnmatch import fnmatchcase
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, field_validator, model_validator

DEFAULT_REDACT_PATTERNS: tuple[str, ...] = (
    # OpenAI-style secret keys (sk-..., sk-proj-...).
    r"\bsk-[A-Za-z0-9_-]{16,}",
    # HTTP bearer credentials pasted from curl commands or logs.
    r"(?i)\bbearer\s+[A-Za-z0-9._~+/=-]{16,}",
    # AWS access key ids.
    r"\b(?:AKIA|ASIA)[0-9A-Z]{16}\b",
    # GitHub and Slack tokens.
    r"\bgh[pousr]_[A-Za-z0-9]{30,}",
    r"\bxox[abprs]-[A-Za-z0-9-]{10,}",
    # key=value secrets; only the value (named group "secret") is replaced so the reader
    # still learns that a password existed.
    r"(?i)\b(?:password|passwd|pwd|secret|api[_-]?key|access[_-]?token)\b\s*[=:]\s*(?P<secret>[^\s,;'\"]+)",
    # PEM private key blocks, whatever the key type.
    r"-----BEGIN [A-Z ]*PRIVATE KEY-----[\s\S]*?-----END [A-Z ]*PRIVATE KEY-----",
)


class ToolRule(BaseModel):
    """How results of one tool (matched by name glob) are compacted once consumed."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    action: Literal["keep", "clean", "truncate"] = Field(
        "truncate",
        description="'keep': never compacted; 'clean': always replaced by a placeholder once outside "
        "the protected rounds; 'truncate': head/tail truncated with a marker instead of a placeholder.",
    )
    head_tokens: int = Field(200, ge=0, description="Tokens kept from the start of a truncated result.")
    tail_tokens: int = Field(100, ge=0, description="Tokens kept from the end of a truncated result.")


# Named bundles of the keys that trade fidelity for cost (docs/architecture.md, "Views").
# A key set explicitly (in [policy] or an override) wins over its profile's value.
PROFILES: dict[str, dict[str, Any]] = {
    # Smallest views: a short summary and the newest rounds raw once a session passes 30% of the
    # budget; old tool results go too while the summary is being written. Old facts come back
    # through recall (the proactive block and the tools), not through a long raw tail.
    "economy": {
        "summary_trigger_ratio": 0.3, "sync_compaction_ratio": 0.7, "keep_recent_tokens": 8000,
        "keep_recent_share": 0.05, "compact_trigger_ratio": 0.35, "view_target_ratio": 0.05,
        "summary_max_words": 400, "exact_values_limit": 15, "compact_keep_rounds": 1,
    },
    # Fit first: old tool payloads go early (they are recoverable), conversation is summarised
    # only down to a large raw tail, and a request that fits is not made to wait for a summary.
    "balanced": {
        "summary_trigger_ratio": 0.75, "sync_compaction_ratio": 0.85, "keep_recent_tokens": 96_000,
        "keep_recent_share": 0.65, "compact_trigger_ratio": 0.65, "view_target_ratio": 0.1,
        "summary_max_words": 700, "exact_values_limit": 40, "compact_keep_rounds": 1,
    },
    # Nearly untouched until the window is nearly full; for models that must see everything.
    "fidelity": {
        "summary_trigger_ratio": 0.85, "sync_compaction_ratio": 0.92, "keep_recent_tokens": 1_000_000,
        "keep_recent_share": 0.75, "compact_trigger_ratio": 0.75, "view_target_ratio": 0.5,
        "summary_max_words": 700, "exact_values_limit": 40, "compact_keep_rounds": 2,
    },
}
PROFILE_KEYS = frozenset(k for bundle in PROFILES.values() for k in bundle)


class Policy(BaseModel):
    """The context policy for one request (after overrides)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    profile: Literal["economy", "balanced", "fidelity"] = Field(
        "balanced",
        description="Preset for the trigger ratios, raw-tail share and view target below: 'economy' (cheapest views), "
        "'balanced' (fit first: tool payloads go early, conversation stays raw while it fits), 'fidelity' (nearly "
        "untouched until the window is nearly full). Keys set explicitly win over the profile.",
    )
    keep_recent_rounds: int = Field(
        2, ge=1,
        description="Newest API rounds (an assistant message and the tool results answering it) always raw after a "
        "summary boundary: the model needs the live exchange verbatim (tool-result compaction: compact_keep_rounds).",
    )
    compact_keep_rounds: int | None = Field(
        None, ge=1,
        description="Newest API rounds whose tool results a compaction event leaves raw (the profile sets it: 1 in "
        "economy and balanced, 2 in fidelity; unset: keep_recent_rounds, which keeps the raw tail after a summary "
        "boundary). The newest round is the live exchange; an "
        "older one the model has already answered, and every raw round an event leaves after its first new placeholder "
        "is rewritten to the provider's cache at that event (issue 29, bench/README.md). Placeholders name the event "
        "id to load them back.",
    )
    keep_recent_tokens: int = Field(
        96_000, ge=0,
        description="Cap on the raw tail kept after a summary boundary (the profile sets it); older API rounds are "
        "summarised, but the last round always stays raw.",
    )
    keep_recent_share: float = Field(
        0.65, gt=0, le=1,
        description="The raw tail's cap as a share of the budget too (the smaller wins; the profile sets it): a "
        "summary covers only what the view cannot keep raw.",
    )
    summary_trigger_ratio: float = Field(
        0.75, description="Share of the budget at which an asynchronous summary job is enqueued after the response (the profile sets it)."
    )
    sync_compaction_ratio: float = Field(
        0.85, description="Share of the budget above which the request waits for a summary: async would be too late (the profile sets it)."
    )
    compact_trigger_ratio: float = Field(
        0.65,
        description="Share of the budget above which old tool results become placeholders (the profile sets it); they "
        "go in one batch, down to view_target_ratio, so the prompt prefix changes rarely.",
    )
    view_target_ratio: float = Field(
        0.1,
        description="Share of the budget the view settles at after tool-result compaction (the profile sets it): far "
        "enough below the window that calls stay cheap and the provider's prompt cache keeps hitting. With cost_model "
        "on it is the floor: the cost model may settle higher, up to compact_trigger_ratio, where folding the "
        "placeholders into a summary would not pay.",
    )
    reserve_tokens: int = Field(
        1024, ge=0, description="Tokens held back from the budget to absorb estimation error against the provider's count."
    )
    injection: Literal["system", "user"] = Field(
        "system",
        description="Where the summary block goes: a system message right after the client's own (which stay "
        "byte-identical, like its tools), or a user turn before the first user message of the view.",
    )
    compact_min_tokens: int = Field(
        300, ge=0, description="Tool results smaller than this stay verbatim: a placeholder would save too little."
    )
    compact_batch_rounds: int = Field(
        8,
        ge=1,
        description="The compaction frontier advances this many rounds at a time, so the prompt prefix "
        "(and the provider's prompt cache) changes rarely.",
    )
    max_result_tokens: int = Field(
        6000, ge=1, description="A single tool result above this, even in protected rounds, is head/tail truncated with a marker."
    )
    tool_rules: dict[str, ToolRule] = Field(
        default_factory=dict, description="Per-tool compaction rules; keys are fnmatch globs on the tool name, first match wins."
    )
    summary_model: str | None = Field(None, description="Model that writes summaries; None uses the request's model.")
    summary_base_url: str | None = Field(None, description="OpenAI-compatible base URL for summaries; None uses the upstream.")
    summary_api_key: str | None = Field(
        None, repr=False, description="Key for summary_base_url; None uses the upstream credential (kept out of repr and logs)."
    )
    summary_max_words: int = Field(
        700, ge=1, description="Word limit asked of the summary: it is re-sent on every request (the profile sets it)."
    )
    exact_values_limit: int = Field(
        40, ge=0,
        description="Paths, dates, numbers and names listed per kind in the summary block, earliest and newest (the "
        "profile sets it); ids, urls, versions and e-mails are always listed whole, and every value stays recallable.",
    )
    summary_prompt: str | None = Field(None, description="Summary instruction with a {max_words} placeholder; None = built-in prompt.")
    summary_chunk_tokens: int = Field(
        16000, ge=256, description="Largest transcript delta per summary call; bigger deltas are folded in chunks."
    )
    summary_parallel: int = Field(
        8, ge=1, le=64,
        description="Chunks of a big delta summarised at once, then merged in one more call: a 100k-token arrival "
        "folds in two call latencies instead of seven, often within sync_budget_s. 1 = fold strictly in sequence.",
    )
    summary_tool_head_chars: int = Field(600, ge=0, description="Characters of each tool result's start shown to the summarizer.")
    summary_tool_tail_chars: int = Field(300, ge=0, description="Characters of each tool result's end shown to the summarizer.")
    redact_patterns: list[str] = Field(
        default_factory=lambda: list(DEFAULT_REDACT_PATTERNS),
        description="Regexes removed from summary input: secrets must not be copied into a long-lived summary.",
    )
    summary_cache_fork: bool = Field(
        True, description="When the summary model is the request's model: send the view just sent (same system, tools and "
        "messages) plus one instruction, so the provider's prompt cache serves the summary call's input."
    )
    cost_model: bool = Field(
        True, description="Compaction events between compact_trigger_ratio and sync_compaction_ratio, and summary jobs, only "
        "when they pay for themselves (policies/cost.py); off: the ratios trigger unconditionally."
    )
    fit_first: bool = Field(
        True, description="A conversation that fits the window as the client sent it gets no summary: billed as direct, "
        "never above it (old tool results may still become placeholders where that pays). Off: a long one that fits is "
        "also summarised when the smaller view pays for the summary and its rewrite (policies/cost.py); on by default in "
        "every profile, as on chat-shaped 128k sessions it measured dearer than placeholders alone (bench/README.md).")
    cached_input_rate: float | None = Field(
        None, ge=0, le=1, description="A cached input token's price / an uncached one's (cost model); unset: the model's "
        "cache rule (policies/prices.py), else 0.1.")
    cache_write_rate: float | None = Field(
        None, ge=0, le=10, description="A cache-written input token's price / an uncached one's (1.0 OpenAI before GPT-5.6, "
        "1.25 GPT-5.6 on and Anthropic); unset: the model's cache rule, else 1.0.")
    cache_write_1h_rate: float | None = Field(
        None, ge=0, le=10, description="The same under the provider's long TTL (Anthropic's 1 hour: 2.0), used when the "
        "client asks its conversation cached that long (the gateway's markers then write at it); unset: the model's cache "
        "rule, else cache_write_rate.")
    holdout_share: float = Field(
        0.0, ge=0, le=1, description="Share of sessions (deterministic per session) sent as direct: untouched while they "
        "fit, the oldest rounds cut when they do not, still recorded; their metrics carry arm=\"holdout\", the others "
        "arm=\"compacted\", so the saving is measured on the operator's own traffic (policies/holdout.py).")
    cache_min_tokens: int | None = Field(
        None, ge=0, description="The shortest prefix the provider caches; unset: the model's cache rule, else 1024.")
    cache_step: int | None = Field(
        None, ge=1, description="Cached prefix lengths grow in these steps; unset: the model's cache rule, else 128.")
    output_rate: float = Field(4.0, ge=0, le=100, description="An output token's price / an uncached input token's (cost model).")
    summary_timeout_s: float = Field(60.0, gt=0, description="Upper bound for one summary call.")
    sync_budget_s: float = Field(
        8.0, gt=0, description="Time a request may wait for a synchronous summary before going out tailored with the exact values."
    )
    summary_required_values_ratio: float = Field(
        0.5, description="Share of extracted ids/paths/versions/emails a summary must keep verbatim to be accepted."
    )
    recall: bool = Field(True, description="Inject session_search/session_load when anything is hidden from the model.")
    pinned_ratio: float = Field(
        0.05, ge=0, le=0.5,
        description="Share of the budget the pinned block of standing instructions may take (the user's rules for the "
        "rest of the session and the instruction files agents inject, kept verbatim once a summary hides them); "
        "over it the oldest rules are left to the summary. 0 turns pinning off.",
    )
    hidden_index_ratio: float = Field(
        0.03, ge=0, le=0.2,
        description="Share of the budget for the hidden-context index, a list of the topics, entities and exact values "
        "a checkpoint hides, with their event ids, after the summary block (so the model knows what to search for); "
        "it changes only with the checkpoint, so it stays in the cached prefix. 0 = off.",
    )
    truncate_last_message: bool = Field(
        False,
        description="Cut the newest user message head/tail when nothing else makes the request fit (a response header "
        "says so); false answers 400 context_length_exceeded with the numbers instead of altering it silently.",
    )

    @model_validator(mode="before")
    @classmethod
    def _profile_defaults(cls, data: Any) -> Any:
        if not isinstance(data, dict):
            return data
        profile = data.get("profile", "balanced")
        bundle = PROFILES.get(profile) if isinstance(profile, str) else None
        if bundle is None:
            return data  # the Literal check names the key and the allowed values
        return {**bundle, **data}

    @field_validator("summary_trigger_ratio", "sync_compaction_ratio", "summary_required_values_ratio",
                     "compact_trigger_ratio", "view_target_ratio")
    @classmethod
    def _ratio(cls, value: float, info) -> float:
        if not 0 < value <= 1:
            raise ValueError(f"Policy '{info.field_name}' has value {value!r}. Must be in (0, 1].")
        return value

    @field_validator("redact_patterns")
    @classmethod
    def _patterns_compile(cls, value: list[str]) -> list[str]:
        for pattern in value:
            try:
                re.compile(pattern)
            except re.error as exc:
                raise ValueError(f"Policy 'redact_patterns' has value {pattern!r}. Not a valid regex: {exc}.") from None
        return value

    @field_validator("summary_prompt")
    @classmethod
    def _prompt_not_blank(cls, value: str | None) -> str | None:
        if value is not None and not value.strip():
            raise ValueError("Policy 'summary_prompt' has value ''. Use null for the built-in prompt.")
        return value

    @model_validator(mode="after")
    def _sync_not_below_trigger(self) -> Policy:
        if self.sync_compaction_ratio < self.summary_trigger_ratio:
            raise ValueError(
                f"Policy 'sync_compaction_ratio' has value {self.sync_compaction_ratio!r}, below "
                f"'summary_trigger_ratio' {self.summary_trigger_ratio!r}. It must be >= the async trigger."
            )
        if self.view_target_ratio > self.compact_trigger_ratio:
            raise ValueError(
                f"Policy 'view_target_ratio' has value {self.view_target_ratio!r}, above "
                f"'compact_trigger_ratio' {self.compact_trigger_ratio!r}. Compaction settles below its trigger."
            )
        return self

    @property
    def compaction_keep(self) -> int:
        """The newest rounds tool-result compaction never touches (``compact_keep_rounds``)."""
        return self.compact_keep_rounds if self.compact_keep_rounds is not None else self.keep_recent_rounds

    def for_budget(self, budget: int) -> Policy:
        """This policy with the raw-tail cap scaled to a window's budget."""
        cap = min(self.keep_recent_tokens, int(self.keep_recent_share * budget))
        return self if cap == self.keep_recent_tokens else self.model_copy(update={"keep_recent_tokens": cap})

    def tool_rule(self, tool_name: str) -> ToolRule | None:
        """The first rule whose glob matches ``tool_name`` (insertion order), else None."""
        for glob, rule in self.tool_rules.items():
            if fnmatchcase(tool_name, glob):
                return rule
        return None


_MATCH_KEYS = ("model", "session")


def _field_adapter(name: str) -> TypeAdapter:
    info = Policy.model_fields[name]
    return TypeAdapter(Annotated[info.annotation, info])


class PolicyOverride(BaseModel):
    """Field overrides applied when the request's model and/or session id match the globs.

    TOML keeps the override fields flat beside the globs::

        [[policies]]
        model = "gpt-4o*"
        session = "ci-*"
        keep_recent_rounds = 2
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    model: str | None = Field(None, description="fnmatch glob on the request's model; None = any model.")
    session: str | None = Field(None, description="fnmatch glob on the session id; None = any session.")
    policy: dict[str, Any] = Field(default_factory=dict, description="Policy fields to override.")

    @model_validator(mode="before")
    @classmethod
    def _flat_fields_into_policy(cls, data: Any) -> Any:
        if not isinstance(data, dict):
            return data
        nested = data.get("policy") or {}
        if not isinstance(nested, dict):
            return data  # let field validation report the bad type
        flat = {k: v for k, v in data.items() if k not in (*_MATCH_KEYS, "policy")}
        out = {k: data[k] for k in _MATCH_KEYS if k in data}
        out["policy"] = {**nested, **flat}
        return out

    @field_validator("policy")
    @classmethod
    def _known_fields_with_valid_values(cls, value: dict[str, Any]) -> dict[str, Any]:
        # Catch typos and bad values at start-up; cross-field checks (sync >= trigger) need
        # the base policy and run in resolve_policy.
        for key, item in value.items():
            if key not in Policy.model_fields:
                raise ValueError(f"Policy override key '{key}' is not a policy field.")
            try:
                _field_adapter(key).validate_python(item)
            except Exception as exc:  # pydantic's message is precise; keep it but name the key
                raise ValueError(f"Policy override '{key}' has value {item!r}. {exc}") from None
        return value

    def matches(self, model: str, session_id: str) -> bool:
        """True when every glob given matches; an override with no glob never matches."""
        if self.model is None and self.session is None:
            return False
        if self.model is not None and not fnmatchcase(model or "", self.model):
            return False
        if self.session is not None and not fnmatchcase(session_id or "", self.session):
            return False
        return True


def resolve_policy(base: Policy, overrides: list[PolicyOverride], model: str, session_id: str) -> Policy:
    """The policy for one request: ``base`` with every matching override applied in order.

    Returns ``base`` itself when nothing matches, so the common path allocates nothing and
    callers may cache by identity.
    """
    merged: dict[str, Any] = {}
    for override in overrides:
        if override.matches(model, session_id):
            merged.update(override.policy)
    if not merged:
        return base
    dump = base.model_dump()
    if "profile" in merged:
        # A profile chosen by the override brings its whole bundle; keys the override sets win.
        dump = {k: v for k, v in dump.items() if k not in PROFILE_KEYS}
    return Policy.model_validate(dump | merged)
