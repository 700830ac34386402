"""A real `mlflow models serve` process on 127.0.0.1, for the serving integration tests: started from a given
virtualenv's bin folder (MLflow starts `uvicorn` from PATH, so that folder leads PATH), ready once /ping answers,
stopped by its process group, and its port checked closed afterwards."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import time
import urllib.error
import urllib.request
from pathlib import Path

from netutil import free_port, listening


@contextlib.contextmanager
def mlflow_serve(model: str, bin_dir: Path, cwd: Path, env: dict[str, str] | None = None, wait_s: float = 240,
                 script: Path | None = None):
    """Yields {"url", "port", "proc", "log"}. `env` is added to this process's environment (minus any tracking
    URI and PYTHONPATH: what is served must come from `model` and `bin_dir` alone). With `script`
    (scripts/serve_model.sh) the server is started the way `make serve-model` starts it, from a PATH without
    `bin_dir`: the script must put it there itself."""
    port = free_port()
    path = os.pathsep.join(p for p in os.environ.get("PATH", "").split(os.pathsep) if Path(p) != bin_dir)
    full = {**os.environ, "HF_HUB_OFFLINE": "1", "TTT_DEVICE": "cpu", "TOKENIZERS_PARALLELISM": "false",
            "MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR": "false",
            "PATH": path if script else f"{bin_dir}{os.pathsep}{path}", **(env or {})}
    for var in ("TTT_TRACKING_URI", "PYTHONPATH", *([] if env and "MLFLOW_TRACKING_URI" in env
                                                     else ["MLFLOW_TRACKING_URI"])):
        full.pop(var, None)
    if script:
        argv = ["bash", str(script), *([model] if model else [])]
        full.update(TTT_BIN=str(bin_dir), TTT_SERVE_PORT=str(port), TTT_HOST="127.0.0.1")
    else:
        argv = [str(bin_dir / "mlflow"), "models", "serve", "-m", model, "--env-manager", "local",
                "-h", "127.0.0.1", "-p", str(port)]
    log_path = cwd / f"serve-{port}.log"
    log = open(log_path, "w")
    proc = subprocess.Popen(argv, env=full, cwd=cwd, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + wait_s
        while True:
            try:
                with urllib.request.urlopen(f"{url}/ping", timeout=2) as r:
                    if r.status == 200:
                        break
            except (urllib.error.URLError, OSError):
                pass
            assert proc.poll() is None, log_path.read_text()[-4000:]
            assert time.monotonic() < deadline, f"mlflow models serve did not answer within {wait_s:.0f} s"
            time.sleep(1)
        yield {"url": url, "port": port, "proc": proc, "log": log_path}
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(10)
        log.close()
        closed_by = time.monotonic() + 20  # uvicorn lets go of the socket a moment after its parent exits
        while listening(port) and time.monotonic() < closed_by:
            time.sleep(0.5)
        assert not listening(port), "the model server's port is still open"


def invoke(server: dict, body: dict, timeout: float = 120) -> list[dict]:
    """POST /invocations; the answer's `predictions`."""
    req = urllib.request.Request(f"{server['url']}/invocations", data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=timeout) as r:
        answer = json.loads(r.read())
    assert set(answer) == {"predictions"}
    return answer["predictions"]
