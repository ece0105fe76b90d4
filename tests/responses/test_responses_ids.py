"""previous_response_id chains and response ids, as the gateway records them: rebuilt from the
ledger (so the view can compact the whole chain), and scoped to the tenant that owns them."""

from __future__ import annotations

import aiohttp
import openai
import pytest

from gateway.keys import LEDGER, RESPONSES
from simulator.puppet import RECEIVED
from tests.responses.test_responses import gateway_config, responses_bodies
from tests.support.agent import RESPONSES_TOOLS

TENANTS = {"alice": "pk-alice", "bob": "pk-bob"}


def client(gw, key: str, session: str | None = "chain") -> openai.AsyncOpenAI:
    headers = {"X-Session-Id": session} if session else {}
    return openai.AsyncOpenAI(base_url=gw.base_url, api_key=key, default_headers=headers, max_retries=0)


async def start(start_gateway):
    return await start_gateway(**gateway_config("responses"), tenants=TENANTS, server={"client_keys": "required"})


@pytest.mark.parametrize("stream", [False, True])
async def test_a_previous_response_id_chain_goes_up_whole_from_the_ledger(start_gateway, upstream, stream):
    gw = await start(start_gateway)
    alice = client(gw, "pk-alice")
    first = await alice.responses.create(model="fake-32k", input='[[call read_file {"target": "/srv/a.py"}]]',
                                         tools=RESPONSES_TOOLS, store=False)
    call = next(i for i in first.output if i.type == "function_call")
    kw = dict(model="fake-32k", previous_response_id=first.id, tools=RESPONSES_TOOLS, store=False,
              input=[{"type": "function_call_output", "call_id": call.call_id, "output": "print('hello')"}])
    if stream:
        async with alice.responses.stream(**kw) as events:
            second = await events.get_final_response()
    else:
        second = await alice.responses.create(**kw)
    assert second.output_text.startswith("Tool read_file returned")
    body = responses_bodies(upstream)[-1]
    assert "previous_response_id" not in body  # the gateway sent the chain itself (the upstream stored nothing)
    kinds = [i.get("type", "message") for i in body["input"]]
    assert kinds == ["message", "function_call", "function_call_output"]
    third = await alice.responses.create(model="fake-32k", previous_response_id=second.id, input="and now?", store=False)
    assert third.output_text.startswith("ok:")
    assert len(responses_bodies(upstream)[-1]["input"]) == 5


async def test_another_tenant_cannot_continue_read_or_delete_a_recorded_response(start_gateway, upstream):
    gw = await start(start_gateway)
    alice = client(gw, "pk-alice")
    first = await alice.responses.create(model="fake-32k", input="alice's secret plan", store=False)
    bob = client(gw, "pk-bob", session=None)
    sent = len(responses_bodies(upstream))
    with pytest.raises(openai.BadRequestError) as refused:  # bob's chain from alice's id: refused, as if unknown
        await bob.responses.create(model="fake-32k", previous_response_id=first.id, input="continue", store=False)
    assert refused.value.code == "previous_response_not_found"
    assert len(responses_bodies(upstream)) == sent  # nothing of it reached the upstream
    async with aiohttp.ClientSession() as http:
        url = f"{gw.base_url}/responses/{first.id}"
        for method in ("GET", "DELETE"):
            async with http.request(method, url, headers={"Authorization": "Bearer pk-bob"}) as response:
                assert response.status == 404
                assert "secret" not in await response.text()
        async with http.get(f"{url}/input_items", headers={"Authorization": "Bearer pk-bob"}) as response:
            assert response.status == 404
        async with http.get(url, headers={"Authorization": "Bearer pk-alice"}) as response:
            assert response.status == 200
            data = await response.json()
            assert data["id"] == first.id and data["output"][0]["content"][0]["text"].startswith("ok:")
        async with http.get(f"{url}/input_items", headers={"Authorization": "Bearer pk-alice"}) as response:
            assert "alice's secret plan" in await response.text()
        async with http.delete(url, headers={"Authorization": "Bearer pk-alice"}) as response:
            assert (await response.json())["deleted"] is True
    with pytest.raises(openai.BadRequestError):  # deleted: the gateway no longer knows it
        await alice.responses.create(model="fake-32k", previous_response_id=first.id, input="continue", store=False)


