"""Opaque tokens the simulated provider hands out and checks when they come back.

Reasoning ``encrypted_content``, thinking ``signature``s and compaction items are, like the real
provider's, opaque to clients: here each is a base64url JSON payload and an HMAC over it with a
per-puppet secret, so a changed byte, or a token from another puppet, fails `verify`.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
from typing import Any

import orjson


def sign(secret: bytes, payload: dict[str, Any]) -> str:
    body = base64.urlsafe_b64encode(orjson.dumps(payload, option=orjson.OPT_SORT_KEYS)).decode()
    mac = hmac.new(secret, body.encode(), hashlib.sha256).hexdigest()
    return f"{body}.{mac}"


def verify(secret: bytes, token: Any) -> dict[str, Any] | None:
    """The payload of a token this secret signed, else None."""
    if not isinstance(token, str) or token.count(".") != 1:
        return None
    body, mac = token.split(".")
    expected = hmac.new(secret, body.encode(), hashlib.sha256).hexdigest()
    if not hmac.compare_digest(mac, expected):
        return None
    try:
        payload = orjson.loads(base64.urlsafe_b64decode(body.encode()))
    except (ValueError, orjson.JSONDecodeError):
        return None
    return payload if isinstance(payload, dict) else None


def thinking_signature(secret: bytes, thinking: str, *, omitted: bool = False) -> str:
    """Anthropic-style signature over a thinking block's text. `omitted`: the block goes out with
    an empty text (``thinking.display`` "omitted"), the signature alone carrying the thinking."""
    payload: dict[str, Any] = {"k": "thinking", "h": hashlib.sha256(thinking.encode()).hexdigest()}
    if omitted:
        payload["o"] = 1
    return sign(secret, payload)


def thinking_verifies(secret: bytes, thinking: Any, signature: Any) -> bool:
    """The block's text is the one signed, or empty under a signature minted for an omitted display."""
    payload = verify(secret, signature)
    return (isinstance(thinking, str) and payload is not None and payload.get("k") == "thinking"
            and (payload.get("h") == hashlib.sha256(thinking.encode()).hexdigest()
                 or (thinking == "" and payload.get("o") == 1)))
