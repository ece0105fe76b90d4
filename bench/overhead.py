"""Pass-through overhead: what a proxy adds on top of the upstream, side by side with peers.

    python bench/overhead.py                       # direct, bare, palimpsest, litellm, headroom
    python bench/overhead.py --targets direct,palimpsest --n 100 --seconds 5 --json out.json
    python bench/overhead.py --api responses --body-kb 500 --targets direct,bare,palimpsest

Every target talks to the same SIMULATED upstream (``python -m simulator.puppet``) in its own
process. Phase 1 sends N short, non-streaming chat requests per target, one at a time and
interleaved round-robin (the starting target rotates every round), so machine noise hits all
targets alike; added latency is measured per round against the direct request of that round.
Phase 2 runs each target alone at C concurrent clients for S seconds (req/s, errors). Idle RSS
of each proxy (its whole process tree) is read from /proc after start-up and warm-up.

``bare`` is the floor: a minimal aiohttp relay (``bench/bare_relay.py``) in its own process,
one more hop and nothing else. ``--body-kb N`` pads each request with a Codex-shaped history
(function calls and their outputs) of about N KB, the same history every round in one session
per target, with one new user message: the steady state of an agent that resends its context.

Peers are the LiteLLM proxy and the Headroom proxy from ``bench/peers.sh`` (virtualenvs under
/opt/palimpsest-peers); a peer that is not installed or does not start is skipped with a note.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import platform
import secrets
import shutil
import signal
import re
import socket
import statistics
import subprocess
import sys
import tempfile
from functools import lru_cache
import time
from dataclasses import dataclass, field
from pathlib import Path

import aiohttp

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import percentile  # noqa: E402

MODEL = "gpt-bench"
API_KEY = "sk-bench-not-a-real-key"
ALL_TARGETS = ("direct", "bare", "palimpsest", "litellm", "headroom")
REPO = Path(__file__).resolve().parent.parent
START_TIMEOUT_S = 120.0


@dataclass
class Target:
    name: str
    base_url: str  # ends in /v1
    proc: subprocess.Popen | None = None
    api_key: str = API_KEY  # what the load generator sends as its bearer token
    api: str = "chat"  # the route measured (--api)
    version: str = ""
    note: str = ""
    latencies: list[float] = field(default_factory=list)  # seconds, phase 1, by round
    errors_seq: int = 0
    rps: float = 0.0
    load_ok: int = 0
    load_errors: int = 0
    load_p50: float = 0.0
    load_latencies: list[float] = field(default_factory=list)  # phase 2, both passes
    load_wall: float = 0.0
    rss_mb: float | None = None
    cpu_ms: float | None = None  # CPU time of the process tree per sequential request (phase 1)


# --- processes ---------------------------------------------------------------------------------


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def spawn(cmd: list[str], log_path: Path, *, env: dict[str, str] | None = None,
          cwd: Path | None = None) -> subprocess.Popen:
    log = log_path.open("wb")
    return subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                            env={**os.environ, **(env or {})}, cwd=cwd, start_new_session=True)


def stop(proc: subprocess.Popen) -> None:
    """SIGTERM the process group we started for this process, then SIGKILL it if it lingers."""
    if proc.poll() is not None:
        return
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGTERM)
    try:
        proc.wait(timeout=15)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=5)


def process_tree(pid: int) -> list[int]:
    """pid and all its descendants (workers, reloaders), from /proc."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        with contextlib.suppress(OSError, IndexError, ValueError):
            stat = (entry / "stat").read_text()
            ppid = int(stat.rsplit(")", 1)[1].split()[1])
            children.setdefault(ppid, []).append(int(entry.name))
    tree, stack = [], [pid]
    while stack:
        current = stack.pop()
        tree.append(current)
        stack.extend(children.get(current, []))
    return tree


def tree_rss_mb(pid: int) -> float | None:
    """VmRSS of pid and all its descendants, in MiB."""
    total_kb, seen = 0, False
    for current in process_tree(pid):
        with contextlib.suppress(OSError):
            for line in Path(f"/proc/{current}/status").read_text().splitlines():
                if line.startswith("VmRSS:"):
                    total_kb += int(line.split()[1])
                    seen = True
    return total_kb / 1024 if seen else None


