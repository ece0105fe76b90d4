"""Standing instructions pinned verbatim, and summaries checked before they replace anything,
through the gateway on all three wire formats (raw HTTP against the strict simulator on
fake-32k): what the upstream received."""

from __future__ import annotations

import aiohttp
import orjson
import pytest
from aiohttp import web

from gateway.keys import CHECKPOINTS, LEDGER
from policies.pinned import PINNED_OPEN
from simulator.standing import ROUTES, play
from simulator.workloads import synthetic_session
from tests.conftest import _serve
from tests.support.agent import settle

# Cached reads at half price: the summary these tests look at comes early in a 26-round session
# (at 0.1 the cost model lets placeholders pile up longer first: policies/cost.settle_size).
ECONOMY = {"profile": "economy", "cached_input_rate": 0.5}
RULES = ["From now on, never run database migrations against the orion cluster without my written approval.",
         "Always sign every commit message with \"Reviewed-by: Ada Okafor\".",
         "Do not ever edit files under /srv/app/cache/ without asking me first."]
REVOKED = "Actually, you may now run database migrations against the orion cluster without asking."
REVOKE_AT = 26  # a round after the session's first summary
CLAUDE_MD = (
    "<system-reminder>\nAs you answer the user's questions, you can use the following context:\n# claudeMd\n"
    "Codebase and user instructions are shown below. Be sure to adhere to these instructions.\n\n"
    "Contents of /repo/CLAUDE.md (project instructions, checked into the codebase):\n\n"
    "- Use pnpm, never npm.\n- Keep functions under 40 lines.\n\n"
    "      IMPORTANT: this context may or may not be relevant to your tasks.\n</system-reminder>\n")
AGENTS_MD = "# AGENTS.md instructions for /tmp/work\n\n<INSTRUCTIONS>\n- Run `pytest -q` before every commit.\n</INSTRUCTIONS>"


def session_with_rules(seed: int, rounds: int, *, revoke_at: int | None = None, first: str = ""):
    session = synthetic_session(seed, rounds=rounds)
    for i, rule in enumerate(RULES):
        session.rounds[1 + 2 * i]["user"] = f"{rule} {session.rounds[1 + 2 * i]['user']}"
    if revoke_at is not None:
        session.rounds[revoke_at]["user"] = f"{REVOKED} {session.rounds[revoke_at]['user']}"
    if first:
        session.rounds[0]["user"] = first + session.rounds[0]["user"]
    return session


def client_requests(upstream, fmt: str) -> list[dict]:
    return [r["json"] for r in upstream.received if r["path"].endswith(ROUTES[fmt]) and r.get("json")
            and r["headers"].get("x-palimpsest-purpose") != "summary"]


def gateway_blocks(fmt: str, body: dict) -> list[str]:
    """The texts the gateway put between the client's instructions and the conversation."""
    if fmt == "chat":
        return [m["content"] for m in body["messages"][1:] if m["role"] == "system"]
    if fmt == "responses":
        return [i["content"][0]["text"] for i in body["input"][1:] if i.get("role") == "developer"]
    return [b["text"] for b in body["system"][1:]] if isinstance(body.get("system"), list) else []


def pinned_of(fmt: str, body: dict) -> str | None:
    blocks = gateway_blocks(fmt, body)
    return next((b for b in blocks if b.startswith(PINNED_OPEN)), None)


