"""``palimpsest demo``: the product working in one minute, offline, without an API key.

Everything runs in this process on loopback: the puppet (a SIMULATED provider whose answers are
scripted, see ``simulator.puppet``) as the upstream, a real gateway in front of it with a
throw-away store, and the official openai SDK as the agent, replaying the bundled synthetic
session (``simulator.workloads``). Each round prints what the client sent, what went upstream
and what the gateway did in between; then the agent asks about a fact planted early in the
session, whose turn the upstream no longer sees, and the gateway recalls it from the ledger
(session_search, session_load) without the client noticing.

Then the same session runs again in the holdout's other arm (``[policy] holdout_share``,
policies/holdout.py): a session the gateway sends as direct, untouched while it fits and its
oldest rounds cut when it does not. The two arms are printed side by side from the gateway's
``palimpsest_arm_*`` counters, as the dashboard's holdout row compares them on real traffic.

The numbers come from the gateway's own response headers and its Prometheus registry, so they
are the ones a dashboard would show.
"""

from __future__ import annotations

import argparse
import asyncio
import re
import shutil
import sys
import tempfile
import time
from dataclasses import dataclass
from typing import TextIO

from aiohttp import web

from gateway.app import create_app
from gateway.ops.logs import setup_logging
from simulator.puppet import RECEIVED, SIMULATED_NOTICE, start_puppet
from gateway.settings import ConfigError, load_settings
from gateway.keys import COUNTER, METRICS
from policies.holdout import COMPACTED, HOLDOUT, arm
from simulator.workloads import TOOL_SPECS, Fact, SyntheticSession, synthetic_session
from store.records import SessionRef

__all__ = ["run_demo"]

MODEL = "fake-32k"
WINDOW = 32_000
# The cheapest views: summaries start at ~35% of the budget, so a short demo shows every
# mechanism (compaction, checkpoints, recall); `balanced`, the default, keeps conversation raw
# longer (README, "Policies").
PROFILE = "economy"
# The bundled session scripts the simulated model with directives; an answer quoting an old
# message shows them, so the demo's answer line leaves them out.
DIRECTIVE = re.compile(r"\s*\[\[(?:call|parallel|fail|sleep|stall)\b.*?\]\]", re.S)
SESSION_ID = "demo-agent"
CLIENT_KEY = "sk-demo-offline"  # the puppet accepts any key; nothing leaves this machine
TENANT = "demo"
# Half the sessions in each arm; the demo names one session of each (`session_in`).
HOLDOUT_SHARE = 0.5
BAR_WIDTH = 30


def run_demo(args: argparse.Namespace) -> int:
    rounds = getattr(args, "rounds", 40)
    if rounds < 1:
        print(f"palimpsest demo: --rounds has value {rounds}: must be at least 1.", file=sys.stderr)
        return 2
    try:
        import openai  # noqa: F401  (the agent side of the demo is the official SDK)
    except ImportError:
        print("palimpsest demo: the official openai SDK is needed (pip install openai).", file=sys.stderr)
        return 2
    # Before anything imports WordLlama, whose import calls logging.basicConfig(level=INFO).
    setup_logging("WARNING", False)
    store = tempfile.mkdtemp(prefix="palimpsest-demo-")
    try:
        return asyncio.run(_demo(rounds, store, sys.stdout, sys.stderr))
    except KeyboardInterrupt:
        return 130
    finally:
        if getattr(args, "keep", False):
            print(f"\nstore kept in {store} (inspect it with: palimpsest inspect, store.path = {store!r})")
        else:
            shutil.rmtree(store, ignore_errors=True)


@dataclass
class Row:
    turn: int
    client_tokens: int
    upstream_tokens: int
    events: str

    def render(self) -> str:
        saved = 1 - self.upstream_tokens / self.client_tokens if self.client_tokens else 0.0
        return f"{self.turn:>5}  {self.client_tokens:>13,}  {self.upstream_tokens:>15,}  {saved:>5.0%}  {self.events}"


TABLE_HEADER = f"{'turn':>5}  {'client prompt':>13}  {'upstream prompt':>15}  {'saved':>5}  events"


