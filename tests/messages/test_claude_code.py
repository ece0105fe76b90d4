"""Claude Code itself (``claude -p --allowedTools Bash``) through the gateway on a 32k model.

Straight against the strict simulator Claude Code is refused "prompt is too long" on fake-32k
long before the end of a Bash chain (tests/simulator/test_cli_chains.py). Through the
gateway a 60-step chain completes: every request the upstream received is accepted by Anthropic's
rules (alternation, tool_result placement, at most 4 breakpoints, thinking signatures that
verify) and fits the window, with placeholders and a summary in place of old results; the
client's key (``x-api-key``) is one of the gateway's client keys, and summary jobs speak Messages. The
binary comes from .ci/run (tests/support/clis.py); without it this test skips, under CI it fails.
"""

from __future__ import annotations

import pytest
from multidict import CIMultiDict

from simulator.messages_rules import blocks, validate
from tests.support.chain import first_prompt
from tests.support.clis import run_claude

# Long enough that placeholders alone cannot keep it under the window, whatever the release's
# own prompt: Claude Code 2.1.332 sends half the tool definitions 2.1.197 did (the rest deferred
# behind ToolSearch), and its 34-step chain fitted with placeholders only, no summary needed.
STEPS = 60
WINDOW = 32_000


@pytest.mark.parametrize("one_hour", [False, True], ids=["5m", "1h"])
async def test_claude_code_completes_a_60_step_bash_chain_through_the_gateway_on_32k(upstream, start_gateway, tmp_path, one_hour):
    """With ENABLE_PROMPT_CACHING_1H Claude Code marks its system and newest message ttl "1h":
    the gateway keeps the hour on the summary block it adds, and no request breaks Anthropic's
    TTL order (validate checks it)."""
    gw = await start_gateway(server={"client_keys": "required"}, tenants={"dev": "sk-ant-dev"},
                             upstream={"format": "anthropic"})
    run = await run_claude(gw.root, first_prompt("claude", STEPS), model="fake-32k", home=tmp_path,
                           api_key="sk-ant-dev", timeout_s=300,
                           extra_env={"ENABLE_PROMPT_CACHING_1H": "1"} if one_hour else None)
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-2000:]
    assert "Prompt is too long" not in run.stdout + run.stderr
    received = [r for r in upstream.received if r["path"] == "/v1/messages" and r.get("json")]
    work = [r for r in received if r["headers"].get("x-palimpsest-purpose") != "summary"]
    secret = upstream.state.secret
    calls: set[str] = set()
    for r in work:
        body = r["json"]
        validate(body, CIMultiDict(r["headers"]), secret)  # what Anthropic would accept, signatures included
        assert sum(t for _, t, _ in blocks(body)) <= WINDOW
        assert any(m["role"] == "system" for m in body["messages"]) or len(body["messages"]) > 1
        calls.update(b["id"] for m in body["messages"] if m["role"] == "assistant" and isinstance(m["content"], list)
                     for b in m["content"] if b.get("type") == "tool_use" and b.get("name") == "Bash")
    assert len(calls) >= STEPS - 4, len(calls)
    # Its mid-conversation system turn reached the upstream as one (no beta header needed since
    # 2.1.332), not folded into the user turn after a refusal.
    assert [m["role"] for m in work[0]["json"]["messages"]][:2] == ["user", "system"]
    # Its thinking blocks went back as they came (validate checked their signatures); under
    # display "omitted" (2.1.332) with the empty text the provider gave.
    thoughts = [(r["json"]["thinking"].get("display"), b["thinking"]) for r in work for m in r["json"]["messages"]
                if m["role"] == "assistant" and isinstance(m["content"], list)
                for b in m["content"] if b.get("type") == "thinking"]
    assert thoughts and all(text == "" for display, text in thoughts if display == "omitted")
    last = work[-1]["json"]
    results = [b for m in last["messages"] if m["role"] == "user" and isinstance(m["content"], list)
               for b in m["content"] if b.get("type") == "tool_result"]
    assert f"CHAIN COMPLETE after {STEPS} steps" in str(results[-1]["content"])
    text = [str(r["json"]) for r in work]
    assert any("[Tool result compacted by the gateway]" in t for t in text), "no placeholder upstream"
    assert any("<session_summary>" in t for t in text), "no summary block upstream"
    assert len(received) > len(work)  # the summary jobs spoke Messages to the Anthropic upstream
    ttls = [t for r in work for _, _, t in blocks(r["json"]) if t]
    assert ("1h" in ttls) == one_hour
    summarised = [r["json"] for r in work if "<session_summary>" in str(r["json"].get("system"))]
    for body in summarised:  # the summary block's marker: the client's lifetime for its conversation
        assert blocks({**body, "tools": [], "messages": []})[-1][2] == ("1h" if one_hour else "5m")


async def test_claude_code_runs_the_chain_on_a_chat_only_model(upstream, start_gateway, tmp_path):
    """Claude Code on a model served only as Chat Completions (``[models."fake-32k"] api = "chat"``):
    every request it makes reaches the upstream as a chat completion (none as Messages), each
    accepted and within the 32k window, and the chain completes with placeholders and a summary
    upstream. Thinking blocks, had there been any, would be named in x-palimpsest-dropped."""
    from gateway.keys import METRICS

    gw = await start_gateway(server={"client_keys": "required"}, tenants={"dev": "sk-ant-dev"},
                             models={"fake-32k": {"api": "chat"}})
    run = await run_claude(gw.root, first_prompt("claude", STEPS), model="fake-32k", home=tmp_path,
                           api_key="sk-ant-dev", timeout_s=300)
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-2000:]
    assert "Prompt is too long" not in run.stdout + run.stderr
    assert not [r for r in upstream.received if r["path"].startswith("/v1/messages")]  # nothing as Messages
    chats = upstream.chat_requests()
    work = [r for r in chats if r["headers"].get("x-palimpsest-purpose") != "summary"]
    assert len(chats) > len(work)  # the summary jobs ran, as chat completions
    steps = {m["content"].split("\n", 1)[0] for r in work for m in r["json"]["messages"]
             if m["role"] == "tool" and str(m["content"]).startswith("step ")}
    assert len(steps) >= STEPS - 4, sorted(steps)  # "step N of 60": the results of the chain's Bash calls
    last = work[-1]["json"]["messages"]
    assert f"CHAIN COMPLETE after {STEPS} steps" in str([m for m in last if m["role"] == "tool"][-1]["content"])
    text = [str(r["json"]) for r in work]
    assert any("[Tool result compacted by the gateway]" in t for t in text), "no placeholder upstream"
    assert any("<session_summary>" in t for t in text), "no summary block upstream"
    rendered = gw.app[METRICS].render().decode()
    rejected = [line for line in rendered.splitlines()
                if line.startswith(("palimpsest_upstream_errors_total", "palimpsest_context_length_rejections_total"))
                and not line.endswith(" 0.0")]
    assert rejected == []  # 0 rejections: the upstream refused nothing, nothing was too long to send
