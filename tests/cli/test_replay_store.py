"""``palimpsest replay`` of the configured store's sessions (gateway/cli/replay_sources.py).

Each request is rebuilt from the ledger and the request form the turn log keeps
(gateway/pipeline/request_form.py): exactly the body the client sent, system prompt,
instructions, tools, parameters and cache breakpoints included, on all three formats. A session
run live against the simulator and replayed from its store bills the live profile within 10% of
what the simulator measured, and its client prompt tokens within 2% of what the client sent.
``--tenant`` never replays another tenant's sessions; sessions recorded before request forms
were kept are replayed from the path alone and counted as approximate.
"""

from __future__ import annotations

import json
import os
import sqlite3
import subprocess
import sys
from pathlib import Path

import aiohttp
import orjson
import pytest

from gateway.cli.replay import RATES, replay
from gateway.cli.replay_sources import ReplayRequest, stored_requests
from gateway.keys import LEDGER, TURNS
from gateway.settings import load_settings
from store.canonical import stored_form
from tests.cli.test_replay import LIVE, MODEL, ROUNDS, _args, _live

PATHS = {"chat": "/chat/completions", "responses": "/responses", "messages": "/messages"}
HEADERS = {"anthropic-version": "2023-06-01"}
BASH = {"type": "object", "properties": {"command": {"type": "string", "description": "The shell command to run."}},
        "required": ["command"]}
ABOUT = "Run a shell command in the build container and return what it printed."
TOOLS = {"chat": [{"type": "function", "function": {"name": "bash", "description": ABOUT, "parameters": BASH}}],
         "responses": [{"type": "function", "name": "bash", "description": ABOUT, "parameters": BASH}],
         "messages": [{"name": "bash", "description": ABOUT, "input_schema": BASH}]}


def first(fmt: str) -> dict:
    """A client's first request, with what the ledger does not hold: system prompt or
    instructions, a developer message, tools, parameters, cache breakpoints."""
    if fmt == "chat":
        return {"model": "fake-32k", "temperature": 0.2, "max_tokens": 300, "tools": TOOLS[fmt],
                "messages": [{"role": "system", "content": "You are a build agent."},
                             {"role": "user", "content": "Run the build."}]}
    if fmt == "responses":
        return {"model": "fake-32k", "instructions": "You are a build agent.", "tools": TOOLS[fmt], "store": False,
                "max_output_tokens": 300,
                "input": [{"type": "message", "role": "developer", "content": "Prefer small steps."},
                          {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "Run the build."}]}]}
    return {"model": "fake-32k", "max_tokens": 300, "tools": TOOLS[fmt],
            "system": [{"type": "text", "text": "You are a build agent.", "cache_control": {"type": "ephemeral"}}],
            "messages": [{"role": "user", "content": [{"type": "text", "text": "Run the build.",
                                                       "cache_control": {"type": "ephemeral"}}]}]}


def unmarked(message: dict) -> dict:
    content = message.get("content")
    if not isinstance(content, list):
        return message
    return {**message, "content": [{k: v for k, v in b.items() if k != "cache_control"} for b in content]}


def following(fmt: str, sent: dict, answer: dict, n: int) -> dict:
    """The next request: the answer sent back as it came, one more user turn (a developer
    message between them in chat; the breakpoint moved to the newest turn in Messages)."""
    text = f"Step {n}: go on."
    if fmt == "chat":
        message = {k: v for k, v in answer["choices"][0]["message"].items() if v is not None}
        return {**sent, "messages": [*sent["messages"], message, {"role": "developer", "content": f"Note {n}."},
                                     {"role": "user", "content": text}]}
    if fmt == "responses":
        user = {"type": "message", "role": "user", "content": [{"type": "input_text", "text": text}]}
        return {**sent, "input": [*sent["input"], *answer["output"], user]}
    history = [unmarked(m) for m in sent["messages"]]
    return {**sent, "messages": [*history, {"role": "assistant", "content": answer["content"]},
                                 {"role": "user", "content": [{"type": "text", "text": text, "cache_control": {"type": "ephemeral"}}]}]}


async def _session(gw, fmt: str, session: str, key: str, turns: int = 3) -> list[dict]:
    sent, body = [], first(fmt)
    async with aiohttp.ClientSession() as http:
        for n in range(turns):
            sent.append(body)
            async with http.post(gw.base_url + PATHS[fmt], json=body,
                                 headers={**HEADERS, "Authorization": f"Bearer {key}", "x-api-key": key, "X-Session-Id": session}) as r:
                answer = await r.json()
                assert r.status == 200, answer
            body = following(fmt, body, answer, n + 1)
    return sent


