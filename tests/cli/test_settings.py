"""Settings: TOML, environment overrides, errors that name the key; the serve command."""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import subprocess
import sys
from pathlib import Path

import aiohttp
import pytest

from gateway.settings import ConfigError, load_settings

ROOT = Path(__file__).resolve().parents[2]


def test_defaults_without_file():
    s = load_settings()
    assert s.server.port == 8787 and s.session.header == "X-Session-Id"
    assert s.upstream.base_url == "https://api.openai.com/v1"


def test_toml_and_env_override(tmp_path, monkeypatch):
    cfg = tmp_path / "c.toml"
    cfg.write_text('[server]\nport = 9000\n[upstream]\nbase_url = "http://a/v1"\n[models."gpt-4o"]\ncontext_window = 128000\n[policy]\nkeep_recent_rounds = 5\n')
    monkeypatch.setenv("PALIMPSEST_UPSTREAM__BASE_URL", "http://b/v1")
    s = load_settings(cfg)
    assert s.server.port == 9000
    assert s.upstream.base_url == "http://b/v1"
    assert s.context_window("gpt-4o") == 128000
    assert s.policy.keep_recent_rounds == 5


def test_example_config_is_valid_and_complete():
    s = load_settings(ROOT / "config.example.toml")
    assert s.server.port == 8787


@pytest.mark.parametrize(
    "text,needle",
    [
        ("[server]\nprot = 1\n", "server.prot"),
        ("[server]\nport = 'abc'\n", "server.port"),
        ("[bogus]\nx = 1\n", "bogus"),
        ("[upstream]\nbase_url = 'ftp://x'\n", "upstream.base_url"),
        ("[policy]\nsummary_trigger_ratio = 3\n", "policy.summary_trigger_ratio"),
        ("[server\nport=1", "not valid TOML"),
    ],
)
def test_bad_config_names_the_key(tmp_path, text, needle):
    cfg = tmp_path / "bad.toml"
    cfg.write_text(text)
    with pytest.raises(ConfigError) as info:
        load_settings(cfg)
    assert needle in str(info.value)


def test_bad_env_value_names_the_key(monkeypatch):
    monkeypatch.setenv("PALIMPSEST_SERVER__PORT", "notaport")
    with pytest.raises(ConfigError) as info:
        load_settings()
    assert "server.port" in str(info.value)


def test_secret_values_not_echoed(tmp_path):
    cfg = tmp_path / "bad.toml"
    cfg.write_text("[upstream]\napi_key = 5\n")
    with pytest.raises(ConfigError) as info:
        load_settings(cfg)
    assert "upstream.api_key" in str(info.value)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


async def test_serve_command_runs_and_stops_on_sigterm(upstream, tmp_path):
    port = _free_port()
    cfg = tmp_path / "c.toml"
    cfg.write_text(f'[server]\nport = {port}\n[upstream]\nbase_url = "{upstream.base_url}"\n[store]\npath = "{tmp_path / "data"}"\n')
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "gateway", "serve", "--config", str(cfg), stderr=asyncio.subprocess.PIPE, env={**os.environ, "PYTHONUNBUFFERED": "1"}
    )
    try:
        async with aiohttp.ClientSession() as s:
            for _ in range(100):
                try:
                    async with s.get(f"http://127.0.0.1:{port}/healthz") as r:
                        if r.status == 200:
                            break
                except aiohttp.ClientConnectionError:
                    await asyncio.sleep(0.1)
            body = {"model": "m", "messages": [{"role": "user", "content": "hi from serve"}]}
            async with s.post(f"http://127.0.0.1:{port}/v1/chat/completions", json=body, headers={"X-Session-Id": "cli"}) as r:
                assert (await r.json())["choices"][0]["message"]["content"] == "ok: hi from serve"
        proc.send_signal(signal.SIGTERM)
        rc = await asyncio.wait_for(proc.wait(), 20)
        assert rc == 0
        log = (await proc.stderr.read()).decode()
        assert "hi from serve" not in log  # message text never reaches the logs
        assert "palimpsest listening" in log
        shutdown = [line for line in log.splitlines() if "palimpsest shutting down" in line]
        assert len(shutdown) == 1 and "requests_in_flight" in shutdown[0] and "summary_jobs_queued" in shutdown[0]
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()


def test_serve_with_bad_config_exits_nonzero(tmp_path):
    cfg = tmp_path / "c.toml"
    cfg.write_text("[server]\nport = 'x'\n")
    out = subprocess.run([sys.executable, "-m", "gateway", "serve", "--config", str(cfg)], capture_output=True, text=True, timeout=60)
    assert out.returncode == 2
    assert "server.port" in out.stderr


def test_example_config_matches_the_settings_models():
    from gateway.settings import example_toml

    assert (ROOT / "config.example.toml").read_text() == example_toml(), "regenerate config.example.toml"
