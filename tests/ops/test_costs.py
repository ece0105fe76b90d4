"""What the provider billed, counted by the gateway: the cached-tokens header, Prometheus by
model and caller, money, the direct counterfactual and the turn log (gateway/ops/costs.py)."""

from __future__ import annotations

import asyncio

import aiohttp
import openai
import pytest

from gateway.keys import LEDGER, METRICS, TURNS
from simulator.workloads import TOOL_SPECS, synthetic_session
from tests.support.agent import drive
from policies.prices import OPENAI_CACHE

cacheable = OPENAI_CACHE.cacheable

PRICED = {"fake-32k": {"context_window": 32_000, "input_price": 2.0, "cached_input_price": 0.2,
                       "output_price": 8.0}}
SYSTEM = {"role": "system", "content": "You follow the house rules. " * 400}  # ~2,400 tokens


def metric(gw, name: str, **labels) -> float:
    return gw.app[METRICS].registry.get_sample_value(name, labels) or 0.0


async def post(gw, body: dict, session: str | None = "cost-1") -> tuple[dict, dict]:
    headers = {"Authorization": "Bearer sk-test"}
    if session:
        headers["X-Session-Id"] = session
    async with aiohttp.ClientSession() as http:
        async with http.post(f"{gw.base_url}/chat/completions", json=body, headers=headers) as resp:
            assert resp.status == 200, await resp.text()
            return await resp.json(), dict(resp.headers)


def dollars(usage: dict) -> float:
    cached = usage["prompt_tokens_details"]["cached_tokens"]
    return ((usage["prompt_tokens"] - cached) * 2.0 + cached * 0.2 + usage["completion_tokens"] * 8.0) / 1e6


async def test_provider_cache_is_counted_by_caller_in_tokens_and_money(start_gateway):
    gw = await start_gateway(models=PRICED)
    history = [SYSTEM, {"role": "user", "content": "first question"}]
    first, h1 = await post(gw, {"model": "fake-32k", "messages": history})
    assert first["usage"]["prompt_tokens_details"]["cached_tokens"] == 0
    assert h1["x-palimpsest-cached-tokens"] == "0"
    history += [first["choices"][0]["message"], {"role": "user", "content": "second question"}]
    second, h2 = await post(gw, {"model": "fake-32k", "messages": history})
    cached = second["usage"]["prompt_tokens_details"]["cached_tokens"]
    assert cached >= 2048
    assert h2["x-palimpsest-cached-tokens"] == str(cached)

    usages = [first["usage"], second["usage"]]
    labels = {"model": "fake-32k", "caller": "client"}
    assert metric(gw, "palimpsest_upstream_billed_tokens_total", kind="cached", **labels) == cached
    assert metric(gw, "palimpsest_upstream_billed_tokens_total", kind="uncached", **labels) == \
        sum(u["prompt_tokens"] for u in usages) - cached
    billed = sum(dollars(u) for u in usages)
    assert metric(gw, "palimpsest_cost_usd_total", **labels) == pytest.approx(billed)

    # Direct: the same prompts (the view is the client's here), the first one cached for the second.
    client = [int(h["x-palimpsest-prompt-tokens-client"]) for h in (h1, h2)]
    outputs = [u["completion_tokens"] for u in usages]
    direct = (client[0] * 2.0 + outputs[0] * 8.0
              + (client[1] - cacheable(client[0])) * 2.0 + cacheable(client[0]) * 0.2 + outputs[1] * 8.0) / 1e6
    assert metric(gw, "palimpsest_direct_cost_usd_total", model="fake-32k") == pytest.approx(direct)
    assert metric(gw, "palimpsest_saved_vs_direct_usd", model="fake-32k") == pytest.approx(direct - billed)

    key = next(s.key for s in gw.app[LEDGER].sessions() if s.session_id == "cost-1")
    rows = gw.app[TURNS].session(key)
    assert [r.cached_tokens for r in rows] == [0, cached]
    assert [r.uncached_tokens for r in rows] == [u["prompt_tokens"] - u["prompt_tokens_details"]["cached_tokens"] for u in usages]
    assert [r.cost_usd for r in rows] == [pytest.approx(dollars(u)) for u in usages]


