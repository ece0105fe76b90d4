"""`palimpsest inspect` shows the window and budget the live gateway used, from the turn log,
without calling the upstream and without re-projecting every past request."""

from __future__ import annotations

import asyncio
import json
import os
import sys

import openai

from gateway.keys import LEDGER, TURNS
from store.turns import TurnBasis, TurnLog


def client(gw, session: str) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url=gw.base_url, api_key="sk-a", default_headers={"X-Session-Id": session}, max_retries=0)


async def inspect(store: str, *args: str) -> dict:
    # No upstream in the environment: an address nothing listens on, and no [models].
    env = {k: v for k, v in os.environ.items() if not k.startswith("PALIMPSEST_")}
    env.update(PALIMPSEST_STORE__PATH=store, PALIMPSEST_UPSTREAM__BASE_URL="http://127.0.0.1:9/v1")
    proc = await asyncio.create_subprocess_exec(sys.executable, "-m", "gateway", "inspect", *args, "--json", env=env,
                                                stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    out, err = await asyncio.wait_for(proc.communicate(), 120)
    assert proc.returncode == 0, err.decode()
    return json.loads(out)


async def test_inspect_reads_the_window_and_budget_the_gateway_recorded(start_gateway, upstream):
    # No [models] entry: the gateway learns fake-32k's window (32,000) from the upstream's /v1/models.
    gw = await start_gateway()
    history = [{"role": "user", "content": "first"}]
    c = client(gw, "rec")
    for turn in range(3):
        answer = await c.chat.completions.create(model="fake-32k", messages=history, max_tokens=500)
        history += [answer.choices[0].message.model_dump(exclude_none=True), {"role": "user", "content": f"next {turn}"}]
    await c.chat.completions.create(model="fake-8k", messages=history)  # the newest request names another model
    record = next(r for r in gw.app[LEDGER].sessions() if r.session_id == "rec")
    rows = gw.app[TURNS].session(record.key)  # flushes: the subprocess below reads the file
    assert [(r.model, r.window, r.budget) for r in rows[:3]] == [("fake-32k", 32_000, 32_000 - 500 - 1024)] * 3
    assert (rows[3].model, rows[3].window) == ("fake-8k", 8_000) and rows[3].budget < 8_000
    assert all(r.client_tokens > 0 and r.upstream_tokens == r.client_tokens for r in rows)
    models_calls = len([r for r in upstream.received if r["path"] == "/v1/models"])

    detail = await inspect(gw.settings.store.path, "rec")
    basis = detail["basis"]
    assert (basis["model"], basis["model_source"], basis["window"]) == ("fake-8k", "newest request", 8_000)
    assert basis["window_source"] == "recorded by the gateway"
    turns = detail["turns"]
    assert [t["event"] for t in turns] == [r.node for r in rows]
    assert [(t["model"], t["window"], t["budget"]) for t in turns] == [(r.model, r.window, r.budget) for r in rows]
    assert detail["totals"]["requests"] == 4
    assert turns[0]["window"] == 32_000  # not the 16k default a fresh process would guess
    view = await inspect(gw.settings.store.path, record.key, "--view")
    assert view["tokens"]["window"] == 8_000 and view["tokens"]["window_source"] == "recorded by the gateway"
    # Inspecting asked the upstream nothing.
    assert len([r for r in upstream.received if r["path"] == "/v1/models"]) == models_calls


async def test_retries_of_one_request_count_once_and_other_branches_do_not_count(start_gateway):
    gw = await start_gateway()
    c = client(gw, "fork")
    base = [{"role": "user", "content": "a"}]
    await c.chat.completions.create(model="fake-32k", messages=base)
    await c.chat.completions.create(model="fake-32k", messages=base)  # a retry of the same request
    first = await c.chat.completions.create(model="fake-32k", messages=base)
    grown = base + [first.choices[0].message.model_dump(exclude_none=True)]
    await c.chat.completions.create(model="fake-32k", messages=grown + [{"role": "user", "content": "b"}])
    await c.chat.completions.create(model="fake-32k", messages=grown + [{"role": "user", "content": "b edited"}])
    gw.app[TURNS].flush()  # the gateway writes its turn rows every ~0.5 s; don't wait for it
    detail = await inspect(gw.settings.store.path, "fork")
    assert detail["totals"]["requests"] == 2  # "a" (three times) and "b edited": the current branch
    assert len(detail["branches"]) == 2


async def test_a_session_answered_before_the_turn_log_still_shows(start_gateway):
    gw = await start_gateway(models={"fake-32k": {"context_window": 30_000}})
    await client(gw, "old").chat.completions.create(model="fake-32k", messages=[{"role": "user", "content": "hi"}])
    record = next(r for r in gw.app[LEDGER].sessions() if r.session_id == "old")
    gw.app[TURNS].delete_session(record.key)  # as if recorded by an older gateway
    env_store = gw.settings.store.path
    detail = await inspect(env_store, "old")
    assert detail["turns"] == [] and detail["totals"]["requests"] == 0
    assert detail["basis"]["window_source"].startswith("not recorded")
    assert detail["basis"]["model"] == "fake-32k"  # the ledger's newest model


def test_turn_log_buffers_until_flush_and_reads_back(tmp_path):
    log = TurnLog(tmp_path)
    row = TurnBasis("t/1", "ev_a", "ev_b", "m", 32_000, 30_000, 1_000, 800, "cp_1", 2)
    log.add(row)
    other = TurnLog(tmp_path)  # another process: sees nothing before the flush
    assert other.session("t/1") == []
    log.flush()
    assert other.session("t/1") == [row]
    assert log.delete_session("t/1") == 1 and other.session("t/1") == []
    log.close()
    other.close()
