"""The embedded store is private to the gateway's OS user (store/private.py): directories 0700,
files 0600, for what it creates and for an existing store opened with other modes."""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import stat
import subprocess
import sys
from pathlib import Path

import aiohttp

from store.ledger import Ledger
from store.turns import TurnLog

REPO = Path(__file__).resolve().parents[2]


def loose(root: Path) -> list[str]:
    """Entries under `root` (itself included) that another OS user could read or enter."""
    out = []
    for path in [root, *root.rglob("*")]:
        mode = stat.S_IMODE(path.lstat().st_mode)
        if not path.is_symlink() and mode & 0o077:
            out.append(f"{path.relative_to(root)} {oct(mode)}")
    return out


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


async def chat(root: str, session: str, text: str, history: list[dict] = ()) -> int:
    messages = [*history, {"role": "user", "content": text}]
    async with aiohttp.ClientSession() as s:
        async with s.post(root + "/v1/chat/completions", headers={"X-Session-Id": session},
                          json={"model": "fake-8k", "messages": messages}) as r:
            await r.read()
            return r.status


async def test_an_existing_world_readable_store_is_made_private_at_start(start_gateway, tmp_path):
    data = tmp_path / "data"
    old = os.umask(0o022)  # a store written by an earlier version, with the usual umask
    try:
        Ledger(data).close()
        TurnLog(data).close()
        (data / "index" / "t").mkdir(parents=True)
        (data / "index" / "t" / "part.lance").write_bytes(b"x")
    finally:
        os.umask(old)
    assert loose(data)
    gw = await start_gateway()
    assert await chat(gw.root, "modes", "hello") == 200
    assert loose(data) == []


async def test_palimpsest_serve_creates_every_store_file_private(upstream, tmp_path):
    data, port = tmp_path / "data", free_port()
    env = {**os.environ, "PALIMPSEST_SERVER__PORT": str(port), "PALIMPSEST_UPSTREAM__BASE_URL": upstream.base_url,
           "PALIMPSEST_STORE__PATH": str(data), "PALIMPSEST_RECALL__INDEX_BATCH_S": "0.05", "PALIMPSEST_LOG__LEVEL": "WARNING"}
    proc = subprocess.Popen([sys.executable, "-m", "gateway", "serve"], cwd=REPO, env=env, umask=0o022,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    root = f"http://127.0.0.1:{port}"
    try:
        for _ in range(600):
            try:
                assert await chat(root, "serve", "the first message about the deploy plan") == 200
                break
            except aiohttp.ClientConnectionError:
                await asyncio.sleep(0.1)
        # A history over the 8k window: the view hides part of it, so the recall index is written.
        history = [{"role": "user" if i % 2 == 0 else "assistant", "content": f"step {i}: " + "the rollout plan " * 150}
                   for i in range(24)]
        assert await chat(root, "serve", "what was step 3?", history) == 200
        for _ in range(600):  # the recall index is written in the background
            if list((data / "index").rglob("*.lance")) or list((data / "index").rglob("*.manifest")):
                break
            await asyncio.sleep(0.1)
    finally:
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=60)
    assert (data / "ledger.sqlite3").exists() and (data / "index").exists(), err.decode()[-2000:]
    assert loose(data) == []
