"""Stand-ins shared by tests that drive the gateway's jobs without LanceDB."""

from __future__ import annotations


class RecordingIndex:
    """Takes the place of `store.index.SearchIndex` for the Indexer: records each add."""

    def __init__(self) -> None:
        self.batches: list[int] = []  # events per add
        self.ids: list[str] = []
        self.seq = -1

    def indexed_seq(self, session_key: str) -> int:
        return self.seq

    async def add(self, session_key: str, batch: list) -> int:
        self.batches.append(len(batch))
        self.ids += [e.event_id for e in batch]
        self.seq = max(self.seq, *(e.seq for e in batch))
        return len(batch)

    def close(self) -> None:
        pass
