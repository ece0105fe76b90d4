"""The options of ``palimpsest replay`` (gateway/cli/replay.py), apart so that building the
command's parser imports neither the gateway nor the simulator."""

from __future__ import annotations

import argparse

__all__ = ["PROFILES", "RATES", "add_arguments"]

PROFILES = ("balanced", "economy", "fidelity", "direct")
# (cache read, cache write) per uncached input token. OpenAI bills no write; Anthropic writes at
# 1.25x (5-minute cache) or 2x (1-hour cache); "openai-write" is OpenAI's read rate with a
# 1.25x write, for OpenAI-compatible providers that bill writes; "none" ignores caching.
RATES: dict[str, tuple[float, float]] = {"openai": (0.1, 1.0), "openai-write": (0.1, 1.25),
                                         "anthropic-5m": (0.1, 1.25), "anthropic-1h": (0.1, 2.0),
                                         "none": (1.0, 1.0)}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--config", help="TOML settings file (its policy and overrides apply to each profile).")
    parser.add_argument("--from", dest="source", metavar="FILE.jsonl",
                        help="Request bodies, one a line, each with 'session' and 'format' (chat, responses, messages); "
                        "without it, the configured store's sessions.")
    parser.add_argument("--tenant", help="Without --from: only this tenant's stored sessions.")
    parser.add_argument("--session", dest="sessions", action="append", default=[], metavar="KEY",
                        help="Without --from: this stored session (key tenant/hash, or session id); repeatable.")
    parser.add_argument("--html", metavar="FILE", help="Also write the per-request chart of the profiles as one offline HTML file.")
    parser.add_argument("--profiles", default=",".join(PROFILES), help="Comma-separated: balanced, economy, fidelity, direct.")
    parser.add_argument("--policy", action="append", default=[], metavar="KEY=VALUE", help="A [policy] setting for every profile.")
    parser.add_argument("--model", help="Send every request as this model (its window decides).")
    parser.add_argument("--rates", default="openai", choices=sorted(RATES), help="Cache read/write rates for 'billed'.")
    parser.add_argument("--json", action="store_true", help="One JSON object on stdout.")
