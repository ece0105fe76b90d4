"""Structured logs: one line per request, never message text or credentials.

``x-request-id`` is accepted from the client (or generated) and echoed back, so a client's
log line and ours can be joined.

Values a client chose (the decoded path, the session id) are logged escaped: in text format a
control character, line break or space cannot end a line or start a forged ``key=value`` (a
value holding any of them is written as a JSON string), and the JSON format escapes them itself.
"""

from __future__ import annotations

import json
import logging
import re
import sys
import time
import uuid

from aiohttp import web

from gateway.keys import LOG_FIELDS, METRICS, MODEL, REQUEST_ID, SESSION, TENANT, UPSTREAM_NAME

access = logging.getLogger("palimpsest.access")
_REQUEST_ID = re.compile(r"^[A-Za-z0-9._:-]{1,128}$")
# What must not appear raw in a text log line: C0/C1 controls, DEL, Unicode line breaks.
_UNSAFE = re.compile(r"[\x00-\x1f\x7f-\x9f\u2028\u2029]")
_NEEDS_QUOTES = re.compile(r"[\s\"=\x00-\x1f\x7f-\x9f\u2028\u2029]")


def escaped(text: str) -> str:
    """`text` with every control character and line break written as an escape."""
    return _UNSAFE.sub(lambda m: json.dumps(m.group())[1:-1], text)


def field_value(value) -> str:
    """A `key=value` value that stays one token on one line."""
    text = str(value)
    return escaped(json.dumps(text, ensure_ascii=False)) if _NEEDS_QUOTES.search(text) else text


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        out = {"ts": round(record.created, 3), "level": record.levelname, "logger": record.name, "msg": record.getMessage()}
        fields = getattr(record, "fields", None)
        if fields:
            out.update(fields)
        if record.exc_info:
            out["exc"] = self.formatException(record.exc_info)
        return json.dumps(out, default=str)


class TextFormatter(logging.Formatter):
    def formatMessage(self, record: logging.LogRecord) -> str:
        record.message = escaped(record.message)  # a logged path may carry %0a; tracebacks keep their lines
        return super().formatMessage(record)

    def format(self, record: logging.LogRecord) -> str:
        base = super().format(record)
        fields = getattr(record, "fields", None)
        if fields:
            base += " " + " ".join(f"{k}={field_value(v)}" for k, v in fields.items())
        return base


def setup_logging(level: str, json_format: bool) -> None:
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter() if json_format else TextFormatter("%(asctime)s %(levelname)s %(name)s %(message)s"))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level)
    logging.getLogger("aiohttp.access").setLevel(logging.WARNING)


@web.middleware
async def request_log_middleware(request: web.Request, handler):
    started = time.perf_counter()
    given = request.headers.get("x-request-id", "")
    request_id = given if _REQUEST_ID.match(given) else uuid.uuid4().hex
    request[REQUEST_ID] = request_id
    status = 500
    metrics = request.app[METRICS]
    metrics.in_flight.inc()
    try:
        response = await handler(request)
        status = response.status
        if not response.prepared:
            response.headers["x-request-id"] = request_id
        return response
    finally:
        metrics.in_flight.dec()
        if request.path not in ("/metrics", "/healthz"):
            fields = {
                "request_id": request_id,
                "method": request.method,
                "route": request.path if not request.path.startswith("/admin") else "/admin",
                "status": status,
                "ms": round((time.perf_counter() - started) * 1000, 2),
                "tenant": request.get(TENANT),
                "session": request.get(SESSION),
                "model": request.get(MODEL),
                "upstream": request.get(UPSTREAM_NAME),  # the name of the upstream that served it
            }
            fields.update(request.get(LOG_FIELDS, {}))
            access.info("request", extra={"fields": fields})
