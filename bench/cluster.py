"""Scale-out benchmark: replicas behind nginx on PostgreSQL and an S3 index.

Starts the local cluster with scripts/cluster.sh (PostgreSQL, moto's S3 server, the simulated
upstream with latency, nginx, N replicas) and runs agent sessions through nginx:

1. `--sessions` (20) concurrent sessions, `--turns` per phase, consistent hashing on X-Session-Id;
2. the same sessions continue with nginx round-robin (no affinity: every turn may land anywhere);
3. they continue again while one replica is killed with kill -9 mid-run and restarted.

A client retries a request that failed (connection error, 502/503/504) with the same messages,
as SDKs do. Afterwards, read from PostgreSQL and the S3 index directly:
- every client message is in the ledger exactly once, in order, and no session forked;
- no session has two checkpoints for one boundary;
- recall on a fresh replica (this process) finds each session's first-turn fact, written
  through other replicas.
Then: throughput with 3 replicas against 1 (same cluster, nginx pointed at one), and the
per-request time one replica adds on PostgreSQL against the embedded store (a lone
`palimpsest serve` on the same upstream without latency), p50, plus the cost of committing an
answer synchronously on the embedded ledger.

    .venv/bin/python bench/cluster.py                  # full size (~10 minutes on 2 CPUs)
    .venv/bin/python bench/cluster.py --sessions 6 --turns 3 --throughput-turns 2   # quick
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import secrets
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import aiohttp
from aiohttp import web

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from bench.common import percentile  # noqa: E402

CLUSTER = REPO / "scripts" / "cluster.sh"
PY = sys.executable
MODEL = "fake-8k"  # a small window, so sessions reach compaction within the run
WORDS = ("deploy cache shard index replica ledger branch commit rollback schema vector token window "
         "lease quorum latency budget summary recall checkpoint migration backup restore").split()


def sh(env: dict, *args: str, check: bool = True) -> str:
    out = subprocess.run([str(CLUSTER), *args], env={**os.environ, **env}, capture_output=True, text=True, timeout=600)
    if check and out.returncode != 0:
        raise RuntimeError(f"cluster.sh {' '.join(args)}: {out.stdout}\n{out.stderr}")
    return out.stdout


def fact(session: str) -> str:
    return f"codename-{session}-{secrets.token_hex(3)}"


def user_text(session: str, turn: int, rng: random.Random, words: int) -> str:
    return f"[{session}] step {turn}: " + " ".join(rng.choice(WORDS) for _ in range(words))


class Agent:
    """One session's client: full history each turn, retries on failure like an SDK."""

    def __init__(self, session: str, url: str, http: aiohttp.ClientSession, words: int) -> None:
        self.session, self.url, self.http, self.words = session, url, http, words
        self.rng = random.Random(session)
        self.fact = fact(session)
        self.history: list[dict] = []
        self.turns = 0
        self.latencies: list[float] = []
        self.retries = 0
        self.retried_requests = 0
        self.failed_on: list[str] = []  # the upstream(s) nginx names for each failed attempt
        self.phase = ""
        self.failures: list[tuple[str, str]] = []  # (phase, what failed) per failed attempt
        self.errors = 0
        self.replicas: set[str] = set()

    async def turn(self) -> None:
        text = user_text(self.session, self.turns, self.rng, self.words)
        if self.turns == 0:
            text = f"Remember this: the project codename is {self.fact}. " + text
        messages = [*self.history, {"role": "user", "content": text}]
        body = {"model": MODEL, "messages": messages, "max_tokens": 64}
        for attempt in range(8):
            if attempt == 1:
                self.retried_requests += 1
            started = time.perf_counter()
            try:
                async with self.http.post(self.url, json=body, headers={"X-Session-Id": self.session, "Authorization": "Bearer sk-bench"}) as r:
                    payload = await r.read()
                    if r.status in (502, 503, 504):
                        self.failed_on.append(r.headers.get("X-Palimpsest-Replica", "?"))
                        raise ConnectionError(f"status {r.status}")
                    if r.status != 200:
                        self.errors += 1
                        return
                    self.replicas.add(r.headers.get("X-Palimpsest-Replica", "?"))
            except (aiohttp.ClientError, ConnectionError, asyncio.TimeoutError) as exc:
                self.failures.append((self.phase, str(exc) if isinstance(exc, ConnectionError) else type(exc).__name__))
                self.retries += 1
                await asyncio.sleep(0.5 * (attempt + 1))
                continue
            self.latencies.append(time.perf_counter() - started)
            answer = json.loads(payload)["choices"][0]["message"]
            self.history = [*messages, {k: v for k, v in answer.items() if v is not None}]
            self.turns += 1
            return
        self.errors += 1


