"""The hidden-context index (policies/hidden_index.py) on every format, through real HTTP: once a
checkpoint hides part of a session, the upstream receives a list of what is hidden (topics,
entities, exact values) where every event id is a hidden event of this conversation that holds
the listed item, in the cached prefix (the same bytes while the checkpoint stays)."""

from __future__ import annotations

import re

import orjson

from gateway.keys import LEDGER
from policies.hidden_index import INDEX_CLOSE, INDEX_OPEN
from simulator.workloads import agent_loop_session, synthetic_session
from tests.pipeline.test_compaction import client as chat_client
from tests.messages.test_messages import ECONOMY, client_for, messages_requests, run_loop
from tests.responses.test_responses import client as responses_client, gateway_config, responses_bodies
from tests.support.agent import drive, drive_responses_loop, settle

INDEX = re.compile(re.escape(INDEX_OPEN) + r".*?" + re.escape(INDEX_CLOSE), re.S)
ITEM = re.compile(r"([^;|\n]+?) \((ev_[0-9a-f]+)\)")


def indexes(texts: list[str]) -> list[str]:
    """The index block of each upstream request that has one."""
    return [m.group(0) for t in texts if (m := INDEX.search(t))]


def text_of(content) -> str:
    if isinstance(content, str):
        return content
    return " ".join(p.get("text", "") for p in content or () if isinstance(p, dict))


def check_index(gw, index: str, visible: str, topics_too: bool = True) -> None:
    """Every listed event exists in the ledger, holds its item, and is not shown in the view.
    An agent loop of one task has no hidden user turn (the task stays in view): values only."""
    ledger = gw.app[LEDGER]
    key = ledger.sessions()[0].key
    topics = re.findall(r"^- (ev_[0-9a-f]+): (.+)$", index, re.M)
    items = ITEM.findall(index.split("entities:", 1)[-1]) if "entities:" in index or "values:" in index else []
    assert items and (topics or not topics_too), index
    for event_id, words in topics:
        event = ledger.get(key, event_id)
        assert event is not None and event.role == "user"
        text = orjson.dumps(event.message).decode().lower()
        assert any(w in text for w in words.split()), (event_id, words)
    for value, event_id in items:
        value = value.strip(" …").removeprefix("entities: ").removeprefix("values: ")
        event = ledger.get(key, event_id)
        assert event is not None, event_id
        assert value in orjson.dumps(event.message).decode() or value in str(event.message), (value, event_id)
    for event_id, _ in topics:
        content = orjson.dumps(ledger.get(key, event_id).message.get("content")).decode()
        assert content not in visible  # hidden: not in the request the index rides on


def stable(blocks: list[str]) -> None:
    """Consecutive requests carry the same index until a new checkpoint replaces it."""
    changes = sum(a != b for a, b in zip(blocks, blocks[1:]))
    assert changes < len(blocks) // 2, changes


async def test_chat_upstream_receives_an_index_of_what_the_checkpoint_hides(start_gateway, upstream):
    gw = await start_gateway(policy={"profile": "economy"})
    session = synthetic_session(seed=1, rounds=30)
    await drive(chat_client(gw, "idx-chat"), session, model="fake-32k")
    await settle(gw)
    bodies = [r["json"] for r in upstream.chat_requests() if not r["headers"].get("x-palimpsest-purpose")]
    texts = [orjson.dumps(b["messages"]).decode() for b in bodies]
    blocks = indexes([m["content"] for b in bodies for m in b["messages"][:3] if isinstance(m.get("content"), str)])
    assert blocks, "no request carried a hidden-context index"
    last = bodies[-1]["messages"]
    system = next(m["content"] for m in last if m["role"] == "system" and INDEX_OPEN in m["content"])
    # It rides in the gateway's summary message, after the summary, before the conversation.
    assert system.startswith("<session_summary>") and system.index(INDEX_OPEN) > system.index("</session_summary>")
    check_index(gw, blocks[-1], orjson.dumps(last[2:]).decode())
    stable(blocks)
    # The planted facts of the hidden span are named in it with the event holding them.
    hidden_facts = [f for f in session.facts if f.answer not in orjson.dumps(last[2:]).decode()]
    assert hidden_facts and any(f.answer in blocks[-1] for f in hidden_facts)
    assert texts


async def test_responses_upstream_receives_the_index(start_gateway, upstream):
    # Cached reads at half price: the loop's placeholders are worth a summary, which carries the
    # index (at 0.1 the cost model settles over them instead, policies/cost.settle_size).
    gw = await start_gateway(**gateway_config("responses"), policy={**ECONOMY, "cached_input_rate": 0.5})
    session = agent_loop_session(seed=9, turns=5, calls=8)
    await drive_responses_loop(responses_client(gw, "idx-resp"), session, model="fake-32k")
    await settle(gw)
    bodies = responses_bodies(upstream)
    per_request = [" ".join(text_of(i.get("content")) for i in b["input"] if i.get("role") == "developer") for b in bodies]
    blocks = indexes(per_request)
    assert blocks, "no Responses request carried a hidden-context index"
    last = bodies[-1]["input"]
    visible = orjson.dumps([i for i in last if i.get("role") != "developer"]).decode()
    check_index(gw, blocks[-1], visible)
    stable(blocks)


async def test_messages_upstream_receives_the_index_in_the_system_blocks(start_gateway, upstream):
    gw = await start_gateway(policy={**ECONOMY, "cached_input_rate": 0.5})  # a summary pays (above)
    await run_loop(client_for(gw), "idx-msg", 40)
    await settle(gw)
    sent = messages_requests(upstream)
    per_request = [" ".join(b["text"] for b in body["system"] if isinstance(b, dict)) for body in sent
                   if isinstance(body.get("system"), list)]
    blocks = indexes(per_request)
    assert blocks, "no Messages request carried a hidden-context index"
    check_index(gw, blocks[-1], orjson.dumps(sent[-1]["messages"]).decode(), topics_too=False)
    assert "/srv/out/step1.bin" in blocks[-1]  # the first step's artifact, long hidden
    stable(blocks)
