"""Real coding-agent CLIs straight against the strict simulator: the problem the gateway solves.

Codex CLI (``codex exec``), Claude Code (``claude -p``) and Qwen Code (``qwen``, Chat
Completions) run a chain of 34 shell calls, each printing 1-4k tokens and the next directive
(tests/support/chain.py). On a 128k model each finishes it; on a 32k model each is refused for
the window long before the end. The binaries
come from .ci/run (tests/support/clis.py); without them these tests skip, under CI they fail.
"""

from __future__ import annotations

import orjson

from simulator.counting import count_prompt
from simulator.messages_rules import blocks
from simulator.puppet import PUPPET_STATE, RECEIVED
from simulator.responses_input import check_context, count_context
from tests.support.chain import first_prompt
from tests.support.clis import run_claude, run_codex, run_qwen

STEPS = 34


def requests(app, path: str) -> list[dict]:
    return [orjson.loads(r["body"]) for r in app[RECEIVED] if r["path"] == path and r["body"]]


def codex_outputs(body: dict) -> list[str]:
    return [item["output"] for item in body["input"] if item.get("type") == "function_call_output"]


def claude_results(body: dict) -> list[str]:
    return [block["content"] for message in body["messages"] if message["role"] == "user"
            and isinstance(message["content"], list) for block in message["content"]
            if block.get("type") == "tool_result"]


async def test_codex_completes_the_chain_on_a_128k_model(puppet, tmp_path):
    app, base_url = puppet
    run = await run_codex(base_url, first_prompt("codex", STEPS), model="fake-128k", home=tmp_path)
    assert run.returncode == 0, run.stderr[-2000:]
    sent = requests(app, "/v1/responses")
    assert len(sent) == STEPS + 1
    outputs = codex_outputs(sent[-1])
    assert len(outputs) == STEPS and f"CHAIN COMPLETE after {STEPS} steps" in outputs[-1]
    assert "Tool exec_command returned" in run.stdout
    state = app[PUPPET_STATE]
    for body in sent:  # what the puppet accepted is paired, reasoning-bound and inside the window
        assert body["store"] is False and body["include"] == ["reasoning.encrypted_content"]
        check_context(body["input"], state.secret, state.bound_reasoning, set())
        tokens = sum(t for _, t in count_context(body.get("instructions"), body["input"], body["tools"], state.secret))
        assert tokens <= 128_000


async def test_codex_runs_out_of_window_on_a_32k_model(puppet, tmp_path):
    app, base_url = puppet
    run = await run_codex(base_url, first_prompt("codex", STEPS), model="fake-32k", home=tmp_path)
    assert run.returncode == 1
    assert "ran out of room in the model's context window" in run.stderr
    sent = requests(app, "/v1/responses")
    last = sent[-1]
    tokens = sum(t for _, t in count_context(last.get("instructions"), last["input"], last["tools"],
                                             app[PUPPET_STATE].secret))
    assert tokens > 32_000 and len(codex_outputs(last)) < STEPS // 2


async def test_claude_code_completes_the_chain_on_a_128k_model(puppet, tmp_path):
    app, base_url = puppet
    run = await run_claude(base_url, first_prompt("claude", STEPS), model="fake-128k", home=tmp_path)
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-2000:]
    sent = requests(app, "/v1/messages")
    results = claude_results(sent[-1])
    assert len(results) == STEPS and f"CHAIN COMPLETE after {STEPS} steps" in results[-1]
    assert "Tool Bash returned" in run.stdout
    for body in sent:
        assert body["thinking"]["type"] in ("adaptive", "enabled")
        assert any(m["role"] == "system" for m in body["messages"])  # its mid-conversation system message
        assert sum(t for _, t, _ in blocks(body)) <= 128_000


async def test_claude_code_is_refused_prompt_too_long_on_a_32k_model(puppet, tmp_path):
    app, base_url = puppet
    run = await run_claude(base_url, first_prompt("claude", STEPS), model="fake-32k", home=tmp_path)
    assert run.returncode != 0
    assert "Prompt is too long" in run.stdout + run.stderr
    sent = requests(app, "/v1/messages")
    refused = [body for body in sent if sum(t for _, t, _ in blocks(body)) > 32_000]
    assert refused, "no request went over the window"
    assert max(len(claude_results(body)) for body in sent) < STEPS // 2


def qwen_results(body: dict) -> list[str]:
    return [str(message["content"]) for message in body["messages"] if message["role"] == "tool"]


async def test_qwen_code_completes_the_chain_on_a_128k_model(puppet, tmp_path):
    """Past ~92k tokens (70% of the 131,072 it assumes for a model it does not know) Qwen Code
    has the model compress the older history once and keeps the newest steps verbatim, so the
    chain goes on: one request per model turn, plus that one."""
    app, base_url = puppet
    run = await run_qwen(base_url, first_prompt("qwen", STEPS), model="fake-128k", home=tmp_path)
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-2000:]
    sent = requests(app, "/v1/chat/completions")
    snapshots = [body for body in sent if "<state_snapshot>" in str(body["messages"][-1]["content"])]
    assert len(snapshots) <= 1 and len(sent) == STEPS + 1 + len(snapshots)
    assert f"CHAIN COMPLETE after {STEPS} steps" in qwen_results(sent[-1])[-1]
    assert "Tool run_shell_command returned" in run.stdout
    for body in sent:
        assert count_prompt(body) + body["max_tokens"] <= 128_000


async def test_qwen_code_is_refused_for_the_window_on_a_32k_model(puppet, tmp_path):
    """The simulator refuses the request that no longer fits next to its 8,000 output tokens;
    Qwen Code then has the model compress its history (its state snapshot) and, from the
    simulator's scripted snapshot, no longer knows the next step: the chain is never finished."""
    app, base_url = puppet
    run = await run_qwen(base_url, first_prompt("qwen", STEPS), model="fake-32k", home=tmp_path)
    sent = requests(app, "/v1/chat/completions")
    refused = [body for body in sent if count_prompt(body) + body["max_tokens"] > 32_000]
    assert refused, "no request went over the window"
    assert max(len(qwen_results(body)) for body in sent) < STEPS // 2
    assert not any(f"CHAIN COMPLETE after {STEPS} steps" in str(body["messages"]) for body in sent)
    assert "CHAIN COMPLETE" not in run.stdout
