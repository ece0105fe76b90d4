"""A gateway and a puppet, each on its own event loop in its own thread, for synchronous tests.

Hypothesis drives synchronous test functions, so the fuzz corpus talks to a real gateway over
loopback with a blocking HTTP client while the gateway runs undisturbed on its own loop. That
loop carries a ticker that measures how late it wakes up: the event-loop lag every request on
the gateway would feel (a frozen loop also freezes /healthz).

The puppet gets an outermost middleware that tags every response it makes with
``x-fuzz-origin: upstream`` (and turns an exception escaping the puppet into a tagged 500), so
a test can tell a status the upstream chose, relayed faithfully, from one the gateway made.
"""

from __future__ import annotations

import asyncio
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from aiohttp import web

from gateway.app import create_app
from gateway.settings import load_settings
from simulator.puppet import create_puppet_app

ORIGIN = "x-fuzz-origin"


class LoopThread:
    """An asyncio loop running forever in a daemon thread; `run` executes a coroutine on it."""

    def __init__(self, name: str) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, name=name, daemon=True)
        self.thread.start()

    def run(self, coro, timeout: float = 120.0) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    def stop(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)
        self.loop.close()


@dataclass
class LagMeter:
    """Ticks every `period` seconds on a loop and keeps the oversleeps over `keep` seconds."""

    period: float = 0.05
    keep: float = 0.2
    worst: float = 0.0
    worst_label: str = ""
    label: str = ""  # what the test is doing now (set from the test thread)
    stalls: list[tuple[float, float, str]] = field(default_factory=list)  # (start, end, label)
    _task: asyncio.Task | None = None

    async def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._tick())

    async def _tick(self) -> None:
        while True:
            t0 = time.monotonic()
            await asyncio.sleep(self.period)
            t1 = time.monotonic()
            lag = t1 - t0 - self.period
            if lag > self.worst:
                self.worst, self.worst_label = lag, self.label
            if lag > self.keep:
                self.stalls.append((t0 + self.period, t1, self.label))

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()

    def own_stalls(self, control: "LagMeter", over: float = 1.0) -> list[tuple[str, float, float]]:
        """Stalls longer than `over` once the time a control loop in another thread of the same
        process was stalled too is taken off (the machine or the process was not running: two
        cores shared by many, a collector pass), as (label, lag, lag not explained by control)."""
        out = []
        for start, end, label in self.stalls:
            shared = sum(max(0.0, min(end, c_end) - max(start, c_start)) for c_start, c_end, _ in control.stalls)
            own = end - start - shared
            if own > over:
                out.append((label, round(end - start, 2), round(own, 2)))
        return out


@web.middleware
async def tag_upstream(request: web.Request, handler):
    try:
        response = await handler(request)
    except web.HTTPException:
        raise
    except Exception as exc:  # a bug in the puppet itself: visible, and never blamed on the gateway
        response = web.json_response({"error": {"message": f"puppet crashed: {type(exc).__name__}: {exc}",
                                                "type": "puppet_bug", "param": None, "code": None}}, status=500)
    if not response.prepared:
        response.headers[ORIGIN] = "upstream"
    return response


async def _serve(app: web.Application) -> tuple[web.AppRunner, int]:
    runner = web.AppRunner(app, access_log=None, handler_cancellation=True)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    return runner, runner.addresses[0][1]


class Rig:
    """Puppet thread + gateway thread (with a lag meter); `url` is the gateway's root."""

    def __init__(self, store: Path, **sections: Any) -> None:
        self.store = store
        self.sections = sections
        self.puppet_thread = LoopThread("fuzz-puppet")
        self.gateway_thread = LoopThread("fuzz-gateway")
        self.lag = LagMeter()
        self.control_thread = LoopThread("fuzz-control")
        self.control = LagMeter()
        self.control_thread.run(self.control.start())
        self.puppet_app: web.Application | None = None
        self.gateway_app: web.Application | None = None
        self._runners: dict[str, web.AppRunner] = {}

    def start(self) -> "Rig":
        async def puppet() -> int:
            app = create_puppet_app(windows={"fake-32k": 32_000, "fake-8k": 8_000}, keep_received=50)
            app.middlewares.insert(0, tag_upstream)
            self.puppet_app = app
            runner, port = await _serve(app)
            self._runners["puppet"] = runner
            return port

        puppet_port = self.puppet_thread.run(puppet())
        sections = dict(self.sections)
        sections["upstream"] = {"base_url": f"http://127.0.0.1:{puppet_port}/v1", **sections.get("upstream", {})}
        sections.setdefault("store", {"path": str(self.store)})
        sections.setdefault("models", {"fake-32k": {"context_window": 32_000}, "fake-8k": {"context_window": 8_000}})
        sections.setdefault("log", {"level": "ERROR"})
        self.settings = load_settings(None, **sections)

        async def gateway() -> int:
            app = create_app(self.settings)
            self.gateway_app = app
            runner, port = await _serve(app)
            self._runners["gateway"] = runner
            await self.lag.start()
            return port

        port = self.gateway_thread.run(gateway())
        self.url = f"http://127.0.0.1:{port}"
        return self

    def on_gateway(self, coro, timeout: float = 120.0) -> Any:
        return self.gateway_thread.run(coro, timeout)

    def stop_gateway(self) -> None:
        runner = self._runners.pop("gateway", None)
        if runner is not None:
            self.gateway_thread.run(self.lag.stop())
            self.gateway_thread.run(runner.cleanup())

    def stop(self) -> None:
        self.stop_gateway()
        runner = self._runners.pop("puppet", None)
        if runner is not None:
            self.puppet_thread.run(runner.cleanup())
        self.control_thread.run(self.control.stop())
        self.gateway_thread.stop()
        self.puppet_thread.stop()
        self.control_thread.stop()