def tree_cpu_seconds(pid: int) -> float | None:
    """User + system CPU time of pid and all its descendants, in seconds."""
    ticks, seen = 0, False
    for current in process_tree(pid):
        with contextlib.suppress(OSError, IndexError, ValueError):
            fields = Path(f"/proc/{current}/stat").read_text().rsplit(")", 1)[1].split()
            ticks += int(fields[11]) + int(fields[12])  # utime, stime
            seen = True
    return ticks / os.sysconf("SC_CLK_TCK") if seen else None


def log_tail(path: Path, lines: int = 6) -> str:
    with contextlib.suppress(OSError):
        text = path.read_text(errors="replace").strip().splitlines()
        return " | ".join(line.strip() for line in text[-lines:])
    return ""


def venv_version(venv: Path, dist: str) -> str:
    out = subprocess.run([str(venv / "bin" / "python"), "-c",
                          f"import importlib.metadata as m; print(m.version({dist!r}))"],
                         capture_output=True, text=True, check=False)
    return out.stdout.strip()


def big_model(body_kb: int) -> str:
    """The model a --body-kb run asks for: a window of 5k tokens per KB of history (at least 1M),
    so the history (~360 tokens per KB, cl100k) stays under balanced's smallest gate, the cost
    model's view_target_ratio (10% of the budget, gateway/pipeline/views.py _untouched), and is
    measured passing through. With gpt-bench-1000k a 500 KB history (~180k tokens) is over it:
    every request is planned, compacted and searched (proactive recall), not passed through."""
    return f"gpt-bench-{max(1000, 5 * body_kb)}k"


def _puppet_model(model: str) -> str:
    """The puppet's --model argument: a name ending in -<N>k gets an N-thousand-token window."""
    sized = re.search(r"-(\d+)k$", model)
    return f"{model}={int(sized.group(1)) * 1000}" if sized else model


def start_puppet(work: Path) -> Target:
    port = free_port()
    proc = spawn([sys.executable, "-m", "simulator.puppet", "--port", str(port),
                  "--keep-received", "50",
                  "--model", _puppet_model(MODEL)], work / "puppet.log", cwd=REPO)
    return Target("direct", f"http://127.0.0.1:{port}/v1", proc, version="puppet (simulated)")


def start_bare(work: Path, upstream: str) -> Target:
    port = free_port()
    proc = spawn([sys.executable, str(REPO / "bench" / "bare_relay.py"), "--port", str(port), "--upstream", upstream],
                 work / "bare.log", cwd=REPO)
    return Target("bare", f"http://127.0.0.1:{port}/v1", proc, version="aiohttp relay (floor)")


def start_palimpsest(work: Path, upstream: str, name: str = "palimpsest", source: Path | None = None) -> Target:
    """The gateway as `palimpsest serve`; from another source tree (`source`, e.g. a git worktree
    of an older commit) when given, so two versions can be measured in the same rounds."""
    exe = shutil.which("palimpsest") or str(Path(sys.executable).with_name("palimpsest"))
    target = Target(name, "", None)
    if not Path(exe).exists():
        target.note = "`palimpsest` not on PATH (pip install -e . first)"
        return target
    port = free_port()
    config = work / f"{name}.toml"
    config.write_text(
        f'[server]\nhost = "127.0.0.1"\nport = {port}\n\n'
        f'[upstream]\nbase_url = "{upstream}"\napi_key = "{API_KEY}"\n\n'
        f'[tenants]\nbench = "{API_KEY}"\n\n'  # the load generator's key (client keys are required with api_key)
        f'[store]\npath = "{work / f"{name}-store"}"\n\n'
        '[log]\nlevel = "WARNING"\n')
    target.base_url = f"http://127.0.0.1:{port}/v1"
    cmd, env, cwd = [exe], None, None
    if source is not None:  # its own entry point (it moved between versions), imported from `source`:
        import tomllib  # PYTHONPATH comes before the editable install's finder

        module, func = tomllib.loads((source / "pyproject.toml").read_text())["project"]["scripts"]["palimpsest"].split(":")
        cmd = [sys.executable, "-c", f"import sys; from {module} import {func}; sys.argv[0] = 'palimpsest'; sys.exit({func}())"]
        env, cwd = {"PYTHONPATH": str(source)}, source  # `-c` puts the working directory first on sys.path
    # The load phase sends thousands of requests a minute from one tenant: no request-rate limit
    # (an environment variable, which a baseline tree without [limits] ignores).
    env = {**(env or {}), "PALIMPSEST_LIMITS__REQUESTS_PER_MINUTE": "0"}
    target.proc = spawn([*cmd, "serve", "--config", str(config)], work / f"{name}.log", env=env, cwd=cwd)
    with contextlib.suppress(Exception):
        from importlib.metadata import version

        target.version = version("palimpsest")
    if source is not None:
        commit = subprocess.run(["git", "-C", str(source), "rev-parse", "--short", "HEAD"],
                                capture_output=True, text=True, check=False).stdout.strip()
        target.version = f"{source.name}@{commit or '?'}"
    return target


