"""Summary jobs under faults: no storms, honoured Retry-After, a breaker per model, and
compaction that proceeds on deterministic checkpoints when the summary model is weak.

Everything goes through a real gateway to the puppet, which plays the faulty summary model
(``PuppetState.summary_*``: off-format answers, failures, 429 with Retry-After, slow calls).
The backoff and breaker clocks are unit-tested with injected clocks at the end.
"""

from __future__ import annotations

import asyncio
import time

import aiohttp
import openai

from gateway.jobs.backoff import Breaker, SessionBackoff, retry_after_seconds
from gateway.keys import CHECKPOINTS, LEDGER, METRICS, SUMMARIZER
from policies.rounds import tool_pair_problems
from policies.summary import DETERMINISTIC_MODEL, DETERMINISTIC_NOTE, REQUIRED_SECTIONS
from simulator.puppet import count_prompt
from simulator.workloads import TOOL_SPECS, synthetic_session
from tests.support.agent import settle

MODEL = "fake-32k"
PURPOSE = "x-palimpsest-purpose"
# Mechanism tests pin when summaries happen (a low trigger and a short raw tail), whatever the
# default policy's balance between summaries and tool-result placeholders.
# These tests are about faults, not about when a summary pays: the ratios trigger unconditionally.
SUMMARIES = {"summary_trigger_ratio": 0.2, "sync_compaction_ratio": 0.9, "keep_recent_tokens": 3000, "keep_recent_share": 0.15,
             "cost_model": False}


def client(gw, session: str, key: str = "sk-faults") -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url=gw.base_url, api_key=key, default_headers={"X-Session-Id": session}, max_retries=0)


async def play(api: openai.AsyncOpenAI, session, rounds: range, history: list[dict] | None = None):
    """Replay rounds of a synthetic session (tool call, then answer); returns the history and
    (prompt tokens the client sent, raw response) per request."""
    history = history if history is not None else [{"role": "system", "content": session.system}]
    sent = []
    for spec in session.rounds[rounds.start:rounds.stop]:
        history.append({"role": "user", "content": spec["user"]})
        for step in ("call", "answer"):
            tokens = count_prompt({"model": MODEL, "messages": history, "tools": TOOL_SPECS})
            raw = await api.chat.completions.with_raw_response.create(model=MODEL, messages=history, tools=TOOL_SPECS)
            sent.append((tokens, raw))
            message = raw.parse().choices[0].message
            history.append(message.model_dump(exclude_none=True))
            if step == "call":
                assert message.tool_calls, message
                history.append({"role": "tool", "tool_call_id": message.tool_calls[0].id, "content": spec["output"]})
    return history, sent


async def ask(api: openai.AsyncOpenAI, history: list[dict], text: str):
    """One more plain turn on top of `history` (not kept)."""
    return await api.chat.completions.with_raw_response.create(model=MODEL, messages=[*history, {"role": "user", "content": text}])


def summary_calls(upstream) -> list[dict]:
    return [r for r in upstream.chat_requests() if r["headers"].get(PURPOSE) == "summary"]


def forwarded(upstream) -> list[dict]:
    return [r for r in upstream.chat_requests() if not r["headers"].get(PURPOSE)]


def assert_every_upstream_request_valid(upstream, window: int = 32_000) -> None:
    for req in upstream.chat_requests():
        body = req["json"]
        assert tool_pair_problems([m for m in body["messages"] if m["role"] not in ("system", "developer")]) == []
        assert count_prompt(body) + (body.get("max_tokens") or 0) <= window


def metric(gw, name: str, **labels) -> float:
    return gw.app[METRICS].registry.get_sample_value(name, labels) or 0.0


def checkpoints(gw, session: str):
    key = next(s.key for s in gw.app[LEDGER].sessions() if s.session_id == session)
    return gw.app[CHECKPOINTS].list(key)


# -- a summary model that ignores the format ------------------------------------------------------


