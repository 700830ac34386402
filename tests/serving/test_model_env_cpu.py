"""The logged model's environment installs where users serve: torch's CPU build by default, no nvidia-* wheels.

Unit: requirements.txt pins torch as its CPU build from PyTorch's CPU index; TTT_MODEL_TORCH=cuda pins PyPI's build.
Integration: MLflow's own `virtualenv` environment manager builds the model's environment from its requirements.txt
alone (`mlflow models prepare-env`); that environment holds torch `+cpu` and no nvidia-* package, and `mlflow models
serve --env-manager virtualenv` answers from it.

This machine reaches no host but its package indexes: download.pytorch.org does not resolve, so pip's one attempt
there fails at once (PIP_RETRIES=0 keeps it from retrying every project) and the `+cpu` wheel comes from the
machine's own wheel folder (pip's find-links). Elsewhere pip takes it from PyTorch's CPU index.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest
from netutil import free_port
from serving_helpers import LABELS, TEXTS

from ttt_pipeline.errors import PipelineError
from ttt_pipeline.io.mlflow_model import TORCH_CPU_INDEX, pip_requirements

BIN = Path(sys.executable).parent


def _torch(lines: list[str]) -> list[str]:
    return [line for line in lines if line.startswith("torch")]


def test_torch_is_the_cpu_build_by_default_and_cuda_on_request(monkeypatch):
    from importlib.metadata import version

    from packaging.version import Version

    public = Version(version("torch")).public
    monkeypatch.delenv("TTT_MODEL_TORCH", raising=False)
    cpu = pip_requirements()
    assert f"--extra-index-url {TORCH_CPU_INDEX}" in cpu
    assert _torch(cpu) == [f'torch=={public}+cpu; sys_platform != "darwin"', f'torch=={public}; sys_platform == "darwin"']
    monkeypatch.setenv("TTT_MODEL_TORCH", "cuda")
    cuda = pip_requirements()
    assert _torch(cuda) == [f"torch=={public}"] and not [line for line in cuda if line.startswith("-")]
    assert pip_requirements("cpu") == cpu
    monkeypatch.setenv("TTT_MODEL_TORCH", "rocm")
    with pytest.raises(PipelineError, match="TTT_MODEL_TORCH"):
        pip_requirements()


@pytest.fixture(scope="module")
def model_dir(tiny_model_dir, tmp_path_factory) -> Path:
    from ttt_pipeline.classifier import inference_config
    from ttt_pipeline.config import TTTConfig
    from ttt_pipeline.io.mlflow_model import save_classifier_model

    return save_classifier_model(tiny_model_dir, tmp_path_factory.mktemp("cpu-env-model") / "model",
                                 inference_config(TTTConfig(), "none"))


def _predict_when_up(url: str, server: subprocess.Popen, log: Path, wait_s: float = 300) -> list[dict]:
    deadline = time.monotonic() + wait_s
    while time.monotonic() < deadline:
        assert server.poll() is None, log.read_text()[-4000:]
        try:
            req = urllib.request.Request(f"{url}/invocations", data=json.dumps({"inputs": TEXTS[:2]}).encode(),
                                         headers={"Content-Type": "application/json"})
            with urllib.request.urlopen(req, timeout=60) as r:
                return json.loads(r.read())["predictions"]
        except (urllib.error.URLError, OSError):
            time.sleep(1)
    pytest.fail(f"the model server did not answer within {wait_s:.0f} s: {log.read_text()[-4000:]}")


@pytest.mark.integration
def test_mlflows_virtualenv_manager_builds_a_cpu_only_environment_that_predicts(model_dir, tmp_path):
    env = {**os.environ, "MLFLOW_ENV_ROOT": str(tmp_path / "envs"), "PIP_RETRIES": "0", "HF_HUB_OFFLINE": "1",
           "PATH": f"{BIN}{os.pathsep}{os.environ['PATH']}"}
    env.pop("PYTHONPATH", None)
    t0 = time.monotonic()
    built = subprocess.run([str(BIN / "mlflow"), "models", "prepare-env", "-m", str(model_dir),
                            "--env-manager", "virtualenv"], env=env, capture_output=True, text=True, timeout=1500,
                           cwd=tmp_path)
    assert built.returncode == 0, built.stdout[-3000:] + built.stderr[-5000:]
    build_s = time.monotonic() - t0
    [python] = (tmp_path / "envs").glob("mlflow-*/bin/python")
    listed = subprocess.run([str(python), "-m", "pip", "list", "--format", "json"], capture_output=True, text=True,
                            timeout=300, check=True)
    installed = {p["name"].lower(): p["version"] for p in json.loads(listed.stdout)}
    assert installed["torch"].endswith("+cpu"), installed["torch"]
    assert not [n for n in installed if n.startswith("nvidia") or n in ("triton", "cuda-python")], installed
    port = free_port()
    with open(tmp_path / "serve.log", "w") as log:  # the environment prepare-env built (MLFLOW_ENV_ROOT), reused
        server = subprocess.Popen([str(BIN / "mlflow"), "models", "serve", "-m", str(model_dir), "--env-manager",
                                   "virtualenv", "-h", "127.0.0.1", "-p", str(port)], env=env, cwd=tmp_path,
                                  stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        rows = _predict_when_up(f"http://127.0.0.1:{port}", server, tmp_path / "serve.log")
    finally:
        os.killpg(server.pid, signal.SIGTERM)
        server.wait(60)
    assert len(rows) == 2 and all(r["label"] in LABELS for r in rows)
    print(f"\nMLflow virtualenv environment: built in {build_s:.0f} s; torch {installed['torch']}; "
          f"{len(installed)} packages, none nvidia-*")
