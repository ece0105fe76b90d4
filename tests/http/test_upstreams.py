"""Several upstreams routed by model (issue 30), against two real simulated providers on port 0:
A is the default ``[upstream]`` (OpenAI format, serves gpt-a), B is ``[upstreams.b]`` (Anthropic
format, serves claude-b). Every format's requests, the summary calls, window discovery and the
pass-through routes go to the upstream of their model, each with only its own keys; /v1/models
is the union; a session that moves between providers stays on one branch."""

from __future__ import annotations

from dataclasses import dataclass

import aiohttp
import anthropic
import pytest
from aiohttp import web

from gateway.app import create_app
from gateway.keys import LEDGER, METRICS, PIPELINE
from gateway.settings import ConfigError, load_settings
from simulator.puppet import RECEIVED, create_puppet_app
from tests.support.agent import settle

KEYS = {("acme", "a"): "sk-acme-a", ("acme", "b"): "sk-acme-b", ("zed", "a"): "sk-op-a", ("zed", "b"): "sk-op-b"}
CLIENT_KEYS = {"acme": "pk-acme", "zed": "pk-zed"}
MODELS = {"a": "gpt-a", "b": "claude-b"}


@dataclass
class Provider:
    runner: web.AppRunner
    app: web.Application
    base_url: str

    @property
    def received(self) -> list[dict]:
        return self.app[RECEIVED]

    def work(self) -> list[dict]:
        return [r for r in self.received if r.get("json") and r["headers"].get("x-palimpsest-purpose") != "summary"]

    def summaries(self) -> list[dict]:
        return [r for r in self.received if r["headers"].get("x-palimpsest-purpose") == "summary"]


async def _serve(app: web.Application) -> tuple[web.AppRunner, str]:
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    return runner, f"http://127.0.0.1:{runner.addresses[0][1]}"


async def _provider(models: tuple[str, ...], windows: dict[str, int]) -> Provider:
    app = create_puppet_app(models=models, windows=windows)
    runner, root = await _serve(app)
    return Provider(runner, app, root + "/v1")


@pytest.fixture
async def two(tmp_path):
    """(A, B, C, start): the providers, and a factory for a gateway in front of them; C answers
    B's embeddings (its embeddings_url)."""
    a = await _provider(("gpt-a", "embed-a"), {"gpt-a": 8_000})
    b = await _provider(("claude-b", "embed-b"), {"claude-b": 16_000})
    c = await _provider(("embed-b",), {})
    runners = [a.runner, b.runner, c.runner]

    async def start(**sections):
        settings = load_settings(None, **{
            "upstream": {"base_url": a.base_url, "api_key": "sk-op-a"},
            "upstreams": {"b": {"base_url": b.base_url, "format": "anthropic", "api_key": "sk-op-b",
                                "models": ["claude-*", "embed-b"], "embeddings_url": c.base_url}},
            "tenants": {"acme": {"key": "pk-acme", "upstream_key": "sk-acme-a", "upstream_keys": {"b": "sk-acme-b"}},
                        "zed": "pk-zed"},
            "store": {"path": str(tmp_path / "data")},
            **sections,
        })
        app = create_app(settings)
        runner, root = await _serve(app)
        runners.append(runner)
        return app, root

    yield a, b, c, start
    for runner in reversed(runners):
        await runner.cleanup()


def credentials(received: dict) -> set[str]:
    h = received["headers"]
    found = {h.get("x-api-key"), h.get("api-key"), (h.get("authorization") or "").removeprefix("Bearer ") or None}
    return {v for v in found if v}


async def _send(http, root: str, kind: str, model: str, tenant: str, stream: bool, session: str) -> tuple[int, bytes, dict]:
    text = f"hi from {tenant}"
    key = CLIENT_KEYS[tenant]
    headers = {"X-Session-Id": session, "Authorization": f"Bearer {key}"}
    if kind == "chat":
        path, body = "/v1/chat/completions", {"model": model, "messages": [{"role": "user", "content": text}], "stream": stream}
    elif kind == "responses":
        path, body = "/v1/responses", {"model": model, "input": text, "stream": stream}
    else:
        path, body = "/v1/messages", {"model": model, "max_tokens": 64, "stream": stream,
                                      "messages": [{"role": "user", "content": text}]}
        headers = {"X-Session-Id": session, "x-api-key": key, "anthropic-version": "2023-06-01"}
    async with http.post(root + path, json=body, headers=headers) as r:
        return r.status, await r.read(), dict(r.headers)