def start_litellm(work: Path, upstream: str, peers: Path) -> Target:
    venv = peers / "litellm"
    target = Target("litellm", "")
    if not (venv / "bin" / "litellm").exists():
        target.note = f"not installed ({venv}; run bench/peers.sh)"
        return target
    port = free_port()
    config = work / "litellm.yaml"
    config.write_text(
        "model_list:\n"
        f"  - model_name: {MODEL}\n"
        "    litellm_params:\n"
        f"      model: openai/{MODEL}\n"
        f"      api_base: {upstream}\n"
        f"      api_key: {API_KEY}\n"
        "litellm_settings:\n"
        "  telemetry: false\n"
        "  set_verbose: false\n")
    # The LiteLLM proxy refuses to start without a strong master key, and then requires it.
    target.api_key = "sk-" + secrets.token_hex(32)
    env = {"LITELLM_MASTER_KEY": target.api_key, "LITELLM_LOG": "ERROR",
           "LITELLM_LOCAL_MODEL_COST_MAP": "True", "LITELLM_TELEMETRY": "False",
           "HOME": str(work / "home"), "DISABLE_ADMIN_UI": "True", "NO_DOCS": "True"}
    target.base_url = f"http://127.0.0.1:{port}/v1"
    target.proc = spawn([str(venv / "bin" / "litellm"), "--config", str(config), "--host",
                         "127.0.0.1", "--port", str(port), "--num_workers", "1"],
                        work / "litellm.log", env=env, cwd=work)
    target.version = venv_version(venv, "litellm")
    return target


def start_headroom(work: Path, upstream: str, peers: Path) -> Target:
    venv = peers / "headroom"
    target = Target("headroom", "")
    if not (venv / "bin" / "headroom").exists():
        target.note = f"not installed ({venv}; run bench/peers.sh)"
        return target
    port = free_port()
    home = work / "home"
    home.mkdir(exist_ok=True)
    # Headroom appends /v1/... itself, so it gets the upstream's origin. Rate limiting (60 rpm
    # by default) and the semantic response cache would measure something else than
    # pass-through, so both are off; its optimizer stays on, as users run it.
    origin = upstream.removesuffix("/v1")
    target.base_url = f"http://127.0.0.1:{port}/v1"
    target.proc = spawn([str(venv / "bin" / "headroom"), "proxy", "--host", "127.0.0.1",
                         "--port", str(port), "--openai-api-url", origin, "--no-rate-limit",
                         "--no-cache", "--no-telemetry", "--no-http2"],
                        work / "headroom.log", env={"HOME": str(home)}, cwd=work)
    target.version = venv_version(venv, "headroom-ai")
    return target


# --- the workload --------------------------------------------------------------------------------


def chat_body(i: int) -> bytes:
    return json.dumps({
        "model": MODEL,
        "max_tokens": 64,
        "messages": [
            {"role": "system", "content": "You are a concise assistant for a logistics team."},
            {"role": "user", "content": f"Shipment {i} left Rotterdam on Monday. Where is it now?"},
            {"role": "assistant", "content": "It is in transit; the last scan was in Hamburg."},
            {"role": "user", "content": f"Thanks. Draft a one-line update for ticket T-{i}."},
        ],
    }).encode()


