"""The floor for a proxy's added latency: a minimal aiohttp relay, measured beside the gateway.

    python bench/bare_relay.py --port 8799 --upstream http://127.0.0.1:8790/v1

Every POST under /v1 goes to the upstream with the client's body and Authorization, through one
pooled client session, and the upstream's status, content type and body come back. Nothing is
parsed, stored or rewritten: what this adds is what any aiohttp proxy must add (a second HTTP
hop in Python), so ``bench/overhead.py`` reports the gateway's added time against it.
"""

from __future__ import annotations

import argparse

import aiohttp
from aiohttp import web

CLIENT = web.AppKey("client", aiohttp.ClientSession)


def create_app(upstream: str) -> web.Application:
    app = web.Application(client_max_size=64 * 1024 * 1024)

    async def session(app: web.Application):
        app[CLIENT] = aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0))
        yield
        await app[CLIENT].close()

    async def relay(request: web.Request) -> web.Response:
        headers = {k: v for k, v in request.headers.items() if k.lower() in ("authorization", "content-type")}
        async with request.app[CLIENT].post(f"{upstream}/{request.match_info['tail']}", data=await request.read(),
                                            headers=headers) as up:
            body = await up.read()
            return web.Response(status=up.status, body=body, content_type=up.content_type)

    app.cleanup_ctx.append(session)
    app.router.add_post("/v1/{tail:.*}", relay)
    return app


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--upstream", required=True, help="the upstream's base URL, ending in /v1")
    args = parser.parse_args()
    web.run_app(create_app(args.upstream.rstrip("/")), host="127.0.0.1", port=args.port, print=None, access_log=None)


if __name__ == "__main__":
    main()