async def test_format_ignoring_model_meets_the_targets(gateway, upstream):
    """Default settings, a 42-round agent session on 32k with a summary model that ignores the
    required headings: summary calls stay under a fifth of the requests, the upstream gets at
    most 35% of the client's prompt tokens, and the checkpoints are the deterministic ones."""
    upstream.state.summary_format = "ignore"
    session = synthetic_session(seed=21, rounds=42)
    history, sent = await play(client(gateway, "weak"), session, range(0, 42))
    await settle(gateway)
    assert len(sent) == 84 and all(raw.http_response.status_code == 200 for _, raw in sent)
    assert len(summary_calls(upstream)) <= 0.2 * len(sent)
    upstream_tokens = sum(count_prompt(r["json"]) for r in forwarded(upstream))
    client_tokens = sum(tokens for tokens, _ in sent)
    assert upstream_tokens <= 0.35 * client_tokens, upstream_tokens / client_tokens
    assert all(cp.model == DETERMINISTIC_MODEL for cp in checkpoints(gateway, "weak"))
    assert_every_upstream_request_valid(upstream)


async def test_format_ignoring_model_degrades_to_deterministic_checkpoints(start_gateway, upstream):
    gw = await start_gateway(policy=SUMMARIES)
    upstream.state.summary_format = "ignore"
    session = synthetic_session(seed=21, rounds=42)
    history, sent = await play(client(gw, "weak"), session, range(0, 42))
    await settle(gw)
    assert all(raw.http_response.status_code == 200 for _, raw in sent)
    calls = summary_calls(upstream)
    # Before: a fresh job on every turn over the trigger, each chunk tried twice.
    assert 0 < len(calls) <= 0.2 * len(sent), len(calls)
    # The one retry is not blind: it is the same request plus what was wrong.
    retries = [r for r in calls if "previous answer was rejected" in r["json"]["messages"][-1]["content"]]
    assert retries and "missing sections" in retries[0]["json"]["messages"][-1]["content"]
    # Compaction proceeds on checkpoints written without a model, and the views use them.
    cps = checkpoints(gw, "weak")
    assert len(cps) >= 2 and all(cp.model == DETERMINISTIC_MODEL for cp in cps)
    assert metric(gw, "palimpsest_summary_deterministic_checkpoints_total", mode="async") >= 2
    assert sent[-1][1].headers["x-palimpsest-checkpoint"] in {cp.id for cp in cps}
    last = forwarded(upstream)[-1]["json"]["messages"]
    block = next(m["content"] for m in last if m["role"] in ("system", "user") and "<session_summary>" in (m["content"] or ""))
    assert DETERMINISTIC_NOTE in block and all(f"## {s}" in block for s in REQUIRED_SECTIONS)
    assert "DEP-58213" in block  # planted in round 3, long behind the boundary
    assert last[-1]["content"] == history[-2]["content"] or last[-1] == history[-2]
    assert_every_upstream_request_valid(upstream)


async def test_invalid_summary_is_retried_once_with_reasons_then_previous_checkpoint_kept(start_gateway, upstream):
    # Degraded mode held off (deterministic_after high): this is about the retry and the kept checkpoint.
    gw = await start_gateway(summary={"deterministic_after": 10}, policy=SUMMARIES)
    session = synthetic_session(seed=4, rounds=40)
    api = client(gw, "kept")
    history, _ = await play(api, session, range(0, 22))
    await settle(gw)
    good = checkpoints(gw, "kept")
    assert good and good[-1].model == MODEL, "a valid summary came first"
    before = len(summary_calls(upstream))
    upstream.state.summary_format = "ignore"
    history, sent = await play(api, session, range(22, 40), history)
    await settle(gw)
    calls = summary_calls(upstream)[before:]
    # One job: the call and one retry naming the problems; then the session backs off (no job per turn).
    assert len(calls) == 2, len(calls)
    assert calls[0]["json"]["messages"] == calls[1]["json"]["messages"][:-1]
    assert "missing sections" in calls[1]["json"]["messages"][-1]["content"]
    assert metric(gw, "palimpsest_summary_invalid_format_total") == 2
    assert metric(gw, "palimpsest_summary_jobs_skipped_total", reason="backoff") >= 1
    # The previous checkpoint is kept and still used: nothing replaced it.
    assert checkpoints(gw, "kept") == good
    assert sent[-1][1].headers["x-palimpsest-checkpoint"] == good[-1].id
    assert all(raw.http_response.status_code == 200 for _, raw in sent)
    assert_every_upstream_request_valid(upstream)