def responses_body(i: int) -> bytes:
    """The same exchange as `chat_body` over the Responses API, as Codex sends it (store false)."""
    return json.dumps({
        "model": MODEL, "max_output_tokens": 64, "store": False,
        "instructions": "You are a concise assistant for a logistics team.",
        "input": [
            {"type": "message", "role": "user", "content": [{"type": "input_text", "text": f"Shipment {i} left Rotterdam on Monday. Where is it now?"}]},
            {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "It is in transit; the last scan was in Hamburg."}]},
            {"type": "message", "role": "user", "content": [{"type": "input_text", "text": f"Thanks. Draft a one-line update for ticket T-{i}."}]},
        ],
    }).encode()


# --api: which route phase 1 and 2 send to (both answered by the puppet).
API = {"chat": ("/chat/completions", chat_body), "responses": ("/responses", responses_body)}
BODY_KB = 0  # --body-kb: the history each request carries
TOOL_TAIL = False  # --tool-tail: each padded request ends in a tool call's output (an agent step)


@lru_cache(maxsize=4)
def _history(api: str, kb: int) -> list[dict]:
    """A Codex-shaped agent history of about `kb` KB: shell calls and their ~2 KB outputs."""
    items: list[dict] = []
    step = 0
    while len(json.dumps(items)) < kb * 1024:
        output = " ".join(f"src/module_{step}_{j}.py: ok" for j in range(90))
        if api == "responses":
            items += [{"type": "function_call", "call_id": f"call_{step}", "name": "shell",
                       "arguments": json.dumps({"command": ["rg", "-n", f"step{step}"]})},
                      {"type": "function_call_output", "call_id": f"call_{step}", "output": output}]
        else:
            items += [{"role": "assistant", "content": None, "tool_calls": [
                          {"id": f"call_{step}", "type": "function",
                           "function": {"name": "shell", "arguments": json.dumps({"command": f"rg step{step}"})}}]},
                      {"role": "tool", "tool_call_id": f"call_{step}", "content": output}]
        step += 1
    return items


def padded_body(api: str, i: int, kb: int) -> bytes:
    """Round 0's opening, the shared history, then round `i`'s last exchange: every request
    resends the same prefix, as an agent does, so the session stays on one ledger branch."""
    body = json.loads(API[api][1](i))
    key = "input" if api == "responses" else "messages"
    first = 1 if api == "chat" else 0  # after chat's system message
    opening = json.loads(API[api][1](0))[key][:first + 1]
    body[key] = [*opening, *_history(api, kb), *body[key][first + 1:]]
    if TOOL_TAIL:  # the step after the question: the model's call and its output end the request
        output = f"ticket T-{i}: in transit, last scan Hamburg"
        body[key] += ([{"type": "function_call", "call_id": f"tail_{i}", "name": "shell", "arguments": "{}"},
                       {"type": "function_call_output", "call_id": f"tail_{i}", "output": output}]
                      if api == "responses" else
                      [{"role": "assistant", "content": None, "tool_calls": [{"id": f"tail_{i}", "type": "function",
                                                                              "function": {"name": "shell", "arguments": "{}"}}]},
                       {"role": "tool", "tool_call_id": f"tail_{i}", "content": output}])
    return json.dumps(body).encode()


def answer_text(payload: bytes) -> str:
    data = json.loads(payload)
    if "choices" in data:
        return data["choices"][0]["message"]["content"]
    return "".join(part.get("text", "") for item in data.get("output", []) if item.get("type") == "message"
                   for part in item.get("content", []))


def headers(target: Target, session: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {target.api_key}", "Content-Type": "application/json",
            "X-Session-Id": session}


async def one_request(http: aiohttp.ClientSession, target: Target, i: int, session: str) -> float:
    """Latency in seconds of one chat request; raises on anything but a proper completion."""
    path, body = API[target.api]
    data = padded_body(target.api, i, BODY_KB) if BODY_KB else body(i)
    if BODY_KB:
        session = f"bench-big-{target.name}"  # one session resending its history with a new message
    started = time.perf_counter()
    async with http.post(f"{target.base_url}{path}", data=data, headers=headers(target, session)) as response:
        payload = await response.read()
        elapsed = time.perf_counter() - started
    if response.status != 200:
        raise RuntimeError(f"HTTP {response.status}: {payload[:200]!r}")
    if not answer_text(payload).startswith("Tool shell returned: " if TOOL_TAIL and BODY_KB else "ok: "):
        raise RuntimeError(f"unexpected answer: {payload[:200]!r}")
    return elapsed


