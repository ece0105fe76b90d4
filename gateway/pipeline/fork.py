"""A summary call that is a cache fork of the request just sent (docs/architecture.md,
"Summary jobs").

The provider caches the prefix of the request it just answered. A summary call that resends
that request as it went (instructions, tools, the conversation), then the answer and the
gateway's instruction, with ``tool_choice`` none, is served that prefix from the cache and pays
for little more than what it adds. A view is a prefix only in its own wire format, so each
format renders its own fork (``gateway/chat/fork.py``, ``gateway/responses/fork.py``,
``gateway/messages/fork.py``) behind this interface; the summary model (``gateway/jobs/``) sees
only ``SummaryFork``. Which upstream the call goes to is the summary model's transport.
"""

from __future__ import annotations


class SummaryFork:
    """The parent request of a cache-forked summary call, in its format."""

    path = ""  # the route under the upstream's base URL, e.g. "/responses"
    key_header = "Authorization"  # how an operator's key is spelled on that route

    def __init__(self, parent: dict, *, tokens: int, headers: dict[str, str] | None = None) -> None:
        self.parent = parent  # the body the upstream received for the view (the cached prefix)
        self.tokens = tokens  # about what it holds: the call's reserved input
        self.headers = headers or {}  # the parent's format headers the call repeats

    def body(self, texts: list[str], max_tokens: int) -> dict:
        """The summary call: the parent, its answer, then `texts` (the gateway's instruction
        and, on a retry, the correction) as user text; no tool may be called."""
        raise NotImplementedError

    def reply(self, data: dict) -> tuple[str, dict | None]:
        """(the summary text, the call's usage as the provider reported it) of an answer."""
        raise NotImplementedError
