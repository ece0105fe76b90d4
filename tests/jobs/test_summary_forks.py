"""Cache-forked summary calls in every wire format: a Responses or Messages view forks in its own
format, on its own route, with the parent's instructions, tools and conversation as they went,
``tool_choice`` none in that format's spelling, so the provider's cache serves the prefix
(the chat fork: tests/pipeline/test_cost_model.py)."""

from __future__ import annotations

import anthropic
import openai

from gateway.keys import CHECKPOINTS, LEDGER, METRICS
from simulator.workloads import agent_loop_session
from tests.messages.test_messages import BETA, ECONOMY, client_for, run_loop
from tests.support.agent import drive_responses_loop, settle


def purpose(record: dict) -> str:
    return record["headers"].get("x-palimpsest-purpose", "")


def summary_share_cached(gw, model: str) -> float:
    registry = gw.app[METRICS].registry

    def billed(kind: str) -> float:
        return registry.get_sample_value("palimpsest_upstream_billed_tokens_total",
                                         {"model": model, "caller": "summary", "kind": kind}) or 0

    total = billed("cached") + billed("uncached") + billed("cache_write")
    return billed("cached") / total if total else 0.0


def credential(record: dict) -> dict:
    return {k: v for k, v in record["headers"].items() if k in ("authorization", "x-api-key", "api-key")}


def checkpoints_made(gw) -> bool:
    return bool(gw.app[CHECKPOINTS].list(gw.app[LEDGER].sessions()[0].key))


async def test_a_responses_view_forks_as_a_responses_call(start_gateway, upstream):
    # cost_model off: the ratios decide when to compact and summarise, so the views stay large
    # and most calls fork (with it, early compaction events keep the view so small that most
    # deltas are cheaper as transcripts, which are uncached); this test is about the fork's form.
    gw = await start_gateway(policy={**ECONOMY, "cost_model": False})
    api = openai.AsyncOpenAI(base_url=gw.base_url, api_key="sk-fork", max_retries=0,
                             default_headers={"X-Session-Id": "fork-responses"})
    session = agent_loop_session(seed=13, turns=1, calls=40)
    await drive_responses_loop(api, session, model="fake-32k")
    await api.close()
    await settle(gw)
    received = [r for r in upstream.received if r.get("json")]
    views = [r["json"] for r in received if r["path"] == "/v1/responses" and not purpose(r)]
    forks = [r for r in received if purpose(r) == "summary" and r["path"] == "/v1/responses"]
    assert forks, "the summary model is the request's model: the call forks the Responses view"
    # The others folded a delta small enough that its transcript cost less than re-reading the view.
    transcripts = [r for r in received if purpose(r) == "summary" and r["path"] != "/v1/responses"]
    assert all(r["path"] == "/v1/chat/completions" for r in transcripts)
    cheaper = gw.app[METRICS].registry.get_sample_value("palimpsest_summary_transcript_cheaper_total") or 0
    assert bool(transcripts) == bool(cheaper)  # a job's transcript may take a call per chunk
    for record in forks:
        body = record["json"]
        assert body["tool_choice"] == "none" and body["store"] is False and body["stream"] is False
        # Its parent: a view the upstream received, resent as it went, then what the fork adds.
        parent = next(v for v in reversed(views) if body["input"][:len(v["input"])] == v["input"]
                      and len(v["input"]) < len(body["input"]))
        assert body["tools"] == parent["tools"] and body.get("instructions") == parent.get("instructions")
        assert body["include"] == parent["include"]
        added = body["input"][len(parent["input"]):]
        assert all(i["type"] == "message" and i["role"] == "assistant" for i in added[:-1])
        assert added[-1]["role"] == "user" and "the gateway's instruction, not the user's" in added[-1]["content"]
    # The provider served most of the summary input from its cache (the transcripts' share is
    # uncached, and small); the summaries became checkpoints.
    assert summary_share_cached(gw, "fake-32k") >= 0.7
    assert (gw.app[METRICS].registry.get_sample_value("palimpsest_summary_invalid_format_total") or 0) == 0
    assert checkpoints_made(gw)


