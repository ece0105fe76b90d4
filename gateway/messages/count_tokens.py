"""POST /v1/messages/count_tokens: the gateway's estimate of the view it would send for a body.

Answered without calling the upstream, writing the ledger or starting a summary; the body is
parsed and the session named by the Messages ``Pipeline``'s own steps.
"""

from __future__ import annotations

from aiohttp import web

from gateway.http.gate import tenant_of
from gateway.pipeline.pipeline import Pipeline


class CountTokens:
    def __init__(self, pipeline: Pipeline) -> None:
        self.pipeline = pipeline  # the Messages pipeline: its parser, identity and views
        # A view builder that cannot start summary jobs or move counters.
        self.estimates = pipeline.views.readonly()

    async def handle(self, request: web.Request) -> web.Response:
        """``{"input_tokens": N}`` for the view the gateway would send for this body."""
        pipeline = self.pipeline
        tenant = tenant_of(request)  # resolved by the route's gate
        chat, ids = await pipeline.parsed(await request.read())
        ref = pipeline.identity.session(request, tenant, ids[0] if ids else None)
        chat.ids = ids
        if ref is None or not ids:
            # Without a session the gateway forwards the request as it came: its own size.
            views = pipeline.views
            raw_tokens = views.counter.count_messages(chat.instructions + chat.history) + views.counter.count_tools(chat.body.get("tools"))
            tokens = views.calibration.scale(chat.model, raw_tokens)
        else:
            tokens = (await self.estimates.build(chat, ref, pipeline.auth(request))).upstream_tokens
        return web.json_response({"input_tokens": tokens})
