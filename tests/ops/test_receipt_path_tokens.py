"""A receipt counts a forwarded path's tokens from the session's previous path (gateway/ops/
receipts.py, ``path_tokens``): always the figure counting every message gives."""

from __future__ import annotations

from gateway.ops import receipts
from policies.tokens import REPLY_PRIMING, TokenCounter
from store.canonical import path_ids


def messages(n: int, tag: str = "") -> list[dict]:
    return [{"role": "user" if i % 2 == 0 else "assistant", "content": f"{tag} message {i} " + "word " * (i % 7)}
            for i in range(n)]


def test_path_tokens_is_the_full_count_whatever_was_counted_before(monkeypatch):
    counted = []
    counter = TokenCounter()
    real = counter.count_message
    monkeypatch.setattr(counter, "count_message", lambda m, k=None: counted.append(k) or real(m, k))
    base = messages(50)
    cases = [base[:30], base[:31], base[:40], base[:35], [*base[:20], {"role": "user", "content": "forked"}], base, messages(50, "other")]
    for history in cases:
        ids = path_ids(history)
        counted.clear()
        want = TokenCounter().count_messages(history, ids) - REPLY_PRIMING
        assert receipts.path_tokens(counter, history, ids) == want
    # The session's next step counted only what it added.
    ids = path_ids(base[:45])
    receipts.path_tokens(counter, base[:44], ids[:44])
    counted.clear()
    receipts.path_tokens(counter, base[:45], ids)
    assert counted == [ids[44]]
