"""Fixtures of the reliability suite (helpers live in reliability_helpers.py)."""

from __future__ import annotations

import functools
import http.server
import threading

import pytest


@pytest.fixture()
def drive(tmp_path, monkeypatch):
    """Serves files of a folder as `/uc?id=<name>`, like Google Drive's download endpoint."""
    root = tmp_path / "drive"
    root.mkdir()

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self):  # noqa: N802
            f = root / self.path.split("id=")[-1].split("&")[0]
            if not f.is_file():
                self.send_error(404)
                return
            data = f.read_bytes()
            self.send_response(200)
            self.send_header("Content-Type", "application/octet-stream")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, *a):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(Handler))
    threading.Thread(target=server.serve_forever, daemon=True).start()
    monkeypatch.setenv("TTT_GDRIVE_URL", f"http://127.0.0.1:{server.server_port}/uc?id={{id}}")
    yield root
    server.shutdown()