async def phase(agents: list[Agent], turns: int, during=None, name: str = "") -> float:
    started = time.perf_counter()
    for agent in agents:
        agent.phase = name

    async def run(agent: Agent) -> None:
        for _ in range(turns):
            await agent.turn()

    tasks = [asyncio.create_task(run(a)) for a in agents]
    if during is not None:
        await during()
    await asyncio.gather(*tasks)
    return time.perf_counter() - started


def nginx_resent(log: Path) -> dict:
    """Requests nginx resent to another replica after one failed (its access log)."""
    lines = [ln for ln in log.read_text().splitlines() if "upstream=" in ln and "," in ln.split("upstream=")[1].split()[0]]
    return {"requests": len(lines), "statuses": sorted({ln.split("upstream_status=")[1].split(" rt=")[0] for ln in lines})}


def verify(pg_url: str, agents: list[Agent]) -> dict:
    import psycopg

    from store.ledger import SessionRef

    out = {"sessions": len(agents), "messages": 0, "missing": 0, "duplicated": 0, "forked": 0, "double_checkpoints": 0}
    with psycopg.connect(pg_url) as conn:
        for agent in agents:
            rows = conn.execute(
                "SELECT message, seq FROM events WHERE session_key LIKE %s AND kind = 'message' ORDER BY seq",
                (f"%/{SessionRef('x', agent.session).key.split('/')[1]}",),
            ).fetchall()
            stored = [json.loads(r[0])["content"] for r in rows]
            sent = [m["content"] for m in agent.history if m["role"] == "user"]
            out["messages"] += len(sent)
            out["missing"] += sum(1 for s in sent if s not in stored)
            out["duplicated"] += sum(stored.count(s) - 1 for s in sent if stored.count(s) > 1)
            out["forked"] += int(len(stored) != len(agent.history))  # exactly the client's path, no branch
        (doubles,) = conn.execute(
            "SELECT COUNT(*) FROM (SELECT 1 FROM checkpoints GROUP BY session_key, boundary HAVING COUNT(*) > 1) d"
        ).fetchone()
        out["double_checkpoints"] = doubles
        out["checkpoints"] = conn.execute("SELECT COUNT(*) FROM checkpoints").fetchone()[0]
        out["sessions_with_checkpoints"] = conn.execute("SELECT COUNT(DISTINCT session_key) FROM checkpoints").fetchone()[0]
    return out


async def recall_check(env: dict, agents: list[Agent]) -> dict:
    """A replica in this process (never served any of these sessions) searches each session."""
    import orjson

    from gateway.app import create_app
    from gateway.keys import LEDGER, PIPELINE
    from gateway.settings import load_settings

    lines = dict(line.split("=", 1) for line in sh(env, "env").splitlines() if "=" in line)
    base = int(env["BASE_PORT"])
    settings = load_settings(None, upstream={"base_url": lines["PALIMPSEST_UPSTREAM__BASE_URL"]},
                             store={"path": tempfile.mkdtemp(prefix="palimpsest-bench-"), "url": lines["PALIMPSEST_STORE__URL"]},
                             recall={"index_uri": lines["PALIMPSEST_RECALL__INDEX_URI"], "index_endpoint": f"http://127.0.0.1:{base + 1}",
                                     "index_access_key_id": "testing", "index_secret_access_key": "testing"})
    app = create_app(settings)
    runner = web.AppRunner(app)
    await runner.setup()
    found, seconds = 0, []
    try:
        for agent in agents:
            record = next(r for r in app[LEDGER].sessions() if r.session_id == agent.session)
            ids = [e.id for e in app[LEDGER].since(record.key, -1) if e.kind == "message"]
            call = {"id": "q", "type": "function", "function": {"name": "session_search", "arguments": json.dumps(
                {"query": f"project codename {agent.fact}", "scope": "session"})}}
            started = time.perf_counter()
            result = orjson.loads(await app[PIPELINE].loop.tools.run(call, kind="search", session_key=record.key,
                                                                        path_ids=ids, hidden=frozenset(ids)))
            seconds.append(time.perf_counter() - started)
            found += any(agent.fact in (r.get("passage") or r.get("snippet") or "") for r in result.get("results", [])[:3])
    finally:
        await runner.cleanup()
    return {"found": found, "of": len(agents), "first_search_p50_s": percentile(seconds, 50)}


