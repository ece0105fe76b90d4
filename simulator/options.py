"""The simulator's command-line options and model names: cheap to import (``palimpsest``
builds its ``simulate`` subcommand from them without loading the simulator)."""

from __future__ import annotations

import argparse
import re

# The models the simulated provider serves unless told otherwise: the fake-<N>k family (any
# N; the window is N thousand tokens) and the names this repository's tests and benchmarks use.
DEFAULT_MODELS = ("fake-8k", "fake-32k", "fake-128k")
FIXTURE_MODELS = ("m", "gpt-test", "gpt-bench")
# Name families served as well: fake-<N>k, and the many distinct names of the metrics
# label-cardinality test.
MODEL_FAMILIES = (re.compile(r"fake-\d+k"), re.compile(r"client-model-\d+"))


def add_arguments(parser: argparse.ArgumentParser, *, fixtures: bool = True) -> None:
    """Options shared by ``python -m simulator.puppet`` and ``palimpsest simulate``; with
    `fixtures` the test and benchmark names are served too (``palimpsest simulate`` leaves
    them out: a user sees the fake-<N>k family and the models they add)."""
    parser.set_defaults(fixtures=fixtures)
    served = DEFAULT_MODELS + (FIXTURE_MODELS if fixtures else ())
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8790)
    parser.add_argument("--model", action="append", default=[], metavar="NAME[=TOKENS]",
                        help="serve this model too, with this context window (repeatable); "
                        f"always served: {', '.join(served)} and any "
                        "fake-<N>k (window N thousand)")
    parser.add_argument("--window", action="append", default=[], metavar="MODEL=TOKENS",
                        help="context window for a model name (repeatable; also serves it)")
    parser.add_argument("--default-window", type=int, default=128_000,
                        help="window of served models without one")
    parser.add_argument("--chunk-chars", type=int, default=12, help="characters per SSE chunk")
    parser.add_argument("--latency", type=float, default=0.0, help="seconds before each answer")
    parser.add_argument("--keep-received", type=int, default=1000,
                        help="requests kept in memory for inspection")
