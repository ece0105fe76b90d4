"""GET / DELETE /v1/responses/{id} (and ``/input_items``) for the responses the gateway recorded.

Ids are looked up for the request's tenant (``store.response_ids``, keyed by tenant and id). A
response the gateway answered is read from the ledger; an id recorded only for another tenant
never goes upstream and gets the answer an id that never existed gets here (the pass-through's
403 on the operator's key, else a 404). Ids the gateway never
recorded go on to the pass-through route (and its rules for the operator's key). A response
relayed without a session is the provider's to answer, on its tenant's behalf only. A delete
makes the id unknown from then on (``previous_response_id`` and reads refuse it); the
conversation's events stay in the ledger until the session itself is deleted.
"""

from __future__ import annotations

from aiohttp import web

from gateway.http.errors import NotFound
from gateway.http.gate import tenant_of
from gateway.http.proxy import passthrough, refused
from gateway.keys import LEDGER, OWNED, RESPONSES
from policies.conversation import wire_items
from store import call as store_call


async def stored_response(request: web.Request) -> web.StreamResponse:
    routes = request.app[RESPONSES]  # gateway/responses/routes.py
    response_id = request.match_info["response_id"]
    found = await routes.owned(request, response_id)
    if found is None:
        if await store_call(routes.response_ids.taken, response_id):  # another tenant's: never upstream,
            # and answered as an unknown id would be here (no hint that it exists)
            raise refused(request) or NotFound(f"No response found with id '{response_id}'.", param="response_id")
        return await passthrough(request)
    if not found.event_id:  # relayed without a session: the provider holds it, for its tenant only
        request[OWNED] = True
        return await passthrough(request)
    ledger = request.app[LEDGER]
    if request.method == "DELETE":
        await store_call(routes.response_ids.forget, tenant_of(request), response_id)
        return web.json_response({"id": response_id, "object": "response", "deleted": True})
    events = await store_call(ledger.path_to, found.session_key, found.event_id)
    if not events:
        return await passthrough(request)
    answer = events[-1]
    if request.match_info.get("tail") == "input_items":
        items = [item for event in events[:-1] for item in (wire_items(event.message, "responses") or [])]
        data = [{"id": item.get("id") or f"item_{i}", **item} for i, item in enumerate(items)]
        data.reverse()  # newest first, as the API lists them by default
        return web.json_response({"object": "list", "data": data, "first_id": data[0]["id"] if data else None,
                                  "last_id": data[-1]["id"] if data else None, "has_more": False})
    session = await store_call(ledger.session, found.session_key)
    return web.json_response({
        "id": response_id, "object": "response", "created_at": int(answer.created), "status": "completed",
        "model": session.model if session else None, "output": wire_items(answer.message, "responses") or [],
    })
