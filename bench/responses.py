"""The Responses API side by side: sending direct vs through the gateway, on a 32k model.

    python -m bench.responses [--calls 34] [--seeds 3] [--no-codex]

Workloads (all against the simulated provider, ``simulator/``):
- **Codex CLI** (``codex exec``, the real binary from npm; skipped when not installed) driven
  through a chain of ``--calls`` ``exec_command`` calls whose outputs are 1-3k tokens each
  (``tests/support/chain.py``): direct, through the gateway on a Responses upstream, and through
  the gateway on a chat-only upstream (``[models."fake-32k"] api = "chat"``);
- **SDK loops**: ``--seeds`` agent loops of ``--calls`` tool calls driven with the official SDK as
  Codex uses the API (store false, the whole input every call, reasoning carried back), then
  every planted fact asked once (``RECALL: question``).

Figures:
- provider rejections: direct, the requests whose prompt is over the window (each one a 400);
  through the gateway, the 400s the upstream actually gave;
- upstream / client prompt tokens: every upstream call (summaries and recall rounds included)
  against what the client sent;
- billed / ideal direct: prompt cost with the provider's cache (a prefix shared with an earlier
  request of at least 1,024 tokens, in steps of 128, billed at 0.1x), every upstream call
  included, against the client's own append-only history sent with that cache and no window
  limit (the same run on a 2M-token model, straight to the provider);
- prefix stability: per consecutive upstream view requests, the share of the prompt that is a
  prefix of the previous one (what a prompt cache can serve), and the share of the previous
  prompt kept unchanged (1.0 for a request that only appends);
- planted facts recalled (SDK loops);
- gateway time added: request time not spent waiting on the upstream, p50 and p99.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import tempfile
import time

import openai
import orjson
from aiohttp import web

from bench import prefix_breaks
from bench.bill_parts import Call, breakdown, header, is_recall_round, render
from bench.common import _message_keys, _serve, fmt, machine_note, percentile, quiet_logs, start_puppet
from gateway.app import create_app
from gateway.keys import LOG_FIELDS
from gateway.settings import load_settings
from simulator.puppet import PUPPET_STATE, RECEIVED
from simulator.responses_input import as_items, count_context
from simulator.workloads import agent_loop_session
from tests.support.agent import drive_responses_loop, responses_turn

SMALL, BIG = "fake-32k", "fake-2000k"
WINDOWS = {SMALL: 32_000, BIG: 2_000_000}
CACHE_MIN, CACHE_STEP, CACHED_PRICE = 1024, 128, 0.1
WRITE_PRICE = 1.0  # a token written to the cache (--write-rate; 1.25 for GPT-5.6-style premiums)
POLICY: dict = {}  # [policy] keys for the gateway (--policy KEY=VALUE)


# -- billing ----------------------------------------------------------------------------------


def elements(record: dict, secret: bytes) -> list[tuple[bytes, int]] | None:
    """A request as (element, tokens) in prompt order: what a prefix cache matches on."""
    body = record.get("json")
    if not isinstance(body, dict):
        return None
    if record["path"].endswith("/responses"):
        return count_context(body.get("instructions"), as_items(body.get("input")), body.get("tools"), secret)
    if record["path"].endswith("/chat/completions"):
        from simulator.puppet import count_text

        tools = body.get("tools")
        head = [(orjson.dumps(tools, option=orjson.OPT_SORT_KEYS), count_text(orjson.dumps(tools).decode()) if tools else 0)]
        return head + _message_keys(body.get("messages") or [])
    return None


def shared(a: list[tuple[bytes, int]], b: list[tuple[bytes, int]]) -> int:
    total = 0
    for (x, tokens), (y, _) in zip(a, b):
        if x != y:
            break
        total += tokens
    return total


def cache_split(requests: list[list[tuple[bytes, int]]]) -> list[tuple[int, int, int]]:
    """(prompt, cached, written) tokens of each request in order, with a provider cache."""
    out = []
    for n, request in enumerate(requests):
        total = sum(t for _, t in request)
        best = max((shared(request, earlier) for earlier in requests[:n]), default=0)
        cached = 0 if best < CACHE_MIN else best // CACHE_STEP * CACHE_STEP
        written = max(0, (0 if total < CACHE_MIN else total // CACHE_STEP * CACHE_STEP) - cached)
        out.append((total, cached, written))
    return out


def billed(requests: list[list[tuple[bytes, int]]]) -> tuple[int, float]:
    """(prompt tokens, billed prompt tokens) of requests in order, with a provider cache."""
    split = cache_split(requests)
    return (sum(t for t, _, _ in split),
            sum(t - c - w + WRITE_PRICE * w + CACHED_PRICE * c for t, c, w in split))


def bill_parts(through: dict, ideal: dict, ideal_cost: float) -> dict[str, float]:
    """The gateway run's bill split by bench/bill_parts.py, over the ideal-direct bill."""
    calls = [Call(kind, t, c, w) for kind, (t, c, w) in zip(through["kinds"], cache_split(through["upstream"]))]
    views = ideal["views"]
    growth = [sum(t for _, t in b) - (shared(b, a) if a is not None else 0) for a, b in zip([None, *views], views)]
    return breakdown(calls, growth, ideal_cost, read=CACHED_PRICE, write=WRITE_PRICE)