async def test_on_the_operators_key_a_relayed_response_stays_its_tenants(start_gateway, upstream):
    gw = await start_gateway(**gateway_config("responses"), tenants=TENANTS, upstream={"api_key": "sk-operator"})
    alice, bob = client(gw, "pk-alice", session=None), client(gw, "pk-bob", session=None)
    first = await alice.responses.create(model="fake-32k", input="alice's plan")  # no session: relayed, stored upstream
    sent = len(responses_bodies(upstream))
    with pytest.raises(openai.BadRequestError) as refused:
        await bob.responses.create(model="fake-32k", previous_response_id=first.id, input="continue")
    assert refused.value.code == "previous_response_not_found"
    with pytest.raises(openai.BadRequestError):  # an id nobody recorded: not on the shared account either
        await bob.responses.create(model="fake-32k", previous_response_id="resp_guessed", input="continue")
    assert len(responses_bodies(upstream)) == sent  # refused before anything went up
    async with aiohttp.ClientSession() as http:
        url = f"{gw.base_url}/responses/{first.id}"
        # Bob gets what an id nobody recorded gets on the operator's key (no hint that it exists).
        received = len(upstream.app[RECEIVED])
        async with http.get(url, headers={"Authorization": "Bearer pk-bob"}) as response:
            theirs = (response.status, (await response.json())["error"]["code"])
        async with http.get(f"{gw.base_url}/responses/resp_guessed", headers={"Authorization": "Bearer pk-bob"}) as response:
            assert theirs == (response.status, (await response.json())["error"]["code"]) == (403, "route_not_allowed")
        assert len(upstream.app[RECEIVED]) == received
        async with http.get(url, headers={"Authorization": "Bearer pk-alice"}) as response:
            assert response.status == 200  # the provider's copy, for its owner
    second = await alice.responses.create(model="fake-32k", previous_response_id=first.id, input="continue")
    assert second.output_text.startswith("ok:")
    assert all(r["headers"].get("authorization") == "Bearer sk-operator" for r in upstream.app[RECEIVED]
               if r["path"].endswith("/responses") or "/responses/" in r["path"])


async def test_a_responses_request_refused_for_the_window_stores_nothing(start_gateway, upstream):
    gw = await start_gateway(**gateway_config("responses"))
    huge = "word " * 40_000  # one user message bigger than the 32k window
    with pytest.raises(openai.BadRequestError) as refused:
        await client(gw, "sk-a", session="too-big").responses.create(model="fake-32k", input=huge, store=False)
    assert refused.value.code == "context_length_exceeded"
    assert responses_bodies(upstream) == []
    assert not [s for s in gw.app[LEDGER].sessions() if s.session_id == "too-big" and s.events]


