"""The shape of a Responses request (``POST /v1/responses``), as far as the gateway reads it
(gateway/pipeline/shape.py).

Checked against openai-python's ``ResponseCreateParams`` and ``ResponseInputItemParam`` types:

- ``input``: a string, or an array of items told apart by ``type`` (``message`` when absent);
- a ``message``'s content: a string or an array of typed parts whose text (``input_text``,
  ``output_text``) is a string; images, files and audio are the provider's;
- ``function_call`` / ``custom_tool_call``: a string ``call_id`` and ``name``, string arguments
  (``input`` for a custom call);
- ``function_call_output`` / ``custom_tool_call_output``: a string ``call_id``; ``output`` a
  string or an array of typed parts (``input_text`` with a string ``text``, images, files);
- ``reasoning``: ``summary`` and ``content`` arrays of text parts, ``encrypted_content`` a string;
- any other item (server-side calls, ``compaction``, future types) is opaque: a string ``name``
  and ``call_id`` where it has them, and every ``*_output`` item a string ``call_id`` with its
  ``output`` a string, an object or an array of objects (``computer_call_output`` sends an
  object, ``shell_call_output`` an array);
- top level: ``reasoning`` and ``text`` are objects, ``tool_choice`` a string or an object,
  ``previous_response_id`` a string, and the fields the gateway counts.
"""

from __future__ import annotations

from gateway.pipeline.shape import ANY, BOOL, COUNT, OBJECT, STRING, TEXT, Either, Enum, ListOf, Obj, Tagged, obj, OPENAI

ROLES = ("user", "assistant", "system", "developer")
TEXT_PART = obj(required=("text",), text=STRING)
PART = Tagged({
    "input_text": TEXT_PART, "output_text": TEXT_PART, "text": TEXT_PART, "summary_text": TEXT_PART,
    "refusal": obj(required=("refusal",), refusal=STRING),
}, expected="a content part (an object with a string 'type')")
CONTENT = Either((STRING, ListOf(PART, expected="an array of content parts")),
                 "a string or an array of content parts")
OUTPUT = Either((STRING, ListOf(PART, expected="an array of content parts")),
                "a string or an array of content parts")
OPAQUE_OUTPUT = Either((STRING, OBJECT, ListOf(OBJECT, expected="an array of objects")),
                       "a string, an object or an array of objects")
CALL_OUTPUT = obj(required=("call_id",), call_id=STRING, output=OUTPUT)
SUMMARY = ListOf(Tagged({"summary_text": TEXT_PART}, expected="a summary part"), expected="an array of summary parts")
REASONING_TEXT = ListOf(Tagged({"reasoning_text": TEXT_PART}, expected="a reasoning part"),
                        expected="an array of reasoning parts")

ITEM = Tagged(
    {
        "message": obj(required=("role", "content"), role=Enum(ROLES), content=CONTENT),
        "function_call": obj(required=("call_id",), call_id=STRING, name=STRING, arguments=STRING),
        "custom_tool_call": obj(required=("call_id",), call_id=STRING, name=STRING, input=STRING),
        "function_call_output": CALL_OUTPUT,
        "custom_tool_call_output": CALL_OUTPUT,
        "reasoning": obj(summary=SUMMARY, content=REASONING_TEXT, encrypted_content=STRING),
    },
    other=obj(name=STRING, call_id=STRING),
    suffixes={"_output": obj(required=("call_id",), call_id=STRING, output=OPAQUE_OUTPUT)},
    default="message",
    expected="an input item (an object)",
)
INPUT = Either((STRING, ListOf(ITEM, expected="an array of input items")), "a string or an array of input items")
REQUEST: Obj = obj(
    "a JSON object", required=("model",),
    model=TEXT,
    input=INPUT,
    instructions=Either((STRING, ListOf(ANY)), "a string"),
    stream=BOOL,
    tools=ListOf(OBJECT, expected="an array of objects"),
    tool_choice=Either((STRING, OBJECT), "a string or an object"),
    max_output_tokens=COUNT,
    previous_response_id=STRING,
    reasoning=OBJECT,
    text=OBJECT,
)

STYLE = OPENAI