async def test_every_format_goes_to_the_upstream_of_its_model_with_only_its_keys(two):
    a, b, _, start = two
    app, root = await start()
    sent = 0
    async with aiohttp.ClientSession() as http:
        for tenant in ("acme", "zed"):
            for name, model in MODELS.items():
                for kind in ("chat", "responses", "messages"):
                    for stream in (False, True):
                        status, body, _ = await _send(http, root, kind, model, tenant, stream, f"{tenant}-{model}-{kind}-{stream}")
                        assert status == 200, body[:300]
                        sent += 1
    for provider, name in ((a, "a"), (b, "b")):
        work = provider.work()
        assert len(work) == sent // 2  # each upstream got its model's 12 requests, chat + Responses + Messages
        misrouted = [r for r in work if r["json"].get("model") != MODELS[name]]
        assert misrouted == []  # 0 requests of the other upstream's model, either way
        assert {r["path"] for r in work} == {"/v1/chat/completions", "/v1/responses", "/v1/messages"}
        for r in work:
            tenant = "acme" if "hi from acme" in str(r["json"]) else "zed"
            assert credentials(r) == {KEYS[(tenant, name)]}, (name, tenant, r["path"])
    everything_a = str([r["headers"] for r in a.received])
    everything_b = str([r["headers"] for r in b.received])
    assert "sk-acme-b" not in everything_a and "sk-op-b" not in everything_a
    assert "sk-acme-a" not in everything_b and "sk-op-a" not in everything_b
    assert "pk-acme" not in everything_a + everything_b  # the client's gateway key never goes upstream
    metrics = app[METRICS].render().decode()
    assert 'route="messages",status="200",upstream="b"' in metrics
    assert 'route="responses",status="200",upstream="default"' in metrics


async def _session_goes_on(http, root: str, model: str, history: list[dict], headers: dict) -> None:
    """Two requests of one session: a history arriving at once gets its summary only when the
    session goes on (a one-shot arrival pays none, tests/pipeline/test_arrival.py)."""
    async with http.post(root + "/v1/chat/completions", json={"model": model, "messages": history}, headers=headers) as r:
        assert r.status == 200, await r.text()
        answer = (await r.json())["choices"][0]["message"]["content"]
    more = [*history, {"role": "assistant", "content": answer}, {"role": "user", "content": "hi from acme, and then?"}]
    async with http.post(root + "/v1/chat/completions", json={"model": model, "messages": more}, headers=headers) as r:
        assert r.status == 200, await r.text()