def stability(requests: list[list[tuple[bytes, int]]], starts: list[int] | None = None) -> str:
    """Mean share of each prompt that is the previous prompt's prefix (what a cache can serve),
    and in brackets the mean share of the previous prompt kept unchanged (1.0 = append only).
    With ``starts`` (where each session's requests begin), pairs within one session only."""
    bounds = [*(starts or [0]), len(requests)]
    pairs = [pair for a, b in zip(bounds, bounds[1:]) for pair in zip(requests[a:b], requests[a + 1:b])]
    if not pairs:
        return "-"
    cur = statistics.mean(shared(b, a) / max(1, sum(t for _, t in b)) for a, b in pairs)
    kept = statistics.mean(shared(b, a) / max(1, sum(t for _, t in a)) for a, b in pairs)
    return f"{cur:.3f} (kept {kept:.3f})"


# -- running ----------------------------------------------------------------------------------


class Run:
    """One puppet, optionally a gateway in front, and what went through them."""

    def __init__(self, puppet, gateway_runner=None, base_url: str = "") -> None:
        self.puppet = puppet
        self.gateway_runner = gateway_runner
        self.base_url = base_url or puppet.base_url
        self.overheads: list[float] = []
        self.client_requests = 0

    @classmethod
    async def start(cls, *, gateway: bool, api: str = "responses") -> "Run":
        puppet = await start_puppet(windows=WINDOWS)
        if not gateway:
            return cls(puppet)
        settings = load_settings(None, upstream={"base_url": puppet.base_url}, store={"path": tempfile.mkdtemp()},
                                 models={SMALL: {"context_window": WINDOWS[SMALL], "api": api}},
                                 server={"client_keys": "off"}, log={"level": "ERROR"},
                                 # the operator tells the gateway its provider's write price
                                 policy={**({"cache_write_rate": WRITE_PRICE} if WRITE_PRICE != 1.0 else {}), **POLICY})
        app = create_app(settings)
        run = cls(puppet)
        app.middlewares.insert(0, run._timing())
        runner, port = await _serve(app)
        run.gateway_runner, run.base_url = runner, f"http://127.0.0.1:{port}/v1"
        return run

    def _timing(self):
        @web.middleware
        async def timing(request: web.Request, handler):
            started = time.perf_counter()
            response = await handler(request)
            if request.path.endswith("/responses"):
                self.client_requests += 1
                upstream_ms = (request.get(LOG_FIELDS) or {}).get("upstream_ms", 0.0)
                self.overheads.append((time.perf_counter() - started) * 1000 - upstream_ms)
            return response
        return timing

    def upstream(self, *, views_only: bool = False) -> list[list[tuple[bytes, int]]]:
        secret = self.puppet.app[PUPPET_STATE].secret
        out = []
        for record in self.puppet.app[RECEIVED]:
            if views_only and record["headers"].get("x-palimpsest-purpose"):
                continue
            keyed = elements(record, secret)
            if keyed is not None:
                out.append(keyed)
        return out

    def view_recall(self) -> list[bool]:
        """Each request of ``upstream(views_only=True)``: is it a recall round?"""
        secret = self.puppet.app[PUPPET_STATE].secret
        return [is_recall_round(r["json"]) for r in self.puppet.app[RECEIVED]
                if not r["headers"].get("x-palimpsest-purpose") and elements(r, secret) is not None]

    def kinds(self) -> list[str]:
        """Each request of ``upstream()``: "summary", "recall" (a recall round) or "main"."""
        secret = self.puppet.app[PUPPET_STATE].secret
        return [("summary" if r["headers"].get("x-palimpsest-purpose") == "summary" else
                 "recall" if is_recall_round(r["json"]) else "main")
                for r in self.puppet.app[RECEIVED] if elements(r, secret) is not None]

    async def close(self) -> None:
        if self.gateway_runner is not None:
            await self.gateway_runner.cleanup()
        await self.puppet.runner.cleanup()


