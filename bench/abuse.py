"""Abuse figures: what each attack of the adversarial review gets out of a running gateway.

    python bench/abuse.py                       # every attack, ~1-2 minutes on 2 CPUs
    python bench/abuse.py --only gzip-nokey,passthrough

`palimpsest serve` runs in its own process in front of the SIMULATED upstream (`simulator.puppet`,
never a real provider), which runs in a third process (this script with `--puppet PORT`) with
`bench/common.py`'s recording middleware and a `/bench/log` route, so every upstream request is
seen with its credential and every summary call with its usage, and the /healthz probes (in
this process) measure the gateway's event loop alone. The gateway holds an operator key
(`upstream.api_key`) and two tenants with client keys (alice, bob).

Per attack, one line: the attacking requests' statuses; /healthz worst latency while the attack
runs (and 3 s after it, for background work); summary calls and their prompt+completion tokens
per attacking request; and how many upstream requests carried the operator's key on a route
that is not stateless (a tenant reading or deleting the operator's account), besides the
attack's own chat forwards and the gateway's summary calls.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import gzip
import os
import re
import subprocess
import sys
import tempfile
import time
import zlib
from pathlib import Path

import aiohttp
import orjson

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(1, str(Path(__file__).resolve().parent.parent))  # tests.support.agent drives the fence probe
from aiohttp import web  # noqa: E402
from common import _recording_middleware, Puppet  # noqa: E402
from overhead import free_port, log_tail, spawn, stop  # noqa: E402
from event_loop import wait_ready  # noqa: E402
from simulator.puppet import create_puppet_app  # noqa: E402
import abuse_probes as probes  # noqa: E402

# What a model could read as the summary block's closing tag: any case, spacing or separator.
CLOSING = re.compile(r"[<\uff1c][\s\u200b]*/[\s\u200b]*session[\s_\-\u200b]*summary", re.IGNORECASE)

REPO = Path(__file__).resolve().parent.parent
OPERATOR = "sk-operator-bench-key"
ALICE, BOB = "pk-alice-bench", "pk-bob-bench"
STATELESS = (("GET", "/v1/models"), ("POST", "/v1/embeddings"), ("POST", "/v1/moderations"), ("POST", "/v1/chat/completions"))


def gzip_bomb(decoded_mb: int) -> bytes:
    """A gzip member of `decoded_mb` MiB of zeros (about 1/1000 of that compressed)."""
    z = zlib.compressobj(9, zlib.DEFLATED, 31)
    block = b"\0" * (1 << 20)
    return b"".join(z.compress(block) for _ in range(decoded_mb)) + z.flush()


def words(n_bytes: int) -> str:
    unit = " ".join(f"w{i} token{i % 97} value{i % 13}" for i in range(200)) + "\n"
    return unit * max(1, n_bytes // len(unit))


def chat(messages: list[dict], model: str = "fake-32k") -> bytes:
    return orjson.dumps({"model": model, "max_tokens": 16, "messages": messages})


def big_history(total_bytes: int, turns: int = 40) -> list[dict]:
    """A conversation of `turns` rounds totalling about `total_bytes` (so summaries fold it)."""
    per = total_bytes // turns
    out: list[dict] = []
    for i in range(turns):
        out += [{"role": "user", "content": f"turn {i}: " + words(per)}, {"role": "assistant", "content": f"noted {i}"}]
    return out + [{"role": "user", "content": "what did we say?"}]


def legal_29mb() -> list[dict]:
    """10,001 messages of ~2.9 KB each: 29 MB, under the 32 MB body limit."""
    text = words(3_000)[:2_900]
    return [{"role": "user" if i % 2 == 0 else "assistant", "content": f"message {i}: {text}"} for i in range(10_001)]


class Probe:
    """GET /healthz every `every` s; the worst latency seen (a probe still waiting counts as far as it got)."""

    def __init__(self, root: str, every: float = 0.05) -> None:
        self.root, self.every = root, every
        self.latencies: list[float] = []
        self._pending: float | None = None
        self._task: asyncio.Task | None = None

    async def __aenter__(self) -> "Probe":
        self._session = aiohttp.ClientSession()
        self._task = asyncio.create_task(self._run())
        await asyncio.sleep(self.every)
        return self

    async def _run(self) -> None:
        while True:
            t0 = time.perf_counter()
            self._pending = t0
            with contextlib.suppress(aiohttp.ClientError):
                async with self._session.get(self.root + "/healthz") as r:
                    await r.read()
            self.latencies.append(time.perf_counter() - t0)
            self._pending = None
            await asyncio.sleep(self.every)

    async def __aexit__(self, *exc) -> None:
        if self._pending is not None:
            self.latencies.append(time.perf_counter() - self._pending)
        assert self._task is not None
        self._task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self._task
        await self._session.close()

    @property
    def worst(self) -> float:
        return max(self.latencies or [0.0])


async def send(method: str, url: str, *, data: bytes | None = None, headers: dict | None = None) -> int | str:
    try:
        async with aiohttp.ClientSession() as s:
            async with s.request(method, url, data=data, headers=headers or {},
                                 timeout=aiohttp.ClientTimeout(total=120)) as r:
                await r.read()
                return r.status
    except aiohttp.ClientError as exc:
        return type(exc).__name__


def attacks(root: str) -> dict[str, tuple[str, list]]:
    """name -> (what it is, [coroutine factories, run concurrently])."""
    v1 = root + "/v1"
    key = lambda k, session=None: {"Authorization": f"Bearer {k}", "Content-Type": "application/json",  # noqa: E731
                                   **({"X-Session-Id": session} if session else {})}
    bomb = gzip_bomb(512)
    gz = {"Content-Encoding": "gzip", "Content-Type": "application/json"}
    tool = [{"role": "user", "content": "hi"},
            {"role": "assistant", "content": None, "tool_calls": [{"id": "c1", "type": "function", "function": "read_file"}]},
            {"role": "tool", "tool_call_id": "c1", "content": "x"}, {"role": "user", "content": "go"}]
    ten_k = [{"role": "user" if i % 2 == 0 else "assistant", "content": f"message {i}"} for i in range(10_001)]
    return {
        "passthrough": ("bob reads/deletes stateful routes on the operator's key", [
            lambda: send("GET", v1 + "/files", headers=key(BOB)),
            lambda: send("GET", v1 + "/chat/completions", headers=key(BOB)),
            lambda: send("GET", v1 + "/responses/resp_1", headers=key(BOB)),
            lambda: send("DELETE", v1 + "/files/file-1", headers=key(BOB)),
            lambda: send("GET", v1 + "/models", headers={**key(BOB), "OpenAI-Organization": "org-bob"}),
        ]),
        "no-key-summary": ("no credential at all, 200 KB history", [
            lambda: send("POST", v1 + "/chat/completions", data=chat(big_history(200_000)), headers={"X-Session-Id": "anon"}),
        ]),
        "gzip-nokey": (f"4 x {len(bomb) // 1024} KB gzip -> 512 MB, no key", [
            (lambda: send("POST", v1 + "/chat/completions", data=bomb, headers=gz)) for _ in range(4)
        ]),
        "gzip-key": (f"1 x {len(bomb) // 1024} KB gzip -> 512 MB, alice", [
            lambda: send("POST", v1 + "/chat/completions", data=bomb, headers={**key(ALICE, "gz"), **gz}),
        ]),
        "summary-1.4MB": ("one 1.4 MB history, alice", [
            lambda: send("POST", v1 + "/chat/completions", data=chat(big_history(1_400_000)), headers=key(ALICE, "big1")),
        ]),
        "summary-3x700KB": ("three 700 KB histories at once, alice", [
            (lambda i=i: send("POST", v1 + "/chat/completions", data=chat(big_history(700_000)), headers=key(ALICE, f"big3-{i}")))
            for i in range(3)
        ]),
        "10k-messages": ("three 10,001-message histories at once, bob", [
            (lambda i=i: send("POST", v1 + "/chat/completions", data=chat(ten_k), headers=key(BOB, f"10k-{i}"))) for i in range(3)
        ]),
        "29MB-10k": ("one legal 29 MB request of 10,001 messages, alice", [
            lambda: send("POST", v1 + "/chat/completions", data=chat(legal_29mb()), headers=key(ALICE, "29mb")),
        ]),
        "refused-31MB": ("a 31 MB message the window cannot hold (400), alice", [
            lambda: send("POST", v1 + "/chat/completions", data=chat([{"role": "user", "content": words(31_000_000)}]),
                         headers=key(ALICE, "refused")),
        ]),
        "tool-call-shape": ("function as a string in tool_calls", [
            lambda: send("POST", v1 + "/chat/completions", data=chat(tool), headers=key(ALICE, "tc")),
        ]),
        "admin-token": ("the admin token as a client key on /v1/x", [
            lambda: send("GET", v1 + "/x", headers=key("adm-bench-token")),
        ]),
    }


async def stored_sessions(root: str, session_id: str) -> int:
    """How many sessions named `session_id` the gateway stored (admin API)."""
    async with aiohttp.ClientSession() as s:
        async with s.get(root + "/admin/sessions?limit=500", headers={"Authorization": "Bearer adm-bench-token"}) as r:
            return sum(1 for row in (await r.json())["data"] if row["session_id"] == session_id)


async def serve_puppet(port: int) -> None:
    """`--puppet PORT`: the recording puppet, with GET /bench/log and POST /bench/reset."""
    async def log(request: web.Request) -> web.Response:
        return web.json_response({
            "calls": [{"purpose": c.purpose, "usage": c.usage} for c in puppet.calls],
            "received": [{"method": r["method"], "path": r["path"], "authorization": r["headers"].get("authorization"),
                          "json": r.get("json") if len(r.get("body") or b"") < 100_000 else None}
                         for r in puppet.received],
        })

    async def reset(request: web.Request) -> web.Response:
        puppet.reset()
        return web.json_response({})

    async def grep(request: web.Request) -> web.Response:
        needles = [n.encode() for n in (await request.json())["needles"]]
        return web.json_response({"hits": sum(1 for r in puppet.received if any(n in (r.get("body") or b"") for n in needles))})

    async def fences(request: web.Request) -> web.Response:
        blocks = [m["content"] for r in puppet.received if r["path"].endswith("/chat/completions")
                  for m in ((r.get("json") or {}).get("messages") or []) if isinstance(m, dict)
                  and isinstance(m.get("content"), str) and m["content"].startswith("<session_summary>")]
        return web.json_response({"blocks": len(blocks), "carrying": sum("SYSTEM OVERRIDE" in b for b in blocks),
                                  "broken": sum(len(CLOSING.findall(b)) > 1 for b in blocks)})

    async def dup(request: web.Request) -> web.Response:
        duplicate[0] = bool((await request.json())["on"])
        return web.json_response({})

    duplicate = [False]

    @web.middleware
    async def reuse_ids(request: web.Request, handler):
        """With /bench/dup on, every /v1/responses answer carries the same id (a provider reusing ids)."""
        response = await handler(request)
        if duplicate[0] and request.path == "/v1/responses" and isinstance(getattr(response, "body", None), bytes):
            with contextlib.suppress(Exception):
                body = orjson.loads(response.body)
                body["id"] = "resp_bench_reused"
                response.body = orjson.dumps(body)
        return response

    ref: list[Puppet] = []
    app = create_puppet_app(windows={"fake-32k": 32_000})
    app.middlewares.insert(0, _recording_middleware(ref))
    app.middlewares.insert(0, reuse_ids)
    app.router.add_get("/bench/log", log)
    app.router.add_post("/bench/reset", reset)
    app.router.add_post("/bench/grep", grep)
    app.router.add_get("/bench/fences", fences)
    app.router.add_post("/bench/dup", dup)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    puppet = Puppet(app, runner, f"http://127.0.0.1:{port}/v1")
    ref.append(puppet)
    await asyncio.Event().wait()


ISSUE_ROWS = [  # (key, figure, the issue's "now", target)
    ("cross", "cross-tenant reads, over every route of every format", "1 route (/compact)", "0"),
    ("takeover", "response-id takeover (upstream reuses an id)", "A gets 404/400", "A keeps its id"),
    ("malformed", "gateway 500s, malformed corpus of all three formats, nested junk included", "36 of 370", "0"),
    ("inspect", "inspect after /v1/responses/compact", "500", "200"),
    ("edges", "/v1/messages edge errors (431, 415, CL+TE) in OpenAI's shape", "3 of 3", "0"),
    ("fence", "summary fence closed by stored text (cache-forked path)", "yes", "no"),
    ("healthz", "/healthz worst during a legal 29 MB / 10k-message request", "2.05 s", "< 0.25 s"),
    ("pickle", "pickle in the store", "checkpoints", "none"),
    ("modes", "store files readable by other OS users", "all", "0"),
    ("limits", "caps on n / output tokens, request rate, /metrics", "none", "held"),
    ("replicas", "Responses chain and compaction round trip across 2 replicas, no affinity", "fails", "works"),
    ("deps", "aiohttp floor at the lock's release", "3.13.3", "3.14.5"),
]


async def issue_figures(root: str, up: probes.Upstream, store: Path, tree: Path,
                        wanted: set[str] | None) -> dict[str, tuple[str, bool]]:
    """Every row of issue 26 against one running gateway, in an order where each probe's tenants
    are still under their limits (the rate probe, on its own tenant, runs last)."""
    out: dict[str, tuple[str, bool]] = {key: ("not run (--only)", False) for key, *_ in ISSUE_ROWS}
    for key, probe in (("cross", probes.cross_tenant), ("takeover", probes.takeover), ("malformed", probes.malformed),
                       ("inspect", probes.inspect_after_compaction), ("edges", probes.messages_edges),
                       ("fence", probes.summary_fence)):
        if wanted is not None and key not in wanted:
            continue
        try:
            out[key] = await probe(root, up)
        except Exception as exc:  # a probe the gateway broke is a figure too
            out[key] = (f"probe failed: {type(exc).__name__}: {str(exc)[:80]}", False)
    if wanted is None or "healthz" in wanted:
        out["healthz"] = await healthz_29mb(root)
    if wanted is None or "limits" in wanted:
        out["limits"] = await probes.limits(root, up)
    out["pickle"] = probes.store_pickle(store)
    out["modes"] = probes.store_modes(store)
    out["replicas"] = ("not run here: bench/cluster.py (PostgreSQL + S3)", False)
    out["deps"] = probes.dependency_floors(tree)
    return out


async def healthz_29mb(root: str) -> tuple[str, bool]:
    async with Probe(root) as probe:
        status = await send("POST", root + "/v1/chat/completions", data=chat(legal_29mb()),
                            headers={"Authorization": f"Bearer {probes.ALICE}", "Content-Type": "application/json",
                                     "X-Session-Id": "29mb"})
        await asyncio.sleep(8)  # the summary job and the indexer that follow it
    return f"{probe.worst:.2f} s (status {status})", probe.worst < 0.25


async def run(args, tree: Path, *, attacks_table: bool) -> dict[str, tuple[str, bool]]:
    work = Path(tempfile.mkdtemp(prefix="palimpsest-abuse-"))
    puppet_port = free_port()
    puppet_proc = spawn([sys.executable, str(Path(__file__).resolve()), "--puppet", str(puppet_port)], work / "puppet.log", cwd=REPO)
    puppet_url = f"http://127.0.0.1:{puppet_port}"
    port = free_port()
    config = work / "palimpsest.toml"
    config.write_text(
        f'[server]\nhost = "127.0.0.1"\nport = {port}\nadmin_token = "adm-bench-token"\n\n'
        f'[upstream]\nbase_url = "{puppet_url}/v1"\napi_key = "{OPERATOR}"\n\n'
        f'[store]\npath = "{work / "store"}"\n\n[log]\nlevel = "WARNING"\n\n'
        f'[tenants]\nalice = "{ALICE}"\nbob = "{BOB}"\ncarol = "{probes.CAROL}"\n')
    # Another source tree's gateway: its own package first on the path (`-m` puts the cwd first).
    env = None if tree == REPO else {"PYTHONPATH": str(tree)}
    gateway = spawn([sys.executable, "-m", "gateway", "serve", "--config", str(config)], work / "gateway.log", cwd=tree, env=env)
    root = f"http://127.0.0.1:{port}"
    wanted = set(args.only.split(",")) if args.only else None
    try:
        await wait_ready(puppet_url + "/v1/models")
        await wait_ready(root + "/healthz")
        if attacks_table:
            await attack_rows(args, root, puppet_url, wanted)
        if args.issue:
            return await issue_figures(root, probes.Upstream(puppet_url), work / "store", tree, wanted)
        return {}
    except Exception:
        print("gateway log:", log_tail(work / "gateway.log"), file=sys.stderr)
        raise
    finally:
        stop(gateway)
        stop(puppet_proc)


async def attack_rows(args, root: str, puppet_url: str, wanted: set[str] | None) -> None:
    print(f"{'attack':<16} {'statuses':<28} {'healthz max ms':>14} {'summ calls/req':>14} {'summ tok/req':>12} "
          f"{'operator key on stateful':>24}  what")
    for name, (what, factories) in attacks(root).items():
        if wanted is not None and name not in wanted:
            continue
        await send("POST", puppet_url + "/bench/reset")
        async with Probe(root) as probe:
            statuses = await asyncio.gather(*(f() for f in factories))
            await asyncio.sleep(args.tail)
        async with aiohttp.ClientSession() as s:
            async with s.get(puppet_url + "/bench/log") as r:
                seen = await r.json()
        summaries = [c for c in seen["calls"] if c["purpose"] == "summary"]
        tokens = sum((c["usage"] or {}).get("total_tokens", 0) for c in summaries)
        leaked = [r for r in seen["received"]
                  if r["authorization"] == f"Bearer {OPERATOR}"
                  and (r["method"], r["path"]) not in STATELESS and not r["path"].startswith("/v1/models/")]
        shown = ",".join(str(s) for s in statuses)
        n = len(factories)
        if name == "refused-31MB":
            what += f"; sessions stored after it: {await stored_sessions(root, 'refused')}"
        print(f"{name:<16} {shown[:28]:<28} {probe.worst * 1000:>14.0f} {len(summaries) / n:>14.1f} {tokens / n:>12,.0f} "
              f"{'yes (' + str(len(leaked)) + ')' if leaked else 'no':>24}  {what}")


def commit_of(tree: Path) -> str:
    return subprocess.run(["git", "-C", str(tree), "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                          check=False).stdout.strip() or "?"


async def main(args) -> int:
    after = await run(args, REPO, attacks_table=not args.skip_attacks)
    before = await run(args, Path(args.before).resolve(), attacks_table=False) if args.before and args.issue else None
    if not args.issue:
        return 0
    cols = [f"before ({commit_of(Path(args.before))})"] if before else []
    cols.append(f"this tree ({commit_of(REPO)})")
    print(f"\n| figure | issue's now | {' | '.join(cols)} | target |")
    print("|---|---|" + "---|" * len(cols) + "---|")
    for key, figure, now, target in ISSUE_ROWS:
        cells = [before[key] if before else None, after[key]]
        shown = [f"{'ok' if holds else 'FAILS'}: {text}" for cell in cells if cell for text, holds in [cell]]
        print(f"| {figure} | {now} | {' | '.join(shown)} | {target} |")
    return 0


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--only", default="", help="comma-separated attack names")
    parser.add_argument("--tail", type=float, default=3.0, help="seconds to keep probing after an attack's answers")
    parser.add_argument("--no-issue", dest="issue", action="store_false", help="skip issue 26's probes and table")
    parser.add_argument("--skip-attacks", action="store_true", help="only issue 26's probes and table")
    parser.add_argument("--before", default="", help="another source tree (git worktree of an older commit): its "
                        "gateway gets the same probes, printed as the table's 'before' column")
    parser.add_argument("--puppet", type=int, default=0, help=argparse.SUPPRESS)  # internal: serve the recording puppet
    args = parser.parse_args()
    if args.puppet:
        asyncio.run(serve_puppet(args.puppet))
    sys.exit(asyncio.run(main(args)))
