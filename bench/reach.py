"""Does a labelled evidence turn reach the model? Read from one upstream request's messages.

The "answer round" is the last upstream request of a turn: the one whose reply the client got.
It holds the view (kept turns, summary, pinned rules, the recalled-history block) and every
recall call of the turn with its result. An evidence turn *reaches the model* when that request
holds, anywhere in its text:

- the turn's whole text (whitespace folded), or
- a piece of it attributed to its event id (a search passage or snippet, a session_load page,
  an entry of the recalled-history block) that holds the turn's answer part: every word of the
  gold answer that the turn itself holds (words as `store.chunking.query_terms` reads them).
  When the turn holds none of the answer's words (a count, a date computed from several turns),
  only its whole text counts.

The direct baseline is the same test on the request sent without the gateway: the whole
conversation, when it fits the window (otherwise the provider rejects it and nothing reaches).
"""

from __future__ import annotations

import orjson

from store.chunking import query_terms

TEXT_FIELDS = ("passage", "content", "text", "snippet")


def words(text: str) -> set[str]:
    return set(query_terms(str(text))) or {w for w in str(text).lower().split() if w}


def fold(text: str) -> str:
    return " ".join(str(text).split())


def _decoded(text: str):
    """A JSON document, or the JSON lines of a fenced block; None when neither."""
    stripped = text.strip()
    if stripped[:1] in "{[":
        try:
            return orjson.loads(stripped)
        except orjson.JSONDecodeError:
            pass
    docs = []
    for line in text.splitlines():
        if line.startswith("{"):
            try:
                docs.append(orjson.loads(line))
            except orjson.JSONDecodeError:
                continue
    return docs or None


def _walk(value, texts: list[str], pieces: list[tuple[str, str]]) -> None:
    if isinstance(value, dict):
        eid = value.get("event_id")
        if isinstance(eid, str):
            for field in TEXT_FIELDS:
                if isinstance(value.get(field), str):
                    pieces.append((eid, value[field]))
        for item in value.values():
            _walk(item, texts, pieces)
    elif isinstance(value, list):
        for item in value:
            _walk(item, texts, pieces)
    elif isinstance(value, str):
        texts.append(value)


def read_texts(messages: list[dict]) -> tuple[list[str], list[tuple[str, str]]]:
    """Every text of the request (contents, content parts, decoded tool results) and the pieces
    of events it carries as (event_id, text)."""
    texts: list[str] = []
    pieces: list[tuple[str, str]] = []
    for message in messages:
        content = message.get("content")
        parts = [content] if isinstance(content, str) else [
            p.get("text") for p in content or () if isinstance(p, dict) and isinstance(p.get("text"), str)]
        for part in parts:
            texts.append(part)
            decoded = _decoded(part)
            if decoded is not None:
                _walk(decoded, texts, pieces)
    return texts, pieces


def reaching(messages: list[dict], evidence: dict[str, str], gold: str) -> set[str]:
    """The evidence texts (values of `evidence`, keyed by event id; ids may be made up when the
    request has none) that reach the model through `messages`."""
    texts, pieces = read_texts(messages)
    folded = [fold(t) for t in texts]
    gold_words = words(gold)
    out = set()
    for eid, turn in evidence.items():
        whole = fold(turn)
        if any(whole in t for t in folded):
            out.add(turn)
            continue
        answer_part = gold_words & words(turn)
        for piece_id, piece in pieces:
            if piece_id != eid:
                continue
            if answer_part and answer_part <= words(piece) or whole in fold(piece):
                out.add(turn)
                break
    return out
