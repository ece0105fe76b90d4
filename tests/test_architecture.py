"""The dependency rules of docs/architecture.md ("Dependency rules"), checked on the source.

An AST import graph over gateway/, policies/, store/ and simulator/: module-level imports (those
that run when the module is imported; imports inside functions and under ``if TYPE_CHECKING``
are not edges of a cycle) must not form a cycle; policies/ stays pure; store/ does not know
the gateway; nobody imports or reads another module's private names; modules stay small.
"""

from __future__ import annotations

import ast
import importlib
import importlib.util
from dataclasses import dataclass, field
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("gateway", "policies", "store", "simulator")
MAX_LINES = 450  # "~400": a module past this must be split
# Third-party modules that are optional extras: a module needing them is skipped when absent.
OPTIONAL = ("psycopg", "psycopg_pool", "boto3", "moto")


@dataclass
class Module:
    name: str
    path: Path
    tree: ast.Module
    runtime: set[str] = field(default_factory=set)  # project modules imported at import time
    every: set[str] = field(default_factory=set)  # every module named anywhere (any level)
    private: list[str] = field(default_factory=list)  # private names reached in other modules


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _is_type_checking(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def _resolve(module: Module, node: ast.ImportFrom) -> str:
    if not node.level:
        return node.module or ""
    package = module.name.split(".")
    if module.path.name != "__init__.py":
        package = package[:-1]
    base = package[: len(package) - (node.level - 1)]
    return ".".join([*base, *([node.module] if node.module else [])])


def _targets(module: Module, node: ast.stmt, known: set[str]) -> list[tuple[str, list[str]]]:
    """(imported module, names taken from it) for an import statement."""
    if isinstance(node, ast.Import):
        return [(alias.name, []) for alias in node.names]
    assert isinstance(node, ast.ImportFrom)
    base = _resolve(module, node)
    out = []
    for alias in node.names:
        sub = f"{base}.{alias.name}"
        out.append((sub, []) if sub in known else (base, [alias.name]))
    return out


def _walk_imports(module: Module, known: set[str]) -> None:
    aliases: dict[str, str] = {}

    def visit(nodes, runtime: bool) -> None:
        for node in nodes:
            if isinstance(node, ast.If) and _is_type_checking(node):
                visit(node.body, False)
                visit(node.orelse, runtime)
                continue
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                for target, names in _targets(module, node, known):
                    module.every.add(target)
                    if runtime and target in known and target != module.name:
                        module.runtime.add(target)
                    if target in known and target != module.name:
                        module.private += [f"{target}.{n}" for n in names if n.startswith("_") and not n.startswith("__")]
                if isinstance(node, ast.Import):
                    for alias in node.names:
                        if alias.name in known:
                            aliases[alias.asname or alias.name] = alias.name
                else:
                    base = _resolve(module, node)
                    for alias in node.names:
                        sub = f"{base}.{alias.name}"
                        if sub in known:
                            aliases[alias.asname or alias.name] = sub
                        elif base in known and base != module.name:
                            aliases[alias.asname or alias.name] = sub  # a class or function of `base`
                continue
            # Module-level code that runs at import: class bodies, if/try/with blocks.
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
                visit(_body_imports(node), False)
                continue
            children = []
            for child in ast.iter_child_nodes(node):
                if isinstance(child, ast.stmt):
                    children.append(child)
                elif isinstance(child, ast.excepthandler):
                    children += child.body
            visit(children, runtime)

    visit(module.tree.body, True)
    # `alias._private` where alias names another project module, or a class imported from one.
    for node in ast.walk(module.tree):
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name):
            target = aliases.get(node.value.id)
            if target and target != module.name and node.attr.startswith("_") and not node.attr.startswith("__"):
                module.private.append(f"{target}.{node.attr}")


def _body_imports(func: ast.AST) -> list[ast.stmt]:
    return [n for n in ast.walk(func) if isinstance(n, (ast.Import, ast.ImportFrom))]


def _load() -> dict[str, Module]:
    modules = {}
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            name = _module_name(path)
            modules[name] = Module(name, path, ast.parse(path.read_text(), str(path)))
    known = set(modules)
    for module in modules.values():
        _walk_imports(module, known)
    return modules


MODULES = _load()


