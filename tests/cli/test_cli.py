"""First-run behaviour of the `palimpsest` command: a busy port, the commands it prints."""

from __future__ import annotations

import os
import socket
import subprocess
import sys

import pytest

from gateway.cli.main import command


@pytest.mark.parametrize(("args", "way_out"), [
    (["serve"], "--port N or PALIMPSEST_SERVER__PORT=N"),
    (["simulate"], "--port N"),
])
def test_a_busy_port_is_one_line_and_exit_code_2(tmp_path, args, way_out):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        env = {**os.environ, "PALIMPSEST_SERVER__PORT": str(port), "PALIMPSEST_STORE__PATH": str(tmp_path / "data")}
        out = subprocess.run([sys.executable, "-m", "gateway", *args, *(["--port", str(port)] if args == ["simulate"] else [])],
                             capture_output=True, text=True, env=env, timeout=60)
    assert out.returncode == 2
    assert out.stderr == f"palimpsest: port {port} on 127.0.0.1 is already in use; pick another with {way_out}\n"
    assert "listening" not in out.stdout + out.stderr  # nothing claims the port before it is bound


def test_printed_commands_follow_how_palimpsest_was_run(monkeypatch):
    monkeypatch.setattr(sys, "argv", [".venv/bin/palimpsest", "simulate"])
    assert command() == ".venv/bin/palimpsest"  # the quick start does not put it on the PATH
    monkeypatch.setattr(sys, "argv", ["/usr/local/bin/palimpsest"])
    assert command() == "/usr/local/bin/palimpsest"
    monkeypatch.setattr(sys, "argv", ["/x/gateway/__main__.py"])
    assert command() == "palimpsest"