class Progress:
    """A plain-text progress bar on stderr: redrawn in place on a terminal (erased before each
    table row is printed), a single line at the end otherwise (so logs stay readable)."""

    def __init__(self, total: int, stream: TextIO) -> None:
        self.total = total
        self.stream = stream
        self.tty = stream.isatty()
        self._shown = -1

    def _bar(self, done: int) -> str:
        filled = BAR_WIDTH * done // self.total
        return f"[{'#' * filled}{'.' * (BAR_WIDTH - filled)}] {done}/{self.total} rounds"

    def update(self, done: int) -> None:
        if self.tty:
            self.stream.write("\r" + self._bar(done))
        else:
            # Not a terminal (a log, a pipe, 2>&1): the table rows are the progress; one line
            # at the end, so nothing lands between them.
            if done != self.total or done == self._shown:
                return
            self.stream.write(self._bar(done) + "\n")
        self._shown = done
        self.stream.flush()

    def clear(self) -> None:
        """Erase the bar (terminal only) so a table row can be printed in its place."""
        if self.tty and self._shown >= 0:
            self.stream.write("\r" + " " * (BAR_WIDTH + 24) + "\r")
            self.stream.flush()


class Counters:
    """Reads the gateway's Prometheus registry: the same numbers /metrics exports."""

    def __init__(self, app: web.Application) -> None:
        self.registry = app[METRICS].registry

    def get(self, name: str, **labels: str) -> float:
        return self.registry.get_sample_value(name, labels) or 0.0

    def snapshot(self) -> dict[str, float]:
        return {
            "async_jobs": self.get("palimpsest_summary_jobs_enqueued_total", mode="async"),
            "sync_jobs": self.get("palimpsest_summary_jobs_enqueued_total", mode="sync"),
            "async_checkpoints": self.get("palimpsest_summary_checkpoints_created_total", mode="async"),
            "sync_checkpoints": self.get("palimpsest_summary_checkpoints_created_total", mode="sync"),
            "compacted": self.get("palimpsest_compaction_replacements_total", **{"pass": "placeholder"})
            + self.get("palimpsest_compaction_replacements_total", **{"pass": "truncate"}),
            "dropped": self.get("palimpsest_tailoring_dropped_messages_total", kind="dropped")
            + self.get("palimpsest_tailoring_dropped_messages_total", kind="truncated"),
        }


def describe_events(before: dict[str, float], after: dict[str, float], checkpoint: str | None, previous: str | None) -> str:
    diff = {k: int(after[k] - before[k]) for k in after}
    events = []
    if diff["async_jobs"]:
        events.append("summary job queued")
    if diff["sync_jobs"]:
        events.append("sync summary (request waited)")
    made = diff["async_checkpoints"] + diff["sync_checkpoints"]
    if made:
        events.append(f"checkpoint created x{made}" if made > 1 else "checkpoint created")
    if checkpoint and checkpoint != previous:
        events.append(f"view folds history into checkpoint {checkpoint[:10]}")
    if diff["compacted"]:
        events.append(f"{diff['compacted']} tool results compacted")
    if diff["dropped"]:
        events.append(f"{diff['dropped']} messages tailored")
    return "; ".join(events)


async def _start_gateway(upstream_url: str, store: str) -> tuple[web.AppRunner, str, web.Application]:
    settings = load_settings(
        None,
        upstream={"base_url": upstream_url},
        store={"path": store},
        models={MODEL: {"context_window": WINDOW}},
        policy={"profile": PROFILE, "holdout_share": HOLDOUT_SHARE},
        tenants={TENANT: CLIENT_KEY},
        server={"shutdown_timeout_s": 10.0},
    )
    app = create_app(settings)
    runner = web.AppRunner(app, access_log=None, handler_cancellation=True)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    return runner, f"http://127.0.0.1:{runner.addresses[0][1]}/v1", app