async def codex(calls: int, *, gateway: bool, api: str = "responses", model: str = SMALL) -> dict:
    from tests.support.chain import first_prompt
    from tests.support.clis import run_codex

    run = await Run.start(gateway=gateway, api=api)
    try:
        result = await run_codex(run.base_url, first_prompt("codex", calls), model=model, timeout_s=600)
        made = sum(1 for r in run.puppet.app[RECEIVED] if r["path"].endswith("/responses")
                   and '"function_call_output"' in orjson.dumps(r.get("json") or {}).decode()[-20000:])
        text = result.stdout + result.stderr
        return {"exit": result.returncode, "completed": "CHAIN COMPLETE" in text and result.returncode == 0,
                "out_of_room": "ran out of room" in text, "requests": len(run.upstream(views_only=True)),
                "calls": made, "upstream": run.upstream(), "views": run.upstream(views_only=True),
                "overheads": run.overheads}
    finally:
        await run.close()


async def sdk_loops(seeds: int, calls: int, *, gateway: bool, model: str, seed_base: int = 100) -> dict:
    run = await Run.start(gateway=gateway)
    recalled = asked = rejected = 0
    client_bodies, starts = [], []
    try:
        for seed in range(seeds):
            starts.append(len(run.upstream(views_only=True)))
            session = agent_loop_session(seed=seed_base + seed, turns=1, calls=calls)
            client = openai.AsyncOpenAI(base_url=run.base_url, api_key="sk-bench", max_retries=0,
                                        default_headers={"X-Session-Id": f"bench-{seed}"})
            try:
                items, _ = await drive_responses_loop(client, session, model=model)
            except openai.BadRequestError:
                rejected += 1
                continue
            for fact in session.facts:
                asked += 1
                try:
                    _, response = await responses_turn(client, [*items, {"type": "message", "role": "user",
                                                                          "content": f"RECALL: {fact.question}"}], model=model)
                    recalled += fact.answer in response.output_text
                except openai.BadRequestError:
                    rejected += 1
        client_bodies = run.upstream(views_only=True)
        return {"upstream": run.upstream(), "kinds": run.kinds(), "views": client_bodies, "starts": starts,
                "view_recall": run.view_recall(), "recalled": recalled, "asked": asked,
                "rejected": rejected, "overheads": run.overheads, "client_requests": run.client_requests}
    finally:
        await run.close()


def over_window(requests: list[list[tuple[bytes, int]]]) -> int:
    return sum(1 for r in requests if sum(t for _, t in r) > WINDOWS[SMALL])


