"""The embedded store is private to the gateway's OS user: directories 0700, files 0600.

Every tenant's raw messages live under ``store.path`` (the ledger, its WAL and SHM files, the
checkpoints, the turn log, the recall index, the Responses ids). With the usual umask (022)
SQLite, diskcache and LanceDB would create them readable by every local user, so the gateway
makes the directories itself with mode 0700, and `secure_tree` sets the modes of what is
already there when the store opens (a store written by an earlier version, or a file one of
the libraries created with the umask's mode). `palimpsest` runs with umask 077 as well
(`gateway/cli/main.py`), so what the libraries create later is private from the start.
SQLite creates a database's WAL and SHM files with the database file's own mode.
"""

from __future__ import annotations

import logging
import os
import stat
from pathlib import Path

log = logging.getLogger("palimpsest.store")

DIR_MODE = 0o700
FILE_MODE = 0o600
UMASK = 0o077


def private_dir(path: Path) -> Path:
    """`path` (and missing parents) created, and `path` itself set to 0700."""
    path.mkdir(mode=DIR_MODE, parents=True, exist_ok=True)
    _set(path, DIR_MODE)
    return path


def secure_tree(root: str | Path) -> int:
    """Every directory under `root` (itself included) 0700, every file 0600; symbolic links are
    left alone and not followed. Returns how many modes it changed."""
    changed = 0
    root = Path(root)
    if not root.is_dir():
        return 0
    changed += _set(root, DIR_MODE)
    for top, dirs, files in os.walk(root):
        for name in dirs:
            changed += _set(Path(top) / name, DIR_MODE)
        for name in files:
            changed += _set(Path(top) / name, FILE_MODE)
    if changed:
        log.info("store modes made private", extra={"fields": {"path": str(root), "changed": changed}})
    return changed


def _set(path: Path, mode: int) -> int:
    try:
        st = path.lstat()
        if stat.S_ISLNK(st.st_mode) or stat.S_IMODE(st.st_mode) == mode:
            return 0
        os.chmod(path, mode)
        return 1
    except FileNotFoundError:  # a WAL or lock file removed while the tree was walked
        return 0
    except PermissionError:  # another user's file: say so, it stays as it is
        log.warning("cannot make a store file private (not its owner)", extra={"fields": {"path": str(path)}})
        return 0