async def test_a_fork_is_not_a_cached_prefix_for_the_direct_counterfactual(start_gateway):
    gw = await start_gateway(models=PRICED)
    history = [SYSTEM, {"role": "user", "content": "first question"}]
    first, h1 = await post(gw, {"model": "fake-32k", "messages": history})
    # An edited first message: a new branch, nothing of the previous request is a prefix.
    edited = [SYSTEM, {"role": "user", "content": "another first question"}]
    second, h2 = await post(gw, {"model": "fake-32k", "messages": edited})
    client = [int(h["x-palimpsest-prompt-tokens-client"]) for h in (h1, h2)]
    outputs = [first["usage"]["completion_tokens"], second["usage"]["completion_tokens"]]
    direct = (sum(client) * 2.0 + sum(outputs) * 8.0) / 1e6
    assert metric(gw, "palimpsest_direct_cost_usd_total", model="fake-32k") == pytest.approx(direct)


async def test_summary_and_recall_calls_are_counted_apart_from_the_client(start_gateway, upstream):
    gw = await start_gateway(models={"fake-8k": {"context_window": 8_000, "input_price": 2.0}})
    sdk = openai.AsyncOpenAI(base_url=gw.base_url, api_key="sk-test", max_retries=0,
                             default_headers={"X-Session-Id": "cost-long"})
    history, _ = await drive(sdk, synthetic_session(seed=1, rounds=24), model="fake-8k")
    history.append({"role": "user", "content": f"RECALL: {synthetic_session(seed=1, rounds=24).facts[0].question}"})
    await sdk.chat.completions.create(model="fake-8k", messages=history, tools=TOOL_SPECS)
    await sdk.close()
    for _ in range(200):  # summary jobs run in the background
        if metric(gw, "palimpsest_cost_usd_total", model="fake-8k", caller="summary"):
            break
        await asyncio.sleep(0.05)
    assert any(r["headers"].get("x-palimpsest-purpose") == "summary" for r in upstream.chat_requests())
    for caller in ("client", "recall", "summary"):
        tokens = sum(metric(gw, "palimpsest_upstream_billed_tokens_total", model="fake-8k", caller=caller, kind=k)
                     for k in ("cached", "uncached"))
        assert tokens > 0, caller
        assert metric(gw, "palimpsest_cost_usd_total", model="fake-8k", caller=caller) > 0, caller


async def test_unpriced_models_count_tokens_but_no_money(start_gateway):
    gw = await start_gateway()
    history = [SYSTEM, {"role": "user", "content": "q"}]
    await post(gw, {"model": "fake-32k", "messages": history})
    await post(gw, {"model": "fake-32k", "messages": history}, session=None)
    assert metric(gw, "palimpsest_upstream_billed_tokens_total", model="fake-32k", caller="client",
                  kind="cached") >= 2048
    assert metric(gw, "palimpsest_cost_usd_total", model="fake-32k", caller="client") == 0


async def test_streamed_answers_carry_no_cached_header(start_gateway):
    gw = await start_gateway(models=PRICED)
    headers = {"Authorization": "Bearer sk-test", "X-Session-Id": "cost-stream"}
    body = {"model": "fake-32k", "stream": True, "messages": [SYSTEM, {"role": "user", "content": "q"}]}
    async with aiohttp.ClientSession() as http:
        async with http.post(f"{gw.base_url}/chat/completions", json=body, headers=headers) as resp:
            assert resp.status == 200
            await resp.read()
            assert "x-palimpsest-cached-tokens" not in resp.headers


async def test_inspect_shows_what_the_provider_cached_and_what_each_request_cost(start_gateway):
    from tests.ops.test_inspect_recorded import inspect

    gw = await start_gateway(models=PRICED)
    history = [SYSTEM, {"role": "user", "content": "first question"}]
    first, _ = await post(gw, {"model": "fake-32k", "messages": history}, session="cost-inspect")
    history += [first["choices"][0]["message"], {"role": "user", "content": "second question"}]
    second, _ = await post(gw, {"model": "fake-32k", "messages": history}, session="cost-inspect")
    key = next(s.key for s in gw.app[LEDGER].sessions() if s.session_id == "cost-inspect")
    gw.app[TURNS].session(key)  # flushes: the subprocess below reads the file
    detail = await inspect(gw.settings.store.path, "cost-inspect")
    cached = second["usage"]["prompt_tokens_details"]["cached_tokens"]
    assert [t["cached_tokens"] for t in detail["turns"]] == [0, cached]
    assert [t["cost_usd"] for t in detail["turns"]] == [pytest.approx(dollars(first["usage"])),
                                                       pytest.approx(dollars(second["usage"]))]
    assert detail["totals"]["cached_tokens"] == cached
    assert detail["totals"]["cost_usd"] == pytest.approx(dollars(first["usage"]) + dollars(second["usage"]), abs=1e-6)