@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize("api", ["responses", "chat"])
async def test_a_reused_upstream_id_never_takes_over_another_tenants_response(start_gateway, upstream, api, stream):
    """The provider hands out the same ids again (here: the simulator's id counter starts over).
    On a Responses upstream both tenants get that id, and each keeps its own response; on a
    chat-only upstream the gateway mints the ids, so they differ."""
    gw = await start_gateway(models={"fake-32k": {"context_window": 32_000, "api": api}}, tenants=TENANTS,
                             server={"client_keys": "required"})
    alice, bob = client(gw, "pk-alice", session="a"), client(gw, "pk-bob", session="b")

    async def create(sdk, **kw):
        if not stream:
            return await sdk.responses.create(model="fake-32k", store=False, **kw)
        async with sdk.responses.stream(model="fake-32k", store=False, **kw) as events:
            return await events.get_final_response()

    counter = upstream.state.counter
    first = await create(alice, input="alice's plan: 7731")
    upstream.state.counter = counter  # the upstream starts its ids over
    theirs = await create(bob, input="bob's plan: 4242")
    assert (first.id == theirs.id) == (api == "responses")
    async with aiohttp.ClientSession() as http:
        for key, response_id, mine, other in (("pk-alice", first.id, "7731", "4242"), ("pk-bob", theirs.id, "4242", "7731")):
            async with http.get(f"{gw.base_url}/responses/{response_id}/input_items",
                                headers={"Authorization": f"Bearer {key}"}) as got:
                assert got.status == 200
                text = await got.text()
                assert mine in text and other not in text
    for sdk, response_id, mine, other in ((alice, first.id, "7731", "4242"), (bob, theirs.id, "4242", "7731")):
        follow = await create(sdk, previous_response_id=response_id, input="and then?")
        assert follow.output_text.startswith("ok:")
        sent = str(upstream.app[RECEIVED][-1]["json"])
        assert mine in sent and other not in sent  # each chain rebuilt from its own tenant's ledger


async def test_response_ids_recorded_before_they_were_kept_per_tenant_still_resolve(tmp_path):
    """The first layout of responses.sqlite3 keyed ids alone; opening it moves them over."""
    import sqlite3

    from store.response_ids import ResponseIds

    db = sqlite3.connect(tmp_path / "responses.sqlite3")
    db.execute("CREATE TABLE responses (id TEXT PRIMARY KEY, session_key TEXT NOT NULL, event_id TEXT NOT NULL, "
               "created REAL NOT NULL, deleted INTEGER NOT NULL DEFAULT 0)")
    db.executemany("INSERT INTO responses VALUES (?, ?, ?, ?, ?)", [
        ("resp_1", "alice/s1", "ev_1", 1.0, 0), ("resp_2", "bob/", "", 2.0, 0), ("resp_3", "alice/s1", "ev_3", 3.0, 1)])
    db.commit()
    db.close()
    ids = ResponseIds(tmp_path)
    try:
        assert ids.find("alice", "resp_1").session_key == "alice/s1" and ids.find("alice", "resp_1").event_id == "ev_1"
        assert ids.find("bob", "resp_1") is None and ids.taken("resp_1")
        assert ids.find("bob", "resp_2").session_key == "" and ids.find("alice", "resp_2") is None
        assert ids.find("alice", "resp_3") is None  # deleted stays deleted
        ids.remember("bob", "resp_1", "bob/s9", "ev_9")  # bob's own resp_1 leaves alice's alone
        assert ids.find("alice", "resp_1").event_id == "ev_1" and ids.find("bob", "resp_1").event_id == "ev_9"
    finally:
        ids.close()
    reopened = ResponseIds(tmp_path)  # opening again migrates nothing twice
    assert reopened.find("alice", "resp_1").event_id == "ev_1"
    reopened.close()


async def test_deleting_a_session_forgets_the_response_ids_of_its_answers(start_gateway, upstream):
    gw = await start_gateway(**gateway_config("responses"), tenants=TENANTS, server={"client_keys": "required", "admin_token": "adm"})
    alice = client(gw, "pk-alice", session="doomed")
    first = await alice.responses.create(model="fake-32k", input="alice's plan: 7731", store=False)
    key = next(s.key for s in gw.app[LEDGER].sessions() if s.session_id == "doomed")
    async with aiohttp.ClientSession() as http:
        async with http.delete(f"{gw.root}/admin/sessions/{key}", headers={"Authorization": "Bearer adm"}) as r:
            assert r.status == 200
    assert not gw.app[RESPONSES].response_ids.taken(first.id)
    with pytest.raises(openai.BadRequestError):  # passed on: the provider (store false) has nothing either
        await alice.responses.create(model="fake-32k", previous_response_id=first.id, input="continue", store=False)


