"""Loopback helpers shared by the suites that start servers.

A module of its own: `from conftest import ...` resolves to whichever folder's conftest.py pytest imported last
(tests/attribution, tests/defenses ... have their own), so shared helpers must not live only there."""

from __future__ import annotations

import socket


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def listening(port: int) -> bool:
    with socket.socket() as s:
        s.settimeout(0.5)
        return s.connect_ex(("127.0.0.1", port)) == 0
