"""Fixtures of the new-user probes (tests/robustness/test_new_user_*.py): a scripted fake
upstream (tests/robustness/scripted.py) on port 0 and gateways in front of it."""

from __future__ import annotations

from typing import Any

import pytest
from aiohttp import web

from tests.robustness.scripted import Scripted, close_clients


@pytest.fixture
async def scripted():
    fake = Scripted()
    app = web.Application(client_max_size=64 << 20)
    app.router.add_post("/v1/chat/completions", fake.handle)
    runner = web.AppRunner(app, access_log=None, handler_cancellation=True, shutdown_timeout=0.1)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    fake.base_url = f"http://127.0.0.1:{runner.addresses[0][1]}/v1"
    yield fake
    await close_clients()
    await runner.cleanup()


@pytest.fixture
async def scripted_gateway(start_gateway, scripted):
    """Factory: a gateway in front of the scripted upstream (settings sections as overrides)."""

    async def start(**sections: Any):
        sections.setdefault("models", {"m-8k": {"context_window": 8_000}, "m-32k": {"context_window": 32_000},
                                       "m-128k": {"context_window": 128_000}})
        sections["upstream"] = {"base_url": scripted.base_url, **sections.get("upstream", {})}
        sections.setdefault("log", {"level": "ERROR"})
        return await start_gateway(**sections)

    return start
