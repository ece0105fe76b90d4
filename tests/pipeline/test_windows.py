"""Context-window discovery (gateway/pipeline/windows.py)."""

from __future__ import annotations

import time

from gateway.pipeline import windows as windows_module
from gateway.pipeline.windows import DEFAULT_WINDOW, Windows


class FakeResponse:
    status = 200

    def __init__(self, payload: bytes) -> None:
        self.payload = payload

    async def read(self) -> bytes:
        return self.payload

    async def __aenter__(self):
        return self

    async def __aexit__(self, *exc) -> None:
        return None


class FakeUpstream:
    api_key = "sk-operator"
    api = object()

    def __init__(self) -> None:
        self.calls: list[str] = []

    def url(self, path: str) -> str:
        return "http://upstream" + path

    def request(self, session, method: str, url: str, headers=None):
        self.calls.append(url)
        return FakeResponse(b'{"data": [{"id": "local-model", "max_model_len": 8192}]}')


async def test_discovery_happens_on_a_freshly_booted_host(monkeypatch):
    # time.monotonic() counts from boot: on a VM, pod or CI runner up for less than the
    # discovery TTL it is small, and "now - never-fetched" must still mean "never fetched".
    monkeypatch.setattr(windows_module.time, "monotonic", lambda: 12.5)
    upstream = FakeUpstream()
    windows = Windows({}, upstream)
    assert await windows.window("local-model") == 8192
    assert upstream.calls == ["http://upstream/v1/models"]
    # Cached for the TTL: no second call, and unknown models fall back without asking again.
    assert await windows.window("local-model") == 8192
    assert await windows.window("other") == DEFAULT_WINDOW
    assert upstream.calls == ["http://upstream/v1/models"]


async def test_discovery_is_asked_again_after_the_ttl(monkeypatch):
    now = [12.5]
    monkeypatch.setattr(windows_module.time, "monotonic", lambda: now[0])
    upstream = FakeUpstream()
    windows = Windows({}, upstream)
    assert await windows.window("other") == DEFAULT_WINDOW
    now[0] += windows_module.DISCOVERY_TTL_S + 1
    assert await windows.window("other") == DEFAULT_WINDOW
    assert len(upstream.calls) == 2
    assert time.monotonic() == now[0]


async def test_configured_window_wins_without_asking():
    upstream = FakeUpstream()
    assert await Windows({"local-model": 4096}, upstream).window("local-model") == 4096
    assert upstream.calls == []


async def test_discovery_sends_the_clients_credential_headers_without_an_operator_key(start_gateway, upstream):
    import openai

    gw = await start_gateway()  # no upstream.api_key: the client's credential goes upstream
    client = openai.AsyncOpenAI(base_url=gw.base_url, api_key="sk-client-own", max_retries=0,
                                default_headers={"X-Session-Id": "discover", "api-key": "azure-style"})
    await client.chat.completions.create(model="fake-32k", messages=[{"role": "user", "content": "hi"}])
    (discovery,) = [r for r in upstream.received if r["path"] == "/v1/models"]
    assert discovery["headers"]["authorization"] == "Bearer sk-client-own"
    assert discovery["headers"]["api-key"] == "azure-style"
