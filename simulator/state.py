"""The puppet's run-time state: knobs tests flip, counters, the request log, the prompt cache."""

from __future__ import annotations

import asyncio
import os
import time
from dataclasses import dataclass, field
from typing import Any, Callable

from aiohttp import web

from simulator.cache import PromptCache
from simulator.counting import window_for
from simulator.errors import PuppetError, injected_failure
from simulator.options import DEFAULT_MODELS, FIXTURE_MODELS, MODEL_FAMILIES



@dataclass
class PuppetState:
    """Mutable knobs and counters; tests change them between requests."""

    default_window: int
    windows: dict[str, int]
    chunk_chars: int
    latency_s: float
    # Statuses that the next chat completions fail with, first in first out.
    failures: list[int] = field(default_factory=list)
    # Faults the next streamed answers meet (not summary calls), first in first out, before the
    # last message's markers: ("stall", seconds) after the first event, ("die", n) a reset
    # after n events; ("stall", 0) lets one answer through untouched. One-shot, so a client can
    # retry the very request that failed.
    stream_faults: list[tuple[str, float]] = field(default_factory=list)
    # Seconds the next answers (not summary calls), JSON or streamed, wait before their headers,
    # first in first out: an upstream that accepted the request and stays silent. One-shot too.
    hangs: list[float] = field(default_factory=list)
    # The next answers (not summary calls), first in first out, in place of the script: a test's
    # drawn model behaviours (simulator.script.Answer), any format, JSON or streamed.
    planned: list[Any] = field(default_factory=list)
    # Pause between streamed chunks, to make streams observable in flight.
    chunk_delay_s: float = 0.0
    # Keep at most this many entries in RECEIVED (None: all); benchmarks bound it.
    keep_received: int | None = None
    # Completion ids of streams whose client went away before the end.
    disconnected: list[str] = field(default_factory=list)
    counter: int = 0
    # The simulated prompt cache (simulator/cache.py): shared prefixes billed as cached_tokens.
    prompt_cache: PromptCache = field(default_factory=PromptCache)
    # The Responses and Messages routes' cache (cached_prefix): the previous prompt per model.
    last_prompt: dict[str, list] = field(default_factory=dict)
    # Model names served besides those in `windows` and the fake-<N>k family.
    models: tuple[str, ...] = DEFAULT_MODELS + FIXTURE_MODELS
    # Summary calls only (x-palimpsest-purpose: summary), to play a weak or rate-limited summary
    # model: statuses the next ones fail with (first in, first out), a status every one fails
    # with, the Retry-After sent with a 429, a delay before answering, a gate that holds every
    # summary call until a test opens it, and "ignore" to answer without the required headings.
    summary_failures: list[int] = field(default_factory=list)
    summary_status: int | None = None
    retry_after: str = "1"
    summary_latency_s: float = 0.0
    summary_gate: asyncio.Event | None = None
    summary_format: str = "follow"
    # Responses kept by id (``store`` not false): {"response", "context", "output"}.
    responses: dict[str, dict[str, Any]] = field(default_factory=dict)
    # function_call id -> the reasoning item id that was emitted right before it.
    bound_reasoning: dict[str, str] = field(default_factory=dict)
    # Anthropic prompt cache: prefix digests written at breakpoints -> (token length, the
    # clock time it expires at, its TTL in seconds); a read renews it for its TTL.
    cache_written: dict[str, dict[bytes, tuple[int, float, float]]] = field(default_factory=dict)
    # The cache's clock (seconds); tests replace it to let entries expire.
    clock: Callable[[], float] = time.monotonic
    # Signs reasoning encrypted_content, thinking signatures and compaction items.
    secret: bytes = field(default_factory=lambda: os.urandom(32))

    def next_id(self) -> int:
        self.counter += 1
        return self.counter

    def delay(self, request: web.Request, marks: dict[str, float]) -> float:
        """Seconds to wait before answering: the latency knob, ``[[sleep S]]`` and the next hang."""
        hang = 0.0
        if self.hangs and request.headers.get("x-palimpsest-purpose", "").lower() != "summary":
            hang = self.hangs.pop(0)
        return self.latency_s + marks.get("sleep", 0.0) + hang

    def next_answer(self, request: web.Request) -> Any:
        """The next planned answer for a request that is not a summary call, else None."""
        if self.planned and request.headers.get("x-palimpsest-purpose", "").lower() != "summary":
            return self.planned.pop(0)
        return None

    def window(self, model: str) -> int:
        return window_for(model, self.windows, self.default_window)

    def known_models(self) -> list[str]:
        """The names /v1/models lists."""
        return list(dict.fromkeys([*self.windows, *self.models]))

    def require_model(self, model: str) -> None:
        """404 model_not_found, as the provider answers, for a model it does not serve."""
        if (model in self.windows or model in self.models
                or any(family.fullmatch(model) for family in MODEL_FAMILIES)):
            return
        raise PuppetError(404, f"The model `{model}` does not exist or you do not have access "
                          "to it.", code="model_not_found")


RECEIVED: web.AppKey[list[dict[str, Any]]] = web.AppKey("puppet_received", list)
PUPPET_STATE: web.AppKey[PuppetState] = web.AppKey("puppet_state", PuppetState)




async def record(request: web.Request, body: bytes, parsed: Any) -> None:
    """Log one request in app[RECEIVED] (bounded by PuppetState.keep_received)."""
    received = request.app[RECEIVED]
    received.append({"method": request.method, "path": request.path,
                     "headers": {k.lower(): v for k, v in request.headers.items()},
                     "json": parsed, "body": body, "at": time.perf_counter()})
    keep = request.app[PUPPET_STATE].keep_received
    if keep is not None and len(received) > keep:
        del received[: len(received) - keep]


# The Responses and Messages routes' prompt cache: the prefix shared with the previous request.


def cached_prefix(state: PuppetState, key: str, keyed: list[tuple[bytes, int]]) -> int:
    """OpenAI's rule: the prefix shared with the previous request under `key`, counted when it
    is at least 1024 tokens, in steps of 128. `keyed` is (item bytes, item tokens) in order."""
    previous = state.last_prompt.get(key, [])
    state.last_prompt[key] = keyed
    shared = 0
    for (key, tokens), (before, _) in zip(keyed, previous):
        if key != before:
            break
        shared += tokens
    return 0 if shared < 1024 else shared // 128 * 128



async def summary_faults(state: PuppetState) -> None:
    """Summary calls only: the failures and delay of a weak or rate-limited summary model."""
    status = state.summary_failures.pop(0) if state.summary_failures else state.summary_status
    if status:
        error = injected_failure(status)
        if status == 429:
            error.headers["retry-after"] = state.retry_after
        raise error
    if state.summary_latency_s:
        await asyncio.sleep(state.summary_latency_s)
    if state.summary_gate is not None:
        await state.summary_gate.wait()
