"""A long history's heavy pure work runs off the event loop (so the loop never stalls over 1 s
while a 10,000-message body is handled). These tests check where the work runs (which thread, in what
slices), never how long it takes; bench/event_loop.py --messages 10000 measures the stall."""

from __future__ import annotations

import asyncio
import threading

import openai

import gateway.jobs.summarizer as summarizer_module
from gateway.pipeline import offload
from gateway.jobs.indexer import BATCH_EVENTS, Indexer
from gateway.keys import CHECKPOINTS, LEDGER
from store.ledger import Event, Ledger
from tests.support.agent import settle
from tests.support.fakes import RecordingIndex


def on_loop_thread() -> bool:
    return threading.current_thread() is threading.main_thread()


async def test_pure_runs_many_messages_in_a_worker_thread_and_a_few_inline():
    seen: list[bool] = []

    def record(messages, extra):
        seen.append(on_loop_thread())
        return len(messages) + extra

    assert on_loop_thread()
    assert await offload.pure(record, [{"role": "user", "content": "hi"}] * 3, 1) == 4
    assert await offload.pure(record, [{"role": "user", "content": "hi"}] * offload.MANY_MESSAGES, 0) == offload.MANY_MESSAGES
    assert await offload.pure(record, [{"role": "user", "content": "x" * offload.BIG_BODY_BYTES}], 0) == 1
    assert await offload.pure(record, [{"role": "tool", "content": [{"type": "text", "text": "y" * offload.BIG_BODY_BYTES}]}], 0) == 1
    assert seen == [True, False, False, False]


class _Ledger:
    def __init__(self, count: int) -> None:
        self.count = count
        self.threads: list[bool] = []

    def since(self, session_key: str, seq: int) -> list[Event]:
        self.threads.append(on_loop_thread())
        return [Event(f"e{i}", f"e{i - 1}" if i else None, i, "user", {"role": "user", "content": f"message {i}"}, 1.0)
                for i in range(seq + 1, self.count)]


async def test_indexer_reads_off_the_loop_and_adds_in_slices():
    ledger, index = _Ledger(10_000), RecordingIndex()
    indexer = Indexer(ledger, lambda: index)  # type: ignore[arg-type]
    assert await indexer.catch_up("t:big") == 10_000
    assert ledger.threads == [False]  # the read and decode ran in a worker thread
    assert max(index.batches) <= BATCH_EVENTS and sum(index.batches) == 10_000
    assert index.ids == [f"e{i}" for i in range(10_000)]  # in order, each once
    assert await indexer.catch_up("t:big") == 0


async def test_summary_job_reads_a_long_delta_off_the_loop(start_gateway, monkeypatch):
    """A 2,001-message history on a 32k model: the sync summary's exact-value extraction runs
    in a worker thread, and the recall index's catch-up reads the ledger in one too."""
    calls: list[tuple[int, bool]] = []
    real_extract = summarizer_module.extract_exact_values

    def extract(messages, *args, **kwargs):
        calls.append((len(messages), on_loop_thread()))
        return real_extract(messages, *args, **kwargs)

    monkeypatch.setattr(summarizer_module, "extract_exact_values", extract)
    since_threads: list[bool] = []
    real_since = Ledger.since

    def since(self, session_key, seq):
        since_threads.append(on_loop_thread())
        return real_since(self, session_key, seq)

    monkeypatch.setattr(Ledger, "since", since)
    # The history fits the window: only with the plain ratios does it wait for a sync summary.
    gw = await start_gateway(policy={"cost_model": False})
    messages = [{"role": "user" if i % 2 == 0 else "assistant", "content": f"message {i}: order ORD-{i:05d}"} for i in range(2_001)]
    api = openai.AsyncOpenAI(base_url=gw.base_url, api_key="sk-loop", default_headers={"X-Session-Id": "long"}, max_retries=0)
    raw = await api.chat.completions.with_raw_response.create(model="fake-32k", messages=messages)
    assert raw.http_response.status_code == 200
    await settle(gw)
    big = [on_loop for n, on_loop in calls if n >= offload.MANY_MESSAGES]
    assert big and not any(big), calls
    key = next(s.key for s in gw.app[LEDGER].sessions() if s.session_id == "long")
    assert gw.app[CHECKPOINTS].list(key)  # the job still wrote its checkpoint
    assert since_threads and not any(since_threads)
    await asyncio.sleep(0)