async def _demo(rounds: int, store: str, out: TextIO, err: TextIO) -> int:
    import openai

    started = time.perf_counter()
    puppet, puppet_url = await start_puppet(windows={MODEL: WINDOW}, keep_received=20)
    gateway = None
    try:
        try:
            gateway, gateway_url, app = await _start_gateway(puppet_url, store)
        except ConfigError as exc:  # PALIMPSEST_* variables in the environment still apply
            print(f"palimpsest demo: {exc}", file=err)
            return 2
        session = synthetic_session(seed=7, rounds=rounds)
        print("Palimpsest demo: offline, no API key, nothing leaves this machine.", file=out)
        print(f"  upstream  {SIMULATED_NOTICE}", file=out)
        print(f"            {puppet_url}  (model {MODEL}, window {WINDOW:,} tokens)", file=out)
        print(f"  gateway   {gateway_url}  (store {store})", file=out)
        print(f"            policy profile {PROFILE}: summaries early, so a short session shows them", file=out)
        print(f"  agent     official openai SDK replaying a bundled {rounds}-round coding session", file=out)
        print("            (each round: a user step, a tool call, a 300-2,500 token tool result, an answer)\n", file=out)
        try:
            async with _client(openai, gateway_url, session_in(COMPACTED)) as client:
                history = await _replay(client, session, app, out, err)
                recalled = await _recall(client, session, history, puppet.app[RECEIVED], out)
            async with _client(openai, gateway_url, session_in(HOLDOUT)) as client:
                history = await _replay(client, session, app, out, err, table=False)
                held_out_recalled = await _ask(client, session, history)
        except openai.APIError as exc:
            print(f"\npalimpsest demo: the gateway answered with an error: {exc}", file=err)
            return 1
        await gateway.cleanup()  # drains summary jobs, so the totals below are final
        gateway = None
        counters = Counters(app)
        _totals(counters, out)
        _arms(counters, out, recalled, held_out_recalled)
        print(f"\nwall time {time.perf_counter() - started:.1f}s, both sessions (upstream SIMULATED: no model was called)", file=out)
        return 0 if recalled else 1
    finally:
        if gateway is not None:
            await gateway.cleanup()
        await puppet.cleanup()


def session_in(wanted: str) -> str:
    """A session id of the demo's tenant that the holdout puts in arm `wanted`: the first of
    SESSION_ID, SESSION_ID-2, ... (deterministic: policies/holdout.py hashes the session)."""
    n = 1
    while True:
        session_id = SESSION_ID if n == 1 else f"{SESSION_ID}-{n}"
        if arm(SessionRef(TENANT, session_id).key, HOLDOUT_SHARE) == wanted:
            return session_id
        n += 1


def _client(openai, gateway_url: str, session_id: str):
    # trust_env=False: an HTTP(S)_PROXY in the environment must not capture loopback calls.
    return openai.AsyncOpenAI(base_url=gateway_url, api_key=CLIENT_KEY, max_retries=0, timeout=60,
                              default_headers={"X-Session-Id": session_id},
                              http_client=openai.DefaultAsyncHttpxClient(trust_env=False))


async def _replay(client, session: SyntheticSession, app: web.Application, out: TextIO, err: TextIO,
                  table: bool = True) -> list[dict]:
    """Play the session like an agent: per round, the user asks, the model calls a tool, the
    tool's output goes back, the model answers. With `table`, one row per round (its last
    request), else only the progress bar."""
    counters, counter = Counters(app), app[COUNTER]
    history: list[dict] = [{"role": "system", "content": session.system}]
    progress = Progress(len(session.rounds), err)
    if table:
        print(TABLE_HEADER, file=out)
        print("-" * 78, file=out)
        out.flush()
    progress.update(0)
    checkpoint = None
    for turn, spec in enumerate(session.rounds, 1):
        before = counters.snapshot()
        history.append({"role": "user", "content": spec["user"]})
        first = await client.chat.completions.with_raw_response.create(model=MODEL, messages=history, tools=TOOL_SPECS)
        message = first.parse().choices[0].message
        history.append(message.model_dump(exclude_none=True))
        call_id = message.tool_calls[0].id if message.tool_calls else "missing"
        history.append({"role": "tool", "tool_call_id": call_id, "content": spec["output"]})
        second = await client.chat.completions.with_raw_response.create(model=MODEL, messages=history, tools=TOOL_SPECS)
        history.append(second.parse().choices[0].message.model_dump(exclude_none=True))
        seen = second.headers.get("x-palimpsest-checkpoint")
        events = describe_events(before, counters.snapshot(), seen, checkpoint)
        if "x-palimpsest-prompt-tokens-client" in second.headers:
            sent = int(second.headers["x-palimpsest-prompt-tokens-client"])
            upstream = int(second.headers["x-palimpsest-prompt-tokens-upstream"])
        else:
            # A session that fits is forwarded byte for byte (no token headers): count it here.
            sent = upstream = counter.count_messages(history[:-1]) + counter.count_tools(TOOL_SPECS)
            events = events or "fits: forwarded byte for byte"
        row = Row(turn, sent, upstream, events)
        checkpoint = seen or checkpoint
        progress.clear()
        if table:
            print(row.render(), file=out)
            out.flush()
        progress.update(turn)
    if progress.tty:
        err.write("\n")
    return history