def _long_history(rounds: int, size: int = 400) -> list[dict]:
    history = []
    for i in range(rounds):
        history.append({"role": "user", "content": f"question {i}: " + " ".join(f"word{i}-{j}" for j in range(size))})
        history.append({"role": "assistant", "content": f"answer {i}: " + " ".join(f"fact{i}-{j}" for j in range(size // 4))})
    return history + [{"role": "user", "content": "hi from acme, what next?"}]


@pytest.mark.parametrize("name", ["a", "b"])
async def test_summary_calls_go_to_the_sessions_upstream_in_its_format(two, name):
    a, b, _, start = two
    app, root = await start(policy={"profile": "economy", "summary_trigger_ratio": 0.3})
    model = MODELS[name]
    history = _long_history(14 if name == "a" else 28)
    async with aiohttp.ClientSession() as http:
        await _session_goes_on(http, root, model, history, {"X-Session-Id": f"long-{name}", "Authorization": "Bearer pk-acme"})
    await settle(type("G", (), {"app": app})(), timeout_s=20)
    own, other = (a, b) if name == "a" else (b, a)
    summaries = own.summaries()
    assert summaries, "no summary call was made"
    assert other.summaries() == []  # 0 summary calls reached the other upstream
    wanted = "/v1/chat/completions" if name == "a" else "/v1/messages"  # the upstream's own format
    assert {r["path"] for r in summaries} == {wanted}
    assert all(credentials(r) == {KEYS[("acme", name)]} for r in summaries)
    assert all(r["json"]["model"] == model for r in summaries)


async def test_a_summary_model_of_the_upstream_writes_its_sessions_summaries(two):
    a, b, _, start = two
    app, root = await start(policy={"profile": "economy", "summary_trigger_ratio": 0.3, "summary_model": "gpt-a"},
                            upstreams={"b": {"base_url": b.base_url, "format": "anthropic", "api_key": "sk-op-b",
                                             "models": ["claude-*"], "summary_model": "claude-b"}})
    async with aiohttp.ClientSession() as http:
        for name in ("a", "b"):
            await _session_goes_on(http, root, MODELS[name], _long_history(28),
                                   {"X-Session-Id": f"sm-{name}", "Authorization": "Bearer pk-zed"})
    await settle(type("G", (), {"app": app})(), timeout_s=20)
    # policy.summary_model (gpt-a) is served by A: A's sessions use it; B's use B's own summary_model.
    assert a.summaries() and {r["json"]["model"] for r in a.summaries()} == {"gpt-a"}
    assert b.summaries() and {r["json"]["model"] for r in b.summaries()} == {"claude-b"}


async def test_models_is_the_union_and_embeddings_and_model_routes_go_by_model(two):
    a, b, c, start = two
    _, root = await start()
    async with aiohttp.ClientSession() as http:
        async with http.get(root + "/v1/models", headers={"Authorization": "Bearer pk-acme"}) as r:
            assert r.status == 200
            listed = [m["id"] for m in (await r.json())["data"]]
        async with http.get(root + "/v1/models/claude-b", headers={"Authorization": "Bearer pk-acme"}) as r:
            assert r.status == 200 and (await r.json())["id"] == "claude-b"
        for model in ("embed-a", "embed-b"):
            async with http.post(root + "/v1/embeddings", json={"model": model, "input": "x"},
                                 headers={"Authorization": "Bearer pk-acme"}) as r:
                assert r.status == 200, await r.text()
    assert sorted(listed) == ["claude-b", "embed-a", "embed-b", "gpt-a"]  # the union of both lists
    asked_a = [r for r in a.received if r["path"] == "/v1/models"]
    asked_b = [r for r in b.received if r["path"] == "/v1/models"]
    assert credentials(asked_a[-1]) == {"sk-acme-a"}
    assert credentials(asked_b[-1]) == {"sk-acme-b"} and asked_b[-1]["headers"].get("anthropic-version")
    assert [r["path"] for r in b.received if r["path"].startswith("/v1/models/")] == ["/v1/models/claude-b"]
    assert [r["json"]["model"] for r in a.received if r["path"] == "/v1/embeddings"] == ["embed-a"]
    assert [r["json"]["model"] for r in c.received if r["path"] == "/v1/embeddings"] == ["embed-b"]  # B's embeddings_url
    assert credentials([r for r in c.received if r["path"] == "/v1/embeddings"][0]) == {"sk-acme-b"}
    assert not [r for r in b.received if r["path"] == "/v1/embeddings"]


async def test_windows_are_discovered_from_each_models_upstream(two):
    a, b, _, start = two
    app, _ = await start()
    windows = app[PIPELINE].views.windows
    assert await windows.window("gpt-a") == 8_000
    assert await windows.window("claude-b") == 16_000
    asked_b = [r for r in b.received if r["path"] == "/v1/models"]
    assert len(asked_b) == 1 and credentials(asked_b[0]) == {"sk-op-b"} and asked_b[0]["headers"].get("anthropic-version")
    assert len([r for r in a.received if r["path"] == "/v1/models"]) == 1


async def test_readyz_reports_each_upstream_and_a_failing_one_fails_only_its_models(two):
    a, b, _, start = two
    _, root = await start()
    async with aiohttp.ClientSession() as http:
        async with http.get(root + "/readyz") as r:
            ready = await r.json()
        assert r.status == 200
        assert {n: u["format"] for n, u in ready["upstreams"].items()} == {"default": "openai", "b": "anthropic"}
        assert {u["status"] for u in ready["upstreams"].values()} == {"ok"}
        assert "sk-" not in str(ready)
        await b.runner.cleanup()  # B goes away: its models fail, A's keep working
        status, _, _ = await _send(http, root, "chat", "claude-b", "acme", False, "down-b")
        assert status == 502
        status, _, _ = await _send(http, root, "chat", "gpt-a", "acme", False, "up-a")
        assert status == 200
        async with http.get(root + "/readyz") as r:
            ready = await r.json()
        assert r.status == 200
        assert ready["upstreams"]["b"]["status"] == "failing" and ready["upstreams"]["default"]["status"] == "ok"


async def test_a_session_that_moves_to_another_provider_stays_on_one_branch(two):
    a, b, _, start = two
    app, root = await start()
    client = anthropic.AsyncAnthropic(base_url=root, api_key="pk-acme", max_retries=0, timeout=30)
    history: list[dict] = [{"role": "user", "content": "hi from acme, first"}]
    for i, model in enumerate(["gpt-a", "claude-b", "gpt-a", "claude-b"]):
        message = await client.messages.create(model=model, max_tokens=64, messages=history,
                                               extra_headers={"X-Session-Id": "moving"})
        history += [{"role": "assistant", "content": [b.model_dump(exclude_none=True) for b in message.content]},
                    {"role": "user", "content": f"next {i}"}]
    ledger = app[LEDGER]
    record = next(r for r in ledger.sessions() if r.session_id == "moving")
    assert len(ledger.heads(record.key)) == 1
    assert len([e for e in ledger.since(record.key, -1) if e.kind != "side"]) == len(history) - 1
    assert [r["json"]["model"] for r in a.work()] == ["gpt-a", "gpt-a"]
    assert [r["json"]["model"] for r in b.work()] == ["claude-b", "claude-b"]
    # The turn B answered second carries the whole conversation, A's answers included.
    assert len(b.work()[-1]["json"]["messages"]) == 7


def test_upstream_names_and_tenant_keys_are_checked_at_start():
    with pytest.raises(ConfigError, match="upstream_keys"):
        load_settings(None, upstreams={"b": {"base_url": "http://x/v1"}},
                      tenants={"t": {"key": "k", "upstream_keys": {"c": "sk"}}})
    with pytest.raises(ConfigError, match="default"):
        load_settings(None, upstreams={"default": {"base_url": "http://x/v1"}})
    with pytest.raises(ConfigError, match="base_url"):
        load_settings(None, upstreams={"b": {"base_url": "ftp://x"}})
    settings = load_settings(None, upstreams={"b": {"base_url": "http://x/v1", "models": ["claude-*"]},
                                              "c": {"base_url": "http://y/v1", "models": ["claude-3*", "llama-*"]}})
    assert [settings.upstream_for(m) for m in ("claude-3-opus", "llama-3", "gpt-4o", "")] == ["b", "c", "default", "default"]


async def test_an_operator_key_of_a_named_upstream_makes_client_keys_required(tmp_path):
    settings = load_settings(None, upstreams={"b": {"base_url": "http://127.0.0.1:9/v1", "api_key": "sk-b"}},
                             store={"path": str(tmp_path / "d")})
    app = create_app(settings)
    runner, root = await _serve(app)
    try:
        async with aiohttp.ClientSession() as http:
            async with http.get(root + "/v1/models") as r:
                assert r.status == 401
    finally:
        await runner.cleanup()


async def test_an_unknown_previous_response_id_is_judged_by_the_key_of_its_models_upstream(two):
    a, b, _, start = two
    _, root = await start(upstreams={"b": {"base_url": b.base_url, "models": ["claude-*"]}})  # B: no operator key
    body = {"model": "claude-b", "input": "hi", "previous_response_id": "resp_unknown"}
    async with aiohttp.ClientSession() as http:
        async with http.post(root + "/v1/responses", json={**body, "model": "gpt-a"},
                             headers={"Authorization": "Bearer pk-zed"}) as r:
            assert r.status == 400  # A on the operator's key: only the tenant's own ids may continue
            assert (await r.json())["error"]["code"] == "previous_response_not_found"
        async with http.post(root + "/v1/responses", json=body, headers={"Authorization": "Bearer pk-zed"}) as r:
            await r.read()
        # B has no operator key: the client's own credential goes, and the provider decides.
    assert [r["json"]["previous_response_id"] for r in b.received if r["path"] == "/v1/responses"] == ["resp_unknown"]
    assert not [r for r in a.received if r["path"] == "/v1/responses"]


async def test_the_access_log_names_the_upstream(two, caplog):
    import logging

    caplog.set_level(logging.INFO, logger="palimpsest.access")
    _, _, _, start = two
    _, root = await start(models={"gpt-a": {}, "claude-b": {}})  # configured: their own model labels
    async with aiohttp.ClientSession() as http:
        for kind in ("chat", "responses", "messages"):
            for model in MODELS.values():
                status, _, _ = await _send(http, root, kind, model, "zed", False, f"log-{kind}-{model}")
                assert status == 200
    lines = [r.fields for r in caplog.records if r.name == "palimpsest.access" and r.fields.get("model")]
    assert {(f["model"], f["upstream"]) for f in lines} == {("gpt-a", "default"), ("claude-b", "b")}


async def test_a_receipt_names_the_upstream(two):
    _, _, _, start = two
    _, root = await start()
    async with aiohttp.ClientSession() as http:
        for model, name in (("gpt-a", "default"), ("claude-b", "b")):
            status, _, headers = await _send(http, root, "messages", model, "acme", False, f"receipt-{model}")
            assert status == 200
            async with http.get(root + f"/v1/palimpsest/receipts/{headers['x-palimpsest-receipt']}",
                                headers={"Authorization": "Bearer pk-acme"}) as r:
                assert r.status == 200, await r.text()
                assert (await r.json())["upstream"] == name