@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize("api", ["responses", "chat"])
async def test_an_item_reference_to_a_recorded_answer_is_read_back_from_the_ledger(start_gateway, upstream, api, stream):
    """A client that stores responses (the Vercel AI SDK's default) resends an earlier answer as
    an ``item_reference``. The gateway recorded that answer after the message before it, so the
    upstream gets the item itself: on a chat-only upstream the assistant's words (not an empty
    message, nothing named dropped), on a Responses upstream the message item with its id; the
    ledger stays one branch. Another tenant's reference to it is not expanded from alice's
    ledger: on a chat-only upstream it is dropped and alice's words never reach bob's view."""
    gw = await start_gateway(models={"fake-32k": {"context_window": 32_000, "api": api}}, tenants=TENANTS,
                             server={"client_keys": "required"})
    alice, bob = client(gw, "pk-alice", session="a"), client(gw, "pk-bob", session="b")

    async def create(sdk, **kw):
        raw = await sdk.responses.with_raw_response.create(model="fake-32k", stream=stream, **kw)
        if not stream:
            return raw.parse(), raw.headers
        done = [event.response async for event in raw.parse() if event.type == "response.completed"]
        return done[0], raw.headers

    first, _ = await create(alice, input="alice's plan: 7731")
    message = next(item for item in first.output if item.type == "message")
    reference = [{"role": "user", "content": "alice's plan: 7731"}, {"type": "item_reference", "id": message.id}]
    follow, headers = await create(alice, input=[*reference, {"role": "user", "content": "and then?"}])
    assert follow.output_text.startswith("ok:") and "x-palimpsest-dropped" not in headers
    if api == "chat":
        sent = upstream.chat_requests()[-1]["json"]["messages"]
        assert {"role": "assistant", "content": first.output_text} in sent
    else:
        sent = responses_bodies(upstream)[-1]["input"]
        assert [i["type"] for i in sent if i.get("id") == message.id] == ["message"]
        assert first.output_text in str(sent)
    ledger = gw.app[LEDGER]
    key = next(s.key for s in ledger.sessions() if s.session_id == "a")
    assert len(ledger.heads(key)) == 1  # the reference is the recorded answer's event, not a new branch
    if api == "chat":
        _, headers = await create(bob, input=[*reference, {"role": "user", "content": "and then?"}])
        assert headers["x-palimpsest-dropped"] == "item_reference=1"
        assert first.output_text not in str(upstream.chat_requests()[-1]["json"])


@pytest.mark.parametrize("api", ["responses", "chat"])
async def test_item_references_the_ledger_cannot_read_back_are_never_a_500(start_gateway, upstream, api):
    """References to nothing the session recorded, malformed ones, and a session whose ledger
    holds earlier malformed references (ids that are lists or objects) at the same place: each
    request is answered (a chat-only upstream drops what it cannot read) or refused with a 4xx
    in OpenAI's envelope, JSON and streamed."""
    gw = await start_gateway(models={"fake-32k": {"context_window": 32_000, "api": api}})
    user = {"role": "user", "content": "hi"}
    inputs = [[{"type": "item_reference", "id": "msg_0123456789abcdef01234567"}],
              [{"type": "item_reference"}], [{"type": "item_reference", "id": 5}],
              [user, {"type": "item_reference", "id": ["a"]}, {"type": "item_reference", "id": {"a": 1}}],
              [user, {"type": "item_reference", "id": "msg_x"}, {"role": "user", "content": "more"}],
              [user, {"type": "item_reference", "id": "msg_x"}, {"type": "function_call_output", "call_id": "c", "output": "x"}]]
    async with aiohttp.ClientSession() as http:
        for stream in (False, True):
            for body in inputs:
                async with http.post(f"{gw.base_url}/responses", headers={"X-Session-Id": "refs"},
                                     json={"model": "fake-32k", "input": body, "stream": stream}) as r:
                    assert r.status < 500, (stream, body, await r.text())
                    if r.status >= 400:
                        assert (await r.json())["error"]["message"]


