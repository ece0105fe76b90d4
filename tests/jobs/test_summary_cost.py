"""What one tenant can make the gateway spend, and on whom its failures fall: summary calls are
paid from a per-tenant token budget, one job folds a bounded part of the history with the
model, sync jobs share the workers with async ones, and a tenant whose content makes summaries
fail does not switch summaries off for everyone else."""

from __future__ import annotations

import asyncio

import openai

from gateway.jobs.budget import TenantBudget
from policies.summary import DETERMINISTIC_MODEL
from simulator.puppet import count_prompt
from tests.jobs.test_summary_faults import MODEL, SUMMARIES, checkpoints, client, metric, summary_calls
from tests.support.agent import settle


def long_chat(rounds: int, words: int, tag: str, planted: str = "") -> list[dict]:
    """A plain chat of `rounds` user/assistant pairs of about `words` words each; `planted`
    goes in the very first user message."""
    out: list[dict] = [{"role": "system", "content": "be brief"}]
    for i in range(rounds):
        text = " ".join(f"{tag}{i}w{j} topic{j % 17}" for j in range(words // 2))
        out += [{"role": "user", "content": (planted + " " if i == 0 else "") + text}, {"role": "assistant", "content": f"noted {i}"}]
    return out + [{"role": "user", "content": "where were we?"}]


def spent(calls: list[dict]) -> int:
    return sum(count_prompt(r["json"]) + (r["json"].get("max_tokens") or 0) for r in calls)


async def send(gw, session: str, messages: list[dict], key: str = "sk-tenant-a"):
    return await client(gw, session, key).chat.completions.create(model=MODEL, messages=messages)


async def test_a_big_request_costs_at_most_the_tenants_budget(start_gateway, upstream):
    gw = await start_gateway(policy={**SUMMARIES, "sync_budget_s": 0.5}, summary={"tenant_tokens_per_hour": 40_000, "max_fold_tokens": 500_000})
    answer = await send(gw, "big", long_chat(40, 1200, "a"))
    assert answer.choices[0].message.content
    await settle(gw, timeout_s=30)
    calls = summary_calls(upstream)
    assert spent(calls) <= 40_000 * 1.1, (len(calls), spent(calls))
    assert metric(gw, "palimpsest_tenant_budget_exceeded_total", kind="summary") >= 1
    assert checkpoints(gw, "big")[-1].model == DETERMINISTIC_MODEL  # compaction went on without the model
    # Another tenant's budget is its own: its summary is written by the model.
    before = len(calls)
    await send(gw, "small", long_chat(6, 1200, "b"), key="sk-tenant-b")
    await settle(gw, timeout_s=30)
    assert len(summary_calls(upstream)) > before
    assert any(cp.model == MODEL for cp in checkpoints(gw, "small"))


async def test_one_job_folds_at_most_max_fold_tokens_with_the_model(start_gateway, upstream):
    gw = await start_gateway(policy={**SUMMARIES, "sync_budget_s": 0.5}, summary={"max_fold_tokens": 6000})
    await send(gw, "fold", long_chat(40, 1200, "c", planted="ticket DEP-40417 opened"))
    await settle(gw, timeout_s=30)
    calls = summary_calls(upstream)
    assert calls
    transcripts = "\n".join(m["content"] for r in calls for m in r["json"]["messages"] if isinstance(m["content"], str))
    assert "c39w0" in transcripts or "c38w0" in transcripts  # the newest part went to the model
    assert "c1w400" not in transcripts  # the oldest did not (only its notes and values, as state)
    assert spent(calls) < 40 * 1200  # far less than the history
    cp = checkpoints(gw, "fold")[-1]
    assert "DEP-40417" in str(cp.state) or "DEP-40417" in cp.summary  # kept as deterministic state


async def test_sync_jobs_count_against_workers(start_gateway, upstream):
    gw = await start_gateway(summary={"workers": 1},
                             policy={**SUMMARIES, "summary_parallel": 1, "sync_budget_s": 3.0, "summary_chunk_tokens": 4000})
    # ~80 summary calls fold the three histories one after another: 0.1 s each keeps every call
    # in flight for five of the watcher's polls, at a third of the test's time at 0.3 s.
    upstream.state.summary_latency_s = 0.1
    peak = 0
    done = asyncio.Event()

    async def watch() -> None:
        nonlocal peak
        while not done.is_set():
            finished = sum(metric(gw, "palimpsest_summary_calls_total", outcome=o) for o in ("ok", "rejected", "error", "rate_limited"))
            peak = max(peak, len(summary_calls(upstream)) - int(finished))
            await asyncio.sleep(0.02)

    watcher = asyncio.create_task(watch())
    answers = await asyncio.gather(*(send(gw, f"sync-{i}", long_chat(30, 1200, f"s{i}"), key=f"sk-t{i}") for i in range(3)))
    await settle(gw, timeout_s=60)
    done.set()
    await watcher
    assert all(a.choices[0].message.content for a in answers)
    assert summary_calls(upstream)
    assert peak == 1, peak  # one worker: one job calling the model at a time, sync or not (and the watcher saw it)


async def test_rejected_summaries_of_one_tenant_leave_the_breaker_closed_for_others(start_gateway, upstream):
    gw = await start_gateway(policy=SUMMARIES, summary={"breaker_failures": 2, "deterministic_after": 1})
    upstream.state.summary_format = "ignore"  # this content's summaries come back off-format
    for i in range(3):
        await send(gw, f"weak-{i}", long_chat(14, 1200, f"w{i}"), key="sk-weak")
        await settle(gw, timeout_s=30)
    assert metric(gw, "palimpsest_summary_breakers_open") == 0
    upstream.state.summary_format = "follow"
    before = len(summary_calls(upstream))
    await send(gw, "other", long_chat(14, 1200, "o"), key="sk-other")
    await settle(gw, timeout_s=30)
    assert len(summary_calls(upstream)) > before  # the other tenant's summary was not skipped
    assert checkpoints(gw, "other")[-1].model == MODEL


async def test_content_4xx_does_not_open_the_shared_breaker_but_5xx_does(start_gateway, upstream):
    gw = await start_gateway(policy=SUMMARIES, summary={"breaker_failures": 2, "backoff_base_s": 60})
    upstream.state.summary_status = 400  # the provider refuses this content
    for i in range(3):
        await send(gw, f"bad-{i}", long_chat(14, 1200, f"x{i}"), key="sk-bad")
        await settle(gw, timeout_s=30)
    assert metric(gw, "palimpsest_summary_breakers_open") == 0
    upstream.state.summary_status = 500
    for i in range(2):
        await send(gw, f"down-{i}", long_chat(14, 1200, f"y{i}"), key="sk-down")
        await settle(gw, timeout_s=30)
    assert metric(gw, "palimpsest_summary_breakers_open") == 1


def test_budget_refills_and_settles_to_what_was_spent():
    now = [0.0]
    budget = TenantBudget(3600, clock=lambda: now[0])  # one token a second
    assert budget.reserve("a", 3000)
    assert not budget.reserve("a", 1000)  # 600 left
    assert budget.reserve("b", 3600)  # tenants apart
    budget.settle("a", 3000, 1000)  # the call used less than it reserved
    assert budget.reserve("a", 2500)
    now[0] += 100
    assert budget.available("a") == 200
    assert TenantBudget(0).reserve("a", 10**9)  # 0 = unlimited