async def test_a_responses_view_to_a_chat_only_model_is_summarised_as_a_transcript(start_gateway, upstream):
    # Cached reads at half price: the loop's placeholders are worth a summary (at 0.1 the cost
    # model settles over them instead, policies/cost.settle_size).
    gw = await start_gateway(models={"fake-32k": {"context_window": 32_000, "api": "chat"}},
                             policy={**ECONOMY, "cached_input_rate": 0.5})
    api = openai.AsyncOpenAI(base_url=gw.base_url, api_key="sk-fork", max_retries=0,
                             default_headers={"X-Session-Id": "fork-chat-only"})
    await drive_responses_loop(api, agent_loop_session(seed=13, turns=1, calls=40), model="fake-32k")
    await api.close()
    await settle(gw)
    summaries = [r for r in upstream.received if purpose(r) == "summary"]
    assert summaries and all(r["path"] == "/v1/chat/completions" for r in summaries)
    assert all("<transcript>" in r["json"]["messages"][-1]["content"] for r in summaries)


async def test_a_messages_view_forks_as_a_messages_call(start_gateway, upstream):
    gw = await start_gateway(policy=ECONOMY)
    client = client_for(gw)
    await run_loop(client, "fork-messages", 40)
    await settle(gw)
    received = [r for r in upstream.received if r.get("json")]
    views = [r["json"] for r in received if r["path"] == "/v1/messages" and not purpose(r)]
    forks = [r for r in received if purpose(r) == "summary"]
    assert forks and all(r["path"] == "/v1/messages" for r in forks)
    for record in forks:
        body = record["json"]
        assert body["tool_choice"] == {"type": "none"} and body["stream"] is False
        # The client's version and beta headers go with it (its body uses those features).
        assert record["headers"]["anthropic-beta"] == BETA and record["headers"]["anthropic-version"]
        # And the client's credential, as its own requests carried it upstream.
        assert credential(record) == credential(next(r for r in received if not purpose(r)))
        n = next(len(v["messages"]) for v in reversed(views) if v["messages"][:-1] == body["messages"][:len(v["messages"]) - 1]
                 and v["system"] == body["system"] and len(v["messages"]) <= len(body["messages"]))
        parent = next(v for v in reversed(views) if len(v["messages"]) == n and v["messages"][:-1] == body["messages"][:n - 1])
        assert body["tools"] == parent["tools"] and body["system"] == parent["system"]
        assert body["thinking"] == parent["thinking"] and body["max_tokens"] > parent["thinking"]["budget_tokens"]
        assert body["context_management"] == parent["context_management"]
        # The parent's newest turn keeps its blocks (and breakpoint); the instruction follows them.
        newest = parent["messages"][-1]["content"]
        assert body["messages"][n - 1]["content"][:len(newest)] == newest
        last = body["messages"][-1]
        assert last["role"] == "user" and body["messages"][-2]["role"] != "user"
        added = [b["text"] for b in last["content"][len(newest) if len(body["messages"]) == n else 0:]]
        assert "the gateway's instruction, not the user's" in added[0]  # then, on a retry, the correction
    assert summary_share_cached(gw, "fake-32k") >= 0.7
    assert checkpoints_made(gw)