async def wait_ready(http: aiohttp.ClientSession, target: Target) -> str | None:
    """None when the target answers a chat request; else why it never did."""
    deadline, last = time.monotonic() + START_TIMEOUT_S, "no answer"
    while time.monotonic() < deadline:
        if target.proc is not None and target.proc.poll() is not None:
            return f"exited with code {target.proc.returncode}"
        try:
            await one_request(http, target, 0, "bench-ready")
            return None
        except (aiohttp.ClientError, RuntimeError, KeyError, ValueError, asyncio.TimeoutError) as exc:
            last = str(exc)[:200] or type(exc).__name__
        await asyncio.sleep(0.5)
    return f"not ready after {START_TIMEOUT_S:.0f}s: {last}"


def pool(limit: int) -> aiohttp.ClientSession:
    return aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=limit, force_close=False),
                                 timeout=aiohttp.ClientTimeout(total=60))


async def sequential(targets: list[Target], sessions: dict[str, aiohttp.ClientSession],
                     n: int, warmup: int) -> None:
    cpu_before: dict[str, float | None] = {}
    for round_ in range(-warmup, n):
        if round_ == 0:  # CPU time from here: what each process spends on the measured requests
            cpu_before = {t.name: tree_cpu_seconds(t.proc.pid) if t.proc else None for t in targets}
        offset = round_ % len(targets)
        for target in targets[offset:] + targets[:offset]:
            try:
                elapsed = await one_request(sessions[target.name], target, round_,
                                            f"bench-seq-{round_}")
            except (aiohttp.ClientError, RuntimeError, asyncio.TimeoutError):
                target.errors_seq += 1
                elapsed = float("nan")
            if round_ >= 0:
                target.latencies.append(elapsed)
    for target in targets:
        before = cpu_before.get(target.name)
        after = tree_cpu_seconds(target.proc.pid) if target.proc else None
        if before is not None and after is not None and n:
            target.cpu_ms = (after - before) / n * 1e3


async def load(target: Target, concurrency: int, seconds: float) -> None:
    latencies: list[float] = []
    deadline = time.perf_counter() + seconds

    async def client(worker: int, http: aiohttp.ClientSession) -> None:
        i = 0
        while time.perf_counter() < deadline:
            i += 1
            try:
                latencies.append(await one_request(http, target, i, f"bench-load-{worker}-{i}"))
            except (aiohttp.ClientError, RuntimeError, asyncio.TimeoutError):
                target.load_errors += 1

    async with pool(concurrency) as http:
        started = time.perf_counter()
        await asyncio.gather(*(client(w, http) for w in range(concurrency)))
        wall = time.perf_counter() - started
    target.load_latencies += latencies
    target.load_wall += wall
    target.load_ok = len(target.load_latencies)
    target.rps = target.load_ok / target.load_wall
    target.load_p50 = percentile(target.load_latencies, 50) if target.load_latencies else float("nan")


# --- figures -----------------------------------------------------------------------------------


def figures(target: Target, direct: Target) -> dict:
    diffs = [t - d for t, d in zip(target.latencies, direct.latencies) if t == t and d == d]
    p50, p99 = percentile(target.latencies, 50), percentile(target.latencies, 99)
    return {
        "target": target.name,
        "version": target.version,
        "p50_ms": p50 * 1e3,
        "p99_ms": p99 * 1e3,
        "mean_ms": statistics.fmean(v for v in target.latencies if v == v) * 1e3
        if any(v == v for v in target.latencies) else float("nan"),
        "added_p50_ms": percentile(diffs, 50) * 1e3,  # per-round difference vs direct
        "added_p99_ms": percentile(diffs, 99) * 1e3,
        "p50_minus_direct_ms": (p50 - percentile(direct.latencies, 50)) * 1e3,
        "p99_minus_direct_ms": (p99 - percentile(direct.latencies, 99)) * 1e3,
        "errors_sequential": target.errors_seq,
        "rps": target.rps,
        "load_ok": target.load_ok,
        "load_errors": target.load_errors,
        "load_p50_ms": target.load_p50 * 1e3,
        "idle_rss_mb": target.rss_mb,
        "cpu_ms_per_request": target.cpu_ms,
    }


