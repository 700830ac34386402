"""Serving that follows the champion: `mlflow models serve` processes behind a small front in this process.

    client -> front (host:port, this process) -> mlflow models serve -m models:/NAME/V   (127.0.0.1, free port)

The front is a reverse proxy of a few lines: it forwards every request (/invocations, /ping, /health, /version) to
the current back end and adds the header `X-Model-Version`. When the `champion` alias of NAME moves, `check()`
starts the new version's server on a second port, waits until it answers /ping and a real /invocations, points the
front at it, lets the requests still running on the old one finish, and stops the old one: no request fails
during the switch and none waits for a model to load. A version whose server does not come up is logged and left
alone (the old one keeps serving) until the alias moves again.

Each back end serves a fixed version (`models:/NAME/V`, not `@champion`): what it serves cannot change under it,
and the header says which it is. MLflow starts its scoring server as `uvicorn` from PATH, so the virtualenv's bin
folder leads PATH here. What tells `check()` to look (a Prefect event, or a timer) is the caller's: see
`ttt_pipeline.cli.serve`. No Prefect import here.
"""

from __future__ import annotations

import http.client
import json
import logging
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

from ttt_pipeline.errors import PipelineError

log = logging.getLogger(__name__)
VERSION_HEADER = "X-Model-Version"
# A real request the back end must answer before it takes traffic: a model that loads but cannot predict is refused.
READY_PROBE = {"inputs": ["Great sound and the battery lasts all day."]}
HOP_BY_HOP = {"connection", "keep-alive", "transfer-encoding", "te", "trailer", "upgrade", "proxy-authorization",
              "proxy-authenticate", "content-length", "server", "date"}


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


@dataclass
class Backend:
    """One `mlflow models serve` process of one model version on 127.0.0.1."""
    version: str
    port: int
    proc: subprocess.Popen
    log_path: Path
    in_flight: int = 0
    idle: threading.Condition = field(default_factory=threading.Condition)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"


def threads_per_worker(workers: int, cores: int | None = None) -> int:
    """Intra-op threads of each of `workers` scoring processes so that workers x threads = the cores (at least 1):
    each worker's torch would otherwise take every core, and N workers would oversubscribe them N times."""
    from ttt_pipeline.cores import available_cores

    return max(1, (cores or available_cores()) // max(1, workers))


def backend_env(model_name: str, version: str, tracking_uri: str, bin_dir: Path, monitoring=None,
                workers: int = 1) -> dict[str, str]:
    """The back end's environment: this one, the tracking URI, the venv's bin first on PATH, traffic capture as
    the configuration's monitoring section says (io.traffic_recorder.capture_env: the model's name and version
    included; with capture off no TTT_MONITORING_CAPTURE reaches it, whatever this process's environment holds),
    and with several workers each one's share of the cores (OMP_NUM_THREADS, `threads_per_worker`)."""
    from ttt_pipeline.io.traffic_recorder import ENV_CAPTURE, capture_env

    env = {**os.environ, "MLFLOW_TRACKING_URI": tracking_uri, "PATH": f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '')}",
           "TOKENIZERS_PARALLELISM": "false", "MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR": "false"}
    env.pop(ENV_CAPTURE, None)
    if monitoring is not None:
        env.update(capture_env(monitoring, model_name, version))
    if workers > 1:
        threads = str(threads_per_worker(workers))
        env.update({"OMP_NUM_THREADS": threads, "MKL_NUM_THREADS": threads})
    return env


