"""``palimpsest replay`` agrees with what a live gateway really cost on the simulator.

A session runs live (a real gateway, profile economy, in front of the strict simulator); its bill
is read off the gateway's own counters of the usage the simulator reported (its prompt cache,
simulator/cache.py). The bodies the client sent go into a JSONL file, and ``palimpsest replay``
re-sends them: its billed ratio for the live profile is within 10% of the live one and its client
prompt tokens within 2% of what the client sent. The ``direct`` profile on a session that
outgrows its window reports the rejections and a billed ratio of 1.0.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

import aiohttp
import orjson
import pytest
from aiohttp import web

from gateway.app import create_app
from gateway.cli.replay import RATES, load_requests, replay
from gateway.keys import METRICS
from gateway.settings import load_settings
from policies.prices import read_usage
from simulator.puppet import start_puppet
from simulator.workloads import TOOL_SPECS, synthetic_session

MODEL = "fake-32k"
# 72 requests: the 32k window forces compaction, and placeholders pile up long enough that the cost
# model folds them into a summary (policies/cost.settle_size).
ROUNDS = 36
LIVE = "economy"  # summaries early: the live bill includes summary calls


def _messages_tools() -> list[dict]:
    return [{"name": t["function"]["name"], "description": t["function"].get("description", ""),
             "input_schema": t["function"]["parameters"]} for t in TOOL_SPECS]


def _responses_tools() -> list[dict]:
    return [{"type": "function", "name": t["function"]["name"], "description": t["function"].get("description", ""),
             "parameters": t["function"]["parameters"]} for t in TOOL_SPECS]


class Driver:
    """An agent for one wire format: it grows its history from the answers, like a client."""

    def __init__(self, fmt: str) -> None:
        self.fmt = fmt
        self.history: list[dict] = []

    def body(self, model: str) -> dict:
        if self.fmt == "chat":
            return {"model": model, "messages": list(self.history), "tools": TOOL_SPECS}
        if self.fmt == "responses":
            return {"model": model, "input": list(self.history), "tools": _responses_tools(), "store": False}
        return {"model": model, "max_tokens": 512, "system": "You are a coding agent.",
                "messages": list(self.history), "tools": _messages_tools()}

    def user(self, text: str) -> None:
        if self.fmt == "chat":
            self.history.append({"role": "user", "content": text})
        elif self.fmt == "responses":
            self.history.append({"type": "message", "role": "user", "content": text})
        else:
            self.history.append({"role": "user", "content": text})

    def answer(self, reply: dict) -> str | None:
        """Append the model's answer; the id of its tool call, if any."""
        if self.fmt == "chat":
            message = reply["choices"][0]["message"]
            self.history.append({k: v for k, v in message.items() if v is not None and k in ("role", "content", "tool_calls")})
            calls = message.get("tool_calls") or []
            return calls[0]["id"] if calls else None
        if self.fmt == "responses":
            call = None
            for item in reply["output"]:
                if item["type"] == "function_call":
                    self.history.append({k: item[k] for k in ("type", "call_id", "name", "arguments")})
                    call = call or item["call_id"]
                elif item["type"] == "message":
                    self.history.append({"type": "message", "role": "assistant",
                                         "content": [{"type": "output_text", "text": c["text"]} for c in item["content"]]})
            return call
        self.history.append({"role": "assistant", "content": reply["content"]})
        return next((b["id"] for b in reply["content"] if b["type"] == "tool_use"), None)

    def tool(self, call_id: str, output: str) -> None:
        if self.fmt == "chat":
            self.history.append({"role": "tool", "tool_call_id": call_id, "content": output})
        elif self.fmt == "responses":
            self.history.append({"type": "function_call_output", "call_id": call_id, "output": output})
        else:
            self.history.append({"role": "user", "content": [{"type": "tool_result", "tool_use_id": call_id, "content": output}]})


PATH = {"chat": "/chat/completions", "responses": "/responses", "messages": "/messages"}
HEADERS = {"Authorization": "Bearer sk-test", "x-api-key": "sk-test", "anthropic-version": "2023-06-01"}


async def _live(fmt: str, tmp_path: Path, model: str, rounds: int) -> tuple[list[dict], dict[str, float]]:
    """Run the session live; the lines for --from and the live gateway's counters."""
    puppet, puppet_url = await start_puppet()
    mirror, mirror_url = await start_puppet(windows={model: 1 << 30})
    settings = load_settings(None, upstream={"base_url": puppet_url}, store={"path": str(tmp_path / "live")},
                             policy={"profile": LIVE}, server={"shutdown_timeout_s": 10.0})
    app = create_app(settings)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    url = f"http://127.0.0.1:{runner.addresses[0][1]}/v1"
    lines: list[dict] = []
    sent: list[int] = []
    driver = Driver(fmt)
    session = synthetic_session(seed=3, rounds=rounds)
    try:
        async with aiohttp.ClientSession(trust_env=False) as http:
            async def send() -> dict:
                body = driver.body(model)
                lines.append({"session": f"live-{fmt}", "format": fmt, "body": body})
                async with http.post(url + PATH[fmt], json=body, headers={**HEADERS, "X-Session-Id": f"live-{fmt}"}) as resp:
                    reply = await resp.json()
                    assert resp.status == 200, reply
                # What the client sent, counted by the simulator as it was sent: the same body
                # straight to a simulator with no window limit.
                async with http.post(mirror_url + PATH[fmt], json=body, headers=HEADERS) as resp:
                    mirrored = await resp.json()
                    assert resp.status == 200, mirrored
                    sent.append(read_usage(mirrored["usage"]).prompt)
                    return reply
            for spec in session.rounds:
                driver.user(spec["user"])
                call = driver.answer(await send())
                assert call, "the simulator calls the tool the user step names"
                driver.tool(call, spec["output"])
                driver.answer(await send())
    finally:
        await runner.cleanup()  # drains summary jobs: their usage is counted
        await puppet.cleanup()
        await mirror.cleanup()
    registry = app[METRICS].registry

    def total(name: str) -> float:
        return sum(s.value for m in registry.collect() for s in m.samples if s.name == name)

    counters = {k: total(f"palimpsest_{k}") for k in (
        "upstream_usage_prompt_tokens_total", "upstream_usage_cached_tokens_total",
        "summary_input_tokens_total", "summary_cache_read_tokens_total")}
    counters["client_sent"] = sum(sent)
    return lines, counters