def render(rows: list[dict], notes: list[str], args: argparse.Namespace) -> str:
    def f(value, digits=2):
        return "-" if value is None or value != value else f"{value:.{digits}f}"

    head = (f"{'target':<11} {'version':<19} {'p50':>7} {'p99':>7} {'+p50':>7} {'+p99':>7} "
            f"{'Δp50':>7} {'Δp99':>7} {'req/s':>8} {'err':>5} {'p50@C':>7} {'RSS MB':>7} {'CPU ms':>7}")
    body = f"{args.api} route" + (f", ~{args.body_kb} KB agent history per request" if args.body_kb else "")
    lines = [f"pass-through overhead ({body}): {args.n} sequential requests per target (interleaved), "
             f"then {args.concurrency} concurrent clients x {args.seconds:g}s per target; "
             f"latencies in ms", head, "-" * len(head)]
    for r in rows:
        lines.append(
            f"{r['target']:<11} {r['version'][:19]:<19} {f(r['p50_ms']):>7} {f(r['p99_ms']):>7} "
            f"{f(r['added_p50_ms']):>7} {f(r['added_p99_ms']):>7} "
            f"{f(r['p50_minus_direct_ms']):>7} {f(r['p99_minus_direct_ms']):>7} "
            f"{f(r['rps'], 0):>8} {r['load_errors'] + r['errors_sequential']:>5} "
            f"{f(r['load_p50_ms'], 1):>7} {f(r['idle_rss_mb'], 0):>7} {f(r['cpu_ms_per_request']):>7}")
    lines += ["", "+p50/+p99: percentiles of the per-round latency difference vs direct; "
              "Δp50/Δp99: difference of the percentiles; p50@C: p50 under load; "
              "RSS: idle, whole process tree after warm-up; CPU ms: the process tree's CPU time per "
              "sequential request (user + system; steadier than latency on a busy machine)."]
    by_name = {r["target"]: r for r in rows}
    if (ours := by_name.get("palimpsest")) is not None:
        checks = [f"added p50 {f(ours['added_p50_ms'])} ms (target <= 1)",
                  f"added p99 {f(ours['added_p99_ms'])} ms (target <= 5)",
                  f"idle RSS {f(ours['idle_rss_mb'], 0)} MB (target <= 150)"]
        if (bare := by_name.get("bare")) is not None and bare["added_p50_ms"] and bare["added_p50_ms"] > 0:
            checks.append(f"added p50 {ours['added_p50_ms'] / bare['added_p50_ms']:.1f}x the bare relay's "
                          f"{f(bare['added_p50_ms'])} ms (target <= 2)")
        if (peer := by_name.get("litellm")) is not None and peer["rps"]:
            checks.append(f"throughput {ours['rps'] / peer['rps']:.1f}x LiteLLM's (target >= 3)")
        lines.append("palimpsest: " + "; ".join(checks))
    lines += [f"note: {note}" for note in notes]
    return "\n".join(lines)


# --- main --------------------------------------------------------------------------------------


