"""The embedded backends implement the store Protocols the gateway is typed against, with the
same parameter names, so a scale-out backend written against store.interfaces fits the gateway."""

from __future__ import annotations

import inspect
import sys

import pytest

from store import interfaces
from store.checkpoints import DiskCheckpoints
from store.index import SearchIndex
from store.ledger import Ledger
from store.response_ids import ResponseIds
from store.turns import TurnLog


def _methods(proto: type) -> list[str]:
    return sorted(n for n, v in vars(proto).items() if inspect.isfunction(v) and not n.startswith("_"))


@pytest.mark.parametrize(("proto", "impl"), [
    (interfaces.LedgerStore, Ledger),
    (interfaces.CheckpointStore, DiskCheckpoints),
    (interfaces.SearchIndex, SearchIndex),
    (interfaces.TurnLogStore, TurnLog),
    (interfaces.ResponseIdStore, ResponseIds),
])
def test_backend_implements_protocol(proto: type, impl: type) -> None:
    for name in _methods(proto):
        wanted, got = inspect.signature(getattr(proto, name)), inspect.signature(getattr(impl, name))
        names = list(wanted.parameters)
        assert list(got.parameters)[:len(names)] == names, f"{impl.__name__}.{name}{got} vs {wanted}"
        extra = list(got.parameters.values())[len(names):]  # a backend may take more, optionally
        assert all(p.default is not inspect.Parameter.empty for p in extra), f"{impl.__name__}.{name}{got}"
        assert inspect.iscoroutinefunction(getattr(impl, name)) == inspect.iscoroutinefunction(getattr(proto, name)), name


def test_protocols_open_instances(tmp_path) -> None:
    ledger, checkpoints, turns = Ledger(tmp_path), DiskCheckpoints(tmp_path), TurnLog(tmp_path)
    try:
        assert isinstance(ledger, interfaces.LedgerStore)
        assert isinstance(checkpoints, interfaces.CheckpointStore)
        assert isinstance(turns, interfaces.TurnLogStore)
    finally:
        ledger.close()
        checkpoints.close()
        turns.close()


def test_importing_interfaces_is_cheap() -> None:
    code = "import sys, store.interfaces; print('lancedb' in sys.modules, 'diskcache' in sys.modules)"
    import subprocess

    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["False", "False"]
