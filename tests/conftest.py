"""Shared fixtures: a real puppet upstream on port 0 and real gateways in front of it.

Every test that goes through a gateway gets, at teardown, a check of every chat request the
upstream received: tool calls paired by OpenAI's rules and the prompt within the model's
window (the puppet rejects violations too, but a test may expect an error on purpose)."""

from __future__ import annotations

import gc
import os
import threading
import time
from dataclasses import dataclass, field
from typing import Any

import pytest
from aiohttp import web

from gateway.app import create_app
from gateway.ops import memory
from simulator.puppet import PUPPET_STATE, RECEIVED, create_puppet_app
from gateway.settings import ServerSettings, Settings, load_settings

# The test process's heap under the malloc arenas `palimpsest serve` runs with (gateway/ops/memory.py):
# with glibc's default of 8 per core the suite's gateways, LanceDB and worker threads left
# hundreds of MB free in arenas no other thread reused (tests/recall: 937 -> 664 MB peak).
memory.limit_arenas(ServerSettings().malloc_arena_max)


@dataclass
class Upstream:
    app: web.Application
    runner: web.AppRunner
    base_url: str

    @property
    def received(self) -> list[dict[str, Any]]:
        return self.app[RECEIVED]

    def chat_requests(self) -> list[dict[str, Any]]:
        return [r for r in self.received if r["path"].endswith("/chat/completions") and r.get("json")]

    @property
    def state(self):
        return self.app[PUPPET_STATE]


@dataclass
class Gateway:
    app: web.Application
    runner: web.AppRunner
    base_url: str  # ends with /v1
    settings: Settings
    root: str = field(default="")

    async def stop(self) -> None:
        await self.runner.cleanup()


async def _serve(app: web.Application) -> tuple[web.AppRunner, int]:
    runner = web.AppRunner(app, access_log=None, handler_cancellation=True)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    return runner, runner.addresses[0][1]


@pytest.fixture
async def upstream():
    app = create_puppet_app(windows={"fake-32k": 32_000, "fake-8k": 8_000})
    runner, port = await _serve(app)
    up = Upstream(app, runner, f"http://127.0.0.1:{port}/v1")
    yield up
    await runner.cleanup()


@pytest.fixture
async def start_gateway(upstream, tmp_path):
    """Factory: start a gateway on the puppet with settings overrides (dicts per section)."""
    started: list[Gateway] = []

    async def start(**sections: Any) -> Gateway:
        sections.setdefault("upstream", {})
        sections["upstream"] = {"base_url": upstream.base_url, **sections["upstream"]}
        sections.setdefault("store", {"path": str(tmp_path / "data")})
        settings = load_settings(None, **sections)
        app = create_app(settings)
        runner, port = await _serve(app)
        gw = Gateway(app, runner, f"http://127.0.0.1:{port}/v1", settings, f"http://127.0.0.1:{port}")
        started.append(gw)
        return gw

    yield start
    for gw in started:
        await gw.runner.cleanup()


@pytest.fixture
async def gateway(start_gateway):
    return await start_gateway()


def _status_mb(field_name: str) -> float:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field_name + ":"):
                return int(line.split()[1]) / 1024
    return 0.0


if os.environ.get("PALIMPSEST_TEST_RSS"):
    # Opt-in memory trace: one tab-separated line per test (RSS and peak RSS in MB after its
    # teardown, threads alive, seconds, of which in Python's cyclic garbage collector) appended
    # to the file PALIMPSEST_TEST_RSS names, so a run shows which tests grow the process and
    # whether it is given back (a collection's cost grows with every object still alive).
    _gc_seconds = [0.0, 0.0]  # total, start of the running collection

    def _time_gc(phase: str, info: dict) -> None:
        if phase == "start":
            _gc_seconds[1] = time.perf_counter()
        else:
            _gc_seconds[0] += time.perf_counter() - _gc_seconds[1]

    gc.callbacks.append(_time_gc)

    @pytest.hookimpl(hookwrapper=True)
    def pytest_runtest_protocol(item, nextitem):
        started, in_gc = time.monotonic(), _gc_seconds[0]
        yield
        with open(os.environ["PALIMPSEST_TEST_RSS"], "a") as out:
            out.write(f"{item.nodeid}\t{_status_mb('VmRSS'):.0f}\t{_status_mb('VmHWM'):.0f}\t"
                      f"{threading.active_count()}\t{time.monotonic() - started:.2f}\t{_gc_seconds[0] - in_gc:.2f}\n")
