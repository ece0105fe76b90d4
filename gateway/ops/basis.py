"""What an answered request was built on, as the turn log keeps it (``store.turns``).

The chat side's ``TurnRecorder`` calls ``of_turn`` once per answered request; the inspector
reads the rows back (docs/architecture.md, "Inspection"), so ``palimpsest inspect`` shows the
window and budget the live gateway used without asking the upstream or re-projecting.
"""

from __future__ import annotations

from typing import Any

from store.turns import TurnBasis


def of_turn(turn: Any, answer: Any, cost_usd: float | None = None, *, compaction_event: bool = False,
            billed_units: float | None = None, form: str | None = None) -> TurnBasis:
    """The basis of a ``gateway.pipeline.turn.Turn`` whose answer was recorded as event `answer`."""
    view = turn.view
    billed = turn.billed  # what the provider said it cached, over the turn's upstream calls
    return TurnBasis(
        session_key=turn.ref.key, node=turn.chat.ids[-1] if turn.chat.ids else None,
        answer=getattr(answer, "id", None), model=turn.chat.model, window=view.window, budget=view.budget,
        client_tokens=view.client_tokens, upstream_tokens=view.upstream_tokens, checkpoint=view.checkpoint,
        recall_calls=turn.recall_calls, cached_tokens=billed.cached if billed else None,
        uncached_tokens=billed.uncached if billed else None, cache_write_tokens=billed.cache_write if billed else None,
        cost_usd=cost_usd, receipt=turn.receipt, compaction_event=compaction_event, billed_units=billed_units,
        route=turn.route, form=form,
    )
