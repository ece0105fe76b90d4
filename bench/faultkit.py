"""Harness of the crash and load benchmarks (bench/crash.py, bench/load.py).

Unlike bench/common.py (everything in one process), the gateway here is a real ``palimpsest
serve`` subprocess that can be killed with SIGKILL, restarted on the same port and store, and
whose resident memory can be read from /proc. The SIMULATED upstream (``simulator.puppet``,
never a real provider) runs in the benchmark's own process, with one outer middleware that
counts the summary calls in flight (so a kill can be aimed at one) and can delay summary calls
and answers. The client speaks the wire format with aiohttp and knows when a stream ended
properly (``[DONE]`` seen, no error event) and when it must resend.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import orjson
from aiohttp import web

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from simulator.puppet import PUPPET_STATE, create_puppet_app  # noqa: E402

PURPOSE = "x-palimpsest-purpose"
API_KEY = "sk-bench-not-a-real-key"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# --- the puppet, in this process -----------------------------------------------------------------


@dataclass
class PuppetRig:
    runner: web.AppRunner
    base_url: str
    summary_delay_s: float = 0.0
    answer_delay_s: float = 0.0
    summaries_in_flight: int = 0
    summary_calls: int = 0
    chat_calls: int = 0

    async def stop(self) -> None:
        await self.runner.cleanup()


async def start_puppet(*, windows: dict[str, int], summary_delay_s: float = 0.0, answer_delay_s: float = 0.0,
                       chunk_chars: int = 12, chunk_delay_s: float = 0.0) -> PuppetRig:
    ref: list[PuppetRig] = []

    @web.middleware
    async def track(request: web.Request, handler):
        if not request.path.endswith("/chat/completions"):
            return await handler(request)
        rig = ref[0]
        if request.headers.get(PURPOSE, "").lower() == "summary":
            rig.summary_calls += 1
            rig.summaries_in_flight += 1
            try:
                if rig.summary_delay_s:
                    await asyncio.sleep(rig.summary_delay_s)
                return await handler(request)
            finally:
                rig.summaries_in_flight -= 1
        rig.chat_calls += 1
        if rig.answer_delay_s:
            await asyncio.sleep(rig.answer_delay_s)
        return await handler(request)

    app = create_puppet_app(windows=windows, keep_received=100, chunk_chars=chunk_chars)
    app.middlewares.insert(0, track)
    app[PUPPET_STATE].chunk_delay_s = chunk_delay_s  # streams that last long enough to be cut
    runner = web.AppRunner(app, access_log=None, handler_cancellation=True)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    rig = PuppetRig(runner, f"http://127.0.0.1:{runner.addresses[0][1]}/v1", summary_delay_s, answer_delay_s)
    ref.append(rig)
    return rig


# --- the gateway, as a subprocess ----------------------------------------------------------------


def toml_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return repr(value)
    return '"' + str(value).replace("\\", "\\\\").replace('"', '\\"') + '"'


def write_config(path: Path, sections: dict[str, dict[str, Any]]) -> Path:
    lines = []
    for name, values in sections.items():
        nested = {k: v for k, v in values.items() if isinstance(v, dict)}
        lines.append(f"[{name}]")
        lines += [f"{k} = {toml_value(v)}" for k, v in values.items() if not isinstance(v, dict)]
        for sub, subvalues in nested.items():
            lines.append(f'[{name}."{sub}"]')
            lines += [f"{k} = {toml_value(v)}" for k, v in subvalues.items()]
    path.write_text("\n".join(lines) + "\n")
    return path


class GatewayProcess:
    """`palimpsest serve --config CFG` on a fixed port; start, kill -9, terminate, RSS."""

    def __init__(self, config: Path, port: int, log: Path) -> None:
        self.config, self.port, self.log = config, port, log
        self.proc: subprocess.Popen | None = None
        self.starts = 0
        self.url = f"http://127.0.0.1:{port}"

    async def start(self, timeout: float = 60.0) -> float:
        started = time.perf_counter()
        with open(self.log, "ab") as log:
            self.proc = subprocess.Popen([sys.executable, "-m", "gateway", "serve", "--config", str(self.config)],
                                         stdout=log, stderr=subprocess.STDOUT, cwd=str(REPO),
                                         env={**os.environ, "PYTHONUNBUFFERED": "1"})
        self.starts += 1
        async with aiohttp.ClientSession() as http:
            while time.perf_counter() - started < timeout:
                if self.proc.poll() is not None:
                    raise RuntimeError(f"gateway exited with {self.proc.returncode}; see {self.log}")
                with contextlib.suppress(aiohttp.ClientError, asyncio.TimeoutError):
                    async with http.get(self.url + "/healthz", timeout=aiohttp.ClientTimeout(total=1)) as r:
                        if r.status == 200:
                            return time.perf_counter() - started
                await asyncio.sleep(0.05)
        raise RuntimeError(f"gateway did not become healthy in {timeout} s; see {self.log}")

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait()

    def terminate(self, timeout: float = 60.0) -> int | None:
        if self.proc is None or self.proc.poll() is not None:
            return None if self.proc is None else self.proc.returncode
        self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.kill()
            return None

    @property
    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def rss_parts(self) -> dict[str, int]:
        """RssAnon (heap), RssFile (mapped files: SQLite, the index), RssShmem, in bytes."""
        if not self.alive:
            return {}
        out = {}
        with open(f"/proc/{self.proc.pid}/status") as status:
            for line in status:
                if line.startswith(("RssAnon:", "RssFile:", "RssShmem:")):
                    out[line.split(":")[0]] = int(line.split()[1]) * 1024
        return out

    def rss_bytes(self) -> int:
        if not self.alive:
            return 0
        with open(f"/proc/{self.proc.pid}/status") as status:
            for line in status:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) * 1024
        return 0


# --- the client ----------------------------------------------------------------------------------


@dataclass
class Outcome:
    status: int  # 0: transport failure (connection refused/reset, timeout)
    message: dict | None = None  # the assistant message, when the answer is complete
    error: str = ""
    elapsed: float = 0.0
    headers: dict[str, str] = field(default_factory=dict)
    first_chunk_at: float | None = None


class Client:
    """One aiohttp session for many simulated agents (connection pool sized for them)."""

    def __init__(self, base_url: str, *, connections: int = 256, timeout_s: float = 60.0) -> None:
        self.base_url = base_url
        self.timeout = aiohttp.ClientTimeout(total=timeout_s)
        self.http = aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=connections, force_close=False))
        self.streams_in_flight = 0  # streams that have received at least one chunk and not ended

    async def close(self) -> None:
        await self.http.close()

    async def chat(self, body: dict, session_id: str, *, abort_after_first_chunk: bool = False) -> Outcome:
        headers = {"Authorization": f"Bearer {API_KEY}", "Content-Type": "application/json", "X-Session-Id": session_id}
        started = time.perf_counter()
        try:
            async with self.http.post(f"{self.base_url}/v1/chat/completions", data=orjson.dumps(body), headers=headers,
                                      timeout=self.timeout) as response:
                hdrs = {k.lower(): v for k, v in response.headers.items()}
                if body.get("stream") and response.status == 200 and "event-stream" in hdrs.get("content-type", ""):
                    if abort_after_first_chunk:  # the user pressed stop: read one chunk, hang up
                        await response.content.readany()
                        response.close()
                        return Outcome(200, error="aborted by the client", elapsed=time.perf_counter() - started, headers=hdrs)
                    return await self._stream(response, started, hdrs)
                payload = await response.read()
        except (aiohttp.ClientError, asyncio.TimeoutError, ConnectionError) as exc:
            return Outcome(0, error=type(exc).__name__, elapsed=time.perf_counter() - started)
        elapsed = time.perf_counter() - started
        try:
            data = orjson.loads(payload)
        except orjson.JSONDecodeError:
            return Outcome(response.status, error=f"not json: {payload[:80]!r}", elapsed=elapsed, headers=hdrs)
        if response.status != 200:
            err = (data.get("error") or {}) if isinstance(data, dict) else {}
            return Outcome(response.status, error=str(err.get("code") or err.get("message")), elapsed=elapsed, headers=hdrs)
        message = {k: v for k, v in data["choices"][0]["message"].items() if v is not None}
        return Outcome(200, message, elapsed=elapsed, headers=hdrs)

    async def _stream(self, response: aiohttp.ClientResponse, started: float, hdrs: dict[str, str]) -> Outcome:
        buffer, chunks, done, error = b"", [], False, ""
        first: float | None = None
        counted = False
        try:
            async for raw in response.content.iter_any():
                if first is None:
                    first = time.perf_counter() - started
                    self.streams_in_flight += 1
                    counted = True
                buffer += raw
                while b"\n\n" in buffer:
                    event, buffer = buffer.split(b"\n\n", 1)
                    for line in event.split(b"\n"):
                        if not line.startswith(b"data:"):
                            continue
                        data = line[5:].strip()
                        if data == b"[DONE]":
                            done = True
                            continue
                        with contextlib.suppress(orjson.JSONDecodeError):
                            chunk = orjson.loads(data)
                            if isinstance(chunk, dict) and chunk.get("error"):
                                error = str((chunk["error"] or {}).get("code") or "stream error")
                            chunks.append(chunk)
        except (aiohttp.ClientError, asyncio.TimeoutError, ConnectionError) as exc:
            error = error or type(exc).__name__
        finally:
            if counted:
                self.streams_in_flight -= 1
        elapsed = time.perf_counter() - started
        if error or not done:
            return Outcome(200, error=error or "stream ended without [DONE]", elapsed=elapsed, headers=hdrs, first_chunk_at=first)
        content, calls = [], {}
        for chunk in chunks:
            for choice in chunk.get("choices") or ():
                delta = choice.get("delta") or {}
                if delta.get("content"):
                    content.append(delta["content"])
                for call in delta.get("tool_calls") or ():
                    slot = calls.setdefault(call.get("index", 0), {"id": None, "type": "function", "function": {"name": "", "arguments": ""}})
                    slot["id"] = call.get("id") or slot["id"]
                    fn = call.get("function") or {}
                    slot["function"]["name"] += fn.get("name") or ""
                    slot["function"]["arguments"] += fn.get("arguments") or ""
        message: dict = {"role": "assistant"}
        if content:
            message["content"] = "".join(content)
        if calls:
            message["tool_calls"] = [calls[i] for i in sorted(calls)]
        return Outcome(200, message, elapsed=elapsed, headers=hdrs, first_chunk_at=first)


def table(rows: list[tuple], header: tuple) -> str:
    cells = [tuple(str(c) for c in header)] + [tuple(str(c) for c in row) for row in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(header))]
    line = lambda r: "| " + " | ".join(c.ljust(w) for c, w in zip(r, widths)) + " |"  # noqa: E731
    return "\n".join([line(cells[0]), "|" + "|".join("-" * (w + 2) for w in widths) + "|"] + [line(r) for r in cells[1:]])
