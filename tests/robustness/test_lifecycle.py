"""SIGTERM drains: `palimpsest serve` finishes the requests in flight, records their answers and
exits 0 within `server.shutdown_timeout_s`; a request that cannot finish in time does not hold
the process past that deadline. (tests/cli/test_settings.py covers SIGTERM on an idle
gateway; these are the cases with work in flight.)"""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import sys
import time

import aiohttp
import orjson

from store.ledger import Ledger


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


async def _serve(tmp_path, upstream_url: str, shutdown_timeout_s: float):
    port = _free_port()
    cfg = tmp_path / "c.toml"
    cfg.write_text(f'[server]\nport = {port}\nshutdown_timeout_s = {shutdown_timeout_s}\n'
                   f'[upstream]\nbase_url = "{upstream_url}"\n[store]\npath = "{tmp_path / "data"}"\n')
    proc = await asyncio.create_subprocess_exec(sys.executable, "-m", "gateway", "serve", "--config", str(cfg),
                                                stderr=asyncio.subprocess.DEVNULL, env={**os.environ, "PYTHONUNBUFFERED": "1"})
    url = f"http://127.0.0.1:{port}"
    async with aiohttp.ClientSession() as s:
        for _ in range(300):
            try:
                async with s.get(url + "/healthz") as r:
                    if r.status == 200:
                        return proc, url
            except aiohttp.ClientConnectionError:
                await asyncio.sleep(0.1)
    proc.kill()
    raise AssertionError("gateway did not start")


async def _stream(url: str, content: str, session: str) -> tuple[bytes, float]:
    body = {"model": "fake-32k", "stream": True, "messages": [{"role": "user", "content": content}]}
    started = time.monotonic()
    async with aiohttp.ClientSession() as s:
        async with s.post(url + "/v1/chat/completions", data=orjson.dumps(body),
                          headers={"X-Session-Id": session, "Content-Type": "application/json"},
                          timeout=aiohttp.ClientTimeout(total=60)) as r:
            assert r.status == 200
            return await r.read(), time.monotonic() - started


async def test_sigterm_drains_an_in_flight_stream_and_records_its_answer(upstream, tmp_path):
    proc, url = await _serve(tmp_path, upstream.base_url, shutdown_timeout_s=15)
    try:
        # The puppet sends the first chunk, then stalls 2 s, then the rest.
        request = asyncio.create_task(_stream(url, "drain me [[stall 2]]", "drain"))
        while not upstream.chat_requests():
            await asyncio.sleep(0.02)
        await asyncio.sleep(0.3)
        proc.send_signal(signal.SIGTERM)
        sent_at = time.monotonic()
        payload, _ = await request
        rc = await asyncio.wait_for(proc.wait(), 20)
        exited_after = time.monotonic() - sent_at
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
    assert rc == 0
    assert payload.rstrip().endswith(b"data: [DONE]")  # the stream in flight finished
    assert b'"error"' not in payload
    assert exited_after < 15  # within shutdown_timeout_s
    ledger = Ledger(tmp_path / "data")
    try:
        (record,) = [r for r in ledger.sessions() if r.session_id == "drain"]
        answers = [e.message for e in ledger.since(record.key, -1) if e.role == "assistant"]
    finally:
        ledger.close()
    assert [a.get("content") for a in answers] == ["ok: drain me [[stall 2]]"]  # recorded before exit


async def test_sigterm_does_not_wait_past_the_deadline_for_a_hung_request(upstream, tmp_path):
    proc, url = await _serve(tmp_path, upstream.base_url, shutdown_timeout_s=2)
    try:
        request = asyncio.create_task(_stream(url, "never [[stall 120]]", "hung"))
        while not upstream.chat_requests():
            await asyncio.sleep(0.02)
        await asyncio.sleep(0.3)
        proc.send_signal(signal.SIGTERM)
        sent_at = time.monotonic()
        rc = await asyncio.wait_for(proc.wait(), 30)
        exited_after = time.monotonic() - sent_at
        # The client is not left hanging either: its stream ends when the process does.
        done, _ = await asyncio.wait([request], timeout=5)
        assert done, "the client still waits after the gateway exited"
        request.exception() if not request.cancelled() else None  # retrieved: an error is expected here
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
    assert rc == 0
    assert exited_after < 2 + 8, exited_after  # the deadline plus cleanup, never the 120 s stall
