"""Loopback helpers shared by the suites that start servers.

A module of its own: `from conftest import ...` resolves to whichever folder's conftest.py pytest imported last
(tests/attribution, tests/defenses ... have their own), so shared helpers must not live only there."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from contextlib import contextmanager
from pathlib import Path


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def listening(port: int) -> bool:
    with socket.socket() as s:
        s.settimeout(0.5)
        return s.connect_ex(("127.0.0.1", port)) == 0


@contextmanager
def prefect_server(tmp: Path, **extra_env: str):
    """A real `prefect server start` on a free loopback port, its home and log under `tmp`: yields (env, port) once
    /api/health answers; stopped by its process group on exit, and its port checked closed."""
    import pytest

    port = free_port()
    env = {**os.environ, "PREFECT_HOME": str(tmp / "home"), "PREFECT_API_URL": f"http://127.0.0.1:{port}/api",
           "PREFECT_SERVER_ANALYTICS_ENABLED": "false", "DO_NOT_TRACK": "1", "PREFECT_LOGGING_LEVEL": "WARNING",
           **extra_env}
    env.pop("PREFECT_API_KEY", None)
    log = open(tmp / "server.log", "w")
    prefect = Path(sys.executable).parent / "prefect"
    proc = subprocess.Popen([str(prefect), "server", "start", "--host", "127.0.0.1", "--port", str(port)],
                            env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        deadline = time.monotonic() + 240
        while time.monotonic() < deadline:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/api/health", timeout=2) as r:
                    if r.status == 200:
                        break
            except OSError:
                time.sleep(1)
        else:
            pytest.fail("the Prefect server did not start: " + (tmp / "server.log").read_text()[-2000:])
        yield env, port
    finally:
        os.killpg(proc.pid, signal.SIGINT)  # our own server, by its process group
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=30)
        log.close()
        assert not listening(port), "the Prefect server's port is still listening"
