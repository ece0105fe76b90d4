"""Reading the checkpoint store of earlier versions (pickle) to convert it to JSON, never running it.

Earlier versions kept checkpoints in diskcache with its default serialisation, pickle: keys
``("cp", session, version)`` with the checkpoint's dict and ``("cps", session)`` with the
count, or (the first layout) ``session -> tuple of dicts``. This module reads that store's
SQLite table and files directly and decodes each pickle with an unpickler that refuses every
global: a checkpoint is made of dicts, lists, tuples, strings and numbers, which need none, and
a planted pickle that would call a function (the only way a pickle runs code) fails to decode
and is counted, not loaded. `store.checkpoints.DiskCheckpoints` writes what it returns as JSON
and deletes the old directory.
"""

from __future__ import annotations

import io
import json
import pickle
import sqlite3
from pathlib import Path

# diskcache's value modes (diskcache.core.MODE_*)
_RAW, _BINARY, _TEXT, _PICKLE = 1, 2, 3, 4


class _PlainData(pickle.Unpickler):
    def find_class(self, module: str, name: str):
        raise pickle.UnpicklingError(f"global {module}.{name} refused")

    def persistent_load(self, pid):
        raise pickle.UnpicklingError("persistent id refused")


def _plain(data: bytes):
    return _PlainData(io.BytesIO(data)).load()


def read_pickled(directory: Path) -> tuple[dict[str, list[dict]], int]:
    """({session key: its checkpoint dicts, oldest first}, rows refused) of a pickle-format store.

    Leases (``lease:NAME``) are not carried over: they expire in seconds anyway."""
    db = sqlite3.connect(f"file:{directory / 'cache.db'}?mode=ro", uri=True)
    try:
        rows = db.execute("SELECT key, raw, mode, filename, value FROM Cache").fetchall()
    finally:
        db.close()
    counts: dict[str, int] = {}
    by_version: dict[str, dict[int, dict]] = {}
    legacy: dict[str, list[dict]] = {}
    refused = 0
    for key, raw, mode, filename, value in rows:
        try:
            key = (bytes(key) if isinstance(key, bytes | memoryview) else key) if raw else _plain(bytes(key))
            if isinstance(key, str) and key.startswith("lease:"):
                continue
            value = _value(directory, mode, filename, value)
            json.dumps(value)  # what cannot be JSON cannot be converted
        except (pickle.UnpicklingError, ValueError, TypeError, EOFError, OSError, AttributeError, IndexError):
            refused += 1
            continue
        if isinstance(key, tuple) and len(key) == 3 and key[0] == "cp" and isinstance(value, dict):
            by_version.setdefault(key[1], {})[int(key[2])] = value
        elif isinstance(key, tuple) and len(key) == 2 and key[0] == "cps" and isinstance(value, int):
            counts[key[1]] = value
        elif isinstance(key, str) and isinstance(value, tuple | list) and all(isinstance(c, dict) for c in value):
            legacy[key] = list(value)
        else:
            refused += 1
    sessions = dict(legacy)
    for session, versions in by_version.items():  # rows are the newer layout: they win over a tuple
        sessions[session] = [versions[v] for v in sorted(versions) if v <= counts.get(session, max(versions))]
    return sessions, refused


def _value(directory: Path, mode: int, filename: str | None, value):
    if mode == _RAW:
        return bytes(value) if isinstance(value, bytes | memoryview) else value
    path = (directory / filename).resolve() if filename else None
    if path is not None and not path.is_relative_to(directory.resolve()):
        raise ValueError("a value file outside the store")
    if mode == _TEXT and path is not None:
        return path.read_text(encoding="utf-8")
    if mode == _BINARY and path is not None:
        return path.read_bytes()
    if mode == _PICKLE:
        return _plain(path.read_bytes() if value is None and path is not None else bytes(value))
    raise ValueError(f"diskcache mode {mode}")
