"""Tests for policies/messages.py."""

from policies.messages import content_text, tool_names_by_call_id, with_text
from tests.policies.conversations import assistant, user


def test_content_text_shapes():
    assert content_text(None) == "" and content_text("hi") == "hi"
    parts = [{"type": "text", "text": "a"}, {"type": "image_url", "image_url": {"url": "x"}}, {"type": "text", "text": "b"}]
    assert content_text(parts) == "a\nb"


def test_with_text_keeps_attachments_and_does_not_mutate():
    image = {"type": "image_url", "image_url": {"url": "x"}}
    message = {"role": "user", "content": [{"type": "text", "text": "long"}, image]}
    new = with_text(message, "short")
    assert new["content"] == [{"type": "text", "text": "short"}, image]
    assert message["content"][0]["text"] == "long"
    assert with_text(user("a"), "b") == user("b")


def test_tool_names_by_call_id():
    msgs = [assistant(None, [("c1", "read", {}), ("c2", "write", {})])]
    assert tool_names_by_call_id(msgs) == {"c1": "read", "c2": "write"}
