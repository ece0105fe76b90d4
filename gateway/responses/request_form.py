"""The Responses API's part of a request the ledger does not hold
(gateway/pipeline/request_form.py): the body without ``input`` (``instructions`` and ``tools``
among its fields), and the input's system and developer messages, and a final
``compaction_trigger``, where they stood. ``rebuild`` puts a stored path's items back between
them: the whole conversation, so a request that named a ``previous_response_id`` comes back as
the full input the chain stood for (the replay's gateway holds no such response)."""

from __future__ import annotations

from typing import Any

from gateway.pipeline.request import ChatRequest
from gateway.pipeline.request_form import pieces
from gateway.responses.adapter import INSTRUCTION_ROLES, input_items, is_output, render_item

FORMAT = "responses"


def _literal(item: dict, last: bool) -> bool:
    kind = item.get("type", "message")
    return (kind == "message" and item.get("role") in INSTRUCTION_ROLES) or (last and kind == "compaction_trigger")


def skeleton(chat: ChatRequest) -> dict[str, Any]:
    raw = chat.body.get("input")
    params = {k: v for k, v in chat.body.items() if k != "input"}
    if chat.form is not None:  # the parser saw the literals (gateway/responses/adapter.py): the list is not walked again
        literals, tail = chat.form
        return {"format": FORMAT, "params": params, "literals": literals, "tail": tail, "input_string": isinstance(raw, str)}
    items = input_items(raw)
    literals = []
    seen, run = 0, False  # neutral history items so far (as adapter.to_neutral groups them); in a model-side run
    for i, item in enumerate(items):
        kind = item.get("type", "message")
        if _literal(item, i == len(items) - 1):
            literals.append([seen + run, item])
        elif kind == "message" and item.get("role") == "user" or is_output(item) or kind == "compaction":
            seen, run = seen + run + 1, False
        else:
            run = True
    return {"format": FORMAT, "params": params, "literals": literals, "tail": seen + run, "input_string": isinstance(raw, str)}


def rebuild(form: dict[str, Any], history: list[dict]) -> tuple[dict[str, Any], bool]:
    """(the request body, exact) from a stored form and the request's path in the ledger."""
    parts, exact = pieces(form.get("literals") or [], history, form.get("tail", len(history)))
    items = [i for kind, value in parts for i in ([value] if kind == "literal" else
                                                    (x for m in value for x in render_item(m, True)))]
    body = {k: v for k, v in form.get("params", {}).items() if k != "previous_response_id"}
    one = items[0] if len(items) == 1 else None
    if form.get("input_string") and one and one.get("role") == "user" and isinstance(one.get("content"), str):
        body["input"] = one["content"]
    else:
        body["input"] = items
    return body, exact
