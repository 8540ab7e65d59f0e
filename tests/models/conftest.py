"""Pull tests never touch the network: any connection that is not to the loopback stand-in Hub
fails the test loudly (huggingface_hub makes requests of its own, e.g. a registry fetch for its
user-agent string, and those must land on the stand-in or nowhere)."""

from __future__ import annotations

import socket

import pytest

_LOOPBACK = ("127.0.0.1", "::1", "localhost")


@pytest.fixture(autouse=True)
def loopback_only(monkeypatch):
    real_connect = socket.socket.connect
    real_getaddrinfo = socket.getaddrinfo
    attempts: list[object] = []

    def connect(self, address):
        if self.family in (socket.AF_INET, socket.AF_INET6) and address[0] not in _LOOPBACK:
            attempts.append(address)
            raise OSError(f"test tried to reach the network: {address!r}")
        return real_connect(self, address)

    def getaddrinfo(host, *args, **kwargs):
        if host not in _LOOPBACK and host is not None:
            attempts.append(host)
            raise socket.gaierror(f"test tried to resolve {host!r}")
        return real_getaddrinfo(host, *args, **kwargs)

    monkeypatch.setattr(socket.socket, "connect", connect)
    monkeypatch.setattr(socket, "getaddrinfo", getaddrinfo)
    yield
    assert attempts == [], f"tests must not touch the network: {attempts}"
