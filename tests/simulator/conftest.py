"""The simulated provider started on port 0, its /v1 URL, and a raw aiohttp session."""

from __future__ import annotations

import aiohttp
import pytest

from simulator.puppet import start_puppet


@pytest.fixture
async def puppet():
    runner, base_url = await start_puppet(windows={"tiny": 300}, chunk_chars=5)
    yield runner.app, base_url
    await runner.cleanup()


@pytest.fixture
async def http():
    async with aiohttp.ClientSession() as session:
        yield session
