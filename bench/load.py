"""Load: 200 concurrent agents over 20 sessions for several minutes, against a SIMULATED upstream
with latency, through a real ``palimpsest serve`` subprocess.

    python bench/load.py                  # 200 clients, 20 sessions, 180 s (the issue's run)
    python bench/load.py --seconds 30     # a quick look

Three processes: the puppet (``python -m simulator.puppet --latency S``), the gateway, and this
one with the clients. Client c works in session c mod 20, so ten agents share each session, each
on its own branch (its own conversation): a synthetic agent session replayed round by round (a
user turn, a tool call, the tool result, the answer; half the requests streamed), restarted as a
new conversation after ``--rounds`` rounds so the run reaches a steady state. The summary queue is
deliberately small (``--queue-size``) so it fills: a full queue must degrade to tailoring (the
request goes on with a tailored view), never to errors or unbounded memory.

Figures against the load targets: errors (any request without a complete answer) = 0, gateway
RSS growth after warm-up <= 10% (median of the first samples after warm-up vs the last ones),
summary queue depth never above its bound (``/metrics``), and no session starves (completed
requests and worst latency per session).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from pathlib import Path

import aiohttp

from bench.common import run_and_report
from bench.faultkit import REPO, Client, GatewayProcess, free_port, table, write_config
from simulator.workloads import TOOL_SPECS, synthetic_session

# A small window, so that compaction, summary jobs and the full-queue path all happen in minutes.
MODEL = "fake-8k"
WINDOW = 8_000


@dataclass
class Stats:
    completed: Counter = field(default_factory=Counter)  # session -> complete answers
    worst: dict[str, float] = field(default_factory=lambda: defaultdict(float))  # session -> worst latency
    latencies: list[float] = field(default_factory=list)
    errors: Counter = field(default_factory=Counter)  # "status error" -> count
    error_examples: list[str] = field(default_factory=list)
    rss: list[tuple[float, int]] = field(default_factory=list)  # (seconds since start, bytes)
    queue_depth_max: float = 0.0
    metrics_last: dict[str, float] = field(default_factory=dict)
    aborted: int = 0
    rss_parts: list[tuple[float, dict]] = field(default_factory=list)
    first_cycle: list[float] = field(default_factory=list)  # seconds until each agent finished its first conversation
    seconds: float = 0.0  # the run's planned length


async def agent(client: Client, c: int, sessions: int, rounds: int, stop_at: float, stats: Stats, rng: random.Random,
                abort_share: float) -> None:
    session_id = f"load-{c % sessions}"
    conversation = 0
    while time.monotonic() < stop_at:
        workload = synthetic_session(seed=c * 1000 + conversation, rounds=rounds, min_tokens=150, max_tokens=1100)
        history = [{"role": "system", "content": workload.system},
                   {"role": "user", "content": f"agent {c} conversation {conversation}: start"}]
        history.append({"role": "assistant", "content": "ready"})
        for spec in workload.rounds:
            if time.monotonic() >= stop_at:
                return
            history.append({"role": "user", "content": spec["user"]})
            answer = await one(client, history, session_id, stats, rng, abort_share)
            if answer is None:
                break  # this conversation is broken (counted as an error); start another
            history.append(answer)
            if answer.get("tool_calls"):
                for call in answer["tool_calls"]:
                    history.append({"role": "tool", "tool_call_id": call["id"], "content": spec["output"]})
                answer = await one(client, history, session_id, stats, rng, abort_share)
                if answer is None:
                    break
                history.append(answer)
            await asyncio.sleep(rng.uniform(0.2, 1.0))  # the agent runs its tool / thinks
        if conversation == 0:
            stats.first_cycle.append(time.monotonic() - (stop_at - stats.seconds))
        conversation += 1


async def one(client: Client, history: list[dict], session_id: str, stats: Stats, rng: random.Random,
              abort_share: float = 0.0) -> dict | None:
    body = {"model": MODEL, "messages": history, "tools": TOOL_SPECS, "stream": rng.random() < 0.5}
    if body["stream"] and rng.random() < abort_share:
        # A user who stops the answer after its first chunk, then asks again: the abandoned
        # stream must cost nothing lasting (connections, tasks, memory).
        aborted = await client.chat(body, session_id, abort_after_first_chunk=True)
        if aborted.error == "aborted by the client":
            stats.aborted += 1
    out = await client.chat(body, session_id)
    if out.message is None:
        key = f"{out.status} {out.error}"
        stats.errors[key] += 1
        if len(stats.error_examples) < 10:
            stats.error_examples.append(f"{session_id}: {key} after {out.elapsed:.1f} s")
        return None
    stats.completed[session_id] += 1
    stats.latencies.append(out.elapsed)
    stats.worst[session_id] = max(stats.worst[session_id], out.elapsed)
    return out.message


async def observe(gateway: GatewayProcess, started: float, stop_at: float, stats: Stats) -> None:
    async with aiohttp.ClientSession() as http:
        while time.monotonic() < stop_at:
            stats.rss.append((time.monotonic() - started, gateway.rss_bytes()))
            stats.rss_parts.append((time.monotonic() - started, gateway.rss_parts()))
            with contextlib.suppress(aiohttp.ClientError, asyncio.TimeoutError):
                async with http.get(gateway.url + "/metrics", timeout=aiohttp.ClientTimeout(total=5)) as r:
                    stats.metrics_last = parse_metrics(await r.text())
                    stats.queue_depth_max = max(stats.queue_depth_max, stats.metrics_last.get("palimpsest_summary_queue_depth", 0.0))
            await asyncio.sleep(1.0)


def parse_metrics(text: str) -> dict[str, float]:
    """Prometheus text -> {name or name{labels}: value}, plus per-name sums."""
    out: dict[str, float] = defaultdict(float)
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        name_labels, _, value = line.rpartition(" ")
        with contextlib.suppress(ValueError):
            out[name_labels] = float(value)
            out[name_labels.split("{", 1)[0] + ":sum"] += float(value)
    return dict(out)


def overrides(pairs: list[str]) -> dict:
    """``section.key=value`` pairs (``--set``, repeatable) as config sections; value parsed as TOML."""
    import tomllib
    out: dict[str, dict] = {}
    for pair in pairs:
        key, _, value = pair.partition("=")
        section, _, name = key.strip().partition(".")
        out.setdefault(section, {})[name] = tomllib.loads(f"v = {value}")["v"]
    return out


async def run(args) -> dict:
    rng = random.Random(args.seed)
    work = Path(tempfile.mkdtemp(prefix="palimpsest-load-"))
    puppet_port, port = free_port(), free_port()
    puppet = subprocess.Popen([sys.executable, "-m", "simulator.puppet", "--port", str(puppet_port), "--latency", str(args.latency),
                               "--window", f"{MODEL}={WINDOW}", "--keep-received", "50"], cwd=str(REPO),
                              stdout=subprocess.DEVNULL, stderr=open(work / "puppet.log", "wb"))
    sections = {
        "server": {"host": "127.0.0.1", "port": port, "shutdown_timeout_s": 10.0},
        "upstream": {"base_url": f"http://127.0.0.1:{puppet_port}/v1"},
        "store": {"path": str(work / "store")},
        "log": {"level": "WARNING"},
        "summary": {"queue_size": args.queue_size, "workers": 2},
        "models": {MODEL: {"context_window": WINDOW}},
    }
    for section, values in overrides(args.set).items():
        sections[section] = {**sections.get(section, {}), **values}
    config = write_config(work / "gateway.toml", sections)
    gateway = GatewayProcess(config, port, work / "gateway.log")
    stats = Stats()
    try:
        await asyncio.sleep(1.0)
        await gateway.start()
        client = Client(gateway.url, connections=args.clients + 10, timeout_s=args.timeout)
        started = time.monotonic()
        stop_at = started + args.seconds
        stats.seconds = args.seconds
        observer = asyncio.create_task(observe(gateway, started, stop_at, stats))
        agents = [asyncio.create_task(agent(client, c, args.sessions, args.rounds, stop_at, stats, random.Random(args.seed * 7919 + c),
                                     args.abort_share))
                  for c in range(args.clients)]
        await asyncio.gather(*agents)
        await observer
        wall = time.monotonic() - started
        await client.close()
        t0 = time.monotonic()
        rc = gateway.terminate(timeout=30)
        sigterm_s = time.monotonic() - t0
    finally:
        gateway.kill()
        puppet.terminate()
        with contextlib.suppress(subprocess.TimeoutExpired):
            puppet.wait(10)
        if puppet.poll() is None:
            puppet.kill()
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)
    warm = max(20.0, args.seconds * args.warmup)
    after = [b for t, b in stats.rss if t >= warm and b]
    k = max(1, min(10, len(after) // 4))
    rss_warm = statistics.median(after[:k]) if after else float("nan")
    rss_end = statistics.median(after[-k:]) if after else float("nan")
    # The same figure from the middle of the measured part: bounded caches (the token counter,
    # the ledger's known ids, LanceDB's caches) fill during the first part; a leak keeps growing.
    late = after[len(after) // 2:]
    rss_mid = statistics.median(late[:k]) if late else float("nan")
    points = [(t, b) for t, b in stats.rss if t >= warm and b]
    rss_points = [(round(points[min(len(points) - 1, int(q * (len(points) - 1)))][0]),
                   round(points[min(len(points) - 1, int(q * (len(points) - 1)))][1] / 2**20)) for q in (0, 0.25, 0.5, 0.75, 1)] if points else []
    m = stats.metrics_last
    return {
        "clients": args.clients, "sessions": args.sessions, "seconds": round(wall, 1), "requests": sum(stats.completed.values()),
        "errors": sum(stats.errors.values()), "error_kinds": dict(stats.errors), "error_examples": stats.error_examples,
        "rss_warm_mb": rss_warm / 2**20, "rss_end_mb": rss_end / 2**20, "rss_max_mb": max((b for _, b in stats.rss), default=0) / 2**20,
        "rss_growth": (rss_end - rss_warm) / rss_warm if after else float("nan"),
        "rss_mid_mb": rss_mid / 2**20, "rss_growth_late": (rss_end - rss_mid) / rss_mid if late else float("nan"),
        "rss_points_mb": rss_points,
        "first_cycle_s": (round(statistics.median(stats.first_cycle)), round(max(stats.first_cycle)), len(stats.first_cycle)) if stats.first_cycle else None, "malloc_arena_max": os.environ.get("MALLOC_ARENA_MAX", ""),
        "latency_p50": statistics.median(stats.latencies) if stats.latencies else float("nan"),
        "latency_p99": sorted(stats.latencies)[int(len(stats.latencies) * 0.99)] if stats.latencies else float("nan"),
        "per_session": {s: {"completed": stats.completed[s], "worst_s": round(stats.worst[s], 2)} for s in sorted(stats.completed)},
        "queue_size": args.queue_size, "queue_depth_max": stats.queue_depth_max,
        "summary_dropped": {k.split('reason="', 1)[1].rstrip('"}'): v for k, v in m.items() if k.startswith("palimpsest_summary_jobs_dropped_total{")},
        "summary_enqueued": m.get("palimpsest_summary_jobs_enqueued_total:sum", 0.0),
        "checkpoints_created": m.get("palimpsest_summary_checkpoints_created_total:sum", 0.0),
        "sigterm_exit": rc, "sigterm_s": round(sigterm_s, 2), "aborted": stats.aborted,
        "rss_timeline_mb": [(round(t), round(b / 2**20)) for t, b in stats.rss[:: max(1, len(stats.rss) // 12)]],
        "warmup_s": warm,
        "rss_parts_mb": [(round(t), {k: round(v / 2**20) for k, v in p.items()}) for t, p in stats.rss_parts[:: max(1, len(stats.rss_parts) // 6)]],
        "summary_metrics": {k: v for k, v in m.items() if "summary" in k and k.endswith(":sum")},
        # Proactive recall per outcome: busy = skipped while a late search of the session still ran.
        "recall_auto": {k.split('outcome="', 1)[1].split('"', 1)[0]: v for k, v in m.items()
                        if k.startswith("palimpsest_recall_calls_total{") and 'tool="auto"' in k},
    }


def render(r: dict) -> str:
    per = r["per_session"]
    counts = [v["completed"] for v in per.values()] or [0]
    worst = max((v["worst_s"] for v in per.values()), default=float("nan"))
    starving = [s for s, v in per.items() if v["completed"] < 0.5 * statistics.mean(counts)]
    missing = r["sessions"] - len(per)
    rows = [
        ("errors", r["errors"], 0, "ok" if r["errors"] == 0 else "FAIL"),
        ("RSS growth after warm-up", f"{r['rss_growth']:+.1%} ({r['rss_warm_mb']:.0f} -> {r['rss_end_mb']:.0f} MB, max {r['rss_max_mb']:.0f})",
         "<= 10%", "ok" if r["rss_growth"] <= 0.10 else "FAIL"),
        ("RSS growth over the second half (caches warm)", f"{r['rss_growth_late']:+.1%} ({r['rss_mid_mb']:.0f} -> {r['rss_end_mb']:.0f} MB)",
         "-", ""),
        ("summary queue depth (max seen)", f"{r['queue_depth_max']:.0f} of {r['queue_size']}", f"<= {r['queue_size']}",
         "ok" if r["queue_depth_max"] <= r["queue_size"] else "FAIL"),
        ("summary jobs turned away by a full queue (requests went on tailored)", f"{r['summary_dropped'].get('queue_full', 0):.0f}",
         "> 0 (path exercised)", "ok" if r["summary_dropped"].get("queue_full", 0) > 0 else "not exercised"),
        ("sessions starving (< half the mean)", len(starving) + missing, 0, "ok" if not starving and not missing else "FAIL"),
        ("completed per session (min / mean / max)", f"{min(counts)} / {statistics.mean(counts):.0f} / {max(counts)}", "-", ""),
        ("worst latency of any session", f"{worst:.1f} s", "-", ""),
    ]
    out = [table(rows, ("figure", "value", "target", "")), ""]
    out.append(f"{r['clients']} clients over {r['sessions']} sessions for {r['seconds']} s: {r['requests']} complete answers "
               f"({r['requests'] / max(1, r['seconds']):.1f}/s), latency p50 {r['latency_p50']:.2f} s p99 {r['latency_p99']:.2f} s; "
               f"summary jobs enqueued {r['summary_enqueued']:.0f}, dropped {r['summary_dropped']}, checkpoints {r['checkpoints_created']:.0f}; "
               f"{r['aborted']} streams abandoned by their client after the first chunk (then asked again); SIGTERM after the run: exit code {r['sigterm_exit']} in {r['sigterm_s']} s")
    out.append(f"RSS (s: MB) {', '.join(f'{t}: {mb}' for t, mb in r['rss_timeline_mb'])}; baseline taken at {r['warmup_s']:.0f} s "
               "(the recall index, LanceDB and WordLlama, adds ~0.5 GB once, when the first session hides history)")
    out.append("RSS after warm-up at 0, 1/4, 1/2, 3/4 and the end (s: MB) " + ", ".join(f"{t}: {mb}" for t, mb in r["rss_points_mb"])
               + (f"; MALLOC_ARENA_MAX={r['malloc_arena_max']}" if r["malloc_arena_max"] else ""))
    if r.get("first_cycle_s"):
        median, latest, agents = r["first_cycle_s"]
        out.append(f"first conversation finished (median / latest) at {median} / {latest} s by {agents} of {r['clients']} agents: "
                   "history sizes (and the gateway's working set) keep growing until then")
    else:
        out.append("no agent finished its first conversation: history sizes (and the working set) grew all run")
    if r.get("recall_auto"):
        out.append("proactive recall searches by outcome: " + ", ".join(f"{k} {v:.0f}" for k, v in sorted(r["recall_auto"].items()))
                   + " (busy: skipped while a search of the session that outlived its request still ran)")
    out.append("RSS by kind (s: anon/file MB) " + ", ".join(f"{t}: {p.get('RssAnon', 0)}/{p.get('RssFile', 0)}" for t, p in r["rss_parts_mb"]))
    for example in r["error_examples"]:
        out.append(f"  ! {example}")
    return "\n".join(out)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--clients", type=int, default=200)
    parser.add_argument("--sessions", type=int, default=20)
    parser.add_argument("--seconds", type=float, default=180.0)
    parser.add_argument("--latency", type=float, default=0.3, help="the puppet's seconds before each answer")
    parser.add_argument("--rounds", type=int, default=16, help="rounds per conversation before an agent starts a new one")
    parser.add_argument("--queue-size", type=int, default=4, help="summary.queue_size (small, so it fills)")
    parser.add_argument("--warmup", type=float, default=1 / 3, help="share of the run before RSS is baselined (at least 20 s)")
    parser.add_argument("--timeout", type=float, default=120.0, help="client timeout per request")
    parser.add_argument("--abort-share", type=float, default=0.05, help="share of streams the client abandons after one chunk")
    parser.add_argument("--seed", type=int, default=3)
    parser.add_argument("--set", action="append", default=[], metavar="SECTION.KEY=VALUE",
                        help="a gateway setting for this run (repeatable; the value is TOML: 16, \"x\", false)")
    parser.add_argument("--keep", action="store_true")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    run_and_report(run, render, args)


if __name__ == "__main__":
    main()
