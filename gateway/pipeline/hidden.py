"""The hidden-context index of a view (policies/hidden_index.py): what a checkpoint hides, listed
after its summary block so the model knows what to search for, and the summary's entities that
``session_search`` expands a query with. Both depend only on the checkpoint (and the budget and
tool names), so they are built once per checkpoint and kept while it is in use."""

from __future__ import annotations

from collections import OrderedDict

from gateway.pipeline.request import ChatRequest
from policies import Policy, TokenCounter, last_user_index
from policies.hidden_index import render_hidden_index
from store.query_expansion import summary_entities
from store.records import Checkpoint

INDEX_MEMO = 256  # hidden-context indexes kept (one per checkpoint in use)


class HiddenIndexes:
    def __init__(self, counter: TokenCounter) -> None:
        self.counter = counter
        self._indexes: OrderedDict[tuple, tuple] = OrderedDict()

    def index(self, chat: ChatRequest, checkpoint: Checkpoint, pos: int, policy: Policy, budget: int,
                      names: tuple[str, str] | None) -> tuple[str | None, int]:
        """The hidden-context index of what `checkpoint` covers (policies/hidden_index.py), put
        after its summary block, and its tokens. It depends only on the checkpoint (its boundary
        fixes the covered events), the budget and the tool names, so it is cached by them and
        changes only when a new checkpoint is adopted. The user message of a turn the checkpoint
        covers in part stays in the view and is not listed."""
        if not names or policy.hidden_index_ratio <= 0:
            return None, 0
        chars = int(policy.hidden_index_ratio * budget * 4)  # ~4 characters per token
        key = (checkpoint.id, chars, names)
        if key in self._indexes:
            self._indexes.move_to_end(key)
            return self._indexes[key]
        covered, ids = chat.history[:pos + 1], chat.ids[:pos + 1]
        if pos + 1 < len(chat.history) and chat.history[pos + 1].get("role") != "user":
            task = last_user_index(covered)
            if task is not None:
                covered, ids = covered[:task] + covered[task + 1:], ids[:task] + ids[task + 1:]
        index = render_hidden_index(covered, ids, checkpoint.state, chars, *names)
        self._indexes[key] = found = (index, self.counter.count_text(index) if index else 0)
        while len(self._indexes) > INDEX_MEMO:
            self._indexes.popitem(last=False)
        return found

    def entities(self, checkpoint: Checkpoint) -> tuple[str, ...]:
        key = ("entities", checkpoint.id)
        if key not in self._indexes:
            self._indexes[key] = (summary_entities(checkpoint.summary, checkpoint.state), 0)
            while len(self._indexes) > INDEX_MEMO:
                self._indexes.popitem(last=False)
        return self._indexes[key][0]
