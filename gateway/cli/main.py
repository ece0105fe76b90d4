"""The ``palimpsest`` command: serve, simulate, inspect, reindex, demo."""

from __future__ import annotations

import argparse
import asyncio
import errno
import logging
import os
import socket
import sys

from gateway.settings import ConfigError, Settings, load_settings

log = logging.getLogger("palimpsest")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="palimpsest", description="OpenAI-compatible context gateway.")
    sub = parser.add_subparsers(dest="command", required=True)
    serve = sub.add_parser("serve", help="Run the gateway in the foreground.")
    serve.add_argument("--config", help="TOML settings file (defaults apply without it).")
    serve.add_argument("--host", help="Override server.host.")
    serve.add_argument("--port", type=int, help="Override server.port.")
    reindex = sub.add_parser("reindex", help="Rebuild the recall search index from the ledger.")
    reindex.add_argument("--config", help="TOML settings file.")
    inspect = sub.add_parser("inspect", help="Show sessions, branches, checkpoints and the projected view.")
    inspect.add_argument("--config", help="TOML settings file.")
    inspect.add_argument("session", nargs="?", help="Session key (tenant/hash) or session id; omit to list sessions.")
    inspect.add_argument("--tenant", help="Only this tenant's sessions.")
    inspect.add_argument("--view", action="store_true", help="Print the exact projected view of the head.")
    inspect.add_argument("--system", metavar="TEXT|@FILE",
                         help="The client's system prompt (not stored in the ledger), for the exact view.")
    inspect.add_argument("--tools", metavar="FILE", help="A JSON file with the client's tools array, for the exact view.")
    inspect.add_argument("--json", action="store_true", help="Machine-readable output.")
    delete = sub.add_parser("delete", help="Delete a session: its ledger events, checkpoints and recall index.")
    delete.add_argument("--config", help="TOML settings file.")
    delete.add_argument("wanted", nargs="?", metavar="SESSION",
                        help="Session key (tenant/hash) or session id; refused when it could name two sessions.")
    delete.add_argument("--key", help="Exactly this session key (tenant/hash).")
    delete.add_argument("--session", help="The session with this id (the X-Session-Id a client sent).")
    delete.add_argument("--tenant", help="With --session: the tenant it belongs to.")
    demo = sub.add_parser("demo", help="Offline demo: a simulated upstream, a long agent session, recall.")
    demo.add_argument("--rounds", type=int, default=40, help="Rounds of the bundled agent session to replay.")
    demo.add_argument("--keep", action="store_true", help="Keep the demo's store directory.")
    replay = sub.add_parser("replay", help="What each policy profile would bill on recorded requests (offline, simulated upstream).")
    from gateway.cli.replay_args import add_arguments as replay_arguments

    replay_arguments(replay)
    simulate = sub.add_parser(
        "simulate", help="Run a SIMULATED upstream (scripted, no key, no network) to try serve against.",
        description="A SIMULATED OpenAI-compatible provider on loopback: answers are scripted, not "
        "generated. Strict like a real one (unknown models 404, wrong types 400). In another terminal: "
        f"PALIMPSEST_UPSTREAM__BASE_URL=http://127.0.0.1:8790/v1 {command()} serve")
    from simulator.options import add_arguments

    add_arguments(simulate, fixtures=False)
    args = parser.parse_args(argv)
    if args.command == "simulate":
        return run_simulator(args)
    if args.command == "replay":
        from gateway.cli.replay import run_replay

        return run_replay(args)
    if args.command == "demo":
        from gateway.cli.demo import run_demo

        return run_demo(args)
    try:
        settings = load_settings(args.config)
    except ConfigError as exc:
        print(f"palimpsest: {exc}", file=sys.stderr)
        return 2
    # Every file the gateway and its libraries create in the store is private (store/private.py).
    from store.private import UMASK

    os.umask(UMASK)
    if args.command == "serve":
        return serve_forever(settings, host=args.host, port=args.port)
    if args.command == "reindex":
        return asyncio.run(reindex_all(settings))
    if args.command == "delete":
        return asyncio.run(delete_session_cli(settings, args.wanted, key=args.key, session=args.session, tenant=args.tenant))
    if args.command == "inspect":
        from gateway.cli.inspect import run_inspect

        return run_inspect(args, settings)
    return 1


