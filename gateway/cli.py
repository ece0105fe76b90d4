"""The ``palimpsest`` command: serve (and the admin tools that later issues add)."""

from __future__ import annotations

import argparse
import asyncio
import logging
import signal
import sys

from aiohttp import web

from gateway.settings import ConfigError, Settings, load_settings

log = logging.getLogger("palimpsest")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="palimpsest", description="OpenAI-compatible context gateway.")
    sub = parser.add_subparsers(dest="command", required=True)
    serve = sub.add_parser("serve", help="Run the gateway in the foreground.")
    serve.add_argument("--config", help="TOML settings file (defaults apply without it).")
    serve.add_argument("--host", help="Override server.host.")
    serve.add_argument("--port", type=int, help="Override server.port.")
    args = parser.parse_args(argv)
    try:
        settings = load_settings(args.config)
    except ConfigError as exc:
        print(f"palimpsest: {exc}", file=sys.stderr)
        return 2
    if args.command == "serve":
        return serve_forever(settings, host=args.host, port=args.port)
    return 1


def serve_forever(settings: Settings, *, host: str | None = None, port: int | None = None) -> int:
    from gateway.app import create_app
    from gateway.logs import setup_logging

    setup_logging(settings.log.level, settings.log.json_format)
    try:
        import uvloop

        asyncio.set_event_loop_policy(uvloop.EventLoopPolicy())
    except ImportError:
        pass
    app = create_app(settings)
    host = host or settings.server.host
    port = settings.server.port if port is None else port
    log.info("palimpsest listening", extra={"fields": {"host": host, "port": port, "upstream": settings.upstream.base_url, "store": settings.store.path}})
    # run_app handles SIGINT/SIGTERM: stop accepting, wait for in-flight requests up to
    # shutdown_timeout, then run cleanup_ctx (which drains summary jobs).
    web.run_app(
        app,
        host=host,
        port=port,
        shutdown_timeout=settings.server.shutdown_timeout_s,
        handler_cancellation=True,
        access_log=None,
        print=lambda *a: None,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
