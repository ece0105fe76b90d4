"""Qwen Code (the real binary, ``qwen PROMPT``) through the gateway on a 32k model: Chat Completions.

Straight against the strict simulator Qwen Code is refused for the window a few steps into the
34-step shell chain and never finishes it (tests/simulator/test_cli_chains.py): its system prompt
and tools take ~16.6k tokens and it asks for 8,000 out. Through the gateway the chain completes:
one upstream request per model turn (none refused), each a paired conversation inside the
window, old results as placeholders, summary jobs on the side. Then, in the same session
(``qwen --continue``), a question about a result long gone from the view is answered by the
gateway's recall tools, which the client never sees. Without a session header it is passed
through untouched and runs out of room as it does direct. The binary comes from .ci/run
(tests/support/clis.py): without it the test skips, under CI it fails.
"""

from __future__ import annotations

import re

import pytest

from gateway.keys import LEDGER, METRICS
from simulator.counting import count_prompt
from tests.chat.test_agent_loops import assert_valid_and_fits, forwarded
from tests.support.chain import filler, first_prompt
from tests.support.clis import run_qwen

STEPS = 34
WINDOW = 32_000
PLACEHOLDER = "[Tool result compacted by the gateway]"


def tool_names(body: dict) -> set[str]:
    return {t["function"]["name"] for t in body.get("tools") or ()}


def recorded_calls(home) -> list[str]:
    """The names of the tool calls in Qwen Code's own record of its session (~/.qwen/projects)."""
    names = []
    for path in (home / ".qwen" / "projects").rglob("*.jsonl"):
        for line in path.read_text().splitlines():
            names += re.findall(r'"name":\s*"(\w+)"', line)
    return names


@pytest.mark.parametrize("session", ["header", "fingerprint"])
async def test_qwen_code_completes_a_34_step_chain_on_a_32k_model_through_the_gateway(start_gateway, upstream, tmp_path,
                                                                                      session):
    """``header``: Qwen Code's settings add X-Session-Id (customHeaders, README's recipe);
    ``fingerprint``: it sends nothing that names a session and the gateway names it from the key
    and the first message (``session.fallback``)."""
    gw = await start_gateway(session={"fallback": "fingerprint"} if session == "fingerprint" else {})
    named = "qwen-chain-1" if session == "header" else None
    run = await run_qwen(gw.base_url, first_prompt("qwen", STEPS), model="fake-32k", home=tmp_path,
                         session=named, timeout_s=120)
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-2000:]
    # The client finished with the chain's last result, answered in text.
    assert "Tool run_shell_command returned" in run.stdout and f"qwen {STEPS} {STEPS}" in run.stdout
    bodies = forwarded(upstream)
    assert len(bodies) == STEPS + 1  # one upstream call per model turn: none refused, none retried
    assert_valid_and_fits(bodies)  # paired tool calls; prompt + max_tokens inside the 32k window
    assert all(b["max_tokens"] == 8000 and b["stream"] for b in bodies)  # the client's own fields
    last = [m for m in bodies[-1]["messages"] if m["role"] == "tool"]
    assert f"CHAIN COMPLETE after {STEPS} steps" in str(last[-1]["content"])
    assert any(PLACEHOLDER in str(b["messages"]) for b in bodies)
    assert any("session_search" in tool_names(b) for b in bodies)  # recall offered once results are hidden
    summaries = [r for r in upstream.chat_requests() if r["headers"].get("x-palimpsest-purpose") == "summary"]
    assert summaries and any("<session_summary>" in str(b["messages"]) for b in bodies)
    rendered = gw.app[METRICS].render().decode()
    rejected = [line for line in rendered.splitlines()
                if line.startswith(("palimpsest_upstream_errors_total", "palimpsest_context_length_rejections_total"))
                and not line.endswith(" 0.0")]
    assert rejected == []

    # Same session, one more turn: a line of step 3's log, long since a placeholder upstream.
    line = filler(3).splitlines()[5]
    words = line.split(" INFO ", 1)[1]
    before = len(upstream.chat_requests())
    again = await run_qwen(gw.base_url, f"RECALL: {words}", model="fake-32k", home=tmp_path, session=named,
                           timeout_s=60, resume=True)
    assert again.returncode == 0, again.stdout[-2000:] + again.stderr[-2000:]
    assert again.stdout.startswith("ANSWER:") and words in again.stdout, again.stdout[:500]
    recall = [r["json"] for r in upstream.chat_requests()[before:] if not r["headers"].get("x-palimpsest-purpose")]
    assert len(recall) >= 2  # the question, then the gateway's own answer to the model's search
    assert any(m.get("tool_calls") and "session_" in m["tool_calls"][0]["function"]["name"]
               for b in recall for m in b["messages"])
    # One session in the ledger, named by the header (from $PALIMPSEST_SESSION) or the fingerprint.
    sessions = gw.app[LEDGER].sessions()
    assert len(sessions) == 1 and sessions[0].requests == STEPS + 2  # the chain, the question
    assert sessions[0].session_id == named if named else sessions[0].session_id.startswith("fp:")
    calls = recorded_calls(tmp_path)
    assert calls.count("run_shell_command") >= STEPS  # the client's record of its own calls ...
    assert not [n for n in calls if n.startswith("session_")]  # ... has none of the recall calls


async def test_without_a_session_header_qwen_code_passes_through_and_runs_out_of_room(start_gateway, upstream, tmp_path):
    """What README warns of: Qwen Code names no session, so without X-Session-Id in its settings
    (and ``session.fallback`` off, the default) the gateway records nothing and forwards its
    requests as they came: the upstream refuses one for the window, as it does direct."""
    gw = await start_gateway()
    run = await run_qwen(gw.base_url, first_prompt("qwen", STEPS), model="fake-32k", home=tmp_path,
                         session=None, timeout_s=60)
    assert gw.app[LEDGER].sessions() == []
    bodies = forwarded(upstream)
    assert not any(PLACEHOLDER in str(b["messages"]) for b in bodies)
    assert any(count_prompt(b) + b["max_tokens"] > WINDOW for b in bodies)  # refused: over the window
    assert not any(f"CHAIN COMPLETE after {STEPS} steps" in str(b["messages"]) for b in bodies)
    assert "CHAIN COMPLETE" not in run.stdout