async def test_deterministic_checkpoint_is_replaced_when_the_model_works_again(start_gateway, upstream):
    # Short waits: the session's backoff and the breaker the rejections open are over by the time the model recovers.
    gw = await start_gateway(summary={"backoff_base_s": 0.05, "backoff_max_s": 0.1, "backoff_jitter": 0, "breaker_cooldown_s": 0.1},
                             policy=SUMMARIES)
    upstream.state.summary_format = "ignore"
    session = synthetic_session(seed=6, rounds=44)
    api = client(gw, "recover")
    history, _ = await play(api, session, range(0, 24))
    await settle(gw)
    degraded = checkpoints(gw, "recover")
    assert degraded and degraded[-1].model == DETERMINISTIC_MODEL
    upstream.state.summary_format = "follow"
    await asyncio.sleep(0.2)  # past the session's backoff
    history, sent = await play(api, session, range(24, 44), history)
    await settle(gw)
    cps = checkpoints(gw, "recover")
    real = [cp for cp in cps if cp.model == MODEL]
    assert real, "a model summary replaced the deterministic one"
    assert real[0].previous == degraded[-1].id
    # The model was asked to merge the deterministic summary, which it then superseded.
    first_good_call = [r for r in summary_calls(upstream) if DETERMINISTIC_NOTE in r["json"]["messages"][-1]["content"]]
    assert first_good_call
    assert sent[-1][1].headers["x-palimpsest-checkpoint"] in {cp.id for cp in real}  # the view uses it
    assert DETERMINISTIC_NOTE not in cps[-1].summary


# -- 429 with Retry-After ------------------------------------------------------------------------


async def test_retry_after_is_honoured(start_gateway, upstream):
    gw = await start_gateway(summary={"backoff_base_s": 0.05, "backoff_jitter": 0},
                             policy={**SUMMARIES, "summary_trigger_ratio": 0.1})
    upstream.state.summary_status = 429
    upstream.state.retry_after = "2"
    session = synthetic_session(seed=8, rounds=20)
    api = client(gw, "limited")
    history = None
    for i in range(20):  # up to the first summary call: the 429
        history, _ = await play(api, session, range(i, i + 1), history)
        await settle(gw)
        if summary_calls(upstream):
            break
    limited_at = time.monotonic()  # just after the 429: Retry-After runs until about limited_at + 2
    assert len(summary_calls(upstream)) == 1
    turns = 0
    while time.monotonic() - limited_at < 1.5:  # every turn is over the trigger and asks for a summary
        r = await ask(api, history, f"meanwhile {turns}")
        assert r.http_response.status_code == 200
        turns += 1
        await settle(gw)
    assert turns >= 2 and len(summary_calls(upstream)) == 1
    assert metric(gw, "palimpsest_summary_jobs_skipped_total", reason="backoff") >= turns
    upstream.state.summary_status = None
    await asyncio.sleep(max(0.0, 2.1 - (time.monotonic() - limited_at)))
    r = await ask(api, history, "after the wait")
    await settle(gw)
    assert len(summary_calls(upstream)) == 2
    assert checkpoints(gw, "limited")[-1].model == MODEL
    assert metric(gw, "palimpsest_summary_calls_total", outcome="rate_limited") == 1


# -- the breaker ---------------------------------------------------------------------------------


