"""The Responses parser's input memo (gateway/pipeline/history_ids.py, ``ListMemo``): a request
that resends a big input list parses to exactly what parsing it from scratch gives (the body
too, against ``orjson.loads``), only the resent part (byte for byte) is taken from the memo, and
one tenant's requests never use another tenant's entries."""

from __future__ import annotations

import copy
import json
import dataclasses
import random

import orjson
import pytest

from gateway.http.errors import BadRequest
from gateway.pipeline import history_ids
from gateway.pipeline.history_ids import MEMO_SCOPE, HistoryIds, ListMemo
from gateway.responses import adapter
from gateway.responses.request_form import skeleton


@pytest.fixture
def memo(monkeypatch):
    memo = ListMemo(min_bytes=0)
    monkeypatch.setattr(adapter, "INPUTS", memo)
    return memo


def items(seed: int, steps: int) -> list[dict]:
    rng = random.Random(seed)
    out: list[dict] = [{"type": "message", "role": "user", "content": [{"type": "input_text", "text": f"task {seed}"}]}]
    for i in range(steps):
        if i % 7 == 3:
            out.append({"type": "reasoning", "summary": [], "encrypted_content": f"enc{i}"})
        if i % 11 == 5:
            out.append({"type": "message", "role": "developer", "content": f"rule {i}"})  # inside a run: hoisted
        out.append({"type": "function_call", "call_id": f"c{i}", "name": "shell", "arguments": orjson.dumps({"n": i}).decode()})
        out.append({"type": "function_call_output", "call_id": f"c{i}", "output": "x" * rng.randint(1, 80)})
        if i % 5 == 4:
            out.append({"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": f"done {i}"}]})
            out.append({"type": "message", "role": "user", "content": f"next {i}"})
    return out


def body(input_items: list, **extra) -> bytes:
    return orjson.dumps({"model": "m", "instructions": "be brief", "input": input_items, **extra})


def scratch(raw: bytes):
    """What the parser makes without any memo."""
    saved = adapter.INPUTS
    adapter.INPUTS = ListMemo(min_bytes=1 << 60)
    try:
        return adapter.parse_responses_request(raw)
    finally:
        adapter.INPUTS = saved


def assert_same_parse(raw: bytes):
    got, want = adapter.parse_responses_request(raw), scratch(raw)
    assert orjson.dumps(got.body) == orjson.dumps(want.body) == orjson.dumps(orjson.loads(raw))
    assert orjson.dumps(got.instructions) == orjson.dumps(want.instructions)  # key order and types too
    assert orjson.dumps(got.history) == orjson.dumps(want.history)
    assert got.compact == want.compact
    # The request form the parser kept is the one walking the list again gives.
    walked = skeleton(dataclasses.replace(want, form=None))
    assert orjson.dumps(skeleton(got)) == orjson.dumps(skeleton(want)) == orjson.dumps(walked)
    return got


def test_a_resend_parses_as_from_scratch_and_reuses_the_resent_items(memo):
    base = items(1, 40)
    first = assert_same_parse(body(base))
    assert memo.reused == 0
    resent = copy.deepcopy(base) + [{"type": "message", "role": "user", "content": "one more"}]
    second = assert_same_parse(body(resent))
    assert memo.reused == len(base)  # every element it resent, byte for byte (the ']' after the last is no part of it)
    # The resent items come back as the same neutral objects (the id memo then finds them by identity).
    assert sum(a is b for a, b in zip(first.history, second.history)) >= len(first.history) - 2


@pytest.mark.parametrize("change", ["text", "key_order", "number_type", "dropped", "inserted"])
def test_a_resend_with_one_item_changed_is_parsed_again_from_there(memo, change):
    base = items(2, 30)
    assert_same_parse(body(base))
    changed = copy.deepcopy(base)
    k = 20
    if change == "text":
        changed[k] = {**changed[k], "output": "edited"} if "output" in changed[k] else {**changed[k], "arguments": "{}"}
    elif change == "key_order":  # equal as Python dicts, not byte for byte: what goes upstream keeps the client's order
        changed[k] = dict(reversed(list(changed[k].items())))
    elif change == "number_type":  # 1 == True == 1.0 in Python; not in JSON
        changed[k] = {**changed[k], "extra": True}
        base_k = {**base[k], "extra": 1}
        base = [*base[:k], base_k, *base[k + 1:]]
        memo_b = ListMemo(min_bytes=0)
        adapter.INPUTS = memo_b
        assert_same_parse(body(base))
    elif change == "dropped":
        del changed[k]
    else:
        changed.insert(k, {"type": "message", "role": "user", "content": "inserted"})
    before = adapter.INPUTS.reused
    got = assert_same_parse(body(changed))
    assert adapter.INPUTS.reused - before <= k  # nothing at or after the change came from the memo
    if change == "key_order":  # the item goes upstream in the order this request sent it
        rendered = orjson.dumps(adapter.render_input(got.history, {id(m) for m in got.history}))
        assert orjson.dumps(changed[k]) in rendered and orjson.dumps(base[k]) not in rendered