def command() -> str:
    """How the user ran `palimpsest` (`.venv/bin/palimpsest` after the quick start), so the
    commands printed for them to type next work as printed."""
    invoked = sys.argv[0] if sys.argv and os.path.basename(sys.argv[0]) == "palimpsest" else ""
    return invoked or "palimpsest"


class PortBusy(Exception):
    """The address to listen on cannot be bound; the message is the one line to print."""


def bind(host: str, port: int, override: str) -> socket.socket:
    """A listening socket on host:port, bound before anything says "listening"; `override` tells
    the user how to pick another port."""
    try:
        family, kind, proto, _, address = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM,
                                                             flags=socket.AI_PASSIVE)[0]
        sock = socket.socket(family, kind, proto)
    except OSError as exc:
        raise PortBusy(f"palimpsest: cannot listen on {host}:{port}: {exc.strerror or exc}") from None
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(address)
    except OSError as exc:
        sock.close()
        if exc.errno == errno.EADDRINUSE:
            raise PortBusy(f"palimpsest: port {port} on {host} is already in use; {override}") from None
        raise PortBusy(f"palimpsest: cannot listen on {host}:{port}: {exc.strerror or exc}") from None
    return sock


def run_simulator(args: argparse.Namespace) -> int:
    """``palimpsest simulate``: the puppet in the foreground until Ctrl-C."""
    from simulator.puppet import SIMULATED_NOTICE, serve

    try:
        sock = bind(args.host, args.port, "pick another with --port N")
    except PortBusy as exc:
        print(exc, file=sys.stderr)
        return 2
    port = sock.getsockname()[1]
    url = f"http://{args.host}:{port}/v1"
    serve(args, sock=sock, banner=f"{SIMULATED_NOTICE}\nlistening on {url}; point the gateway at it:\n"
          f"  PALIMPSEST_UPSTREAM__BASE_URL={url} {command()} serve\n"
          "models: fake-8k, fake-32k, fake-128k, any fake-<N>k (window N thousand tokens)")
    return 0


async def reindex_all(settings: Settings) -> int:
    """Drop the search index and rebuild it from the ledger, session by session."""
    from gateway.app import open_index
    from gateway.jobs.indexer import Indexer
    from gateway.http.routing import build_upstreams
    from store import close_stores, open_stores

    ledger, checkpoints = open_stores(settings.store)  # the shared ledger when store.url is set
    upstream = None
    if settings.recall.embeddings_url:
        upstream = build_upstreams(settings)
        await upstream.start()
    indexer = Indexer(ledger, lambda: open_index(settings, upstream))
    try:
        await (await indexer.opened()).reset()
        sessions = ledger.sessions()
        chunks = 0
        for record in sessions:
            chunks += await indexer.catch_up(record.key)
        print(f"reindexed {len(sessions)} sessions, {chunks} chunks")
    finally:
        await indexer.close()
        close_stores(ledger, checkpoints)
        if upstream is not None:
            await upstream.close()
    return 0


