"""A summary job over a big delta reads its notes off the event loop (gateway/jobs/summarizer.py):
extract_notes over a 10k-message batch took seconds of the loop. The loop's latency itself is
measured by bench/abuse.py (29MB-10k), never timed here."""

from __future__ import annotations

import asyncio
import threading

import aiohttp

import gateway.jobs.summarizer as summarizer_module
from gateway.keys import CHECKPOINTS, LEDGER
from tests.support.agent import settle


async def test_the_state_summary_of_a_big_delta_is_read_off_the_loop(start_gateway, monkeypatch):
    threads: list[bool] = []
    real = summarizer_module.extract_notes

    def recording(messages):
        threads.append(threading.current_thread() is threading.main_thread())
        return real(messages)

    monkeypatch.setattr(summarizer_module, "extract_notes", recording)
    # Deterministic summaries only (no model), so every job writes a state summary of its whole delta.
    # cost_model off: the ratios fold even a one-shot arrival (this test is about where the work runs).
    gw = await start_gateway(summary={"tenant_tokens_per_hour": 1}, policy={"cost_model": False})
    text = "the deploy plan for release 4.2 names the host app-7 and the date 2026-03-04. " * 20
    history = [{"role": "user" if i % 2 == 0 else "assistant", "content": f"message {i}: {text}"} for i in range(2_001)]
    async with aiohttp.ClientSession() as s:
        async with s.post(gw.base_url + "/chat/completions", headers={"X-Session-Id": "big"},
                          json={"model": "fake-32k", "max_tokens": 16, "messages": history}) as r:
            assert r.status == 200
    await settle(gw, timeout_s=60)
    for _ in range(600):
        if gw.app[CHECKPOINTS].list(gw.app[LEDGER].sessions()[0].key):
            break
        await asyncio.sleep(0.1)
    assert threads, "the job wrote a state summary"
    assert not any(threads), "extract_notes ran on the event loop's thread"
