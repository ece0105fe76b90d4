"""glibc malloc arenas are capped by `palimpsest serve` (gateway/ops/memory.py): with one arena
per thread the free part of the heap grew under load (bench/load.py) although live data did not.
Checked in a fresh interpreter, counting the heaps glibc's malloc_info reports."""

from __future__ import annotations

import asyncio
import subprocess
import threading
import sys

import pytest

from gateway.ops import memory

PROBE = r"""
import ctypes, os, sys, tempfile, threading
from gateway.ops import memory
applied = memory.limit_arenas(int(sys.argv[1]))
barrier = threading.Barrier(9)
def work():
    keep = [bytearray(4096) for _ in range(200)]  # a malloc from this thread picks its arena
    barrier.wait()
    barrier.wait()
threads = [threading.Thread(target=work) for _ in range(8)]
for t in threads:
    t.start()
barrier.wait()
libc = ctypes.CDLL("libc.so.6")
libc.fopen.restype = ctypes.c_void_p
path = tempfile.mktemp()
f = libc.fopen(path.encode(), b"w")
libc.malloc_info(0, ctypes.c_void_p(f))
libc.fclose(ctypes.c_void_p(f))
barrier.wait()
for t in threads:
    t.join()
print(applied, open(path).read().count("<heap nr="))
os.unlink(path)
"""


def heaps(arenas: int) -> tuple[bool, int]:
    env = {k: v for k, v in __import__("os").environ.items() if k != "MALLOC_ARENA_MAX"}
    out = subprocess.run([sys.executable, "-c", PROBE, str(arenas)], capture_output=True, text=True, env=env, check=True)
    applied, count = out.stdout.split()
    return applied == "True", int(count)


@pytest.mark.skipif(memory.glibc() is None, reason="glibc only")
def test_limit_arenas_caps_the_heaps_threads_use():
    applied, capped = heaps(2)
    assert applied and capped <= 2
    not_applied, uncapped = heaps(0)  # 0 leaves glibc's default: about one arena per thread
    assert not not_applied and uncapped > 2


def test_operator_environment_wins(monkeypatch):
    monkeypatch.setenv("MALLOC_ARENA_MAX", "4")
    assert memory.limit_arenas(2) is False


async def test_trim_runs_while_serving_and_stops_with_the_app(monkeypatch):
    from aiohttp import web
    from aiohttp.test_utils import TestServer

    called = asyncio.Event()
    threads: list[bool] = []

    def fake_trim() -> bool:
        threads.append(threading.current_thread() is threading.main_thread())
        called.set()
        return True

    monkeypatch.setattr(memory, "trim", fake_trim)
    monkeypatch.setattr(memory, "glibc", lambda: object())
    app = web.Application()
    memory.trim_while_serving(app, 0.01)
    server = TestServer(app)
    await server.start_server()
    await asyncio.wait_for(called.wait(), 30)
    await server.close()
    count = len(threads)
    await asyncio.sleep(0.05)
    assert threads and not any(threads)  # off the event loop
    assert len(threads) == count  # stopped with the app


def test_no_trimming_when_off():
    from aiohttp import web

    app = web.Application()
    memory.trim_while_serving(app, 0)
    assert len(app.cleanup_ctx) == 0
