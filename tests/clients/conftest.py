"""The client compatibility suite talks only to loopback: the client libraries have telemetry,
tracing exporters and price-list downloads of their own, and a connection anywhere else fails
the test instead of leaving the machine."""

from __future__ import annotations

import ipaddress
import socket

import pytest

_connect = socket.socket.connect
_connect_ex = socket.socket.connect_ex


def _loopback_only(address) -> None:
    if isinstance(address, tuple):
        host = address[0]
        try:
            loopback = ipaddress.ip_address(host).is_loopback
        except ValueError:
            loopback = host == "localhost"
        if not loopback:
            raise AssertionError(f"a client library connected to {address!r}: tests talk only to loopback")


@pytest.fixture(autouse=True)
def loopback_only(monkeypatch):
    def connect(self, address):
        _loopback_only(address)
        return _connect(self, address)

    def connect_ex(self, address):
        _loopback_only(address)
        return _connect_ex(self, address)

    monkeypatch.setattr(socket.socket, "connect", connect)
    monkeypatch.setattr(socket.socket, "connect_ex", connect_ex)