def noiseless(fmt: str, body: dict) -> dict:
    if fmt != "chat":
        return body
    return {**body, "messages": [stored_form(m) for m in body["messages"]]}


def _flush(gw) -> None:
    gw.app[LEDGER].flush()
    gw.app[TURNS].flush()


@pytest.mark.parametrize("fmt", ["chat", "responses", "messages"])
async def test_a_stored_request_is_rebuilt_as_the_client_sent_it(fmt, start_gateway):
    gw = await start_gateway()
    sent = await _session(gw, fmt, "s1", "sk-one")
    _flush(gw)
    stored = stored_requests(gw.settings, None, [])
    assert stored.approximate == 0 and stored.sessions == 1
    # Exactly what was sent, up to the fields the ledger leaves out as SDK noise (store.canonical.stored_form:
    # an answer's `annotations: []` sent back).
    assert [body for _, _, _, body in stored.requests] == [noiseless(fmt, b) for b in sent]
    assert {f for _, _, f, _ in stored.requests} == {fmt}
    # The tools list (and the system prompt) repeated on every request is kept once for the session.
    db = sqlite3.connect(Path(gw.settings.store.path) / "turns.sqlite3")
    parts = [orjson.loads(b) for (b,) in db.execute("SELECT body FROM request_parts")]
    assert parts.count(TOOLS[fmt]) == 1
    # ... and goes with the session.
    key = stored.requests[0][1]
    gw.app[TURNS].delete_session(key)
    assert db.execute("SELECT COUNT(*) FROM request_parts").fetchone()[0] == 0
    db.close()


@pytest.mark.parametrize("fmt", ["chat", "responses", "messages"])
async def test_stored_replay_bills_the_live_profile_as_the_simulator_did(fmt, tmp_path):
    lines, live = await _live(fmt, tmp_path, MODEL, ROUNDS)
    settings = load_settings(None, store={"path": str(tmp_path / "live")})
    stored = stored_requests(settings, None, [])
    assert stored.approximate == 0 and len(stored.requests) == 2 * ROUNDS
    requests = [ReplayRequest(s, f, b, t) for t, s, f, b in stored.requests]
    with open(os.devnull, "w") as quiet:
        result = await replay(requests, _args(tmp_path / "unused", [LIVE]), err=quiet)
    (profile,) = result["profiles"]
    read, _ = RATES["openai"]
    cached = live["upstream_usage_cached_tokens_total"] + live["summary_cache_read_tokens_total"]
    prompt = live["upstream_usage_prompt_tokens_total"] + live["summary_input_tokens_total"]
    live_ratio = (prompt - cached + read * cached) / profile["billed_direct"]
    assert profile["summary_calls"] >= 1 and profile["compaction_events"] >= 1, profile
    print(f"\n{fmt}: billed_ratio replay {profile['billed_ratio']:.4f} live {live_ratio:.4f}; client tokens "
          f"replay {profile['client_prompt_tokens']} sent {live['client_sent']:.0f}")
    assert profile["billed_ratio"] == pytest.approx(live_ratio, rel=0.10), (profile, live)
    assert profile["client_prompt_tokens"] == pytest.approx(live["client_sent"], rel=0.02)
    per = result["per_request"]
    assert len(per["client_tokens"]) == len(per["profiles"][LIVE]["upstream_tokens"]) == 2 * ROUNDS
    assert sum(per["client_tokens"]) == profile["client_prompt_tokens"]