async def test_breaker_opens_after_failures_across_sessions_and_half_opens(start_gateway, upstream):
    gw = await start_gateway(
        summary={"breaker_failures": 2, "breaker_cooldown_s": 30, "backoff_jitter": 0, "backoff_base_s": 60},
        policy=SUMMARIES,
    )
    upstream.state.summary_status = 500
    session = synthetic_session(seed=10, rounds=10)
    for name in ("a", "b"):
        await play(client(gw, name), session, range(0, 10))
        await settle(gw)
    assert len(summary_calls(upstream)) == 2  # one failed call per session; each then backs off
    # The cool-down runs on the breaker's clock, which the test moves on: a session played
    # under load must not outlive it by wall time.
    (breaker,) = gw.app[SUMMARIZER].breakers.values()
    skew = [0.0]
    breaker.clock = lambda: time.monotonic() + skew[0]
    assert metric(gw, "palimpsest_summary_breaker_transitions_total", kind="open") == 1
    assert metric(gw, "palimpsest_summary_breakers_open") == 1
    # A third session never calls the model while the breaker is open.
    history, _ = await play(client(gw, "c"), session, range(0, 10))
    await settle(gw)
    assert len(summary_calls(upstream)) == 2
    assert metric(gw, "palimpsest_summary_jobs_skipped_total", reason="open") >= 1
    # After the cool-down one probe goes through; it succeeds and closes the breaker.
    upstream.state.summary_status = None
    skew[0] = 31.0  # the cool-down is over
    await ask(client(gw, "c"), history, "probe")
    await settle(gw)
    assert len(summary_calls(upstream)) == 3
    assert metric(gw, "palimpsest_summary_breaker_transitions_total", kind="half_open") == 1
    assert metric(gw, "palimpsest_summary_breaker_transitions_total", kind="close") == 1
    assert metric(gw, "palimpsest_summary_breakers_open") == 0
    assert checkpoints(gw, "c")[-1].model == MODEL


# -- credentials -----------------------------------------------------------------------------------


async def test_api_key_clients_get_discovery_and_summaries(start_gateway, upstream):
    gateway = await start_gateway(policy=SUMMARIES)
    session = synthetic_session(seed=12, rounds=26)
    history = [{"role": "system", "content": session.system}]
    headers = {"api-key": "az-client-key", "X-Session-Id": "azure"}
    async with aiohttp.ClientSession() as http:
        for spec in session.rounds:
            history.append({"role": "user", "content": spec["user"]})
            for step in ("call", "answer"):
                body = {"model": MODEL, "messages": history, "tools": TOOL_SPECS}
                async with http.post(gateway.base_url + "/chat/completions", json=body, headers=headers) as r:
                    assert r.status == 200, await r.text()
                    message = (await r.json())["choices"][0]["message"]
                history.append({k: v for k, v in message.items() if v is not None})
                if step == "call":
                    history.append({"role": "tool", "tool_call_id": message["tool_calls"][0]["id"], "content": spec["output"]})
    await settle(gateway)
    discovery = [r for r in upstream.received if r["path"] == "/v1/models"]
    assert discovery and discovery[0]["headers"].get("api-key") == "az-client-key"
    calls = summary_calls(upstream)
    assert calls and all(r["headers"].get("api-key") == "az-client-key" for r in calls)
    assert not any("authorization" in r["headers"] for r in calls)
    assert checkpoints(gateway, "azure")[-1].model == MODEL


# -- map-reduce ------------------------------------------------------------------------------------


async def test_failing_part_of_a_map_reduce_leaves_no_sibling_running(start_gateway, upstream):
    # The transcript form: a cache fork reads the view in one call, with no parts to fail.
    gw = await start_gateway(policy={**SUMMARIES, "summary_parallel": 4, "summary_chunk_tokens": 1000,
                                     "summary_cache_fork": False})
    upstream.state.summary_failures = [500]
    upstream.state.summary_latency_s = 5.0  # the siblings would still be waiting on the upstream
    session = synthetic_session(seed=14, rounds=14)
    await play(client(gw, "parts"), session, range(0, 14))
    await settle(gw)
    parts = [t for t in asyncio.all_tasks() if ".part" in getattr(t.get_coro(), "__qualname__", "")]
    assert parts == [], "a sibling of the failed part is still running"
    assert len(summary_calls(upstream)) >= 2  # the wave went out in parallel
    assert metric(gw, "palimpsest_summary_errors_total", reason="upstream_500") == 1
    assert checkpoints(gw, "parts") == []