@pytest.mark.parametrize("deleted_by", ["admin route", "another process"])
async def test_a_deleted_sessions_answers_are_not_read_back_for_a_reference(start_gateway, upstream, tmp_path, deleted_by):
    """The read-back remembers what it read (a client resends every answer by reference on every
    request), but not past the session's deletion, through the admin route or by `palimpsest
    delete` in a process of its own on the same embedded store (the gateway's caches are not
    told): the same reference afterwards finds nothing and, on a chat-only upstream, is dropped."""
    from store.ledger import Ledger

    gw = await start_gateway(models={"fake-32k": {"context_window": 32_000, "api": "chat"}}, tenants=TENANTS,
                             server={"client_keys": "required", "admin_token": "adm"},
                             store={"path": str(tmp_path / "store")})
    alice = client(gw, "pk-alice", session="gone")
    first = await alice.responses.create(model="fake-32k", input="alice's plan: 7731")
    body = [{"role": "user", "content": "alice's plan: 7731"}, {"type": "item_reference", "id": first.output[0].id},
            {"role": "user", "content": "and then?"}]
    for _ in range(2):  # read from the ledger, then from memory
        raw = await alice.responses.with_raw_response.create(model="fake-32k", input=body)
        assert "x-palimpsest-dropped" not in raw.headers
        assert {"role": "assistant", "content": first.output_text} in upstream.chat_requests()[-1]["json"]["messages"]
    key = next(s.key for s in gw.app[LEDGER].sessions() if s.session_id == "gone")
    if deleted_by == "admin route":
        async with aiohttp.ClientSession() as http:
            async with http.delete(f"{gw.root}/admin/sessions/{key}", headers={"Authorization": "Bearer adm"}) as r:
                assert r.status == 200
    else:
        other = Ledger(tmp_path / "store")  # another process's connection to the same files
        try:
            assert other.delete_session(key) > 0
        finally:
            other.close()
    raw = await alice.responses.with_raw_response.create(model="fake-32k", input=body)
    assert raw.headers["x-palimpsest-dropped"] == "item_reference=1"
    assert first.output_text not in str(upstream.chat_requests()[-1]["json"])


def test_the_read_back_memory_stays_within_its_bytes():
    """Remembered items are bounded by their JSON size (oldest out first); an item over a
    sixteenth of the bound is never remembered."""
    from gateway.responses.references import ItemReferences

    memo = ItemReferences(ledger=None, max_bytes=16_000)
    for n in range(100):
        memo._remember(("s", f"ev_{n}", f"msg_{n}"), {"type": "message", "id": f"msg_{n}", "content": "x" * 500})
    assert memo._bytes <= 16_000 and memo._bytes == sum(memo._sizes.values())
    assert ("s", "ev_99", "msg_99") in memo._memo and ("s", "ev_0", "msg_0") not in memo._memo
    memo._remember(("s", "ev_big", "msg_big"), {"type": "message", "content": "x" * 2_000})
    assert ("s", "ev_big", "msg_big") not in memo._memo


@pytest.mark.parametrize("api", ["responses", "chat"])
@pytest.mark.parametrize("stream", [False, True])
async def test_an_item_reference_without_a_session_is_relayed_not_a_500(start_gateway, upstream, api, stream):
    """A request no session is named for (no header, fingerprint fallback off) has no ledger to
    read a reference back from: it goes on as it came (a chat-only upstream drops what it cannot
    read), never a gateway error."""
    gw = await start_gateway(models={"fake-32k": {"context_window": 32_000, "api": api}})
    plain = client(gw, "sk-client", session=None)
    first = await plain.responses.create(model="fake-32k", input="the plan: 7731")
    body = [{"role": "user", "content": "the plan: 7731"}, {"type": "item_reference", "id": first.output[0].id},
            {"role": "user", "content": "and then?"}]
    async with aiohttp.ClientSession() as http:
        async with http.post(f"{gw.base_url}/responses", headers={"Authorization": "Bearer sk-client"},
                             json={"model": "fake-32k", "input": body, "stream": stream}) as r:
            assert r.status == 200, await r.text()
    if api == "responses":  # the provider resolves its own stored item
        assert {"type": "item_reference", "id": first.output[0].id} in responses_bodies(upstream)[-1]["input"]
    else:
        assert r.headers["x-palimpsest-dropped"] == "item_reference=1"


