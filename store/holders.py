"""Who holds a lease: ``host:pid:nonce``, unique across hosts and restarts.

A lease normally ends when it expires. A holder on this host whose process is gone (a gateway
killed with kill -9 mid-summary) cannot renew or release it, and waiting for the expiry would
stall that session's summaries for minutes after a restart, so such a lease counts as free.
"""

from __future__ import annotations

import os
import secrets
import socket

HOST = socket.gethostname()
HOLDER = f"{HOST}:{os.getpid()}:{secrets.token_hex(4)}"


def holder_is_gone(holder: str) -> bool:
    """True only when `holder` ran on this host and its process no longer exists."""
    parts = holder.rsplit(":", 2)
    if len(parts) != 3 or parts[0] != HOST or not parts[1].isdigit():
        return False
    try:
        os.kill(int(parts[1]), 0)
    except ProcessLookupError:
        return True
    except PermissionError:  # alive, owned by another user
        return False
    return False
