"""Admin API and inspector UI behind server.admin_token (owned by the inspector work)."""

from __future__ import annotations

from aiohttp import web


def setup_admin(app: web.Application) -> None:
    """Register /admin routes; nothing is served while server.admin_token is empty."""
