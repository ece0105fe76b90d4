"""Real coding-agent CLIs in tests: Codex CLI (``codex exec``), Claude Code (``claude -p``) and
Qwen Code (``qwen PROMPT``, the one that speaks Chat Completions).

The binaries come from the npm packages pinned in tests/support/cli-packages.txt; ``.ci/run``
installs them into ``.clients/`` at the repository root (by hand: ``npm install --prefix .clients
$(cat tests/support/cli-packages.txt)``). `find_cli` looks first in ``$PALIMPSEST_CLIENTS``
(another install folder, e.g. the newest releases scripts/clients-latest.sh installs), then there,
then on PATH. Each run gets a fresh HOME (and CODEX_HOME) in a temp folder, talks only to the
given loopback base URL, and is killed at its timeout.

What each needs of a server (recorded from the real clients, tests/fixtures/wire/):
- Codex: ``POST {base_url}/responses`` only, streamed; it needs ``response.completed`` (else
  "stream closed before response.completed") and reads items from ``response.output_item.done``.
  A 400 ``context_length_exceeded`` ends it with "ran out of room in the model's context window".
- Claude Code: ``HEAD /`` (any answer), then streamed ``POST /v1/messages`` with
  ``thinking: {"type": "adaptive"}`` (2.1.332 adds ``"display": "omitted"``: thinking blocks
  come back with an empty text) and mid-conversation ``system`` messages (2.1.197 under the
  ``mid-conversation-system-2026-04-07`` beta, 2.1.332 without a header, and folded into the
  user turn if the provider refuses them with a 400); a 400 "prompt is too long: N tokens > M
  maximum" is what makes it compact (or give up on a single exchange).
- Qwen Code: streamed ``POST {base_url}/chat/completions`` (``stream_options.include_usage``,
  ``max_tokens`` 8000, content as lists of text parts, a ~16k-token system prompt and tools). It
  sends no session header of its own: its settings' ``customHeaders`` add ``X-Session-Id``. A 400
  "maximum context length" makes it compress the history with the model (its state snapshot),
  then go on from that. Without ``privacy.usageStatisticsEnabled = false`` it resolves its
  telemetry host at start (strace shows DNS queries); with it, it connects to loopback only.
  Pinned at 0.15.10: the newest release whose engines accept Node 20 (later ones need Node 22).
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
_PINNED = (Path(__file__).with_name("cli-packages.txt")).read_text().split()
PACKAGES = {"codex": next(p for p in _PINNED if p.startswith("@openai/codex@")),
            "claude": next(p for p in _PINNED if p.startswith("@anthropic-ai/claude-code@")),
            "qwen": next(p for p in _PINNED if p.startswith("@qwen-code/qwen-code@"))}
CLIENTS_DIR = ROOT / ".clients"
# Only what the CLIs need from the parent environment: no keys, proxies or client settings leak in.
_KEEP_ENV = ("PATH", "LANG", "LC_ALL", "TERM", "TMPDIR", "TZ")


@dataclass
class CliRun:
    returncode: int | None  # None: killed at the timeout
    stdout: str
    stderr: str
    home: Path


def find_cli(name: str) -> str | None:
    """The path of `name` ("codex", "claude" or "qwen"), or None when it is not installed."""
    folders = [CLIENTS_DIR]
    if os.environ.get("PALIMPSEST_CLIENTS"):  # an install named explicitly wins over the pinned one
        folders.insert(0, Path(os.environ["PALIMPSEST_CLIENTS"]))
    for folder in folders:
        binary = folder / "node_modules" / ".bin" / name
        if binary.exists():
            return str(binary)
    return shutil.which(name)


def require_cli(name: str) -> str:
    """The CLI's path; skips the test without it, fails under CI (``.ci/run`` installs it)."""
    binary = find_cli(name)
    if binary is None:
        message = (f"{name} is not installed (npm package {PACKAGES[name]}; .ci/run installs it "
                   f"into {CLIENTS_DIR})")
        if os.environ.get("CI"):
            pytest.fail(message)
        pytest.skip(message)
    return binary


def _env(home: Path, extra: dict[str, str]) -> dict[str, str]:
    env = {k: os.environ[k] for k in _KEEP_ENV if k in os.environ}
    env.update(HOME=str(home), XDG_CONFIG_HOME=str(home / ".config"), NO_COLOR="1", **extra)
    return env


async def _run(argv: list[str], env: dict[str, str], cwd: Path, timeout_s: float) -> tuple[int | None, str, str]:
    process = await asyncio.create_subprocess_exec(
        *argv, cwd=cwd, env=env, stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE, start_new_session=True)
    try:
        out, err = await asyncio.wait_for(process.communicate(), timeout_s)
        code: int | None = process.returncode
    except asyncio.TimeoutError:
        os.killpg(process.pid, 9)  # its own session: the CLI and the commands it started
        out, err = await process.communicate()
        code = None
    return code, out.decode(errors="replace"), err.decode(errors="replace")


