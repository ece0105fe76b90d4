"""The shape of an Anthropic Messages request (``POST /v1/messages`` and
``/v1/messages/count_tokens``), as far as the gateway reads it (gateway/pipeline/shape.py).

Checked against anthropic-sdk-python's ``MessageCreateParams`` and ``ContentBlockParam`` types:

- ``system``: a string or an array of ``text`` blocks;
- each message: a role (``user``, ``assistant``, and ``system`` for Claude Code's
  mid-conversation system messages) and content, a string or an array of blocks told apart by
  ``type``;
- ``text`` blocks: a string ``text``; ``thinking``: string ``thinking`` and ``signature``;
  ``redacted_thinking``: a string ``data``; ``tool_use`` and ``server_tool_use``: string ``id``
  and ``name``, an object ``input``; ``tool_result``: a string ``tool_use_id``, content a string
  or an array of blocks (``text`` with a string ``text``; images, documents, search results are
  the provider's), ``is_error`` a boolean;
- any other block type (images, documents, server tool results, ``compaction``) is the
  provider's: an object with a string ``type``.
"""

from __future__ import annotations

from gateway.pipeline.shape import BOOL, COUNT, OBJECT, STRING, TEXT, Either, Enum, ListOf, Obj, Tagged, ANTHROPIC, obj

ROLES = ("user", "assistant", "system")
TEXT_BLOCK = obj(required=("text",), text=STRING)
RESULT_BLOCK = Tagged({"text": TEXT_BLOCK}, expected="a content block (an object with a string 'type')")
TOOL_USE = obj(required=("id", "name"), id=STRING, name=STRING, input=OBJECT)
BLOCK = Tagged({
    "text": TEXT_BLOCK,
    "thinking": obj(required=("thinking", "signature"), thinking=STRING, signature=STRING),
    "redacted_thinking": obj(required=("data",), data=STRING),
    "tool_use": TOOL_USE,
    "server_tool_use": TOOL_USE,
    "tool_result": obj(
        required=("tool_use_id",), tool_use_id=STRING, is_error=BOOL,
        content=Either((STRING, ListOf(RESULT_BLOCK, expected="a list of content blocks")),
                       "a string or a list of content blocks"),
    ),
}, expected="a content block (an object with a string 'type')")
CONTENT = Either((STRING, ListOf(BLOCK, expected="a list of content blocks")), "a string or a list of content blocks")
MESSAGE = obj("a message object", required=("role", "content"), role=Enum(ROLES), content=CONTENT)
SYSTEM = Either((STRING, ListOf(Tagged({"text": TEXT_BLOCK}, other=None, expected="a text block"),
                                expected="a list of text blocks")), "a string or a list of text blocks")
REQUEST: Obj = obj(
    "a JSON object", required=("model", "messages"),
    model=TEXT,
    messages=ListOf(MESSAGE, nonempty=True, expected="a list of messages"),
    system=SYSTEM,
    stream=BOOL,
    max_tokens=COUNT,
    tools=ListOf(OBJECT, expected="a list of objects"),
)

STYLE = ANTHROPIC