def start_backend(model_name: str, version: str, tracking_uri: str, log_dir: Path, bin_dir: Path | None = None,
                  monitoring=None, workers: int = 1) -> Backend:
    """`mlflow models serve` of the version on a free loopback port, with `workers` scoring processes (MLflow's
    --workers; each loads the model and answers requests on its own)."""
    bin_dir = bin_dir or Path(sys.executable).parent
    port = free_port()
    env = backend_env(model_name, version, tracking_uri, bin_dir, monitoring, workers)
    log_path = Path(log_dir) / f"model-v{version}-{port}.log"
    with open(log_path, "w") as out:
        proc = subprocess.Popen([str(bin_dir / "mlflow"), "models", "serve", "-m", f"models:/{model_name}/{version}",
                                 "--env-manager", "local", "-h", "127.0.0.1", "-p", str(port),
                                 "--workers", str(workers)],
                                env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    log.info("serve: starting v%s on port %d (log %s)", version, port, log_path)
    return Backend(version, port, proc, log_path)


def _answers(backend: Backend) -> bool:
    try:
        with urllib.request.urlopen(f"{backend.url}/ping", timeout=5) as r:
            if r.status != 200:
                return False
        req = urllib.request.Request(f"{backend.url}/invocations", data=json.dumps(READY_PROBE).encode(),
                                     headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=120) as r:
            return r.status == 200 and "predictions" in json.loads(r.read())
    except (urllib.error.URLError, OSError, ValueError):
        return False


def wait_ready(backend: Backend, timeout_s: float) -> bool:
    """Whether the back end answers /ping and a real /invocations within `timeout_s` (False once its process ends)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if backend.proc.poll() is not None:
            return False
        if _answers(backend):
            return True
        time.sleep(1)
    return False


def stop_backend(backend: Backend, drain_s: float = 120.0) -> None:
    """Waits (up to drain_s) for the requests it is answering, then ends its process group."""
    with backend.idle:
        backend.idle.wait_for(lambda: backend.in_flight == 0, timeout=drain_s)
    if backend.proc.poll() is None:
        os.killpg(backend.proc.pid, signal.SIGTERM)
        try:
            backend.proc.wait(30)
        except subprocess.TimeoutExpired:
            os.killpg(backend.proc.pid, signal.SIGKILL)
            backend.proc.wait(10)
    log.info("serve: stopped v%s (port %d)", backend.version, backend.port)


class Front(ThreadingHTTPServer):
    """The reverse proxy: every request goes to `self.backend` as it is when the request arrives."""
    daemon_threads = True
    request_queue_size = 128  # socketserver's 5 would refuse a burst of clients connecting at once

    def __init__(self, host: str, port: int, backend: Backend):
        self.backend = backend
        self.lock = threading.Lock()
        super().__init__((host, port), _Handler)

    def take(self) -> Backend:
        with self.lock:
            backend = self.backend
            with backend.idle:
                backend.in_flight += 1
            return backend

    def switch(self, backend: Backend) -> Backend:
        with self.lock:
            old, self.backend = self.backend, backend
        return old


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: Front

    def log_message(self, fmt, *args):  # one line per request would drown the switch messages
        log.debug(fmt, *args)

    def _forward(self) -> None:
        body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        backend = self.server.take()
        try:
            conn = http.client.HTTPConnection("127.0.0.1", backend.port, timeout=600)
            headers = {k: v for k, v in self.headers.items() if k.lower() not in HOP_BY_HOP | {"host"}}
            conn.request(self.command, self.path, body=body or None, headers=headers)
            answer = conn.getresponse()
            data = answer.read()
            conn.close()
            self.send_response(answer.status)
            for k, v in answer.getheaders():
                if k.lower() not in HOP_BY_HOP:
                    self.send_header(k, v)
        except (OSError, http.client.HTTPException) as exc:
            data = json.dumps({"error_code": "BAD_GATEWAY", "message": str(exc)}).encode()
            self.send_response(502)
            self.send_header("Content-Type", "application/json")
        finally:
            with backend.idle:
                backend.in_flight -= 1
                backend.idle.notify_all()
        self.send_header(VERSION_HEADER, backend.version)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    do_GET = do_POST = do_PUT = do_DELETE = _forward  # noqa: N815  (http.server's names)


class ChampionServer:
    """The champion of `model_name` behind one front; `check()` switches to a new champion without a failed request."""

    def __init__(self, client, model_name: str, tracking_uri: str, log_dir: Path, bin_dir: Path | None = None,
                 ready_timeout_s: float = 300.0, monitoring=None, alias: str = "champion", workers: int = 1):
        self.client, self.model_name, self.tracking_uri = client, model_name, tracking_uri
        self.workers = workers  # scoring processes per back end (each version's server has as many)
        self.alias = alias  # the alias followed: `champion`, or a user's own (my-classifier@prod)
        self.monitoring = monitoring  # the configuration's monitoring section: whether back ends capture traffic
        self.log_dir, self.bin_dir, self.ready_timeout_s = Path(log_dir), bin_dir, ready_timeout_s
        self.front: Front | None = None
        self.failed: str | None = None  # a version whose server did not come up: not retried until the alias moves
        self.check_lock = threading.Lock()

    def champion_version(self) -> str:
        """The version the followed alias points at now."""
        from ttt_pipeline.io.brought_models import version_at_alias
        from ttt_pipeline.io.model_registry import CHAMPION, current_champion

        if self.alias != CHAMPION:
            return str(version_at_alias(self.client, self.model_name, self.alias).version)
        mv = current_champion(self.client, self.model_name)
        if mv is None:
            raise PipelineError(f"registered model {self.model_name!r} has no `champion` alias",
                                "run the pipeline first (ttt-pipeline run), or pass --model NAME of a task that has one")
        return str(mv.version)

    def _ready_backend(self, version: str) -> Backend:
        backend = start_backend(self.model_name, version, self.tracking_uri, self.log_dir, self.bin_dir,
                                monitoring=self.monitoring, workers=self.workers)
        if not wait_ready(backend, self.ready_timeout_s):
            stop_backend(backend, drain_s=0)
            raise PipelineError(f"the server of {self.model_name} v{version} did not answer /ping and /invocations "
                                f"within {self.ready_timeout_s:.0f} s", f"its log: {backend.log_path}")
        return backend

    def start(self, host: str, port: int) -> Front:
        self.log_dir.mkdir(parents=True, exist_ok=True)
        self.front = Front(host, port, self._ready_backend(self.champion_version()))
        threading.Thread(target=self.front.serve_forever, name="front", daemon=True).start()
        log.info("serve: %s v%s on http://%s:%d", self.model_name, self.front.backend.version, host, port)
        return self.front

    def check(self) -> str | None:
        """Switches to the champion when the alias has moved; returns the version switched to, or None."""
        with self.check_lock:
            version = self.champion_version()
            if version == self.front.backend.version or version == self.failed:
                return None
            try:
                backend = self._ready_backend(version)
            except PipelineError as exc:
                self.failed = version
                log.error("serve: keeping v%s: %s (%s)", self.front.backend.version, exc.message, exc.hint)
                return None
            old = self.front.switch(backend)
            log.info("serve: switched %s v%s -> v%s", self.model_name, old.version, version)
            stop_backend(old)
            return version

    def follow(self, wake: threading.Event, stop: threading.Event, interval_s: float) -> None:
        """Calls check() each time `wake` is set, and every interval_s anyway, until `stop` is set."""
        while not stop.is_set():
            wake.wait(interval_s)
            wake.clear()
            if stop.is_set():
                return
            try:
                self.check()
            except Exception as exc:  # the registry unreachable for a moment: serve on, look again next time
                log.warning("serve: could not read the champion of %s: %s", self.model_name, exc)

    def close(self) -> None:
        if self.front is not None:
            self.front.shutdown()
            self.front.server_close()
            stop_backend(self.front.backend, drain_s=10)