async def _recall(client, session: SyntheticSession, history: list[dict], received: list[dict], out: TextIO) -> bool:
    fact: Fact | None = session.facts[0] if session.facts else None  # the earliest planted
    print("", file=out)
    if fact is None:
        print("recall: the session is too short to have planted a fact (try --rounds 40).", file=out)
        return True
    print(f"Round {fact.round + 1} planted a fact: {fact.statement!r}", file=out)
    question = f"RECALL: {fact.question}"
    print(f"The agent now asks: {question!r}", file=out)
    history.append({"role": "user", "content": question})
    received.clear()  # from here on, the puppet's log is this turn: what the upstream saw
    raw = await client.chat.completions.with_raw_response.create(model=MODEL, messages=history, tools=TOOL_SPECS)
    answer = raw.parse().choices[0].message.content or ""
    recall_calls = int(raw.headers.get("x-palimpsest-recall-calls", 0))
    turn = [r for r in received if r["path"].endswith("/chat/completions") and isinstance(r.get("json"), dict)
            and not r["headers"].get("x-palimpsest-purpose")]
    where = _where_in_view(turn[0]["json"]["messages"] if turn else [], fact.answer)
    client_tokens = int(raw.headers.get("x-palimpsest-prompt-tokens-client", 0))
    upstream_tokens = int(raw.headers.get("x-palimpsest-prompt-tokens-upstream", 0))
    if client_tokens:
        print(f"  the upstream was sent {upstream_tokens:,} of the client's {client_tokens:,} prompt tokens.", file=out)
    else:
        print("  the upstream was sent the whole conversation.", file=out)
    print(f"  {_what_happened(fact.answer, where, _recall_names(turn), recall_calls)}", file=out)
    print(f"  answer: {_excerpt(answer, fact.answer)}", file=out)
    if fact.answer in answer:
        print(f"  recalled: {fact.answer}  (the exact value planted in round {fact.round + 1})", file=out)
        return True
    if where == VERBATIM:
        print("  the fact is still verbatim in the upstream's view: nothing to recall yet (try more --rounds).", file=out)
        return True
    print(f"  NOT recalled: expected {fact.answer!r} in the answer.", file=out)
    return False


async def _ask(client, session: SyntheticSession, history: list[dict]) -> bool | None:
    """The recall question in the other arm, quietly: whether its answer has the fact (None: no fact)."""
    fact = session.facts[0] if session.facts else None
    if fact is None:
        return None
    history.append({"role": "user", "content": f"RECALL: {fact.question}"})
    answer = (await client.chat.completions.create(model=MODEL, messages=history, tools=TOOL_SPECS)).choices[0].message.content
    return fact.answer in (answer or "")


VERBATIM, SUMMARISED, ABSENT = "verbatim", "summary", "absent"


def _where_in_view(messages: list[dict], value: str) -> str:
    """Where the first request of the turn carried the value: a raw message, the summary, nowhere."""
    for message in messages:
        content = message.get("content")
        text = content if isinstance(content, str) else str(content or "")
        if value in text:
            return SUMMARISED if "<session_summary>" in text else VERBATIM
    return ABSENT


def _recall_names(turn: list[dict]) -> list[str]:
    """The recall tools the model called during the turn, in order (from the last request's
    messages, where the gateway appended each call it resolved)."""
    messages = turn[-1]["json"]["messages"] if turn else []
    return [call["function"]["name"] for m in messages if m.get("role") == "assistant"
            for call in m.get("tool_calls") or () if call["function"]["name"].startswith("session_")]


def _what_happened(value: str, where: str, names: list[str], calls: int) -> str:
    """One plain sentence: where the value was in what the model was sent, and what recall did."""
    seen = {VERBATIM: f"{value} was still in the messages the model was sent",
            SUMMARISED: f"{value} was in the summary the gateway put in place of the old turns",
            ABSENT: f"{value} was not in anything the model was sent"}[where]
    if not calls:
        return f"{seen}; the model answered without a recall call."
    tools = ", ".join(dict.fromkeys(names)) or "the recall tools"
    searched = "searched the history for it" if where == ABSENT else "searched the history anyway"
    return (f"{seen}; the model {searched}, and the gateway answered its {calls} recall "
            f"call{'s' if calls != 1 else ''} ({tools}) from the ledger.")