@pytest.mark.parametrize("fmt", ["chat", "responses", "messages"])
async def test_rules_reach_every_late_request_verbatim_in_a_stable_block_before_the_summary(upstream, start_gateway, fmt):
    gw = await start_gateway(policy=ECONOMY)
    async with aiohttp.ClientSession() as http:
        statuses = await play(http, gw.base_url, fmt, session_with_rules(1, 26), f"pin-{fmt}")
    await settle(gw)
    assert set(statuses) == {200}
    sent = client_requests(upstream, fmt)
    late = sent[-10:]
    assert all(PINNED_OPEN in orjson.dumps(b).decode() for b in late)
    for body in late:
        blocks = gateway_blocks(fmt, body)
        # In the format's own place: right after the client's instructions, then the summary.
        assert blocks[0].startswith(PINNED_OPEN) and blocks[1].startswith("<session_summary>"), blocks
        assert [RULES.index(r) for r in RULES if r in blocks[0]] == [0, 1, 2]
        assert [blocks[0].index(r) for r in RULES] == sorted(blocks[0].index(r) for r in RULES)  # first appearance
    # No rule changed after round 6: every request that carries the block carries the same bytes.
    assert len({pinned_of(fmt, b) for b in sent if pinned_of(fmt, b)}) == 1
    # The rounds that stated the rules are summarised away: no user turn of the view holds them.
    users = [m for m in (late[-1].get("messages") or late[-1].get("input")) if m.get("role") == "user"]
    assert users and not any(RULES[0] in orjson.dumps(m).decode() for m in users)


@pytest.mark.parametrize("fmt", ["chat", "responses", "messages"])
async def test_a_later_revocation_updates_the_rule_in_its_place(upstream, start_gateway, fmt):
    gw = await start_gateway(policy=ECONOMY)
    async with aiohttp.ClientSession() as http:
        assert set(await play(http, gw.base_url, fmt, session_with_rules(2, 32, revoke_at=REVOKE_AT), f"rev-{fmt}")) == {200}
    await settle(gw)
    sent = client_requests(upstream, fmt)
    # The block exists once a summary hides part of the path (about round 22 of this session on
    # fake-32k, whatever the search's speed: tests/recall/test_recall_auto_calibration.py);
    # the revocation comes after it, so the block is seen before and after it.
    revoking = next(i for i, b in enumerate(sent) if REVOKED in orjson.dumps(b).decode())
    assert pinned_of(fmt, sent[revoking - 1]) is not None
    blocks = [p for b in sent if (p := pinned_of(fmt, b))]
    before, after = blocks[0], blocks[-1]
    assert RULES[0] in before and REVOKED not in before
    assert RULES[0] not in after and after.index(REVOKED) < after.index(RULES[1]) < after.index(RULES[2])
    assert len(dict.fromkeys(blocks)) == 2  # the block changed once: when the rule did


@pytest.mark.parametrize("fmt,first", [("messages", CLAUDE_MD), ("responses", AGENTS_MD + "\n\n")])
async def test_instruction_files_agents_inject_are_pinned_whole(upstream, start_gateway, fmt, first):
    gw = await start_gateway(policy=ECONOMY)
    async with aiohttp.ClientSession() as http:
        assert set(await play(http, gw.base_url, fmt, session_with_rules(3, 26, first=first), f"file-{fmt}")) == {200}
    await settle(gw)
    block = pinned_of(fmt, client_requests(upstream, fmt)[-1])
    assert block is not None
    if fmt == "messages":
        assert "Contents of /repo/CLAUDE.md (project instructions, checked into the codebase):\n\n- Use pnpm, never npm." in block
        assert "may or may not be relevant" not in block
    else:
        assert AGENTS_MD in block
    assert block.index("CLAUDE.md" if fmt == "messages" else "AGENTS.md") < block.index(RULES[0])


async def test_pinning_off_leaves_the_rules_to_the_checked_summary(upstream, start_gateway):
    gw = await start_gateway(policy={**ECONOMY, "pinned_ratio": 0})
    async with aiohttp.ClientSession() as http:
        assert set(await play(http, gw.base_url, "chat", session_with_rules(4, 26), "off")) == {200}
    await settle(gw)
    last = client_requests(upstream, "chat")[-1]
    assert pinned_of("chat", last) is None
    summary = next(b for b in gateway_blocks("chat", last) if b.startswith("<session_summary>"))
    assert all(rule in summary for rule in RULES)  # the check quoted every rule the block no longer holds


# --- summaries checked: a summary model that makes up an instruction ---------------------------

HEADINGS = ("Goal", "Constraints and prohibitions", "Decisions and ruled out", "Important user messages",
            "Entities and exact values", "Files and resources", "Errors and fixes", "Open tasks", "Current work",
            "Next step")