async def test_each_summary_call_takes_the_cheaper_form_by_the_cache_rule(start_gateway, upstream):
    """A fork re-reads the whole view at the read rate; a transcript pays the delta uncached. With
    no cache discount (read rate 1) re-reading the view never pays: every call is a transcript;
    with free reads every call forks."""
    async def summaries(rate: float, session: str, **policy) -> list[dict]:
        gw = await start_gateway(policy={**ECONOMY, "cached_input_rate": rate, **policy})
        api = openai.AsyncOpenAI(base_url=gw.base_url, api_key="sk-fork", max_retries=0,
                                 default_headers={"X-Session-Id": session})
        await drive_responses_loop(api, agent_loop_session(seed=13, turns=1, calls=40), model="fake-32k")
        await api.close()
        await settle(gw)
        calls = [r for r in upstream.received if purpose(r) == "summary" and r.get("json")]
        upstream.received.clear()
        cheaper = gw.app[METRICS].registry.get_sample_value("palimpsest_summary_transcript_cheaper_total") or 0
        assert bool(cheaper) == any(r["path"] == "/v1/chat/completions" for r in calls)  # a call per chunk
        return calls

    # cost_model off: the ratios decide when to compact and summarise, so both sessions write
    # summaries from views of the same size (with it, early compaction events keep a view small
    # enough to re-read for less than the delta's transcript even at the full rate, and free reads
    # make no summary pay); only the form of each call is priced here.
    dear = await summaries(1.0, "no-discount", cost_model=False)
    assert dear and all(r["path"] == "/v1/chat/completions" and "<transcript>" in r["json"]["messages"][-1]["content"]
                        for r in dear)
    free = await summaries(0.0, "free-reads", cost_model=False)
    assert free and all(r["path"] == "/v1/responses" and r["json"]["tool_choice"] == "none" for r in free)


async def test_tool_choice_is_spelled_as_each_format_wants_on_the_strict_simulator(upstream):
    """The simulator refuses a chat-style tool_choice on /v1/messages and an unknown mode on
    /v1/responses, so the fork tests above would fail on a wrong spelling."""
    client = anthropic.AsyncAnthropic(base_url=upstream.base_url.removesuffix("/v1"), api_key="sk", max_retries=0)
    try:
        await client.messages.create(model="fake-32k", max_tokens=64, messages=[{"role": "user", "content": "hi"}],
                                     extra_body={"tool_choice": "none"})
        raise AssertionError("a string tool_choice was accepted")
    except anthropic.BadRequestError as exc:
        assert "tool_choice" in str(exc)
    api = openai.AsyncOpenAI(base_url=upstream.base_url, api_key="sk", max_retries=0)
    try:
        await api.responses.create(model="fake-32k", input="hi", extra_body={"tool_choice": "never"})
        raise AssertionError("an unknown tool_choice was accepted")
    except openai.BadRequestError as exc:
        assert exc.body["param"] == "tool_choice"
    await client.close()
    await api.close()


async def test_gpt_5_6_views_carry_prompt_cache_breakpoints_and_keep_their_cached_prefix(start_gateway, upstream):
    """A model whose cache rule takes explicit breakpoints (GPT-5.6 on) gets the gateway's marks
    on the end of its instructions and summary block and on the newest user message."""
    upstream.state.windows["gpt-5.6-mini"] = 32_000
    gw = await start_gateway(policy=ECONOMY, models={"gpt-5.6-mini": {"context_window": 32_000}})
    api = openai.AsyncOpenAI(base_url=gw.base_url, api_key="sk-bp", max_retries=0,
                             default_headers={"X-Session-Id": "breakpoints"})
    _, responses = await drive_responses_loop(api, agent_loop_session(seed=13, turns=1, calls=40), model="gpt-5.6-mini")
    await api.close()
    await settle(gw)
    assert len(responses) == 41
    views = [r["json"] for r in upstream.received if r["path"] == "/v1/responses" and not purpose(r)]
    marked = [v for v in views if '"prompt_cache_breakpoint"' in str(v).replace("'", '"')]
    assert marked, "a rendered view of a GPT-5.6 model carries breakpoints"
    for body in marked:
        marks = [(i, p) for i, item in enumerate(body["input"]) if isinstance(item.get("content"), list)
                 for p in item["content"] if isinstance(p, dict) and "prompt_cache_breakpoint" in p]
        assert 1 <= len(marks) <= 3 and all(p["prompt_cache_breakpoint"] == {"mode": "explicit"} for _, p in marks)
        last_user = max(i for i, item in enumerate(body["input"]) if item.get("role") == "user")
        assert last_user in {i for i, _ in marks}
    # The marks move from request to request, and the cached prefix stays.
    assert sum(r.usage.input_tokens_details.cached_tokens for r in responses[-10:]) > \
        0.5 * sum(r.usage.input_tokens for r in responses[-10:])