# -- bounded queue -----------------------------------------------------------------------------------


async def test_full_summary_queue_degrades_to_tailoring(start_gateway, upstream):
    gw = await start_gateway(summary={"workers": 1, "queue_size": 1},
                             policy={**SUMMARIES, "sync_compaction_ratio": 0.5, "sync_budget_s": 0.2})
    upstream.state.summary_latency_s = 1.0
    summarizer = gw.app[SUMMARIZER]
    peak = 0

    async def one(name: str):
        nonlocal peak
        api = client(gw, name)
        history = [{"role": "system", "content": "agent"}]
        session = synthetic_session(seed=int(name[1:]), rounds=12)
        for i in range(12):
            history, sent = await play(api, session, range(i, i + 1), history)
            assert all(raw.http_response.status_code == 200 for _, raw in sent)
            peak = max(peak, len(summarizer._running) + summarizer._queue.qsize())

    await asyncio.gather(*(one(f"q{i}") for i in range(4)))
    assert peak <= 2  # workers + queue_size: jobs in memory stay bounded
    assert metric(gw, "palimpsest_summary_jobs_dropped_total", reason="queue_full") >= 1
    assert_every_upstream_request_valid(upstream)
    await settle(gw, timeout_s=30)


# -- the clocks, unit-tested ---------------------------------------------------------------------


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_retry_after_header_forms():
    assert retry_after_seconds({"retry-after": "20"}) == 20
    assert retry_after_seconds({"retry-after-ms": "1500", "retry-after": "9"}) == 1.5
    assert retry_after_seconds({"retry-after": "Wed, 21 Oct 2015 07:28:30 GMT"}, now_epoch=1445412500.0) == 10
    assert retry_after_seconds({"retry-after": "soon"}) is None and retry_after_seconds({}) is None
    assert retry_after_seconds({"retry-after": "999999"}) == 3600  # capped


def test_session_backoff_doubles_with_jitter_and_honours_retry_after():
    clock = Clock()
    backoff = SessionBackoff(base_s=10, max_s=60, jitter=0.5, degrade_after=2, clock=clock, rand=lambda: 1.0)
    assert backoff.failed("s") == 5  # 10 * (1 - 0.5)
    assert backoff.failed("s") == 10 and backoff.failed("s") == 20 and backoff.failed("s") == 30  # capped at 60 * 0.5
    assert backoff.waiting("s")
    clock.now += 31
    assert not backoff.waiting("s")
    assert backoff.failed("s", retry_after=120) == 120
    backoff.rejected("s")
    assert not backoff.degraded("s")
    backoff.rejected("s")
    assert backoff.degraded("s")
    backoff.succeeded("s")
    assert not backoff.waiting("s") and not backoff.degraded("s")


def test_breaker_opens_half_opens_and_doubles_its_cooldown():
    clock = Clock()
    breaker = Breaker(failures=3, cooldown_s=10, max_s=100, jitter=0, clock=clock)
    assert [breaker.record(False) for _ in range(3)] == [None, None, "open"]
    assert breaker.admit() == "open"
    clock.now += 10
    assert breaker.admit() == "probe" and breaker.admit() == "open"  # one probe at a time
    assert breaker.record(False, cause="rejected") == "open" and breaker.cause == "rejected"
    clock.now += 10
    assert breaker.admit() == "open"  # the cool-down doubled
    clock.now += 10
    assert breaker.admit() == "probe"
    breaker.release()
    assert breaker.admit() == "probe"  # a probe that made no call gives its turn back
    assert breaker.record(True) == "close" and breaker.admit() == "call"
    breaker.record(False, retry_after=5)
    assert breaker.admit() == "retry_after"
    clock.now += 5
    assert breaker.admit() == "call"