async def summary_model(constraints: list[str]):
    """A summary endpoint of its own (summary_base_url) answering every call with a summary
    whose constraints the test chooses."""
    calls: list[dict] = []

    async def complete(request: web.Request) -> web.Response:
        calls.append(await request.json())
        text = "\n".join(f"## {h}\n" + ("\n".join(f"- {c}" for c in constraints) if h == HEADINGS[1] else "- None")
                         for h in HEADINGS)
        return web.json_response({"id": "s", "object": "chat.completion", "choices": [
            {"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": "stop"}],
            "usage": {"prompt_tokens": 10, "completion_tokens": 10, "total_tokens": 20}})

    app = web.Application()
    app.router.add_post("/v1/chat/completions", complete)
    runner, port = await _serve(app)
    return runner, f"http://127.0.0.1:{port}/v1", calls


def chatter(rounds: int) -> list[str]:
    """User turns of plain prose (no tools, no exact values), ~1,300 tokens each."""
    words = "the cache worker keeps a queue of requests and retries them after a timeout".split()
    return [RULES[0] + "\n" + " ".join(words * 90)] + [f"Turn {i}: " + " ".join(words * 90) for i in range(1, rounds)]


async def chat_turns(gw, session: str, turns: list[str]) -> None:
    history = [{"role": "system", "content": "You are terse."}]
    async with aiohttp.ClientSession() as http:
        for text in turns:
            history.append({"role": "user", "content": text})
            async with http.post(gw.base_url + "/chat/completions", headers={"X-Session-Id": session},
                                 json={"model": "fake-32k", "messages": history}) as resp:
                assert resp.status == 200
                history.append((await resp.json())["choices"][0]["message"])
            await settle(gw)


def metric(gw, name: str, **labels) -> float:
    from gateway.keys import METRICS

    return gw.app[METRICS].registry.get_sample_value(name, labels) or 0.0


async def test_an_invented_instruction_is_dropped_and_counted(upstream, start_gateway):
    runner, url, calls = await summary_model([
        "Do not run database migrations against the orion cluster without the user's written approval.",
        "Always deploy straight to production on Fridays without running the tests."])
    try:
        gw = await start_gateway(policy={**ECONOMY, "summary_base_url": url})
        await chat_turns(gw, "invented", chatter(30))
        assert calls, "no summary was written"
        key = gw.app[LEDGER].sessions()[0].key
        stored = gw.app[CHECKPOINTS].list(key)
        assert stored and all("Fridays" not in cp.summary for cp in stored)
        assert all("orion cluster without the user's written approval" in cp.summary for cp in stored)
        assert metric(gw, "palimpsest_summary_checks_total", outcome="repaired") >= 1
        assert metric(gw, "palimpsest_summary_check_problems_total", problem="invented") >= 1
        last = client_requests(upstream, "chat")[-1]
        assert "Fridays" not in orjson.dumps(last).decode() and RULES[0] in pinned_of("chat", last)
    finally:
        await runner.cleanup()


async def test_a_mostly_invented_summary_is_refused_and_nothing_replaces_the_old_one(upstream, start_gateway):
    made_up = [f"Never touch the {w} service configuration files again." for w in
               ("alpha", "beta", "gamma", "delta", "epsilon", "zeta", "theta")]
    runner, url, calls = await summary_model(made_up)
    try:
        gw = await start_gateway(policy={**ECONOMY, "summary_base_url": url})
        await chat_turns(gw, "refused", chatter(30))
        assert calls, "no summary was asked for"
        key = gw.app[LEDGER].sessions()[0].key
        assert gw.app[CHECKPOINTS].list(key) == []  # refused: no checkpoint written
        assert metric(gw, "palimpsest_summary_checks_total", outcome="refused") >= 1
        # Every request still went upstream inside the window, with the rule pinned once hidden.
        sent = client_requests(upstream, "chat")
        assert not any("service configuration" in orjson.dumps(b).decode() for b in sent)
    finally:
        await runner.cleanup()