def _cycles(modules: dict[str, Module]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def strongconnect(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(modules[v].runtime):
            # Importing a submodule runs its package's __init__ first; that is not an edge back.
            if w not in index:
                strongconnect(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(modules):
        if v not in index:
            strongconnect(v)
    return found


def test_the_graph_sees_the_imports():
    pipeline = MODULES["gateway.pipeline.pipeline"]
    assert {"gateway.pipeline.views", "gateway.http.errors", "gateway.keys"} <= pipeline.runtime
    assert "gateway.ops.metrics" not in MODULES["gateway.ops.inspection"].runtime


def test_no_import_cycles():
    assert _cycles(MODULES) == []


def test_cycle_detection_works():
    a = Module("a", ROOT, ast.parse(""), runtime={"b"})
    b = Module("b", ROOT, ast.parse(""), runtime={"a"})
    assert _cycles({"a": a, "b": b}) == [["a", "b"]]


def test_policies_are_pure():
    forbidden = ("gateway", "store", "simulator", "aiohttp", "httpx", "requests", "sqlite3", "diskcache", "lancedb",
                 "socket", "asyncio", "time", "datetime", "random", "os", "subprocess")
    offenders = {m.name: sorted(t for t in m.every if t.split(".")[0] in forbidden)
                 for m in MODULES.values() if m.name.split(".")[0] == "policies"}
    assert {k: v for k, v in offenders.items() if v} == {}


def test_store_does_not_know_the_gateway():
    offenders = {m.name: sorted(t for t in m.every if t.split(".")[0] in ("gateway", "simulator"))
                 for m in MODULES.values() if m.name.split(".")[0] == "store"}
    assert {k: v for k, v in offenders.items() if v} == {}


def test_gateway_runtime_does_not_depend_on_the_simulator():
    # `palimpsest demo` / `simulate` run it; `replay` re-sends recorded requests to it in-process
    allowed = {"gateway.cli.demo", "gateway.cli.main", "gateway.cli.replay"}
    offenders = {m.name: sorted(t for t in m.every if t.split(".")[0] == "simulator")
                 for m in MODULES.values() if m.name.split(".")[0] == "gateway" and m.name not in allowed}
    assert {k: v for k, v in offenders.items() if v} == {}


def test_no_reach_into_another_modules_private_names():
    offenders = {m.name: m.private for m in MODULES.values() if m.private}
    assert offenders == {}


def test_modules_stay_small():
    sizes = {m.name: len(m.path.read_text().splitlines()) for m in MODULES.values()}
    assert {name: n for name, n in sizes.items() if n > MAX_LINES} == {}


@pytest.mark.parametrize("name", sorted(MODULES))
def test_every_module_imports(name):
    if name.endswith("__main__"):
        pytest.skip("runs the CLI")
    missing = [dep for dep in OPTIONAL if dep in MODULES[name].every and importlib.util.find_spec(dep) is None]
    if missing:
        pytest.skip(f"optional dependency not installed: {', '.join(missing)}")
    importlib.import_module(name)


def _synthetic(name: str, source: str, known: set[str]) -> Module:
    module = Module(name, ROOT / (name.replace(".", "/") + ".py"), ast.parse(source))
    _walk_imports(module, known)
    return module


def test_the_checks_catch_what_they_forbid():
    known = {"store", "store.ledger", "gateway", "gateway.keys", "policies", "policies.x"}
    reach = _synthetic("gateway.keys", "from store.ledger import _event, Ledger\nimport store.ledger as l\nl._db\n"
                       "Ledger._row()\n", known)
    assert reach.private == ["store.ledger._event", "store.ledger._db", "store.ledger.Ledger._row"]
    lazy = _synthetic("policies.x", "def f():\n    import aiohttp\n    from gateway import keys\n", known)
    assert {"aiohttp", "gateway.keys"} <= lazy.every and lazy.runtime == set()
    typing_only = _synthetic("store.ledger", "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from gateway.keys import X\n"
                             "try:\n    import gateway.keys\nexcept ImportError:\n    from store import y\n", known)
    assert typing_only.runtime == {"gateway.keys", "store"}


FORMAT_ROOMS = ("gateway.chat", "gateway.responses", "gateway.messages")


def _room(name: str) -> str | None:
    return next((room for room in (*FORMAT_ROOMS, "gateway.pipeline") if name == room or name.startswith(room + ".")), None)


def room_offenders(modules: dict[str, Module]) -> dict[str, list[str]]:
    """Imports (at any level) that cross the rooms' walls: a format room naming another format's
    room, or the shared pipeline naming any format room."""
    offenders: dict[str, list[str]] = {}
    for module in modules.values():
        own = _room(module.name)
        if own is None:
            continue
        bad = sorted(t for t in module.every if (other := _room(t)) in FORMAT_ROOMS and other != own)
        if bad:
            offenders[module.name] = bad
    return offenders


def test_format_rooms_stay_apart():
    assert set(FORMAT_ROOMS) | {"gateway.pipeline"} <= set(MODULES)
    assert not any(name.startswith("gateway.formats") for name in MODULES)  # the old shared room is gone
    assert room_offenders(MODULES) == {}


def test_the_room_check_catches_a_crossing():
    known = {"gateway.chat", "gateway.chat.adapter", "gateway.responses", "gateway.responses.adapter",
             "gateway.pipeline", "gateway.pipeline.views"}
    crossing = _synthetic("gateway.responses.adapter", "from gateway.chat.adapter import parse\n", known)
    shared = _synthetic("gateway.pipeline.views", "def f():\n    from gateway.responses import adapter\n", known)
    own = _synthetic("gateway.chat.adapter", "from gateway.chat import x\nfrom gateway.pipeline import views\n", known)
    found = room_offenders({m.name: m for m in (crossing, shared, own)})
    assert found == {"gateway.responses.adapter": ["gateway.chat.adapter"], "gateway.pipeline.views": ["gateway.responses.adapter"]}


def test_the_view_planner_is_pure():
    """policies/planner.py decides the view (issue 25): it knows neither the gateway nor the store,
    and the gateway's view shell calls it."""
    planner = MODULES["policies.planner"]
    assert sorted(t for t in planner.every if t.split(".")[0] in ("gateway", "store")) == []
    assert "policies.planner" in MODULES["gateway.pipeline.views"].every


def pipeline_subclasses(modules: dict[str, Module]) -> list[str]:
    """Classes that derive from the one ``Pipeline`` (or from the ``WirePipeline`` it replaced),
    by name, imported or through a module alias."""
    found = []
    for module in modules.values():
        for node in ast.walk(module.tree):
            if isinstance(node, ast.ClassDef):
                bases = {b.id if isinstance(b, ast.Name) else b.attr for b in node.bases if isinstance(b, (ast.Name, ast.Attribute))}
                if bases & {"Pipeline", "WirePipeline"}:
                    found.append(f"{module.name}.{node.name}")
    return found


def test_nothing_subclasses_the_pipeline():
    """Issue 25: one Pipeline class, composed with each format's peer; a format's own steps are
    its peer's methods, handed in by the composition root, never overrides of the pipeline."""
    import gateway.app  # noqa: F401  (the composition root imports every format's peer)
    from gateway.pipeline.adapter import FormatPeer
    from gateway.pipeline.pipeline import Pipeline

    assert pipeline_subclasses(MODULES) == [] and Pipeline.__subclasses__() == []
    named = {f"{m.name}.{node.name}" for m in MODULES.values() if m.name.startswith("gateway.")
             for node in ast.walk(m.tree) if isinstance(node, ast.ClassDef) and node.name.endswith("Pipeline")}
    assert named == {"gateway.pipeline.pipeline.Pipeline"}  # no ChatPipeline, ResponsesPipeline, MessagesPipeline
    assert {cls.__name__ for cls in FormatPeer.__subclasses__()} == {"ChatPeer", "ResponsesPeer", "MessagesPeer"}


def test_the_subclass_check_catches_one():
    known = {"gateway.pipeline.pipeline", "gateway.chat.peer"}
    direct = _synthetic("gateway.chat.peer", "from gateway.pipeline.pipeline import Pipeline\nclass ChatPipeline(Pipeline):\n    pass\n", known)
    aliased = _synthetic("gateway.responses.peer", "from gateway.pipeline import pipeline as p\nclass R(p.Pipeline):\n    pass\n", known)
    assert pipeline_subclasses({m.name: m for m in (direct, aliased)}) == ["gateway.chat.peer.ChatPipeline", "gateway.responses.peer.R"]
