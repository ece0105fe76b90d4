"""The recall search index: hybrid BM25 + vector search over one session's ledger events.

Layout: one LanceDB table per session
-------------------------------------
Each session gets its own table, named by a hash of its session key, with one row per chunk:
(session_key, event_id, chunk, seq, role, created, text, vector). We chose this over one shared
table with a `session_key` prefilter (which measured about as fast, 4-6 ms per leg at 20
sessions) because:

- tenant isolation holds by construction: a query can only read the one session's files. The
  `session_key = ...` filter is kept on every query anyway, as a second lock (it costs ~1.5 ms
  on the vector leg at 500 events);
- BM25 statistics (document frequencies, average length) are per session, so other tenants'
  text neither skews ranking nor leaks through scores;
- latency and maintenance cost depend on the session's size, not on the whole gateway's;
- `drop_session` is a directory delete, not a tombstoned delete awaiting compaction.
The cost is a directory per session and a bounded cache of open table handles.

Full-text search and freshness
------------------------------
Each table carries LanceDB's native inverted (BM25) index on `text`, built when the table is
created. Rows appended later are not in the index yet, but the installed LanceDB (0.40) searches
them anyway: its FTS plan unions the indexed `MatchQuery` with a `FlatMatchQuery` over
unindexed fragments, so a search sees every added row immediately (see
`test_search_immediately_after_add_finds_unindexed_rows`). Every append is also a new fragment,
and fragments and the flat tail cost latency (100 one-row appends took each leg from ~3 to
~22 ms), so after `MAINTAIN_AFTER_ADDS` appends or `MAINTAIN_AFTER_ROWS` rows a background task
runs `optimize()` (compaction, incremental FTS update) outside the session lock, so adds never
queue behind it. No vector index: a flat scan of a few thousand rows is exact and takes a few ms.

Ranking and scope
-----------------
Both legs (`store/index_legs.py`) return chunks; `store.ranking.fuse` collapses them to events and
fuses them. A search may be limited to some events (`within`: the request's own path, so another
conversation that shares the session never shows up, not even through a neighbour's score) and
may skip some (`exclude`: what the model already sees). A scope of up to `PREFILTER_WITHIN`
events is a prefilter inside LanceDB; a larger scope and the exclusions are applied after
retrieval, re-querying deeper when they ate into the top (a `NOT IN (...)` prefilter measured
8 ms for 200 ids and 46 ms for 2,000 on the vector leg). `indexed_seq` is synchronous, on the
request path: the first call per session per process reads the table once (a few ms, blocking),
later calls are a dict lookup.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
import weakref
from collections import OrderedDict
from dataclasses import dataclass
from datetime import timedelta

import lancedb
import pyarrow as pa
import pyarrow.compute as pc
from lancedb.index import FTS

from store.chunking import split_chunks
from store.embedders import Embedder
from store.answer_types import expected_type
from store.kinds import LINE_ROW, index_rows, kind_token
from store.index_legs import deeper_by, retrieve, scope_filter, sql_string
from store.ranking import Hit, Ranking, fuse, text_query, vector_query

__all__ = ["LINE_ROW", "Hit", "IndexedEvent", "Ranking", "SearchIndex"]

logger = logging.getLogger(__name__)

MAINTAIN_AFTER_ADDS = 16
MAINTAIN_AFTER_ROWS = 256
OPEN_TABLES = 128
# Sessions whose index is optimised at the same time: each optimize() rewrites fragments and
# merges the FTS index in native memory, and 20 at once hold hundreds of MB.
MAINTAIN_CONCURRENTLY = 2
HIGH_WATER_TRACKED = 10_000  # sessions whose high-water mark is remembered (locks: a weak map)
# LanceDB's index + metadata caches, split evenly. Its default is GiBs: they grew ~1 MB per append under load.
# Under writes they fill with old versions' metadata; searches of 20 sessions used ~9 MB (bench/lance_memory.py).
CACHE_BYTES = 32 * 2**20
# Old table versions are garbage once no query can still be reading them.
_KEEP_OLD_VERSIONS = timedelta(minutes=1)
_COLUMNS = ["event_id", "chunk", "seq", "role", "created", "parent", "text"]
_EMBEDDER_KEY = b"palimpsest.embedder"
# Bumped when the table's columns or chunking change: a table of another layout is rebuilt.
_LAYOUT = "layout=3"  # 3: lines annotated with their values' kinds, notable lines as rows (store/kinds.py)


@dataclass(frozen=True)
class IndexedEvent:
    event_id: str
    seq: int
    role: str
    created: float
    text: str
    parent: str = ""  # the event before it in its conversation ("" for the first)


@dataclass
class _Session:
    table: lancedb.table.AsyncTable
    adds_since_optimize: int = 0
    rows_since_optimize: int = 0


def _table_name(session_key: str) -> str:
    return "session_" + hashlib.sha256(session_key.encode()).hexdigest()[:40]


class SearchIndex:
    def __init__(
        self,
        path: str,
        embedder: Embedder,
        chunk_chars: int = 1200,
        overlap_chars: int = 200,
        ranking: Ranking | None = None,
        *,
        storage_options: dict[str, str] | None = None,
        shared: bool = False,
        cache_bytes: int = CACHE_BYTES,
    ) -> None:
        split_chunks("", chunk_chars, overlap_chars)  # validates the sizes now, not on first add
        self._path = path
        # Replicas share one index (an s3:// URI): each read checks for other writers' commits,
        # and what another replica indexed since this one's high-water mark is looked up, not
        # assumed new (docs/architecture.md, Scale-out).
        self._shared = shared
        self._connect_options: dict = {"storage_options": storage_options} if storage_options else {}
        if shared:
            self._connect_options["read_consistency_interval"] = timedelta(0)
        half = max(1, cache_bytes // 2)  # one bounded cache for both connections
        self._lance_session = lancedb.Session(index_cache_size_bytes=half, metadata_cache_size_bytes=half)
        self._connect_options["session"] = self._lance_session
        # An embedder may say how far its vectors can be trusted (gateway/recall/embeddings.py).
        self.ranking = ranking or getattr(embedder, "ranking", None) or Ranking()
        self._built_with = f"{embedder.name};{_LAYOUT};chunks={chunk_chars}/{overlap_chars}"
        self._embedder = embedder
        self._chunk_chars = chunk_chars
        self._overlap_chars = overlap_chars
        self._schema = pa.schema(
            [
                ("session_key", pa.string()),
                ("event_id", pa.string()),
                ("chunk", pa.int32()),
                ("seq", pa.int64()),
                ("role", pa.string()),
                ("created", pa.float64()),
                ("parent", pa.string()),
                ("text", pa.string()),
                ("vector", pa.list_(pa.float32(), embedder.dim)),
            ],
            metadata={_EMBEDDER_KEY: self._built_with.encode()},
        )
        self._db: lancedb.AsyncConnection | None = None
        self._sync_db: lancedb.DBConnection | None = None
        self._open: OrderedDict[str, _Session] = OrderedDict()
        self._high_water: dict[str, int] = {}  # at most HIGH_WATER_TRACKED, oldest dropped first
        self._locks: weakref.WeakValueDictionary[str, asyncio.Lock] = weakref.WeakValueDictionary()
        self._maintenance: dict[str, asyncio.Task[None]] = {}
        self._maintaining = asyncio.Semaphore(MAINTAIN_CONCURRENTLY)  # bounded optimize(), see MAINTAIN_CONCURRENTLY

    # -- writing -----------------------------------------------------------------------------

    async def add(self, session_key: str, events: list[IndexedEvent]) -> int:
        """Index events not yet indexed for the session; returns the number of chunks written."""
        if not events:
            return 0
        async with self._lock(session_key):
            session = await self._session(session_key)
            high_water = await asyncio.to_thread(self.indexed_seq, session_key)
            unique = list({event.event_id: event for event in events}.values())
            # seq is the ledger's insertion order, so an event above the high-water mark cannot
            # be indexed yet; only events at or below it need a look-up.
            maybe_known = [event.event_id for event in unique if self._shared or event.seq <= high_water]
            known = await self._existing_ids(session, session_key, maybe_known)
            # Chunks and a tool output's notable lines; the vector leg embeds the text as
            # written, BM25 also reads each line's kind words (store/kinds.py).
            rows = await asyncio.to_thread(lambda: [
                (event, number, text, indexed)
                for event in unique
                if event.event_id not in known
                for number, text, indexed in index_rows(
                    event.text, event.role, split_chunks(event.text, self._chunk_chars, self._overlap_chars))
            ])
            self._note_high_water(session_key, max(high_water, max(e.seq for e in events)))
            if not rows:
                return 0
            vectors = await self._embedder.embed([text for _, _, text, _ in rows])
            batch = pa.table(
                {
                    "session_key": [session_key] * len(rows),
                    "event_id": [event.event_id for event, *_ in rows],
                    "chunk": [number for _, number, *_ in rows],
                    "seq": [event.seq for event, *_ in rows],
                    "role": [event.role for event, *_ in rows],
                    "created": [event.created for event, *_ in rows],
                    "parent": [event.parent for event, *_ in rows],
                    "text": [indexed for *_, indexed in rows],
                    "vector": pa.FixedSizeListArray.from_arrays(
                        pa.array(vectors.reshape(-1), pa.float32()), self._embedder.dim
                    ),
                },
                schema=self._schema,
            )
            if session is None:
                await self._create(session_key, batch)
            else:
                await session.table.add(batch)
                session.adds_since_optimize += 1
                session.rows_since_optimize += len(rows)
                if (
                    session.adds_since_optimize >= MAINTAIN_AFTER_ADDS
                    or session.rows_since_optimize >= MAINTAIN_AFTER_ROWS
                ):
                    self._schedule_maintenance(session_key, session)
            return len(rows)

    def indexed_seq(self, session_key: str) -> int:
        """Highest seq indexed for the session, -1 when none."""
        cached = self._high_water.get(session_key)
        if cached is not None:
            return cached
        high_water = self._read_high_water(session_key)
        high_water = self._high_water.get(session_key, high_water)  # an add may have moved it meanwhile
        self._note_high_water(session_key, high_water)
        return high_water

    def bookkeeping(self) -> dict[str, int]:  # what is kept per session, and LanceDB's cache bytes
        return {"open_tables": len(self._open), "high_water": len(self._high_water), "locks": len(self._locks),
                "maintenance": len(self._maintenance), "cache_bytes": self._lance_session.size_bytes}

    async def chunk_keys(self, session_key: str) -> set[tuple[str, int]]:
        """(event_id, chunk) of every indexed row of the session: what `reindex` must reproduce."""
        session = await self._session(session_key)
        if session is None:
            return set()
        rows = await session.table.query().select(["event_id", "chunk"]).to_list()
        return {(row["event_id"], row["chunk"]) for row in rows}

    async def drop_session(self, session_key: str) -> None:
        async with self._lock(session_key):
            await self._cancel_maintenance(session_key)
            self._open.pop(session_key, None)
            await (await self._connection()).drop_table(
                _table_name(session_key), ignore_missing=True
            )
            self._note_high_water(session_key, -1)

    async def reset(self) -> None:
        """Drop every session's index (`palimpsest reindex`); not meant to race with `add`."""
        for session_key in list(self._maintenance):
            await self._cancel_maintenance(session_key)
        await (await self._connection()).drop_all_tables()
        self._open.clear()
        self._high_water.clear()

    def close(self) -> None:
        for task in self._maintenance.values():
            task.cancel()
        self._maintenance.clear()
        self._open.clear()
        if self._db is not None:
            self._db.close()
            self._db = None
        self._sync_db = None

    # -- searching ---------------------------------------------------------------------------

    async def search(
        self,
        session_key: str,
        query: str,
        limit: int = 5,
        exclude_event_ids: frozenset[str] = frozenset(),
        within: frozenset[str] | None = None,
        ranking: Ranking | None = None,
        expansion: str = "",
    ) -> list[Hit]:
        """Events of this session best matching `query`, best first, at most `limit`.

        `within`: only these events count (None: the whole session); `exclude_event_ids`:
        these are never returned, though they still lend their neighbours a share of score.
        `expansion`: more words, searched by BM25 as a leg of their own, worth
        `Ranking.expansion_weight` (store/query_expansion.py).
        """
        if limit <= 0 or not query.strip():
            return []
        session = await self._session(session_key)
        if session is None or (within is not None and not within):
            return []
        ranking = ranking or self.ranking
        query_vector = (await self._embedder.embed([vector_query(query, ranking)]))[0]
        where = scope_filter(session_key, within)
        # A question asking for a rare kind of value also retrieves the rows holding one.
        kind = kind_token(expected_type(query)) if ranking.kind_weight else ""
        depth = first = max(20, 4 * limit + 2 * len(exclude_event_ids))
        while True:
            text_depth = depth + ranking.text_extra
            text_rows, vector_rows, *expanded = await retrieve(
                session.table, where, text_query(query, ranking), query_vector, _COLUMNS,
                depth, text_depth, expansion if ranking.expansion_weight else "", kind,
            )
            if expanded and expanded[-1] and expanded[-1][0].get("_kind") and len(expanded[-1]) >= depth:
                expanded[-1] = []  # the kind is everywhere: holding one tells nothing
            legs = [
                rows if within is None else [row for row in rows if row["event_id"] in within]
                for rows in (text_rows, vector_rows, *expanded)
            ]
            fused = fuse(legs, query, limit + len(exclude_event_ids), ranking)
            hits = [hit for hit in fused if hit.event_id not in exclude_event_ids][:limit]
            # Go deeper when the scope or exclusions (or many chunks per event) left the list short while
            # a leg still had more rows, and once when the BM25 leg is flat or misses the answer (`deeper_by`).
            deeper = deeper_by(text_rows, text_depth, hits, query if ranking.answer_type else "") if depth == first else 1
            if (len(hits) >= limit and deeper == 1) or (len(text_rows) < text_depth and len(vector_rows) < depth):
                return hits
            depth *= max(2, deeper)

    # -- internals ---------------------------------------------------------------------------

    def _lock(self, session_key: str) -> asyncio.Lock:
        return self._locks.setdefault(session_key, asyncio.Lock())  # weak: lives while held or awaited

    def _note_high_water(self, session_key: str, seq: int) -> None:
        self._high_water[session_key] = seq  # also from a worker thread: a race drops one more
        with contextlib.suppress(KeyError, RuntimeError, StopIteration):
            while len(self._high_water) > HIGH_WATER_TRACKED:
                del self._high_water[next(iter(self._high_water))]

    async def _connection(self) -> lancedb.AsyncConnection:
        if self._db is None:
            self._db = await lancedb.connect_async(self._path, **self._connect_options)
        return self._db

    async def _session(self, session_key: str) -> _Session | None:
        """The session's open table, or None when it has no index (or one from another embedder)."""
        session = self._open.get(session_key)
        if session is not None:
            self._open.move_to_end(session_key)
            return session
        db = await self._connection()
        name = _table_name(session_key)
        try:
            table = await db.open_table(name)
        except ValueError:  # LanceDB's "Table '...' was not found"
            return None
        built_with = ((await table.schema()).metadata or {}).get(_EMBEDDER_KEY, b"").decode()
        if built_with != self._built_with:
            # Vectors from another embedder (or rows of another layout) are useless here: start over, and let
            # the gateway's catch-up (indexed_seq is now -1) re-add the session's events.
            logger.warning(
                "Index of session table %s was built as %r, not %r; rebuilding",
                name, built_with, self._built_with,
            )
            await db.drop_table(name, ignore_missing=True)
            self._note_high_water(session_key, -1)
            return None
        if not any(index.index_type == "FTS" for index in await table.list_indices()):
            try:
                await table.create_index("text", config=FTS())  # a crash interrupted _create
            except RuntimeError:
                # LanceDB refused a second CreateIndex: another open (a search racing an add, another
                # replica) built it. Searches scan unindexed rows until a shared index's is done.
                await table.checkout_latest()
                if not (self._shared or any(i.index_type == "FTS" for i in await table.list_indices())):
                    raise
        return self._remember(session_key, _Session(table))

    async def _create(self, session_key: str, batch: pa.Table) -> None:
        try:
            table = await (await self._connection()).create_table(
                _table_name(session_key), data=batch, schema=self._schema
            )
        except ValueError:
            if not self._shared:
                raise
            # Another replica created the session's table first: add what it lacks.
            session = await self._session(session_key)
            if session is None:
                raise
            known = await self._existing_ids(session, session_key, batch["event_id"].to_pylist())
            fresh = batch.filter(pc.invert(pc.is_in(batch["event_id"], pa.array(sorted(known), pa.string()))))
            if fresh.num_rows:
                await session.table.add(fresh)
            return
        await table.create_index("text", config=FTS())
        self._remember(session_key, _Session(table))

    def _remember(self, session_key: str, session: _Session) -> _Session:
        self._open[session_key] = session
        while len(self._open) > OPEN_TABLES:
            self._open.popitem(last=False)
        return session

    async def _existing_ids(
        self, session: _Session | None, session_key: str, event_ids: list[str]
    ) -> set[str]:
        if session is None or not event_ids:
            return set()
        wanted = ", ".join(sql_string(event_id) for event_id in event_ids)
        rows = await (
            session.table.query()
            .where(f"session_key = {sql_string(session_key)} AND event_id IN ({wanted})")
            .select(["event_id"])
            .to_arrow()
        )
        return set(rows["event_id"].to_pylist())

    def _read_high_water(self, session_key: str) -> int:
        if self._sync_db is None:
            self._sync_db = lancedb.connect(self._path, **self._connect_options)
        try:
            table = self._sync_db.open_table(_table_name(session_key))
        except ValueError:
            return -1
        if (table.schema.metadata or {}).get(_EMBEDDER_KEY, b"").decode() != self._built_with:
            return -1  # _session rebuilds it on the next add
        seqs = table.search().select(["seq"]).limit(None).to_arrow()["seq"]
        highest = pc.max(seqs).as_py()
        return -1 if highest is None else highest

    def _schedule_maintenance(self, session_key: str, session: _Session) -> None:
        if session_key in self._maintenance:
            return  # the counters keep growing and trigger again once it is done
        session.adds_since_optimize = 0
        session.rows_since_optimize = 0
        task = asyncio.create_task(self._maintain(session_key, session.table))
        self._maintenance[session_key] = task
        task.add_done_callback(lambda _: self._maintenance.pop(session_key, None))

    async def _maintain(self, session_key: str, table: lancedb.table.AsyncTable) -> None:
        # Not under the session lock: LanceDB commits appends and compaction concurrently
        # (checked: 300 appends racing 31 optimize() calls and searches lost no row), so adds
        # on the catch-up path never wait ~0.2 s behind an optimize.
        try:
            async with self._maintaining:  # bounded optimize(), see MAINTAIN_CONCURRENTLY
                await table.optimize(cleanup_older_than=_KEEP_OLD_VERSIONS)
        except Exception:
            # Searches stay correct without it (the tail is scanned flat); the next
            # threshold crossing retries.
            logger.exception(
                "Optimising the index of session table %s failed", _table_name(session_key)
            )

    async def _cancel_maintenance(self, session_key: str) -> None:
        task = self._maintenance.pop(session_key, None)
        if task is not None:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