async def test_on_the_operators_key_an_item_reference_must_be_the_tenants_own(start_gateway, upstream):
    """Every tenant's stored items meet on the operator's provider account: a reference the
    gateway cannot read back goes upstream only when the item is one this tenant's answers had
    (recorded with the answer, with or without a session). Another tenant's item, or one nobody
    recorded, is refused as the provider refuses an unknown item, and nothing goes upstream."""
    gw = await start_gateway(**gateway_config("responses"), tenants=TENANTS, upstream={"api_key": "sk-operator"})
    alice, bob = client(gw, "pk-alice", session=None), client(gw, "pk-bob", session=None)
    first = await alice.responses.create(model="fake-32k", input="alice's secret plan: 7731")
    item = first.output[0].id

    def reference(to: str) -> list[dict]:
        return [{"role": "user", "content": "what was the plan?"}, {"type": "item_reference", "id": to},
                {"role": "user", "content": "repeat it"}]

    sent = len(responses_bodies(upstream))
    for stream in (False, True):
        for guess in (item, "msg_nobody_recorded_this"):
            with pytest.raises(openai.BadRequestError) as refused:
                if stream:
                    async with bob.responses.stream(model="fake-32k", input=reference(guess)) as events:
                        await events.get_final_response()
                else:
                    await bob.responses.create(model="fake-32k", input=reference(guess))
            assert refused.value.status_code == 400 and f"Item with id '{guess}' not found." in str(refused.value)
            assert refused.value.body["param"] == "input"
    assert len(responses_bodies(upstream)) == sent  # refused before anything went up
    # Alice's own item goes up for the provider to resolve, without a session and from a session
    # whose ledger does not hold it.
    for session in (None, "another"):
        own = await client(gw, "pk-alice", session=session).responses.create(model="fake-32k", input=reference(item))
        assert own.output_text.startswith("ok:")
        assert {"type": "item_reference", "id": item} in responses_bodies(upstream)[-1]["input"]


async def test_on_the_clients_own_key_another_tenants_item_is_refused(start_gateway, upstream):
    """With each tenant's own provider key, a reference to an item nobody recorded is the
    provider's to answer; one recorded for another tenant is refused before it goes up."""
    tenants = {"alice": {"key": "pk-alice", "upstream_key": "sk-alice"}, "bob": {"key": "pk-bob", "upstream_key": "sk-bob"}}
    gw = await start_gateway(**gateway_config("responses"), tenants=tenants)
    alice, bob = client(gw, "pk-alice", session="a"), client(gw, "pk-bob", session="b")
    item = (await alice.responses.create(model="fake-32k", input="alice's plan")).output[0].id
    body = [{"role": "user", "content": "hi"}, {"type": "item_reference", "id": item}, {"role": "user", "content": "go"}]
    sent = len(responses_bodies(upstream))
    with pytest.raises(openai.BadRequestError, match=f"Item with id '{item}' not found"):
        await bob.responses.create(model="fake-32k", input=body)
    assert len(responses_bodies(upstream)) == sent
    unknown = [{"role": "user", "content": "hi"}, {"type": "item_reference", "id": "msg_before_the_gateway"},
               {"role": "user", "content": "go"}]
    with pytest.raises(openai.BadRequestError):  # the provider's own answer: it holds no such item
        await bob.responses.create(model="fake-32k", input=unknown)
    assert len(responses_bodies(upstream)) == sent + 1
    assert responses_bodies(upstream)[-1]["input"][1] == {"type": "item_reference", "id": "msg_before_the_gateway"}
