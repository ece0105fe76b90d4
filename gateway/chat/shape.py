"""The shape of a Chat Completions request, as far as the gateway reads it (gateway/pipeline/shape.py).

Checked against openai-python's ``CompletionCreateParams`` and ``ChatCompletion*MessageParam``
types: message roles, content as a string or an array of typed parts (a ``text`` part's ``text``
and a ``refusal`` part's ``refusal`` are strings; other parts, images, audio and files, are the
provider's), tool calls with their ``function``, the legacy ``function_call``, and the fields
the gateway counts or reads (``tools``, ``functions``, ``stream_options``, the token limits).
Everything else, unknown fields included, is the provider's business and passes unchanged.
"""

from __future__ import annotations

from gateway.pipeline.shape import BOOL, COUNT, OBJECT, STRING, TEXT, Either, Enum, ListOf, Tagged, obj, OPENAI

ROLES = ("system", "developer", "user", "assistant", "tool", "function")

PART = Tagged({
    "text": obj(required=("text",), text=STRING),
    "refusal": obj(required=("refusal",), refusal=STRING),
}, expected="a content part (an object with a string 'type')")
CONTENT = Either((STRING, ListOf(PART, expected="an array of content parts")),
                 "a string or an array of content parts")
FUNCTION = obj("an object with 'name' and 'arguments'", name=STRING, arguments=STRING)
TOOL_CALL = obj("a tool call object", required=("function",), id=STRING, type=STRING, function=FUNCTION)
MESSAGE = obj(
    "a message object", required=("role",),
    role=Enum(ROLES), content=CONTENT, tool_calls=ListOf(TOOL_CALL, expected="an array of tool calls"),
    function_call=FUNCTION, tool_call_id=STRING, name=STRING,
)
REQUEST = obj(
    "a JSON object", required=("model", "messages"),
    model=TEXT,
    messages=ListOf(MESSAGE, nonempty=True, expected="an array of messages"),
    stream=BOOL,
    stream_options=obj(include_usage=BOOL),
    tools=ListOf(OBJECT, expected="an array of objects"),
    functions=ListOf(OBJECT, expected="an array of objects"),
    max_completion_tokens=COUNT,
    max_tokens=COUNT,
)

STYLE = OPENAI
