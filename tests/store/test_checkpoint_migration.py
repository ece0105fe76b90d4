"""A gateway started on a store whose checkpoints are pickles (earlier versions) converts them to
JSON and uses every one of them: the admin API lists them all and the next request's view is
built on the newest (store/checkpoints.py, store/checkpoints_migration.py)."""

from __future__ import annotations

import shutil
from dataclasses import asdict

import aiohttp
import diskcache
import openai

from gateway.keys import CHECKPOINTS, LEDGER
from simulator.workloads import TOOL_SPECS, synthetic_session
from store.checkpoints import DIRECTORY
from tests.support.agent import drive, settle

AUTH = {"Authorization": "Bearer adm"}


async def test_a_pickle_checkpoint_store_converts_and_every_checkpoint_reads_back(start_gateway, upstream, tmp_path):
    data = tmp_path / "data"
    first = await start_gateway(server={"admin_token": "adm"}, policy={"profile": "economy"})
    api = openai.AsyncOpenAI(base_url=first.base_url, api_key="sk-m", default_headers={"X-Session-Id": "old"}, max_retries=0)
    history, _ = await drive(api, synthetic_session(seed=4, rounds=30), model="fake-32k")
    await settle(first)
    record = first.app[LEDGER].sessions()[0]
    written = first.app[CHECKPOINTS].list(record.key)
    assert len(written) >= 1
    await first.stop()
    # The same checkpoints as the pickle store of earlier versions wrote them (one row each).
    shutil.rmtree(data / DIRECTORY)
    old = diskcache.Cache(str(data / "checkpoints"), size_limit=2**62, eviction_policy="none")
    for cp in written:
        old[("cp", record.key, cp.version)] = asdict(cp)
    old[("cps", record.key)] = len(written)
    old.close()

    second = await start_gateway(server={"admin_token": "adm"}, policy={"profile": "economy"})
    assert second.app[CHECKPOINTS].list(record.key) == written
    async with aiohttp.ClientSession() as s:
        async with s.get(f"{second.root}/admin/sessions/{record.key}", headers=AUTH) as r:
            assert r.status == 200
            listed = (await r.json())["checkpoints"]
    assert [cp["id"] for cp in listed] == [cp.id for cp in written]
    assert [cp["summary"] for cp in listed] == [cp.summary for cp in written]
    assert not (data / "checkpoints").exists()
    # The next request of the session is built on the converted checkpoints.
    before = len(upstream.chat_requests())
    api = openai.AsyncOpenAI(base_url=second.base_url, api_key="sk-m", default_headers={"X-Session-Id": "old"}, max_retries=0)
    history.append({"role": "user", "content": "and now?"})
    await api.chat.completions.create(model="fake-32k", messages=history, tools=TOOL_SPECS)
    sent = [r for r in upstream.chat_requests()[before:] if not r["headers"].get("x-palimpsest-purpose")][0]
    blocks = [m["content"] for m in sent["json"]["messages"] if "<session_summary>" in str(m.get("content"))]
    assert blocks and any(cp.summary.strip()[:200] in blocks[0] for cp in written)