def _excerpt(text: str, needle: str, width: int = 90) -> str:
    text = " ".join(DIRECTIVE.sub("", text).split())
    at = text.find(needle)
    if at < 0 or len(text) <= 2 * width:
        return text if len(text) <= 2 * width else text[: 2 * width] + " …"
    start, end = max(0, at - width), min(len(text), at + len(needle) + width)
    return ("… " if start else "") + text[start:end] + (" …" if end < len(text) else "")


def _totals(counters: Counters, out: TextIO) -> None:
    # The first session's figures: the compacted arm's (the holdout session after it has its own table).
    client = counters.get("palimpsest_arm_prompt_tokens_total", arm=COMPACTED, side="client")
    upstream = counters.get("palimpsest_arm_prompt_tokens_total", arm=COMPACTED, side="upstream")
    summary_calls = int(counters.get("palimpsest_summary_llm_duration_seconds_count"))
    checkpoints = int(counters.get("palimpsest_summary_checkpoints_created_total", mode="async")
                      + counters.get("palimpsest_summary_checkpoints_created_total", mode="sync"))
    overhead = counters.get("palimpsest_overhead_tokens_total", purpose="summary") \
        + counters.get("palimpsest_overhead_tokens_total", purpose="recall")
    saved = client - upstream
    print("\nTotals over every request of the session above (as exported on /metrics):", file=out)
    print(f"  client prompt tokens    {int(client):>12,}", file=out)
    print(f"  upstream prompt tokens  {int(upstream):>12,}   saved {int(saved):,} ({_ratio(saved, client)})", file=out)
    print(f"  summary calls           {summary_calls:>12,}   ({checkpoints} checkpoints, {int(overhead):,} tokens spent on them)", file=out)
    print(f"  net saving              {int(saved - overhead):>12,}   ({_ratio(saved - overhead, client)} of the client's prompt tokens)", file=out)


ARMS_HEADER = f"{'arm':<10}  {'requests':>8}  {'client prompt':>13}  {'upstream prompt':>15}  {'billed':>11}  {'rejected':>8}  {'recall':>6}  fact"


def _arms(counters: Counters, out: TextIO, recalled: bool, held_out_recalled: bool | None) -> None:
    """The two arms side by side, from the holdout's counters (the dashboard's holdout row)."""
    print("\nThe holdout: the same session again, in the arm sent as direct (untouched while it fits,", file=out)
    print(f"its oldest rounds cut when it does not), [policy] holdout_share = {HOLDOUT_SHARE}:", file=out)
    print(ARMS_HEADER, file=out)
    print("-" * len(ARMS_HEADER), file=out)
    billed: dict[str, float] = {}
    for name in (COMPACTED, HOLDOUT):
        requests = sum(counters.get("palimpsest_arm_requests_total", arm=name, status=status) for status in ("200", "400"))
        billed[name] = counters.get("palimpsest_arm_billed_units_total", arm=name, what="billed")
        fact = recalled if name == COMPACTED else held_out_recalled
        print(f"{name:<10}  {int(requests):>8,}  "
              f"{int(counters.get('palimpsest_arm_prompt_tokens_total', arm=name, side='client')):>13,}  "
              f"{int(counters.get('palimpsest_arm_prompt_tokens_total', arm=name, side='upstream')):>15,}  "
              f"{int(billed[name]):>11,}  {int(counters.get('palimpsest_arm_context_rejections_total', arm=name)):>8,}  "
              f"{int(counters.get('palimpsest_arm_recall_calls_total', arm=name)):>6,}  "
              f"{'n/a' if fact is None else 'recalled' if fact else 'lost'}", file=out)
    print("  billed: every upstream call (summaries count to compacted) in uncached input tokens, with the", file=out)
    print(f"  provider cache priced by the model's rule. compacted / holdout: {_ratio(billed[COMPACTED], billed[HOLDOUT])}", file=out)


def _ratio(part: float, whole: float) -> str:
    return f"{part / whole:.0%}" if whole else "n/a"
