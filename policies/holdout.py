"""The holdout: a share of sessions sent as direct, so the saving is measured on the operator's
own traffic (docs/architecture.md, "Views").

``arm`` puts a session in the ``holdout`` arm or the ``compacted`` arm by a hash of its key:
the same session always lands in the same arm, on every replica and after a restart, and a
share ``s`` of sessions lands in the holdout. Holdout sessions are answered as a client sending
direct would be: untouched while they fit, the oldest rounds cut when they do not (tailoring),
no summaries, no compaction, no recall tools. They are still recorded in the ledger.
"""

from __future__ import annotations

import hashlib

HOLDOUT, COMPACTED = "holdout", "compacted"
ARMS = (HOLDOUT, COMPACTED)
_SALT = b"palimpsest-holdout-v1:"


def arm(session_key: str, share: float) -> str:
    """The session's arm for a holdout of `share` (0: every session is compacted)."""
    if share <= 0:
        return COMPACTED
    digest = hashlib.sha256(_SALT + session_key.encode()).digest()
    return HOLDOUT if int.from_bytes(digest[:8], "big") / 2**64 < share else COMPACTED