async def main(args) -> None:
    quiet_logs()
    rows: list[tuple[str, str, str, str, str]] = []
    # SDK loops: the ideal (no window), direct on 32k, through the gateway.
    global WRITE_PRICE
    WRITE_PRICE = args.write_rate
    for item in args.policy:
        key, _, value = item.partition("=")
        try:
            POLICY[key] = orjson.loads(value)
        except orjson.JSONDecodeError:
            POLICY[key] = value
    ideal = await sdk_loops(args.seeds, args.calls, gateway=False, model=BIG, seed_base=args.seed_base)
    direct = await sdk_loops(args.seeds, args.calls, gateway=False, model=SMALL, seed_base=args.seed_base)
    through = await sdk_loops(args.seeds, args.calls, gateway=True, model=SMALL, seed_base=args.seed_base)
    ideal_tokens, ideal_cost = billed(ideal["views"])
    up_tokens, up_cost = billed(through["upstream"])
    rows.append(("SDK loops, 32k: provider rejections", f"{over_window(ideal['views'])} of {len(ideal['views'])} requests over the window",
                 str(through["rejected"]), "-", "0"))
    rows.append(("upstream / client prompt tokens", "1.00", fmt(up_tokens / ideal_tokens, 3), "-", "<= 0.30"))
    rows.append(("billed / ideal direct", fmt(ideal_cost / ideal_cost), fmt(up_cost / ideal_cost, 3), "-", "<= 0.6"))
    rows.append(("prefix stability", stability(ideal["views"], ideal["starts"]), stability(through["views"], through["starts"]),
                 "-", ">= 0.85"))
    rows.append(("planted facts recalled", f"{direct['recalled']}/{direct['asked']} (rejected {direct['rejected']})",
                 f"{through['recalled']}/{through['asked']}", "-", ">= 0.95"))
    overhead = through["overheads"]
    rows.append(("gateway time added, p50 / p99 (ms)", "-", f"{fmt(percentile(overhead, 50))} / {fmt(percentile(overhead, 99))}",
                 "-", "<= 2 ms p50"))
    parts = bill_parts(through, ideal, ideal_cost)
    if args.codex:
        direct_cx = await codex(args.calls, gateway=False)
        through_cx = await codex(args.calls, gateway=True)
        chat_cx = await codex(args.calls, gateway=True, api="chat")
        ideal_cx = await codex(args.calls, gateway=False, model=BIG)

        def outcome(r: dict) -> str:
            return ("completes" if r["completed"] else "fails" + (" (ran out of room)" if r["out_of_room"] else f" (exit {r['exit']})")) \
                + f", {r['requests']} requests"

        rows.append((f"Codex CLI {args.calls}-call loop, 32k", outcome(direct_cx), outcome(through_cx), outcome(chat_cx),
                     "completes, 0 rejections"))
        i_tokens, i_cost = billed(ideal_cx["views"])
        for name, r in (("responses", through_cx), ("chat-only", chat_cx)):
            t, c = billed(r["upstream"])
            rows.append((f"Codex {name} upstream: upstream/client tokens, billed/ideal", "1.00 / 1.00",
                         f"{fmt(t / i_tokens, 3)} / {fmt(c / i_cost, 3)}", "", "<= 0.30 / <= 0.6"))
        rows.append(("Codex: prefix stability", stability(ideal_cx["views"]), stability(through_cx["views"]),
                     stability(chat_cx["views"]), ">= 0.85"))
    print(f"bench/responses.py — {args.seeds} SDK loops x {args.calls} calls; Codex chain {args.calls} calls; {machine_note()}")
    print()
    print("| figure | sending direct | gateway (Responses upstream) | gateway (chat-only upstream) | target |")
    print("|---|---|---|---|---|")
    for row in rows:
        print("| " + " | ".join(row) + " |")
    print()
    print("Where the SDK loops' bill goes (bench/bill_parts.py):")
    print(header())
    print(render("gateway, Responses upstream", parts))
    print()
    print("Where the prefix breaks (bench/prefix_breaks.py; pairs, mean share of the newer prompt lost per class):")
    def by_session(run: dict, flags: list[bool] | None = None) -> dict:
        bounds = [*run["starts"], len(run["views"])]
        return prefix_breaks.pool([prefix_breaks.decompose(run["views"][a:b], flags[a:b] if flags else None)
                                   for a, b in zip(bounds, bounds[1:])])

    print(prefix_breaks.render("direct (ideal)", by_session(ideal), ideal_cost))
    print(prefix_breaks.render("gateway", by_session(through, through["view_recall"]), ideal_cost))


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--calls", type=int, default=34)
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--no-codex", dest="codex", action="store_false")
    parser.add_argument("--seed-base", type=int, default=100, help="the SDK loops' first seed")
    parser.add_argument("--write-rate", type=float, default=1.0,
                        help="price of a token written to the provider's cache (1.25: GPT-5.6-style premiums)")
    parser.add_argument("--policy", action="append", default=[], metavar="KEY=VALUE",
                        help="a [policy] key for the gateway (repeatable; VALUE parsed as JSON, else a string)")
    asyncio.run(main(parser.parse_args()))