async def throughput(env: dict, url: str, sessions: int, turns: int, words: int, tag: str) -> dict:
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=120)) as http:
        agents = [Agent(f"tp-{tag}-{i}", url, http, words) for i in range(sessions)]
        elapsed = await phase(agents, turns)
    done = sum(a.turns for a in agents)
    lat = [x for a in agents for x in a.latencies]
    return {"requests": done, "seconds": elapsed, "rps": done / elapsed, "p50_s": percentile(lat, 50),
            "errors": sum(a.errors for a in agents)}


async def measure_throughput(env: dict, lb: str, args, report: dict) -> None:
    """Fresh sessions through nginx pointed at 1 replica, then at all of them, alternating
    `--throughput-rounds` times (the machine is shared: alternation spreads its noise)."""
    runs: dict[int, list[dict]] = {1: [], args.replicas: []}
    for rnd in range(args.throughput_rounds):
        for n in (1, args.replicas):
            sh(env, "nginx", str(n))
            runs[n].append(await throughput(env, lb, args.throughput_sessions, args.throughput_turns, args.words, f"{n}x{rnd}"))
    sh(env, "nginx", str(args.replicas))
    for n, results in runs.items():
        rps = sorted(r["rps"] for r in results)
        report[f"throughput_{'1' if n == 1 else 'n'}"] = {
            "rps": rps[len(rps) // 2], "runs_rps": [round(x, 1) for x in rps],
            "p50_s": sorted(r["p50_s"] for r in results)[len(results) // 2], "errors": sum(r["errors"] for r in results)}


async def overhead(url: str, n: int, tag: str) -> float:
    """p50 latency of short sequential turns straight to one gateway (upstream latency 0)."""
    lat = []
    async with aiohttp.ClientSession() as http:
        for s in range(n // 10):
            agent = Agent(f"oh-{tag}-{s}", url, http, 20)
            for _ in range(10):
                await agent.turn()
            lat += agent.latencies[1:]
    return percentile(lat, 50)


def commit_cost(n: int = 2000) -> dict:
    """p50 of appending an answer with a commit of its own, vs deferred."""
    from store.ledger import Ledger, SessionRef

    root = Path(tempfile.mkdtemp(prefix="palimpsest-commit-"))
    out = {}
    for mode, defer in (("sync", False), ("deferred", True)):
        ledger = Ledger(root / mode, defer_answers=defer)
        ref = SessionRef("t", mode)
        parent = ledger.sync(ref, [{"role": "user", "content": "q"}]).ids[-1]
        times = []
        for i in range(n):
            t = time.perf_counter()
            ledger.append(ref, parent, {"role": "assistant", "content": f"answer {i}"}, defer=True)
            times.append(time.perf_counter() - t)
            if defer and i % 10 == 9:
                ledger.flush()  # the 0.5 s flusher's work, outside the timed call
        out[mode] = percentile(times, 50) * 1000
        ledger.close()
    shutil.rmtree(root, ignore_errors=True)
    return out


async def main(args) -> dict:
    root = Path(tempfile.mkdtemp(prefix="palimpsest-cluster-"))
    os.chmod(root, 0o755)
    base = args.base_port
    env = {"CLUSTER_DIR": str(root), "BASE_PORT": str(base), "UPSTREAM_LATENCY": str(args.latency)}
    lb = f"http://127.0.0.1:{base + 3}/v1/chat/completions"
    report: dict = {"machine": f"{os.cpu_count()} CPUs, Python {sys.version.split()[0]}; PostgreSQL, moto, nginx, "
                               "the simulated upstream and every replica are separate processes on this machine",
                    "args": vars(args)}
    try:
        sh(env, "up", str(args.replicas))
        if args.only_throughput:
            await measure_throughput(env, lb, args, report)
            sh(env, "down", check=False)
            shutil.rmtree(root, ignore_errors=True)
            return report
        # No client keep-alive: nginx reloads (affinity on/off) close idle connections, which
        # would count as failures of the gateway here.
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=120),
                                         connector=aiohttp.TCPConnector(force_close=True)) as http:
            agents = [Agent(f"agent-{i}", lb, http, args.words) for i in range(args.sessions)]
            report["affinity_s"] = await phase(agents, args.turns, name="affinity")
            report["affinity_replicas_per_session"] = max(len(a.replicas) for a in agents)
            for a in agents:
                a.replicas.clear()
            sh({**env, "AFFINITY": "0"}, "nginx", str(args.replicas))
            report["spray_s"] = await phase(agents, args.turns, name="sprayed")
            report["spray_replicas_per_session_min"] = min(len(a.replicas) for a in agents)
            sh(env, "nginx", str(args.replicas))
            before = sum(a.retries for a in agents)

            async def kill_and_restart() -> None:
                await asyncio.sleep(args.kill_after)
                sh(env, "replica", "1", "kill")
                report["killed_at_turns"] = sum(a.turns for a in agents)
                await asyncio.sleep(args.down_for)
                await asyncio.to_thread(sh, env, "replica", "1", "start")

            report["kill_s"] = await phase(agents, args.turns, kill_and_restart, name="kill")
            report["nginx_resent"] = nginx_resent(root / "log" / "nginx-access.log")
            report["retries_during_kill"] = sum(a.retries for a in agents) - before
            report["retried_requests"] = sum(a.retried_requests for a in agents)
            kinds: dict[str, int] = {}
            for a in agents:
                for ph, what in a.failures:
                    kinds[f"{ph}: {what}"] = kinds.get(f"{ph}: {what}", 0) + 1
            report["failed_attempts"] = kinds
            report["failed_attempts_on"] = sorted({u for a in agents for u in a.failed_on})
            report["killed_replica"] = f"127.0.0.1:{base + 11}"
            report["client_errors"] = sum(a.errors for a in agents)
        pg_url = sh(env, "env").split("PALIMPSEST_STORE__URL=")[1].split()[0]
        await asyncio.sleep(3)  # summary jobs still running finish
        report["ledger"] = verify(pg_url, agents)
        report["recall"] = await recall_check(env, agents[: args.recall_sessions])
        await measure_throughput(env, lb, args, report)
    finally:
        sh(env, "down", check=False)
    # Per-request time on PostgreSQL vs embedded: one replica each, upstream without latency.
    env0 = {**env, "UPSTREAM_LATENCY": "0"}
    try:
        sh(env0, "pg", "up")
        sh(env0, "s3")
        sh(env0, "upstream")
        sh(env0, "replica", "0", "start")
        replica = f"http://127.0.0.1:{base + 10}/v1/chat/completions"
        report["overhead_pg_p50_ms"] = await overhead(replica, args.overhead_n, "pg") * 1000
        sh(env0, "replica", "0", "stop")
        sh({**env0, "REPLICA_ARGS": "PALIMPSEST_STORE__URL=\nPALIMPSEST_RECALL__INDEX_URI="}, "replica", "0", "start")
        report["overhead_embedded_p50_ms"] = await overhead(replica, args.overhead_n, "emb") * 1000
    finally:
        sh(env0, "down", check=False)
        shutil.rmtree(root, ignore_errors=True)
    report["commit_p50_ms"] = commit_cost()
    return report


def render(r: dict) -> str:
    led, rec, t1, t3 = r["ledger"], r["recall"], r["throughput_1"], r["throughput_n"]
    rows = [
        ("client errors (after retries)", r["client_errors"], "0"),
        ("requests retried (attempts) around the kill -9", f"{r['retried_requests']} ({r['retries_during_kill']})", "in-flight only"),
        ("failed attempts by phase and kind", "; ".join(f"{k} x{v}" for k, v in sorted(r["failed_attempts"].items())) or "none", "kill phase only"),
        ("requests nginx resent to another replica (upstream statuses)", f"{r['nginx_resent']['requests']} ({'; '.join(r['nginx_resent']['statuses'])})", "the in-flight ones"),
        ("upstreams nginx named on failed attempts", ", ".join(r["failed_attempts_on"]) + f" (killed: {r['killed_replica']})", "the killed one"),
        ("client messages missing / duplicated", f"{led['missing']} / {led['duplicated']} of {led['messages']}", "0 / 0"),
        ("sessions whose ledger differs from the client's history", led["forked"], "0"),
        ("checkpoints (sessions with any)", f"{led['checkpoints']} ({led['sessions_with_checkpoints']})", "-"),
        ("sessions with two checkpoints for one boundary", led["double_checkpoints"], "0"),
        ("recall on a fresh replica finds the first-turn fact", f"{rec['found']}/{rec['of']}", "all"),
        ("replicas per session: affinity / sprayed (min)", f"{r['affinity_replicas_per_session']} / {r['spray_replicas_per_session_min']}", "1 / >1"),
        ("throughput 1 replica: median req/s (runs), p50 s", f"{t1['rps']:.1f} {t1['runs_rps']}, {t1['p50_s']:.3f}", "-"),
        (f"throughput {r['args']['replicas']} replicas: median req/s (runs), p50 s", f"{t3['rps']:.1f} {t3['runs_rps']}, {t3['p50_s']:.3f}", "measured"),
        ("per-request p50, PostgreSQL / embedded (ms)", f"{r['overhead_pg_p50_ms']:.2f} / {r['overhead_embedded_p50_ms']:.2f}", "+ a few ms"),
        ("answer append p50, own commit / deferred (ms)", f"{r['commit_p50_ms']['sync']:.3f} / {r['commit_p50_ms']['deferred']:.3f}", "< 0.5 ms extra"),
    ]
    width = max(len(a) for a, _, _ in rows)
    lines = [r["machine"], f"args: {r['args']}", "", f"{'figure':<{width}}  value  (target)"]
    lines += [f"{a:<{width}}  {b}  ({c})" for a, b, c in rows]
    return "\n".join(lines)


if __name__ == "__main__":
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--replicas", type=int, default=3)
    p.add_argument("--sessions", type=int, default=20)
    p.add_argument("--turns", type=int, default=8, help="turns per session in each of the three phases")
    p.add_argument("--words", type=int, default=200, help="words per user message")
    p.add_argument("--latency", type=float, default=0.3, help="simulated upstream latency (s)")
    p.add_argument("--kill-after", type=float, default=4.0)
    p.add_argument("--down-for", type=float, default=3.0)
    p.add_argument("--recall-sessions", type=int, default=20)
    p.add_argument("--throughput-turns", type=int, default=6)
    p.add_argument("--throughput-sessions", type=int, default=60, help="concurrent sessions of the throughput runs")
    p.add_argument("--throughput-rounds", type=int, default=3)
    p.add_argument("--only-throughput", action="store_true", help="skip the three phases and their checks")
    p.add_argument("--overhead-n", type=int, default=200)
    p.add_argument("--base-port", type=int, default=18700)
    p.add_argument("--json", help="write the figures here too")
    a = p.parse_args()
    result = asyncio.run(main(a))
    print(json.dumps({k: v for k, v in result.items() if k.startswith("throughput")}, indent=1) if a.only_throughput else render(result))
    if a.json:
        Path(a.json).write_text(json.dumps(result, indent=2, default=str))