def test_a_resent_item_now_invalid_is_refused(memo):
    base = items(3, 20)
    assert_same_parse(body(base))
    bad = copy.deepcopy(base)
    bad[10] = {**bad[10], "call_id": 7}
    with pytest.raises(BadRequest) as refused:
        adapter.parse_responses_request(body(bad))
    assert "input[10].call_id" in str(refused.value)


def test_runs_across_the_resume_point_and_a_compaction_trigger(memo):
    base = items(4, 25)
    # The list ends in an open model-side run: the next request continues it.
    run_open = [*base, {"type": "function_call", "call_id": "x1", "name": "shell", "arguments": "{}"}]
    assert_same_parse(body(run_open))
    more = [*copy.deepcopy(run_open), {"type": "function_call", "call_id": "x2", "name": "shell", "arguments": "{}"},
            {"type": "function_call_output", "call_id": "x1", "output": "a"},
            {"type": "function_call_output", "call_id": "x2", "output": "b"}]
    assert_same_parse(body(more))
    got = assert_same_parse(body([*copy.deepcopy(more), {"type": "compaction_trigger"}]))
    assert got.compact
    assert_same_parse(body(copy.deepcopy(more)))  # the same list again, whole


def test_an_item_sent_twice_in_one_request_is_two_items(memo):
    twice = [{"type": "message", "role": "user", "content": "continue"}] * 2
    base = [*items(5, 10), *copy.deepcopy(twice)]
    assert_same_parse(body(base))
    got = assert_same_parse(body([*copy.deepcopy(base), *copy.deepcopy(twice)]))
    assert len({id(m) for m in got.history}) == len(got.history)


def test_two_tenants_never_share_entries(memo, monkeypatch):
    ids = HistoryIds(min_bytes=0)
    monkeypatch.setattr(history_ids, "HISTORY_IDS", ids)
    raw = body(items(6, 30))
    for tenant in ("tenant-a", "tenant-b"):
        token = MEMO_SCOPE.set(tenant)
        try:
            chat = adapter.parse_responses_request(raw)
            ids.ids(chat.history, 1 << 20)
        finally:
            MEMO_SCOPE.reset(token)
    assert memo.reused == 0 and ids.reused == 0  # b sent a's list byte for byte, and found nothing
    token = MEMO_SCOPE.set("tenant-a")
    try:
        chat = adapter.parse_responses_request(raw)
        ids.ids(chat.history, 1 << 20)
    finally:
        MEMO_SCOPE.reset(token)
    assert memo.reused > 0 and ids.reused > 0  # a's own resend did


def test_the_memo_stays_within_its_budget(monkeypatch):
    memo = ListMemo(min_bytes=0, budget_bytes=30_000)
    monkeypatch.setattr(adapter, "INPUTS", memo)
    for seed in range(12):
        raw = body(items(100 + seed, 20))
        assert len(raw) < 30_000
        adapter.parse_responses_request(raw)
        assert memo._bytes <= 30_000
    assert 0 < sum(len(entries) for entries in memo._recent.values()) < 12


def test_depth_is_refused_exactly_where_writing_the_whole_body_fails(memo):
    """The memo writes the input list (one level down) and the other fields instead of the whole
    body: a body is refused as too deep at exactly the same nesting either way."""
    outcomes = {}
    for depth in range(245, 262):
        nested: object = "leaf"
        for _ in range(depth):
            nested = [nested]
        raw = json.dumps({"model": "m", "input": [*items(7, 3), {"type": "reasoning", "summary": [], "extra": nested}]}).encode()
        results = []
        for parse in (adapter.parse_responses_request, scratch):
            try:
                parse(raw)
                results.append("ok")
            except BadRequest as exc:
                results.append("too deep" if "nested too deeply" in str(exc) else str(exc))
        assert results[0] == results[1], depth
        outcomes[depth] = results[0]
    assert set(outcomes.values()) == {"ok", "too deep"}  # the limit lies inside the range tried