def qwen_settings(session: bool, compress: bool = True) -> dict:
    """Qwen Code's ~/.qwen/settings.json (schema version 4, so it is not migrated): the OpenAI
    auth (key, URL and model come from OPENAI_*), no usage statistics or telemetry, no update
    check, no background memory agents; with `session`, X-Session-Id on every request from
    $PALIMPSEST_SESSION (Qwen Code substitutes variables in its settings; README's recipe);
    without `compress`, it never compresses its history itself (its client-side compaction, from
    70% of the window it assumes)."""
    settings: dict = {
        "$version": 4, "security": {"auth": {"selectedType": "openai"}},
        "privacy": {"usageStatisticsEnabled": False}, "telemetry": {"enabled": False},
        "general": {"enableAutoUpdate": False},
        # Commands run as plain child processes: through its pseudo-terminal Qwen Code 0.15.10
        # loses the tail of a command's output when the command exits while the pty still holds
        # unread bytes (seen on a loaded machine: "step 9 of 34" cut mid-line, no "next:" line).
        "tools": {"shell": {"enableInteractiveShell": False}},
        "memory": {"enableManagedAutoMemory": False, "enableManagedAutoDream": False, "enableAutoSkill": False}}
    model: dict = {}
    if session:
        model["generationConfig"] = {"customHeaders": {"X-Session-Id": "$PALIMPSEST_SESSION"}}
    if not compress:
        model["chatCompression"] = {"contextPercentageThreshold": 0}
    if model:
        settings["model"] = model
    return settings


def codex_config(base_url: str, model: str) -> str:
    return (f'model = "{model}"\nmodel_provider = "sim"\n\n[model_providers.sim]\nname = "sim"\n'
            f'base_url = "{base_url}"\nwire_api = "responses"\nenv_key = "SIM_API_KEY"\n'
            "request_max_retries = 0\nstream_max_retries = 0\n")


def _home(home: Path | None, prefix: str) -> Path:
    home = Path(tempfile.mkdtemp(prefix=prefix)) if home is None else home
    home.mkdir(parents=True, exist_ok=True)
    return home


async def run_codex(base_url: str, prompt: str, *, model: str = "fake-128k",
                    timeout_s: float = 110.0, api_key: str = "sk-sim-codex",
                    home: Path | None = None) -> CliRun:
    """``codex exec PROMPT`` against `base_url` (ending in /v1), no sandbox, no approvals."""
    binary = require_cli("codex")
    home = _home(home, "codex-home-")
    (home / ".codex").mkdir()
    (home / ".codex" / "config.toml").write_text(codex_config(base_url, model))
    work = home / "work"
    work.mkdir()
    env = _env(home, {"CODEX_HOME": str(home / ".codex"), "SIM_API_KEY": api_key})
    argv = [binary, "exec", "--skip-git-repo-check", "--dangerously-bypass-approvals-and-sandbox",
            prompt]
    code, out, err = await _run(argv, env, work, timeout_s)
    return CliRun(code, out, err, home)


async def run_claude(base_url: str, prompt: str, *, model: str = "fake-128k",
                     timeout_s: float = 110.0, max_output_tokens: int = 4096,
                     api_key: str = "sk-ant-sim", home: Path | None = None,
                     extra_env: dict[str, str] | None = None) -> CliRun:
    """``claude -p PROMPT --allowedTools Bash`` against `base_url` (the root, without /v1);
    ``extra_env``: more of Claude Code's settings (e.g. ENABLE_PROMPT_CACHING_1H)."""
    binary = require_cli("claude")
    home = _home(home, "claude-home-")
    work = home / "work"
    work.mkdir()
    env = _env(home, {
        "ANTHROPIC_BASE_URL": base_url.removesuffix("/v1"), "ANTHROPIC_API_KEY": api_key,
        "CLAUDE_CODE_MAX_OUTPUT_TOKENS": str(max_output_tokens),
        # Loopback only: no telemetry, error reports, update checks or other side traffic.
        "DISABLE_TELEMETRY": "1", "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
        "DISABLE_AUTOUPDATER": "1", "DISABLE_ERROR_REPORTING": "1", **(extra_env or {})})
    argv = [binary, "-p", prompt, "--allowedTools", "Bash", "--model", model]
    code, out, err = await _run(argv, env, work, timeout_s)
    return CliRun(code, out, err, home)


async def run_qwen(base_url: str, prompt: str, *, model: str = "fake-128k", timeout_s: float = 110.0,
                   api_key: str = "sk-sim-qwen", session: str | None = "qwen-session",
                   home: Path | None = None, resume: bool = False, compress: bool = True) -> CliRun:
    """``qwen PROMPT --approval-mode yolo`` (one shot, every tool allowed) against `base_url`
    (ending in /v1) as an OpenAI-compatible Chat Completions provider; ``session``: the
    X-Session-Id its requests carry (None: none); ``resume``: go on with the last session run in
    this `home` (``--continue``); ``compress``: see `qwen_settings`."""
    binary = require_cli("qwen")
    home = _home(home, "qwen-home-")
    (home / ".qwen").mkdir(exist_ok=True)
    (home / ".qwen" / "settings.json").write_text(json.dumps(qwen_settings(session is not None, compress)))
    work = home / "work"
    work.mkdir(exist_ok=True)
    env = _env(home, {"OPENAI_BASE_URL": base_url, "OPENAI_API_KEY": api_key, "OPENAI_MODEL": model,
                      **({"PALIMPSEST_SESSION": session} if session is not None else {})})
    argv = [binary, prompt, "--approval-mode", "yolo", *(["--continue"] if resume else [])]
    code, out, err = await _run(argv, env, work, timeout_s)
    return CliRun(code, out, err, home)
