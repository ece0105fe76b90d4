"""Tests for policies/tokens.py."""

import math

from policies.tokens import Calibration, TokenCounter


def test_count_text_matches_the_encoder(counter):
    assert counter.count_text("") == 0
    assert counter.count_text("hello world") == 2
    # Special-token text in user content is data, not a control token (and must not raise).
    assert counter.count_text("<|endoftext|>") > 1


def test_message_accounting(counter):
    plain = counter.count_message({"role": "user", "content": "hello world"})
    assert plain == 3 + 1 + 2  # framing + role + content
    named = counter.count_message({"role": "user", "content": "hello world", "name": "bob"})
    assert named == plain + 1 + counter.count_text("bob")
    none_content = counter.count_message({"role": "assistant", "content": None})
    assert none_content == 3 + 1


def test_role_names_counted_once_each_and_any_number_counted_right():
    from policies.tokens import ROLES_KEPT

    counter = TokenCounter()
    roles = ["user", "assistant", *(f"agent role number {i}" for i in range(ROLES_KEPT + 10))]
    for role in [*roles, *roles]:  # twice: the second time from the memo, past its bound counted again
        assert counter.count_message({"role": role, "content": "x"}, key=None) == 3 + counter.count_text(role) + 1
        counter._cache.clear()
    assert len(counter._roles) == ROLES_KEPT
    calls = []
    counter._encoding = type("Spy", (), {"encode_ordinary": lambda _, text: calls.append(text) or [0] * len(text)})()
    counter.count_message({"role": "user", "content": "hello"})
    assert calls == ["hello"]  # the role's count was remembered


def test_tool_calls_and_ids_are_counted(counter):
    call = {"id": "c1", "type": "function", "function": {"name": "read_file", "arguments": '{"path": "/a/b.py"}'}}
    bare = counter.count_message({"role": "assistant", "content": None})
    with_call = counter.count_message({"role": "assistant", "content": None, "tool_calls": [call]})
    assert with_call - bare >= counter.count_text("read_file") + counter.count_text('{"path": "/a/b.py"}')
    tool = counter.count_message({"role": "tool", "tool_call_id": "call_abc", "content": "ok"})
    assert tool == 3 + counter.count_text("tool") + counter.count_text("call_abc") + 1


def test_content_parts_count_text_and_fixed_image_cost(counter):
    parts = [
        {"type": "text", "text": "hello world"},
        {"type": "image_url", "image_url": {"url": "data:image/png;base64," + "A" * 5000}},
    ]
    assert counter.count_message({"role": "user", "content": parts}) == 3 + 1 + 2 + 85


def test_cache_by_key_skips_encoding(counter):
    message = {"role": "user", "content": "a fairly long message " * 50}
    n = counter.count_message(message, key="evt1")
    # Same key, different content: the cached value wins (ids are content-addressed upstream).
    assert counter.count_message({"role": "user", "content": "x"}, key="evt1") == n


def test_hash_cache_distinguishes_content(counter):
    a = counter.count_message({"role": "user", "content": "one two three"})
    b = counter.count_message({"role": "user", "content": "one two three four five"})
    assert a != b
    assert counter.count_message({"role": "user", "content": "one two three"}) == a


def test_cache_is_bounded_lru():
    counter = TokenCounter(cache_size=3)
    for i in range(10):
        counter.count_message({"role": "user", "content": f"m{i}"}, key=f"k{i}")
    assert len(counter) == 3


def test_count_messages_adds_priming(counter):
    msgs = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}]
    assert counter.count_messages(msgs) == sum(counter.count_message(m) for m in msgs) + 3
    assert counter.count_messages(msgs, keys=["a", "b"]) == counter.count_messages(msgs)


def test_count_tools(counter):
    tools = [{"type": "function", "function": {"name": "f", "parameters": {"type": "object", "properties": {}}}}]
    assert counter.count_tools(None) == 0 and counter.count_tools([]) == 0
    n = counter.count_tools(tools)
    assert n > 5 and counter.count_tools(tools) == n


def test_head_tail_slices_by_tokens(counter):
    text = " ".join(f"w{i}" for i in range(1000))
    head, tail, omitted = counter.head_tail(text, 10, 5)
    assert text.startswith(head) and text.endswith(tail)
    assert counter.count_text(head) == 10 and counter.count_text(tail) <= 6
    assert omitted == counter.count_text(text) - 15
    assert counter.head_tail("short", 10, 5) is None


def test_calibration_learns_and_clamps():
    cal = Calibration()
    assert cal.factor("m") == 1.0 and cal.scale("m", 100) == 100
    cal.observe("m", 1000, 1200)
    assert math.isclose(cal.factor("m"), 1.2)
    cal.observe("m", 1000, 1000)
    assert 1.0 < cal.factor("m") < 1.2  # moving average, not last sample
    assert cal.scale("m", 1000) == math.ceil(1000 * cal.factor("m"))
    cal.observe("big", 1000, 10_000)
    assert cal.factor("big") == 2.0
    cal.observe("small", 10_000, 1000)
    assert cal.factor("small") == 0.5


def test_calibration_ignores_tiny_samples_and_bounds_models():
    cal = Calibration(max_models=2)
    cal.observe("m", 10, 30)
    assert cal.factor("m") == 1.0
    for name in ("a", "b", "c"):
        cal.observe(name, 1000, 1100)
    assert len(cal) == 2 and cal.factor("a") == 1.0 and cal.factor("c") > 1.0


def test_scale_has_no_float_noise():
    cal = Calibration()
    cal.observe("m", 1000, 1100)
    assert cal.scale("m", 100) == 110