def _cli(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OPENAI_", "PALIMPSEST_"))}
    env.update(HTTP_PROXY="http://127.0.0.1:9", HTTPS_PROXY="http://127.0.0.1:9")
    return subprocess.run([sys.executable, "-m", "gateway", "replay", *args], capture_output=True, text=True,
                          timeout=180, env=env, cwd=Path(__file__).resolve().parents[2])


async def test_a_tenant_replays_only_its_own_sessions(start_gateway, tmp_path):
    gw = await start_gateway(tenants={"alice": "pk-alice", "bob": "pk-bob"})
    await _session(gw, "chat", "shared-id", "pk-alice", turns=2)
    await _session(gw, "messages", "shared-id", "pk-bob", turns=3)
    await _session(gw, "responses", "bob-only", "pk-bob", turns=1)
    _flush(gw)
    alice = stored_requests(gw.settings, "alice", [])
    assert alice.sessions == 1 and len(alice.requests) == 2
    assert {t for t, _, _, _ in alice.requests} == {"alice"} and {f for _, _, f, _ in alice.requests} == {"chat"}
    # Named by its id, a session is still only the tenant's own.
    assert len(stored_requests(gw.settings, "bob", ["shared-id"]).requests) == 3
    with pytest.raises(LookupError):
        stored_requests(gw.settings, "alice", ["bob-only"])

    config = tmp_path / "replay.toml"
    # The deployment's own config: its providers and keys never reach the replay (nothing listens on port 9).
    config.write_text(f'[store]\npath = "{gw.settings.store.path}"\n[tenants]\nalice = "pk-alice"\nbob = "pk-bob"\n'
                      '[upstream]\nbase_url = "http://127.0.0.1:9/v1"\napi_key = "sk-operator"\n'
                      '[upstreams.far]\nbase_url = "http://127.0.0.1:9/v1"\nmodels = ["fake-*"]\n')
    done = _cli("--config", str(config), "--tenant", "alice", "--profiles", "balanced", "--json", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout)
    assert result["sessions"] == 1 and result["requests"] == 2 and result["approximate"] == 0
    assert result["profiles"][0]["rejections"] == 0 and result["profiles"][0]["upstream_prompt_tokens"] > 0
    both = json.loads(_cli("--config", str(config), "--session", "shared-id", "--profiles", "balanced", "--json",
                           cwd=tmp_path).stdout)
    assert both["sessions"] == 2 and both["requests"] == 5  # one id, two tenants: two sessions, never mixed
    missing = _cli("--config", str(config), "--tenant", "alice", "--session", "bob-only", cwd=tmp_path)
    assert missing.returncode == 2 and "no stored session 'bob-only' of tenant 'alice'" in missing.stderr
    mixed = _cli("--config", str(config), "--from", str(config), "--tenant", "alice", cwd=tmp_path)
    assert mixed.returncode == 2 and "do not apply with --from" in mixed.stderr


async def test_sessions_recorded_before_request_forms_replay_approximately(start_gateway, tmp_path):
    gw = await start_gateway()
    for fmt in ("chat", "responses", "messages"):
        await _session(gw, fmt, f"old-{fmt}", "sk-one", turns=3)
    await _session(gw, "chat", "older", "sk-two", turns=2)
    _flush(gw)
    db = sqlite3.connect(Path(gw.settings.store.path) / "turns.sqlite3")
    with db:
        db.execute("UPDATE turns SET form = NULL, route = NULL")  # as a turn log written before forms
        older = stored_requests(gw.settings, None, ["older"]).requests[0][1]
        db.execute("DELETE FROM turns WHERE session_key = ?", (older,))  # as a session before the turn log
    db.close()
    stored = stored_requests(gw.settings, None, [])
    assert stored.sessions == 4 and stored.approximate == len(stored.requests) == 3 * 3 + 2
    # The format comes from the ledger's wire items; the conversation is the recorded one.
    formats = {s: f for _, s, f, _ in stored.requests}
    assert sorted(formats.values()) == ["chat", "chat", "messages", "responses"]
    config = tmp_path / "replay.toml"
    config.write_text(f'[store]\npath = "{gw.settings.store.path}"\n')
    done = _cli("--config", str(config), "--profiles", "balanced,direct", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert "11 of them rebuilt approximately" in done.stdout
    result = json.loads(_cli("--config", str(config), "--profiles", "balanced", "--json", cwd=tmp_path).stdout)
    assert result["approximate"] == 11 and result["profiles"][0]["rejections"] == 0


async def test_a_chained_responses_request_is_rebuilt_with_the_whole_input(start_gateway):
    """A request that named a ``previous_response_id`` comes back as the full input the chain
    stood for: the replay's gateway holds no such response."""
    gw = await start_gateway()
    opening = {"model": "fake-32k", "instructions": "You are a build agent.", "tools": TOOLS["responses"],
               "input": [{"type": "message", "role": "developer", "content": "Prefer small steps."},
                         {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "Run the build."}]}]}
    headers = {"Authorization": "Bearer sk-one", "X-Session-Id": "chain"}
    async with aiohttp.ClientSession() as http:
        async with http.post(gw.base_url + "/responses", json=opening, headers=headers) as r:
            answer = await r.json()
            assert r.status == 200, answer
        user = {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "Go on."}]}
        chained = {"model": "fake-32k", "instructions": "You are a build agent.", "tools": TOOLS["responses"],
                   "previous_response_id": answer["id"], "input": [user]}
        async with http.post(gw.base_url + "/responses", json=chained, headers=headers) as r:
            assert r.status == 200, await r.text()
    _flush(gw)
    stored = stored_requests(gw.settings, None, [])
    assert stored.approximate == 0 and [b for _, _, _, b in stored.requests][0] == opening
    rebuilt = stored.requests[1][3]
    assert "previous_response_id" not in rebuilt and rebuilt["instructions"] == chained["instructions"]
    # The chain's history (the opening's developer message is an instruction of that request, not history), then the new turn.
    assert rebuilt["input"] == [opening["input"][1], *answer["output"], user]