def outcome(parse, raw: bytes):
    """What a parser makes of `raw`: the body, instructions and history as JSON, or its 400."""
    try:
        chat = parse(raw)
    except BadRequest as exc:
        return "400: " + str(exc)
    return orjson.dumps([chat.body, chat.instructions, chat.history])


def test_the_resent_bytes_are_spliced_whatever_the_layout(memo):
    """Spaces, indents, escapes and brackets inside strings, non-ASCII text, fields before and
    after the list: each next step parses to what orjson gives for the whole body."""
    base = items(8, 30)
    base[3] = {**base[3], "output": 'a "quoted" ] } [ { \\ \u00e9\u6f22 \\"'}
    for dump in (lambda b: json.dumps(b).encode(), lambda b: json.dumps(b, indent=2, ensure_ascii=False).encode(),
                 orjson.dumps):
        memo._recent.clear()
        reused = memo.reused
        history: list = []
        for step in range(4):
            history = [*history, *copy.deepcopy(base[step * 8:(step + 1) * 8])]
            raw = dump({"model": "m", "instructions": "be brief", "input": history, "stream": step % 2 == 0,
                        "tools": [{"type": "function", "name": f"t{step}", "parameters": {}}]})
            assert outcome(adapter.parse_responses_request, raw) == outcome(scratch, raw)
        assert memo.reused - reused >= 8 + 16 + 24  # each step's resent items came from the memo, in every layout


@pytest.mark.parametrize("tail", [
    b', {"type": "message", "role": "user", "content": "x"}], "model": "other"}',  # a key twice: the last wins
    b', {"type": "message", "role": "user", "content": "x"}], "input": [{"type": "message", "role": "user", "content": "y"}]}',
    b', "a string item"]}',
    b', 5]}',
    b', ]}',  # a trailing comma: not JSON
    b'], }',
    b', {"type": "message", "role": "user", "content": "x"}]} trailing',
    b', {"type": "message", "role": "user", "content": "x"}',  # cut short
    b', {"type": "message", "role": "user", "content": "x"}], "stream": true}',
    b', {"type": "message", "role": "user", "content": "x"}]   }  ',
])
def test_whatever_follows_the_resent_items_parses_as_from_scratch(memo, tail):
    base = items(9, 25)
    whole = orjson.dumps({"model": "m", "input": base})
    adapter.parse_responses_request(whole)
    raw = whole[:whole.rindex(b"]")] + tail
    assert outcome(adapter.parse_responses_request, raw) == outcome(scratch, raw)


async def test_a_resent_big_body_is_compared_once_with_each_remembered_body(memo, monkeypatch):
    """Where a big body is parsed (``BODIES.resends``) and the parse (``ListMemo.parse``) compare it
    with the same remembered bytes: ~500 KB compared once per remembered body, not twice; the
    parse is the one from scratch, and a body compared outside a parse is compared afresh."""
    from gateway.pipeline import offload
    from gateway.responses.peer import ResponsesPeer

    bodies = history_ids.RecentBodies()
    monkeypatch.setattr(offload, "BODIES", bodies)
    compared: list[tuple[int, int]] = []
    real = history_ids._common_prefix
    monkeypatch.setattr(history_ids, "_common_prefix", lambda a, b: compared.append((id(a), id(b))) or real(a, b))
    peer = ResponsesPeer.__new__(ResponsesPeer)  # parse only: no collaborators
    base = items(8, 700)
    first = body(base)
    assert len(first) >= offload.BIG_BODY_BYTES
    await offload.parse_and_hash(first, peer)  # nothing remembered: a worker thread parses it whole
    second = body([*copy.deepcopy(base), {"type": "message", "role": "user", "content": "next"}])
    chat, ids = await offload.parse_and_hash(second, peer)
    assert compared == [(id(second), id(first))]  # one compare serves both memos
    assert memo.reused == len(base)
    assert orjson.dumps(chat.body) == orjson.dumps(orjson.loads(second))
    assert orjson.dumps(chat.history) == orjson.dumps(scratch(second).history)
    compared.clear()
    history_ids.common_prefix(second, first)
    history_ids.common_prefix(second, first)
    assert len(compared) == 2  # outside a parse nothing is remembered (nor held)