def _args(source: Path, profiles: list[str], model: str | None = None) -> argparse.Namespace:
    return argparse.Namespace(source=str(source), profiles=profiles, policy_overrides={}, model=model,
                              rates="openai", config=None, json=True)


def _write(path: Path, lines: list[dict]) -> Path:
    path.write_bytes(b"".join(orjson.dumps(line) + b"\n" for line in lines))
    return path


@pytest.mark.parametrize("fmt", ["chat", "responses", "messages"])
async def test_replay_bills_the_live_profile_as_the_simulator_did(fmt, tmp_path):
    lines, live = await _live(fmt, tmp_path, MODEL, ROUNDS)
    source = _write(tmp_path / "session.jsonl", lines)
    with open(os.devnull, "w") as quiet:
        result = await replay(load_requests(str(source)), _args(source, [LIVE, "direct"]), err=quiet)
    assert result["sessions"] == 1 and result["requests"] == 2 * ROUNDS
    profile, direct = result["profiles"]
    read, _ = RATES["openai"]
    cached = live["upstream_usage_cached_tokens_total"] + live["summary_cache_read_tokens_total"]
    prompt = live["upstream_usage_prompt_tokens_total"] + live["summary_input_tokens_total"]
    live_billed = prompt - cached + read * cached
    assert profile["summary_calls"] >= 1 and profile["compaction_events"] >= 1, profile
    assert profile["upstream_prompt_tokens"] < profile["client_prompt_tokens"]
    live_ratio = live_billed / profile["billed_direct"]
    assert profile["billed_ratio"] == pytest.approx(live_ratio, rel=0.10), (profile, live)
    assert profile["client_prompt_tokens"] == pytest.approx(live["client_sent"], rel=0.02)
    # The session fits no 32k window by its end: direct passes it through and counts what a
    # provider would refuse.
    assert direct["rejections"] >= 1 and direct["billed_ratio"] == pytest.approx(1.0, abs=1e-3), direct
    assert direct["summary_calls"] == 0 and direct["compaction_events"] == 0
    assert 0 <= profile["exact_values_visible"] <= 1


def test_the_command_prints_one_json_object_and_refuses_bad_input(tmp_path):
    session = synthetic_session(seed=1, rounds=2)
    history: list[dict] = []
    lines = []
    for spec in session.rounds:
        history.append({"role": "user", "content": spec["user"].split(" [[")[0]})
        lines.append({"session": "cli", "format": "chat", "model": "fake-8k", "messages": list(history)})
        history.append({"role": "assistant", "content": "ok"})
    source = _write(tmp_path / "s.jsonl", lines)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OPENAI_", "PALIMPSEST_"))}
    env.update(HTTP_PROXY="http://127.0.0.1:9", HTTPS_PROXY="http://127.0.0.1:9")
    run = lambda *a: subprocess.run([sys.executable, "-m", "gateway", "replay", *a], capture_output=True, text=True,
                                    timeout=120, env=env, cwd=Path(__file__).resolve().parents[2])
    done = run("--from", str(source), "--profiles", "economy,direct", "--json", "--rates", "anthropic-5m")
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout)
    assert result["sessions"] == 1 and result["requests"] == 2
    assert [p["profile"] for p in result["profiles"]] == ["economy", "direct"]
    assert all(p["requests"] == 2 and p["rejections"] == 0 for p in result["profiles"])
    # A short session fits: every profile sends it as the client did.
    assert result["profiles"][0]["upstream_prompt_tokens"] == result["profiles"][0]["client_prompt_tokens"] > 0
    # With --rates none a cached token costs as much as any other: the bill is the prompt.
    flat = json.loads(run("--from", str(source), "--profiles", "economy", "--json", "--rates", "none").stdout)
    assert flat["profiles"][0]["billed_direct"] == flat["profiles"][0]["client_prompt_tokens"]
    table = run("--from", str(source), "--profiles", "balanced")
    assert table.returncode == 0 and "profile balanced" in table.stdout and "billed_ratio" in table.stdout
    assert "\r" not in table.stderr  # not a terminal: no progress bar
    bad = _write(tmp_path / "bad.jsonl", [{"session": "x", "format": "grpc", "model": "m"}])
    refused = run("--from", str(bad))
    assert refused.returncode == 2 and "'format' has value 'grpc'" in refused.stderr
    assert run("--from", str(source), "--profiles", "cheap").returncode == 2
    chained = _write(tmp_path / "chained.jsonl", [{"session": "x", "format": "responses", "model": "fake-8k",
                                                   "input": "hi", "previous_response_id": "resp_1"}])
    refused = run("--from", str(chained))
    assert refused.returncode == 2 and "previous_response_id" in refused.stderr
