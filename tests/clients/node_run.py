"""Running the Node client scripts in tests/clients/node/ (the Vercel AI SDK, the official
`openai` and `@anthropic-ai/sdk` packages) against a gateway.

The packages are pinned in tests/support/cli-packages.txt and installed into ``.clients/``
(``$PALIMPSEST_CLIENTS``, when set, is looked in first) like the coding-agent CLIs (tests/support/clis.py). Node resolves a bare
import from the script's own folder upwards, so each run copies the scripts into a temp folder
beside a ``node_modules`` link to that install. Without node or the packages the test skips;
under CI it fails. A run gets only PATH and a temp HOME from the environment, talks only to the loopback URL in its
configuration, and is killed at its timeout."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import tempfile
from pathlib import Path

import pytest

from tests.support.clis import CLIENTS_DIR

SCRIPTS = Path(__file__).with_name("node")
PACKAGES = ("ai", "@ai-sdk/openai", "@ai-sdk/anthropic", "openai", "@anthropic-ai/sdk")


def node_modules() -> Path:
    """The install that holds every package the scripts import; skips (fails under CI) without one."""
    folders = [CLIENTS_DIR / "node_modules"]
    if os.environ.get("PALIMPSEST_CLIENTS"):  # an install named explicitly wins over the pinned one
        folders.insert(0, Path(os.environ["PALIMPSEST_CLIENTS"]) / "node_modules")
    for folder in folders:
        if shutil.which("node") and all((folder / p / "package.json").exists() for p in PACKAGES):
            return folder
    message = f"node or the npm packages {', '.join(PACKAGES)} are not installed (.ci/run installs them into {CLIENTS_DIR})"
    if os.environ.get("CI"):
        pytest.fail(message)
    pytest.skip(message)


async def run_node(script: str, config: dict, *, timeout_s: float = 60.0) -> dict:
    """Run tests/clients/node/`script` with `config`; the JSON line it printed last. A failed or
    timed-out run fails the test with the script's output."""
    modules = node_modules()
    with tempfile.TemporaryDirectory(prefix="node-client-") as work:
        folder = Path(work)
        for source in SCRIPTS.glob("*.mjs"):
            shutil.copy(source, folder / source.name)
        (folder / "node_modules").symlink_to(modules)
        env = {"PATH": os.environ.get("PATH", ""), "HOME": work, "NO_COLOR": "1"}
        process = await asyncio.create_subprocess_exec(
            "node", str(folder / script), json.dumps(config), cwd=work, env=env,
            stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE, start_new_session=True)
        try:
            out, err = await asyncio.wait_for(process.communicate(), timeout_s)
        except asyncio.TimeoutError:
            os.killpg(process.pid, 9)
            out, err = await process.communicate()
            pytest.fail(f"{script} timed out after {timeout_s} s: {err.decode(errors='replace')[-3000:]}")
    if process.returncode != 0:
        pytest.fail(f"{script} exited {process.returncode}: {err.decode(errors='replace')[-4000:]}")
    return json.loads(out.decode().strip().splitlines()[-1])


# What every Node client test plays: a 12-step run_step chain of ~1,200-token outputs on a 16k
# model (the economy profile's triggers, tests/clients/rig.GATEWAY), then the planted fact asked back.
MODEL = "fake-16k"
STEPS = 12
TOKENS = 1_200
ANSWER = "DEP-58213"  # the fact step 1 plants (tests/clients/node/steps.mjs)
PLACEHOLDER = "[Tool result compacted by the gateway]"
PATHS = {"responses": "/v1/responses", "chat": "/v1/chat/completions", "messages": "/v1/messages"}


def conversation(upstream, path: str) -> list[dict]:
    """The bodies the upstream received for the client's turns on `path` (not summary jobs)."""
    return [r["json"] for r in upstream.received
            if r["path"] == path and r.get("json") and not r["headers"].get("x-palimpsest-purpose")]


def assert_compacted_upstream(upstream, path: str, *, summary_adopted: bool = True) -> None:
    """One upstream call per model step of the chain (none refused or retried: the puppet refuses
    a body over the window or unpaired), placeholders and a summary in the views, the last
    step's output sent as the tool returned it, then two calls for the recall question: the
    model's session_search (offered by the gateway) and its answer. Summary jobs ran; with
    `summary_adopted` one of their summaries is in a view."""
    bodies = conversation(upstream, path)
    assert [r for r in upstream.received if r["headers"].get("x-palimpsest-purpose") == "summary"], "no summary job"
    assert len(bodies) == STEPS + 1 + 2, len(bodies)
    text = [json.dumps(body) for body in bodies]
    assert any(PLACEHOLDER in t for t in text[:STEPS + 1]), "no placeholder upstream"
    if summary_adopted:
        assert any("<session_summary>" in t for t in text[:STEPS + 1]), "no summary upstream"
    assert f"CHAIN COMPLETE after {STEPS} steps" in text[STEPS]
    assert "session_search" in json.dumps(bodies[STEPS + 1].get("tools"))
    assert "session_search" in json.dumps(bodies[STEPS + 2].get("input") or bodies[STEPS + 2].get("messages"))
