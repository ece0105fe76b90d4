"""Settings: one pydantic-settings model, loaded from TOML, overridable by environment.

Every key can be overridden with ``PALIMPSEST_<SECTION>__<KEY>`` (for example
``PALIMPSEST_UPSTREAM__BASE_URL``); environment beats TOML, TOML beats the defaults below.
Unknown keys and bad values fail at start-up with a ``ConfigError`` naming the key.
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, SecretStr, ValidationError, field_validator
from pydantic_settings import (
    BaseSettings,
    PydanticBaseSettingsSource,
    SettingsConfigDict,
    TomlConfigSettingsSource,
)

from policies.policy import PROFILE_KEYS, Policy, PolicyOverride


class ConfigError(Exception):
    """Start-up configuration problem; the message names the key and the bad value."""


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid")


class ServerSettings(_Section):
    host: str = Field("127.0.0.1", description="Interface to listen on.")
    port: int = Field(8787, ge=0, le=65535, description="TCP port (0 picks a free one).")
    admin_token: SecretStr = Field(SecretStr(""), description="Bearer token for /admin; empty turns the admin API off.")
    metrics_token: SecretStr = Field(SecretStr(""), description="Bearer token /metrics requires; empty = /metrics is open, "
                                     "unless tenants are configured: then it answers 401 until a token is set or metrics_open = true.")
    metrics_open: bool = Field(False, description="With tenants configured and no metrics_token: serve /metrics to anyone anyway "
                               "(one warning at start says so). Its figures name tenants and models.")
    client_keys: Literal["auto", "required", "off"] = Field(
        "auto",
        description="Must /v1 clients present a key listed under [tenants] (401 otherwise)? 'auto': when any operator key is "
        "set (upstream.api_key, policy.summary_api_key, recall.embeddings_api_key, a tenant's upstream_key), so the gateway "
        "never lends the operator's keys to anyone; 'required': always; 'off': never.",
    )
    max_body_mb: float = Field(
        32.0, gt=0, description="Largest request body accepted, decoded (413 above); pass-through uploads are unbounded unless compressed."
    )
    max_decompression_ratio: float = Field(
        200.0, gt=1, description="Largest decoded-to-compressed size ratio of a request body past its first 4 MiB (413 above)."
    )
    body_read_timeout_s: float = Field(
        30.0, gt=0,
        description="Longest time a client may take to send a request body the gateway reads whole (408 after, "
        "connection closed); for a streamed pass-through upload, the longest silence between two chunks.",
    )
    keepalive_timeout_s: float = Field(
        75.0, gt=0, description="How long a client connection may sit idle, or with its request head unfinished, before it is closed."
    )
    shutdown_timeout_s: float = Field(30.0, ge=0, description="How long SIGTERM waits for in-flight work.")
    malloc_arena_max: int = Field(
        2, ge=0, description="glibc malloc arenas for `serve` (like MALLOC_ARENA_MAX, which wins when set); 0 = glibc's default of "
        "8 per core, whose free memory grew the heap under load."
    )
    malloc_trim_s: float = Field(60.0, ge=0, description="Seconds between returning free heap pages to the kernel (glibc malloc_trim); 0 = never.")
    passthrough_routes: list[str] = Field(
        default_factory=list,
        description="Pass-through routes beyond the stateless ones (models, embeddings, moderations) that may go upstream "
        "with upstream.api_key, as 'METHOD /v1/glob' or '/v1/glob' (any method); others get 403. Stateful routes "
        "(files, stored completions, batches) on the operator's account are shared by every tenant.",
    )


class UpstreamSettings(_Section):
    base_url: str = Field("https://api.openai.com/v1", description="OpenAI-compatible base URL, ending in /v1.")
    api_key: SecretStr = Field(SecretStr(""), description="Key used upstream; empty forwards the client's Authorization.")
    format: Literal["openai", "anthropic"] = Field(
        "openai", description="The API the gateway's own calls speak (summary jobs, window discovery): 'openai' "
        "(/chat/completions, Authorization) or 'anthropic' (/messages, x-api-key). The operator's key goes in "
        "x-api-key on /v1/messages whatever this says.",
    )
    connect_timeout_s: float = Field(10.0, gt=0, description="TCP/TLS connect timeout (502/504 after).")
    read_timeout_s: float = Field(600.0, gt=0, description="Cap on the two timeouts below (kept for older configs).")
    first_byte_timeout_s: float = Field(
        600.0, gt=0, description="Longest wait for the upstream to start answering: headers, then the first body chunk (504 after)."
    )
    idle_timeout_s: float = Field(
        300.0, gt=0,
        description="Longest silence between two chunks of an upstream body (504, or an error event in a started stream).",
    )
    max_connections: int = Field(0, ge=0, description="Upstream connection pool size; 0 = unbounded.")

    @field_validator("base_url")
    @classmethod
    def _url(cls, value: str) -> str:
        if not value.startswith(("http://", "https://")):
            raise ValueError("must start with http:// or https://")
        return value.rstrip("/")


class StoreSettings(_Section):
    path: str = Field("./palimpsest-data", description="Directory of the embedded store (ledger, checkpoints, index).")
    sync: Literal["normal", "full"] = Field(
        "normal", description="Commit durability: 'normal' survives a gateway crash (SQLite synchronous=NORMAL; PostgreSQL synchronous_commit=off), 'full' also power loss."
    )
    url: str = Field(
        "", description="PostgreSQL URL (postgresql://user:pass@host:port/db) for the ledger and checkpoints shared by replicas; empty = embedded store under path."
    )
    pool_size: int = Field(10, ge=1, le=200, description="PostgreSQL connections per replica.")
    retention_days: float = Field(0, ge=0, description="Delete sessions not updated for this many days (0 = keep forever).")
    max_stored_mb: float = Field(
        0, ge=0, description="Storage quota per tenant: MiB of stored messages past which its requests get 429 (0 = none); "
        "[tenants.NAME] max_stored_mb overrides it."
    )


class SessionSettings(_Section):
    header: str = Field("X-Session-Id", description="Request header naming the session.")
    headers: list[str] = Field(
        default_factory=lambda: ["session-id", "thread-id", "X-Claude-Code-Session-Id"],
        description="Without `header`, these headers name the session, first found wins: what well-known agent clients "
        "send on every request (Codex CLI: session-id, thread-id; Claude Code: X-Claude-Code-Session-Id). Sessions stay "
        "scoped by tenant. [] turns this off.",
    )
    fallback: Literal["fingerprint", "off"] = Field(
        "off",
        description="Without the header: pass through unrecorded ('off'), or derive the session from the credential and "
        "first message ('fingerprint': users behind one key who open alike would share it).",
    )


class ModelSettings(_Section):
    context_window: int | None = Field(None, gt=0, description="Context window in tokens (unset: the upstream's or a well-known one).")
    api: Literal["responses", "chat"] = Field(
        "responses",
        description="What the upstream serves for this model: 'responses' (/v1/responses as well as chat), or 'chat' "
        "(/v1/chat/completions only, e.g. llama.cpp): Responses requests are then rendered as Chat Completions and "
        "the answer translated back.",
    )
    # Prices, US dollars per million tokens; unset fields come from policies.prices.KNOWN_PRICES.
    input_price: float | None = Field(None, ge=0, description="Price of an uncached input token, $ per 1M.")
    cached_input_price: float | None = Field(None, ge=0, description="Price of a cached input token (cache read), $ per 1M.")
    cache_write_price: float | None = Field(None, ge=0, description="Price of an input token written to the cache, $ per 1M.")
    output_price: float | None = Field(None, ge=0, description="Price of an output token, $ per 1M.")

    def price_fields(self) -> dict[str, float | None]:
        """The overrides as policies.prices.price_of reads them."""
        return {"input": self.input_price, "cached_input": self.cached_input_price,
                "cache_write": self.cache_write_price, "output": self.output_price}


class RecallSettings(_Section):
    max_rounds: int = Field(3, ge=0, le=10, description="Recall tool rounds per turn before a final call without them.")
    embeddings_url: str = Field("", description="OpenAI-compatible /v1 base for embeddings; empty = embedded WordLlama.")
    embeddings_model: str = Field("text-embedding-3-small", description="Model name sent to embeddings_url.")
    embeddings_api_key: SecretStr = Field(SecretStr(""), description="Key for embeddings_url.")
    embeddings_dim: int = Field(1536, gt=0, description="Vector size embeddings_url returns.")
    search_limit: int = Field(5, ge=1, le=20, description="Default number of search results.")
    passage_tokens: int = Field(
        600, ge=0, le=8000, description="Tokens of matching passages a search result carries for its best hits (0 = snippets only)."
    )
    auto_tokens: int = Field(
        600, ge=0, le=8000, description="Proactive recall: tokens of hidden history, found with a fresh user message, added to the view (0 = off)."
    )
    auto_placement: Literal["message", "user", "system"] = Field(
        "message", description="Where the proactive recall block goes: 'message', a user message of its own before the newest "
        "user message (recalled text never carries the system role's authority); 'user', the start of that message (for chat "
        "templates that require turns to alternate); 'system', a system message of its own before it."
    )
    auto_timeout_s: float = Field(
        5.0, gt=0, description="Longest a request waits for its proactive recall search; past it the request goes on "
        "without the block (the search finishes in the background, warming the index)."
    )
    index_uri: str = Field("", description="LanceDB URI of the recall index (s3://bucket/prefix for replicas); empty = <store.path>/index.")
    index_endpoint: str = Field("", description="S3-compatible endpoint URL for index_uri (MinIO, moto, ...); empty = AWS.")
    index_region: str = Field("us-east-1", description="S3 region for index_uri.")
    index_access_key_id: SecretStr = Field(SecretStr(""), description="S3 access key for index_uri; empty = the environment's credentials.")
    index_secret_access_key: SecretStr = Field(SecretStr(""), description="S3 secret key for index_uri.")
    index_cache_mb: int = Field(
        32, ge=1, description="Memory bound of LanceDB's index and metadata caches (split evenly); its own default is GiBs."
    )
    index_batch_s: float = Field(
        1.0, ge=0, description="Background indexing after a turn waits this long, so a busy session's turns go into one "
        "add (each add is a LanceDB version and data file held in native memory until optimised); searches always "
        "catch up first, so they never miss an event.",
    )


class SummarySettings(_Section):
    workers: int = Field(1, ge=1, le=16, description="Concurrent summary jobs (one per session at a time).")
    queue_size: int = Field(256, ge=1, description="Pending summary jobs; more are dropped and retried on a later turn.")
    backoff_base_s: float = Field(
        30.0, gt=0, description="A session's wait after a failed summary job; doubles per failure in a row (no new job per turn)."
    )
    backoff_max_s: float = Field(900.0, gt=0, description="Longest backoff and breaker cool-down.")
    backoff_jitter: float = Field(
        0.5, ge=0, le=1, description="Share of each wait drawn at random, so sessions that failed together retry apart."
    )
    breaker_failures: int = Field(
        5, ge=1, description="Failed summary calls in a row, across sessions, that open a summary model's circuit breaker."
    )
    breaker_cooldown_s: float = Field(
        60.0, gt=0, description="How long an open breaker blocks calls before one probe; doubles after a failed probe."
    )
    tenant_tokens_per_hour: int = Field(
        1_000_000, ge=0,
        description="Summary tokens (prompt + completion) the gateway may spend per tenant and hour, refilled "
        "continuously; past it a job writes deterministic state instead of calling the model (0 = unlimited).",
    )
    max_fold_tokens: int = Field(
        100_000, ge=1000,
        description="History tokens one summary job folds with the model; an older remainder of a bigger delta "
        "becomes deterministic state (its exact values and notes, no model call).",
    )
    deterministic_after: int = Field(
        2, ge=1,
        description="Rejected (off-format) summaries in a row after which a session's jobs write a deterministic "
        "state-only checkpoint, so compaction proceeds while the model is weak.",
    )


class LimitSettings(_Section):
    max_n: int = Field(16, ge=1, description="Largest `n` (choices per Chat Completions request) relayed on a tenant's behalf "
                       "(400 above): n=100000 would be billed to the provider account 100000 times.")
    max_output_tokens: int = Field(131_072, ge=1, description="Largest output-token request (Chat max_tokens / "
                                   "max_completion_tokens, Responses max_output_tokens, Messages max_tokens; 400 above): "
                                   "the largest outputs models offer today fit.")
    requests_per_minute: float = Field(1200, ge=0, description="Requests per minute per tenant on the chat, Responses and "
                                       "Messages routes, with a burst of one minute's worth (429 with Retry-After above); "
                                       "0 = no limit.")


class TenantSettings(_Section):
    key: SecretStr = Field(..., description="The tenant's client API key.")
    upstream_key: SecretStr = Field(SecretStr(""), description="Provider key used for this tenant instead of upstream.api_key.")
    max_stored_mb: float | None = Field(None, gt=0, description="Ledger storage quota for this tenant (default store.max_stored_mb).")
    max_n: int | None = Field(None, ge=1, description="This tenant's limits.max_n.")
    max_output_tokens: int | None = Field(None, ge=1, description="This tenant's limits.max_output_tokens.")
    requests_per_minute: float | None = Field(None, ge=0, description="This tenant's limits.requests_per_minute.")
    bypass: bool = Field(False, description="Send this tenant's requests upstream untouched (still recorded), "
                         "as x-palimpsest-bypass: 1 does for one request.")


class LogSettings(_Section):
    level: Literal["DEBUG", "INFO", "WARNING", "ERROR"] = "INFO"
    json_format: bool = Field(False, alias="json", description="One JSON object per line.")
    content: bool = Field(False, description="Log message text (off by default: never log conversations).")

    model_config = ConfigDict(extra="forbid", populate_by_name=True)


class Settings(BaseSettings):
    model_config = SettingsConfigDict(
        env_prefix="PALIMPSEST_", env_nested_delimiter="__", extra="forbid", env_parse_none_str="null"
    )

    server: ServerSettings = ServerSettings()
    upstream: UpstreamSettings = UpstreamSettings()
    store: StoreSettings = StoreSettings()
    session: SessionSettings = SessionSettings()
    models: dict[str, ModelSettings] = Field(default_factory=dict)
    tenants: dict[str, SecretStr | TenantSettings] = Field(
        default_factory=dict, description="Named tenants: name = client API key, or a table with key, upstream_key, max_stored_mb, max_n, max_output_tokens, requests_per_minute."
    )
    policy: Policy = Policy()
    policies: list[PolicyOverride] = Field(default_factory=list)
    summary: SummarySettings = SummarySettings()
    recall: RecallSettings = RecallSettings()
    limits: LimitSettings = LimitSettings()
    log: LogSettings = LogSettings()

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        toml_file = settings_cls.model_config.get("toml_file")
        sources: list[PydanticBaseSettingsSource] = [init_settings, env_settings]
        if toml_file is not None:
            sources.append(TomlConfigSettingsSource(settings_cls, toml_file=toml_file))
        return tuple(sources)

    def tenant_table(self) -> dict[str, TenantSettings]:
        """Every named tenant in the table form (``name = "key"`` is ``key`` alone)."""
        return {name: t if isinstance(t, TenantSettings) else TenantSettings(key=t) for name, t in self.tenants.items()}

    def context_window(self, model: str) -> int | None:
        found = self.models.get(model)
        return found.context_window if found else None


def load_settings(path: str | Path | None = None, **overrides) -> Settings:
    """Build settings from an optional TOML file, the environment and keyword overrides."""
    cls: type[Settings] = Settings
    if path is not None:
        file = Path(path)
        if not file.is_file():
            raise ConfigError(f"Config file '{file}' does not exist.")
        cls = type("FileSettings", (Settings,), {"model_config": SettingsConfigDict(**{**Settings.model_config, "toml_file": file})})
    try:
        return cls(**overrides)
    except ValidationError as exc:
        raise ConfigError(_describe(exc)) from None
    except ValueError as exc:  # TOML syntax errors surface as ValueError subclasses
        raise ConfigError(f"Config file '{path}' is not valid TOML: {exc}") from None


def _describe(exc: ValidationError) -> str:
    lines = []
    for err in exc.errors():
        key = ".".join(str(part) for part in err["loc"]) or "(root)"
        if err["type"] == "extra_forbidden":
            lines.append(f"Config key '{key}' is not a known setting.")
        else:
            value = err.get("input")
            shown = "<secret>" if any(s in key for s in ("key", "token", "tenants")) else repr(value)
            lines.append(f"Config '{key}' has value {shown}: {err['msg']}.")
    return "\n".join(lines)


def _toml_value(value) -> str:
    if isinstance(value, SecretStr):
        value = value.get_secret_value()
    if isinstance(value, bool):
        return "true" if value else "false"
    if value is None:
        return '""  # unset'
    if isinstance(value, str):
        return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(_toml_value(v) for v in value) + "]" if value else "[]"
    if isinstance(value, dict):
        return "{ " + ", ".join(f"{k} = {_toml_value(v)}" for k, v in value.items()) + " }" if value else "{}"
    return str(value)


SECTION_HELP = {
    "server": "The HTTP server.",
    "upstream": "The OpenAI-compatible provider requests are forwarded to.",
    "store": "The embedded store (nothing else to run).",
    "session": "How requests map to sessions.",
    "policy": "The default compaction policy; [[policies]] below override it by model/session glob.",
    "summary": "The summary job queue.",
    "recall": "In-gateway recall (session_search / session_load).",
    "limits": "What one tenant may ask of the provider account; [tenants.NAME] max_n, max_output_tokens and requests_per_minute override them.",
    "log": "Logging. Message text and credentials are never logged unless log.content = true.",
}


def example_toml() -> str:
    """config.example.toml, rendered from the settings models: every key, its default and why."""
    lines = [
        "# Palimpsest settings: every key with its default. Generated by",
        "# `python -c 'from gateway.settings import example_toml; print(example_toml(), end=\"\")'`.",
        "# Every key can be overridden by PALIMPSEST_<SECTION>__<KEY>, e.g. PALIMPSEST_UPSTREAM__BASE_URL.",
        "",
    ]
    defaults = Settings.model_construct()
    for name, field in Settings.model_fields.items():

        if name in ("models", "tenants", "policies"):
            continue
        lines.append(f"# {SECTION_HELP.get(name, '')}")
        lines.append(f"[{name}]")
        section = getattr(defaults, name)
        for key, f in type(section).model_fields.items():
            alias = f.alias or key
            if f.description:
                lines.append(f"# {f.description}")
            value = getattr(section, key)
            if name == "policy" and key in PROFILE_KEYS:  # set here, it would override the profile's
                lines.append(f"# {alias} = {_toml_value(value)}   (set by the profile)")
            elif value is None:
                lines.append(f"# {alias} =   (unset by default)")
            elif isinstance(value, dict) and not value:
                lines.append(f"# {alias} = {{}}")
            else:
                lines.append(f"{alias} = {_toml_value(value)}")
        lines.append("")
    lines += [
        "# Context windows by model name. Without an entry the window is discovered from the upstream's",
        "# /v1/models (context_length, max_model_len, ...), else a conservative default is used.",
        "# Prices ($ per 1M tokens) override the built-in table of well-known models (policies/prices.py).",
        '# [models."gpt-4o"]',
        "# context_window = 128000",
        '# api = "responses"   # "chat": the upstream serves only /v1/chat/completions; Responses requests are translated',
        "# input_price = 2.50",
        "# cached_input_price = 1.25",
        "# cache_write_price = 2.50",
        "# output_price = 10.00",
        "",
        "# Named tenants: requests whose API key matches are stored under the tenant's name instead",
        "# of a hash of the key. Keys are compared in constant time and never logged.",
        "# [tenants]",
        '# acme = "sk-acme-..."',
        "# A tenant of its own provider account, with a storage quota and its own limits ([limits]):",
        "# [tenants.beta]",
        '# key = "pk-beta-..."',
        '# upstream_key = "sk-provider-beta-..."',
        "# max_stored_mb = 500",
        "# max_n = 4",
        "# max_output_tokens = 32000",
        "# requests_per_minute = 120",
        "# A tenant whose requests all go upstream untouched, still recorded (default false; the header",
        "# x-palimpsest-bypass: 1 asks the same for one request): a control group, or a client that",
        "# must see the provider exactly.",
        "# [tenants.control]",
        '# key = "pk-control-..."',
        "# bypass = true",
        "",
        "# Policy overrides, applied in order to requests whose model and/or session id match the",
        "# globs (later wins). Any [policy] key may be set.",
        "# [[policies]]",
        '# model = "gpt-4o-mini*"',
        "# keep_recent_rounds = 2",
        "#",
        "# [[policies]]",
        '# session = "ci-*"',
        '# injection = "user"',
        "",
        "# Per-tool compaction rules (fnmatch globs on the tool name), inside [policy] or an override:",
        '# [policy.tool_rules."read_file"]',
        '# action = "truncate"   # keep | clean | truncate',
        "# head_tokens = 200",
        "# tail_tokens = 100",
        "",
    ]
    return "\n".join(lines)
