"""``[upstreams.NAME]``: further providers, and which of them serves a model.

A request goes to the first named upstream whose ``models`` globs match its model, else to the
default ``[upstream]`` (named ``default`` in routing, metrics and ``/readyz``). The rule is a pure
function of the settings, so the live gateway, ``palimpsest inspect`` and the tests route alike
(docs/architecture.md, "Upstreams").
"""

from __future__ import annotations

import fnmatch
from collections.abc import Mapping
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, SecretStr, field_validator

DEFAULT_UPSTREAM = "default"  # the name of [upstream]


class NamedUpstreamSettings(BaseModel):
    """One ``[upstreams.NAME]`` table: a provider that serves the models its globs match."""

    model_config = ConfigDict(extra="forbid")

    base_url: str = Field(..., description="Base URL of the provider's API, ending in /v1.")
    format: Literal["openai", "anthropic"] = Field(
        "openai", description="The API the gateway's own calls speak to it (summary jobs, window discovery, /v1/models).")
    api_key: SecretStr = Field(SecretStr(""), description="Key used on this upstream; empty forwards the client's credential.")
    models: list[str] = Field(
        default_factory=list, description="Globs of the model names this upstream serves (fnmatch, case-sensitive); the "
        "first [upstreams.NAME] whose globs match a request's model serves it, else [upstream].")
    summary_model: str = Field(
        "", description="Model that writes the summaries of this upstream's sessions; empty = policy.summary_model when "
        "this upstream serves it, else the session's own model.")
    embeddings_url: str = Field(
        "", description="Base URL (/v1) that answers /v1/embeddings for this upstream's models; empty = base_url.")

    @field_validator("base_url", "embeddings_url")
    @classmethod
    def _url(cls, value: str) -> str:
        if value and not value.startswith(("http://", "https://")):
            raise ValueError("must start with http:// or https://")
        return value.rstrip("/")


def upstream_for(upstreams: Mapping[str, NamedUpstreamSettings], model: str | None) -> str:
    """The name of the upstream that serves `model`: the first table whose globs match it, else
    the default [upstream]."""
    if model:
        for name, named in upstreams.items():
            if any(fnmatch.fnmatchcase(model, glob) for glob in named.models):
                return name
    return DEFAULT_UPSTREAM


UPSTREAMS_EXAMPLE = [
    "# Further providers, routed by model: a request goes to the first [upstreams.NAME] whose",
    "# `models` globs match its model, else to [upstream]. Each is discovered, calibrated and billed",
    "# on its own; a session's summary calls go to its upstream, in that upstream's format.",
    "# Timeouts and the pool size are [upstream]'s. /v1/models answers the union of every upstream's.",
    "# [upstreams.anthropic]",
    '# base_url = "https://api.anthropic.com/v1"',
    '# format = "anthropic"   # "openai" (Chat Completions, Authorization) or "anthropic" (Messages, x-api-key)',
    '# api_key = "sk-ant-..."   # empty: the client\'s credential is forwarded',
    '# models = ["claude-*"]',
    '# summary_model = "claude-haiku-4-5"   # empty: policy.summary_model if this upstream serves it, else the session\'s model',
    '# embeddings_url = ""   # where /v1/embeddings for these models goes; empty = base_url',
    "",
]