async def run(args: argparse.Namespace, work: Path) -> tuple[list[dict], list[str]]:
    wanted = [t.strip() for t in args.targets.split(",") if t.strip()]
    unknown = set(wanted) - set(ALL_TARGETS)
    if unknown:
        raise SystemExit(f"unknown targets: {', '.join(sorted(unknown))}")
    notes: list[str] = [f"machine: {os.cpu_count()} CPUs, Python {platform.python_version()}; "
                        "load generator, upstream and proxies share them"]
    direct = start_puppet(work)
    started = [direct]
    starters = {"bare": lambda: start_bare(work, direct.base_url),
                "palimpsest": lambda: start_palimpsest(work, direct.base_url),
                "litellm": lambda: start_litellm(work, direct.base_url, args.peers),
                "headroom": lambda: start_headroom(work, direct.base_url, args.peers)}
    try:
        async with pool(4) as probe:
            if reason := await wait_ready(probe, direct):
                raise SystemExit(f"puppet did not start: {reason}: {log_tail(work / 'puppet.log')}")
            if args.baseline is not None:  # right after direct: measured in the same rounds as palimpsest
                wanted = ["baseline", *wanted]
                starters["baseline"] = lambda: start_palimpsest(work, direct.base_url, "baseline", args.baseline)
            for name in wanted:
                if name == "direct":
                    continue
                target = starters[name]()
                if target.proc is None:
                    notes.append(f"{name} skipped: {target.note}")
                    continue
                started.append(target)
                if reason := await wait_ready(probe, target):
                    notes.append(f"{name} skipped: {reason}; log: {log_tail(work / f'{name}.log')}")
                    stop(target.proc)
                    started.remove(target)
        targets = started
        for target in targets:
            target.api = args.api
        sessions = {t.name: pool(4) for t in targets}
        try:
            await sequential(targets, sessions, n=args.n, warmup=args.warmup)
        finally:
            for http in sessions.values():
                await http.close()
        await asyncio.sleep(1.0)  # let post-response work settle before reading idle RSS
        for target in targets:
            target.rss_mb = tree_rss_mb(target.proc.pid) if target.proc else None
        # Two passes, the second in reverse order: whatever drifts over the run (the upstream's
        # state, the machine) weighs on every target alike instead of on the last one.
        for target in [*targets, *reversed(targets)]:
            await load(target, args.concurrency, args.seconds / 2)
        for target in targets:
            if target.proc is not None and target.proc.poll() is not None:
                notes.append(f"{target.name} exited during the run: {log_tail(work / f'{target.name}.log')}")
        return [figures(t, direct) for t in targets], notes
    finally:
        for target in reversed(started):
            if target.proc is not None:
                stop(target.proc)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--n", type=int, default=300, help="sequential requests per target")
    parser.add_argument("--warmup", type=int, default=30, help="unrecorded rounds first")
    parser.add_argument("--concurrency", type=int, default=64)
    parser.add_argument("--seconds", type=float, default=10.0, help="load phase per target")
    parser.add_argument("--targets", default=",".join(ALL_TARGETS),
                        help=f"comma-separated subset of {','.join(ALL_TARGETS)}")
    parser.add_argument("--peers", type=Path, default=Path(os.environ.get(
        "PEERS_ROOT", "/opt/palimpsest-peers")), help="where bench/peers.sh installed the peers")
    parser.add_argument("--baseline", type=Path, metavar="DIR",
                        help="also run the gateway from this source tree (a git worktree of another commit) as "
                        "target 'baseline', interleaved with the others: a regression, not machine noise, "
                        "shows as a difference between the two in the same run")
    parser.add_argument("--json", type=Path, help="also write the figures to this file")
    parser.add_argument("--api", choices=sorted(API), default="chat",
                        help="the route measured: chat completions, or the Responses API (peers may not serve it)")
    parser.add_argument("--tool-tail", action="store_true",
                        help="with --body-kb: end each request in a tool output (no proactive recall search)")
    parser.add_argument("--body-kb", type=int, default=0,
                        help="pad each request with an agent history of about this many KB (one session per target)")
    parser.add_argument("--model", help="the model every target asks for (default gpt-bench; with --body-kb, "
                        "big_model's gpt-bench-<N>k, whose window the simulated upstream reads from the name, so a "
                        "big history is measured passing through rather than refused or compacted)")
    parser.add_argument("--keep-logs", action="store_true", help="keep the work dir with logs")
    args = parser.parse_args(argv)
    global BODY_KB, MODEL, TOOL_TAIL
    BODY_KB = args.body_kb
    TOOL_TAIL = args.tool_tail
    MODEL = args.model or (big_model(args.body_kb) if args.body_kb else MODEL)
    with contextlib.suppress(ImportError):
        import uvloop  # a faster loop keeps the load generator out of the way

        asyncio.set_event_loop_policy(uvloop.EventLoopPolicy())
    work = Path(tempfile.mkdtemp(prefix="palimpsest-overhead-"))
    try:
        rows, notes = asyncio.run(run(args, work))
    finally:
        if args.keep_logs:
            print(f"logs kept in {work}", file=sys.stderr)
        else:
            shutil.rmtree(work, ignore_errors=True)
    print(render(rows, notes, args))
    if args.json:
        args.json.write_text(json.dumps({"args": {k: str(v) for k, v in vars(args).items()},
                                         "rows": rows, "notes": notes}, indent=2))


if __name__ == "__main__":
    main()
