"""The canonical form: what a client may reshape in a resent message without forking the session,
and what stays an edit."""

from __future__ import annotations

import json

from store.canonical import event_id

CALL = {"role": "assistant", "content": None,
        "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "read", "arguments": '{"target":"/srv/a","turn":0}'}}]}


def with_arguments(arguments):
    return {**CALL, "tool_calls": [{**CALL["tool_calls"][0], "function": {"name": "read", "arguments": arguments}}]}


def same(a: dict, b: dict) -> bool:
    return event_id("ev_parent", a) == event_id("ev_parent", b)


def test_json_arguments_count_by_value():
    recorded = with_arguments('{"target":"/srv/a","turn":0}')
    assert same(recorded, with_arguments(json.dumps({"target": "/srv/a", "turn": 0})))  # spaces
    assert same(recorded, with_arguments('{"turn": 0,\n "target": "/srv/a"}'))  # key order, newlines
    assert same(recorded, with_arguments({"target": "/srv/a", "turn": 0}))  # the object itself
    assert not same(recorded, with_arguments('{"target":"/srv/b","turn":0}'))  # another value
    assert not same(recorded, with_arguments('{"target":"/srv/a","turn":"0"}'))  # another type


def test_unparsable_arguments_count_as_written():
    broken = with_arguments('{"target": "/srv/a", ')
    assert same(broken, with_arguments('{"target": "/srv/a", '))
    assert not same(broken, with_arguments('{"target":"/srv/a",'))


def test_escapes_big_numbers_and_empty_arguments():
    assert same(with_arguments('{"q":"\\u00e9"}'), with_arguments('{"q": "é"}'))
    assert not same(with_arguments('{"n": 123456789012345678901234567890}'), with_arguments('{"n": 123456789012345678901234567891}'))
    assert same(with_arguments(""), with_arguments("{}"))
    event_id(None, with_arguments('{"q": "\\ud800"}'))  # a lone surrogate hashes, it does not raise


def test_framework_noise_is_not_meaning():
    resent = {**CALL, "content": "", "refusal": None, "audio": None, "annotations": [], "function_call": None,
              "tool_calls": [{**CALL["tool_calls"][0], "function": {"name": "read", "arguments": '{"turn": 0, "target": "/srv/a"}'}}]}
    assert same(CALL, resent)
    assert same({"role": "user", "content": "hi"}, {"role": "user", "content": [{"type": "text", "text": "hi"}]})


def test_what_stays_an_edit():
    assert not same({"role": "user", "content": "hi"}, {"role": "user", "content": "hi "})  # whitespace counts
    assert not same({"role": "user", "content": "hi", "name": "ann"}, {"role": "user", "content": "hi", "name": "bob"})
    two = [{"id": "a", "type": "function", "function": {"name": "x", "arguments": "{}"}},
           {"id": "b", "type": "function", "function": {"name": "y", "arguments": "{}"}}]
    assert not same({"role": "assistant", "tool_calls": two}, {"role": "assistant", "tool_calls": two[::-1]})