async def delete_session_cli(settings: Settings, wanted: str | None = None, *, key: str | None = None,
                             session: str | None = None, tenant: str | None = None) -> int:
    """`palimpsest delete SESSION | --key KEY | --session ID [--tenant T]`: against the
    configured store (embedded or PostgreSQL). A client names its own session ids, so one may
    look like another tenant's key ("alice/f99..."): a SESSION that matches more than one
    session, as a key and as an id or as the id of several tenants, is refused."""
    from gateway.app import open_index
    from store import close_stores, delete_session, open_response_ids, open_stores
    from store.turns import TurnLog

    if sum(x is not None for x in (wanted, key, session)) != 1 or (tenant is not None and session is None):
        print("palimpsest: give one of SESSION, --key KEY or --session ID (--tenant only with --session)", file=sys.stderr)
        return 2
    ledger, checkpoints = open_stores(settings.store)
    turns = TurnLog(settings.store.path, synchronous=settings.store.sync)
    responses = open_response_ids(settings.store, ledger)
    index = None
    try:
        if key is not None:
            found = [ledger.session(key)]
        elif session is not None:
            found = [r for r in ledger.sessions(tenant) if r.session_id == session]
        else:
            found = [ledger.session(wanted), *(r for r in ledger.sessions() if r.session_id == wanted)]
        matches = {r.key: r for r in found if r}
        if len(matches) != 1:
            asked = key or session or wanted
            print(f"palimpsest: {'no' if not matches else 'more than one'} session '{asked}'"
                  + (f" ({', '.join(sorted(matches))}): pass --key, or --session with --tenant" if matches else ""),
                  file=sys.stderr)
            return 1
        matches = list(matches.values())
        index = await asyncio.to_thread(open_index, settings, None)
        deleted = await delete_session(matches[0].key, ledger=ledger, checkpoints=checkpoints, index=index, turns=turns,
                                       responses=responses)
        _forget_turns(settings, matches[0].key)
        print(f"deleted {matches[0].key}: {deleted['events']} events, {deleted['checkpoints']} checkpoints, index dropped")
        return 0
    finally:
        if index is not None:
            index.close()
        turns.close()
        responses.close()
        close_stores(ledger, checkpoints)


def _forget_turns(settings: Settings, session_key: str) -> None:
    """The session's rows in the turn log (store.turns) go with it."""
    from store.turns import TurnLog

    turns = TurnLog(settings.store.path, synchronous=settings.store.sync)
    try:
        turns.delete_session(session_key)
    finally:
        turns.close()


def serve_forever(settings: Settings, *, host: str | None = None, port: int | None = None) -> int:
    from gateway.ops.memory import limit_arenas, trim_while_serving

    limit_arenas(settings.server.malloc_arena_max)  # before any thread starts (gateway/ops/memory.py)
    from aiohttp import web

    from gateway.app import create_app
    from gateway.ops.logs import setup_logging

    setup_logging(settings.log.level, settings.log.json_format)
    try:
        import uvloop

        asyncio.set_event_loop_policy(uvloop.EventLoopPolicy())
    except ImportError:
        pass
    host = host or settings.server.host
    port = settings.server.port if port is None else port
    try:
        sock = bind(host, port, "pick another with --port N or PALIMPSEST_SERVER__PORT=N")
    except PortBusy as exc:
        print(exc, file=sys.stderr)
        return 2
    app = create_app(settings)
    trim_while_serving(app, settings.server.malloc_trim_s)
    app.on_shutdown.append(_log_shutdown)
    log.info("palimpsest listening", extra={"fields": {"host": host, "port": port, "upstream": settings.upstream.base_url, "store": settings.store.path}})
    # run_app handles SIGINT/SIGTERM: stop accepting, wait for in-flight requests up to
    # shutdown_timeout, then run cleanup_ctx (which drains summary jobs).
    web.run_app(
        app,
        sock=sock,
        shutdown_timeout=settings.server.shutdown_timeout_s,
        handler_cancellation=True,
        access_log=None,
        print=lambda *a: None,
    )
    return 0


async def _log_shutdown(app) -> None:
    """One line when shutdown begins (the listener is closed by then): what is left to drain."""
    from gateway.keys import METRICS, SETTINGS, SUMMARIZER

    registry = app[METRICS].registry
    in_flight = int(registry.get_sample_value("palimpsest_requests_in_flight") or 0)
    queued = int(registry.get_sample_value("palimpsest_summary_queue_depth") or 0)
    log.info("palimpsest shutting down: draining in-flight requests and summary jobs", extra={"fields": {
        "requests_in_flight": in_flight, "summary_jobs_queued": queued, "summary_jobs_idle": app[SUMMARIZER].idle,
        "timeout_s": app[SETTINGS].server.shutdown_timeout_s}})


if __name__ == "__main__":
    sys.exit(main())
