"""Crash safety: kill -9 the gateway at random points of a replayed agent workload, restart it,
let the clients resend, then audit the store.

    python bench/crash.py                       # 20 kills (the issue's target), ~3-5 minutes
    python bench/crash.py --kills 4 --agents 2  # a quick look

The gateway is a real ``palimpsest serve`` subprocess on a fixed port and store; the SIMULATED
upstream (``simulator.puppet``) runs in this process and counts summary calls in flight. Agents
replay synthetic sessions (simulator/workloads.py: a user turn, a tool call, the tool result, an
answer) on a small-window model so compaction, summary jobs and background indexing all happen,
streaming every request. A client resends a request until it gets a complete answer (a 200 JSON
or a stream that ended with ``[DONE]`` and no error event), exactly as an agent SDK with retries
would after a connection failure.

The killer cycles through kill points: ``mid-stream`` (a client is inside a stream that has
started), ``mid-summary`` (a summary call is in flight at the upstream), ``mid-index`` (within
300 ms of a compacted turn, when the gateway indexes the hidden history in the background) and
``random``. A point not reached within 30 s is killed at random and reported as such. The run
ends with one more kill -9 (no graceful shutdown), then the store is audited offline:

- lost: messages of the clients' final histories whose event is not in the ledger,
- duplicated: client messages (user/tool) stored more often than the client sent them,
- inconsistent checkpoints: a boundary that is not an event of the session, two checkpoints for
  the same boundary, or version numbers that are not 1..n,
- index behind: sessions whose recall index, after the gateway's catch-up, still misses ledger
  events or cannot find the session's last user message; then ``palimpsest reindex`` rebuilds
  the whole index from the ledger (exit code and time reported).
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import random
import shutil
import subprocess
import sys
import tempfile
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import orjson

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # `python bench/crash.py` from anywhere

from bench.common import run_and_report  # noqa: E402
from bench.faultkit import REPO, Client, GatewayProcess, free_port, start_puppet, table, write_config  # noqa: E402
from simulator.workloads import TOOL_SPECS, synthetic_session  # noqa: E402
from store.canonical import canonical_message, is_instruction, path_ids  # noqa: E402

MODEL = "fake-8k"
WINDOW = 8_000
KINDS = ("mid-stream", "mid-summary", "mid-index", "random")


@dataclass
class Shared:
    gateway: GatewayProcess
    client: Client
    up: asyncio.Event
    stop_new_sessions: bool = False
    last_compacted_turn: float = 0.0
    histories: dict[str, list[dict]] = field(default_factory=dict)  # session id -> final client history
    requests: int = 0
    resends: int = 0
    client_errors: list[str] = field(default_factory=list)


async def send_until_complete(shared: Shared, body: dict, session_id: str) -> dict | None:
    for _ in range(200):
        await shared.up.wait()
        shared.requests += 1
        out = await shared.client.chat(body, session_id)
        if out.message is not None:
            client_tokens = int(out.headers.get("x-palimpsest-prompt-tokens-client", 0))
            upstream_tokens = int(out.headers.get("x-palimpsest-prompt-tokens-upstream", client_tokens))
            if upstream_tokens < client_tokens:  # history hidden: the gateway indexes it now
                shared.last_compacted_turn = time.monotonic()
            return out.message
        if out.status == 0 or out.status >= 500 or out.status == 200:
            shared.resends += 1  # connection lost, gateway 5xx, or a stream cut short: resend
            await asyncio.sleep(0.05)
            continue
        shared.client_errors.append(f"{session_id}: {out.status} {out.error}")
        return None
    shared.client_errors.append(f"{session_id}: gave up after 200 attempts")
    return None


async def agent(shared: Shared, index: int, rounds: int, seed: int) -> None:
    n = 0
    while n == 0 or not shared.stop_new_sessions:
        session_id = f"crash-{index}-{n}"
        session = synthetic_session(seed=seed * 1000 + index * 100 + n, rounds=rounds, min_tokens=150, max_tokens=1100)
        history: list[dict] = [{"role": "system", "content": session.system}]
        shared.histories[session_id] = history
        for spec in session.rounds:
            history.append({"role": "user", "content": spec["user"]})
            answer = await send_until_complete(shared, {"model": MODEL, "messages": history, "tools": TOOL_SPECS, "stream": True}, session_id)
            if answer is None:
                return
            history.append(answer)
            if not answer.get("tool_calls"):
                continue
            for call in answer["tool_calls"]:
                history.append({"role": "tool", "tool_call_id": call["id"], "content": spec["output"]})
            answer = await send_until_complete(shared, {"model": MODEL, "messages": history, "tools": TOOL_SPECS, "stream": True}, session_id)
            if answer is None:
                return
            history.append(answer)
        n += 1


async def observe_metrics(shared: Shared, totals: dict, stop: asyncio.Event) -> None:
    """Scrape /metrics every second; keep each gateway incarnation's last counters (a kill
    loses at most the last second of them)."""
    import aiohttp

    from bench.load import parse_metrics

    last: dict[int, dict[str, float]] = {}
    async with aiohttp.ClientSession() as http:
        while not stop.is_set():
            incarnation = shared.gateway.starts
            try:
                async with http.get(shared.gateway.url + "/metrics", timeout=aiohttp.ClientTimeout(total=2)) as r:
                    last[incarnation] = parse_metrics(await r.text())
            except Exception:  # noqa: BLE001 - the gateway is down between a kill and its restart
                pass
            await asyncio.sleep(1.0)
    for name in ("palimpsest_summary_checkpoints_created_total:sum", 'palimpsest_summary_jobs_dropped_total{reason="leased"}',
                 "palimpsest_summary_jobs_enqueued_total:sum"):
        totals[name] = sum(m.get(name, 0.0) for m in last.values())


async def wait_for_point(kind: str, shared: Shared, puppet, rng: random.Random, timeout: float = 30.0) -> str:
    deadline = time.monotonic() + timeout
    if kind == "random":
        await asyncio.sleep(rng.uniform(0.1, 1.5))
        return kind
    while time.monotonic() < deadline:
        if kind == "mid-stream" and shared.client.streams_in_flight > 0:
            await asyncio.sleep(rng.uniform(0, 0.005))
            return kind
        if kind == "mid-summary" and puppet.summaries_in_flight > 0:
            await asyncio.sleep(rng.uniform(0, 0.1))
            return kind
        if kind == "mid-index" and time.monotonic() - shared.last_compacted_turn < 0.05:
            await asyncio.sleep(rng.uniform(0, 0.3))
            return kind
        await asyncio.sleep(0.002)
    return f"{kind} (not reached: random)"


async def killer(shared: Shared, puppet, kills: int, rng: random.Random, log: list[dict]) -> None:
    await asyncio.sleep(2.0)  # let sessions grow before the first kill
    for k in range(kills):
        kind = KINDS[k % len(KINDS)]
        point = await wait_for_point(kind, shared, puppet, rng)
        in_flight = {"streams": shared.client.streams_in_flight, "summaries": puppet.summaries_in_flight}
        shared.up.clear()
        shared.gateway.kill()
        restart = await shared.gateway.start()
        shared.up.set()
        log.append({"kill": k + 1, "point": point, **in_flight, "restart_s": round(restart, 2)})
        print(f"  kill {k + 1:>2}: {point:<32} streams={in_flight['streams']} summaries={in_flight['summaries']} restart {restart:.1f} s", flush=True)
        await asyncio.sleep(rng.uniform(0.5, 2.0))  # progress between kills


async def stop_sessions_after(shared: Shared, seconds: float) -> None:
    await asyncio.sleep(seconds)
    shared.stop_new_sessions = True


# --- the audit ------------------------------------------------------------------------------------


def _canon(message: dict) -> bytes:
    return orjson.dumps(canonical_message(message), option=orjson.OPT_SORT_KEYS)


async def audit(config: Path, histories: dict[str, list[dict]], since: float) -> dict:
    from gateway.app import open_index
    from gateway.jobs.indexer import Indexer
    from gateway.settings import load_settings
    from store.checkpoints import DiskCheckpoints
    from store.ledger import Ledger

    settings = load_settings(config)
    import sqlite3

    integrity = {}
    for db_file in sorted(Path(settings.store.path).rglob("*.sqlite3")) + sorted(Path(settings.store.path).rglob("cache.db")):
        with sqlite3.connect(db_file) as db:  # before anything opens (and repairs) the store
            integrity[db_file.name] = db.execute("PRAGMA integrity_check").fetchone()[0]
    ledger = Ledger(settings.store.path)
    checkpoints = DiskCheckpoints(settings.store.path)
    indexer = Indexer(ledger, lambda: open_index(settings, None))
    keys = {r.session_id: r.key for r in ledger.sessions()}
    lost = duplicated = orphan_answers = messages = 0
    bad_checkpoints: list[str] = []
    index_behind: list[str] = []
    index_was_behind = 0
    checkpoint_count = checkpoints_after_last_kill = 0
    try:
        index = await indexer.opened()
        for session_id, history in histories.items():
            path = [m for m in history if not is_instruction(m)]
            if not path:
                continue
            key = keys.get(session_id)
            ids = path_ids(path)
            messages += len(path)
            if key is None:
                lost += len(path)
                continue
            events = [e for e in ledger.since(key, -1) if e.kind == "message"]
            by_id = {e.id: e for e in events}
            lost += sum(1 for i in ids if i not in by_id)
            # Duplicates: a client message (user/tool) stored more often than the client sent it.
            sent = Counter(_canon(m) for m in path if m.get("role") in ("user", "tool"))
            stored = Counter(_canon(e.message) for e in events if e.role in ("user", "tool"))
            duplicated += sum(max(0, stored[c] - n) for c, n in sent.items())
            on_path = set(ids)
            orphan_answers += sum(1 for e in events if e.role == "assistant" and e.id not in on_path)
            # Checkpoints: boundaries exist, one per boundary, versions 1..n.
            cps = checkpoints.list(key)
            checkpoint_count += len(cps)
            checkpoints_after_last_kill += sum(1 for cp in cps if cp.created >= since)
            boundaries = Counter(cp.boundary for cp in cps)
            all_ids = {e.id for e in ledger.since(key, -1)}
            for cp in cps:
                if cp.boundary not in all_ids:
                    bad_checkpoints.append(f"{session_id}: {cp.id} boundary {cp.boundary} is not an event")
            bad_checkpoints += [f"{session_id}: {n} checkpoints for boundary {b}" for b, n in boundaries.items() if n > 1]
            if [cp.version for cp in cps] != list(range(1, len(cps) + 1)):
                bad_checkpoints.append(f"{session_id}: versions {[cp.version for cp in cps]}")
            # Index: behind before the catch-up is expected after a kill; after it, never.
            newest = max(e.seq for e in events)
            if index.indexed_seq(key) < newest:
                index_was_behind += 1
            await indexer.catch_up(key)
            last_user = next(m for m in reversed(path) if m.get("role") == "user")
            last_id = ids[len(path) - 1 - path[::-1].index(last_user)]
            hits = await index.search(key, last_user["content"], limit=5)
            if index.indexed_seq(key) < newest or last_id not in {h.event_id for h in hits}:
                index_behind.append(session_id)
    finally:
        await indexer.close()
        checkpoints.close()
        ledger.close()
    return {"integrity": integrity, "messages": messages, "lost": lost, "duplicated": duplicated, "orphan_answers": orphan_answers,
            "checkpoints": checkpoint_count, "checkpoints_after_last_kill": checkpoints_after_last_kill,
            "inconsistent_checkpoints": bad_checkpoints,
            "index_behind": index_behind, "index_behind_before_catch_up": index_was_behind}


async def run(args) -> dict:
    rng = random.Random(args.seed)
    work = Path(tempfile.mkdtemp(prefix="palimpsest-crash-"))
    puppet = await start_puppet(windows={MODEL: WINDOW}, summary_delay_s=args.summary_delay, chunk_delay_s=0.01)
    port = free_port()
    config = write_config(work / "gateway.toml", {
        "server": {"host": "127.0.0.1", "port": port, "shutdown_timeout_s": 5.0},
        "upstream": {"base_url": puppet.base_url},
        "store": {"path": str(work / "store")},
        "log": {"level": "WARNING"},
        "models": {MODEL: {"context_window": WINDOW}},
    })
    gateway = GatewayProcess(config, port, work / "gateway.log")
    kills: list[dict] = []
    started = time.perf_counter()
    try:
        await gateway.start()
        shared = Shared(gateway, Client(gateway.url, timeout_s=30.0), asyncio.Event())
        shared.up.set()
        totals: dict = {}
        stop_observing = asyncio.Event()
        observer = asyncio.create_task(observe_metrics(shared, totals, stop_observing))
        agents = [asyncio.create_task(agent(shared, i, args.rounds, args.seed)) for i in range(args.agents)]
        await killer(shared, puppet, args.kills, rng, kills)
        last_restart = time.monotonic()
        await stop_sessions_after(shared, args.tail_seconds)  # no more kills: do checkpoints resume?
        await asyncio.gather(*agents)
        await asyncio.sleep(1.5)
        stop_observing.set()
        await observer
        gateway.kill()  # the last one: no graceful shutdown before the audit
        await shared.client.close()
        elapsed = time.perf_counter() - started
        result = await audit(config, shared.histories, since=time.time() - (time.monotonic() - last_restart))
        result["gateway_metrics"] = totals
        # The operator's way back: `palimpsest reindex` rebuilds the whole index from the ledger.
        t0 = time.perf_counter()
        reindex = subprocess.run([sys.executable, "-m", "gateway", "reindex", "--config", str(config)], cwd=str(REPO),
                                 capture_output=True, text=True, timeout=600)
        result["reindex"] = {"exit": reindex.returncode, "seconds": round(time.perf_counter() - t0, 1),
                             "output": (reindex.stdout.strip().splitlines() or [reindex.stderr.strip()[-200:]])[-1]}
        result.update({"kills": len(kills) + 1, "kill_log": kills, "sessions": len(shared.histories),
                       "requests": shared.requests, "resends": shared.resends, "client_errors": shared.client_errors,
                       "summary_calls": puppet.summary_calls, "seconds": round(elapsed, 1), "gateway_log": str(work / "gateway.log")})
        return result
    finally:
        gateway.kill()
        await puppet.stop()
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)


def render(r: dict) -> str:
    points = Counter(k["point"] for k in r["kill_log"])
    rows = [
        ("kills (kill -9)", r["kills"], ">= 20", "ok" if r["kills"] >= 20 else "short"),
        ("lost client messages", r["lost"], 0, "ok" if r["lost"] == 0 else "FAIL"),
        ("duplicated client messages", r["duplicated"], 0, "ok" if r["duplicated"] == 0 else "FAIL"),
        ("inconsistent checkpoints", len(r["inconsistent_checkpoints"]), 0, "ok" if not r["inconsistent_checkpoints"] else "FAIL"),
        ("index behind after catch-up (sessions)", len(r["index_behind"]), 0, "ok" if not r["index_behind"] else "FAIL"),
        ("client errors (4xx, gave up)", len(r["client_errors"]), 0, "ok" if not r["client_errors"] else "FAIL"),
        ("SQLite integrity_check", ", ".join(f"{k}: {v}" for k, v in r["integrity"].items()), "ok",
         "ok" if all(v == "ok" for v in r["integrity"].values()) else "FAIL"),
    ]
    out = [table(rows, ("figure", "value", "target", "")), ""]
    out.append("kill points: " + ", ".join(f"{p} x{n}" for p, n in sorted(points.items())) + ", final x1")
    out.append(f"{r['sessions']} sessions, {r['messages']} client messages audited, {r['requests']} requests "
               f"({r['resends']} resends), {r['summary_calls']} summary calls, {r['checkpoints']} checkpoints, "
               f"{r['orphan_answers']} answers recorded but never resent (branches), index behind before catch-up in "
               f"{r['index_behind_before_catch_up']} sessions; {r['seconds']} s")
    g = r.get("gateway_metrics", {})
    leased = g.get('palimpsest_summary_jobs_dropped_total{reason="leased"}', 0)
    out.append(f"gateway counters over all incarnations: summary jobs enqueued {g.get('palimpsest_summary_jobs_enqueued_total:sum', 0):.0f}, "
               f"checkpoints created {g.get('palimpsest_summary_checkpoints_created_total:sum', 0):.0f}, jobs refused by a lease "
               f"{leased:.0f}; checkpoints written after the last kill "
               f"{r['checkpoints_after_last_kill']}")
    if "reindex" in r:
        out.append(f"palimpsest reindex after the last kill: exit {r['reindex']['exit']} in {r['reindex']['seconds']} s: {r['reindex']['output']}")
    for item in (r["inconsistent_checkpoints"] + r["client_errors"])[:10]:
        out.append(f"  ! {item}")
    return "\n".join(out)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--kills", type=int, default=20)
    parser.add_argument("--agents", type=int, default=4, help="concurrent agents (each replays sessions one after another)")
    parser.add_argument("--rounds", type=int, default=24, help="rounds per synthetic session")
    parser.add_argument("--summary-delay", type=float, default=0.4, help="seconds each summary call takes at the puppet")
    parser.add_argument("--tail-seconds", type=float, default=20.0, help="keep starting sessions this long after the last kill")
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--keep", action="store_true", help="keep the work directory (store, logs)")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    logging.getLogger("aiohttp").setLevel(logging.CRITICAL)  # the puppet writing to a killed gateway
    run_and_report(run, render, args)


if __name__ == "__main__":
    main()
