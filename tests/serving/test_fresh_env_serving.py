"""Acceptance (issue 33): the MLflow Model is self-contained. A fresh virtualenv gets the model's own
requirements.txt and nothing else (torch first, as the CPU build, so the pinned `torch==X` does not pull a CUDA
build); that venv's `mlflow models serve` (cwd outside the repo, no PYTHONPATH: the project is not importable
there) answers /invocations with the labels and probabilities `ttt-pipeline predict` gives for the same reviews."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from model_server import invoke, mlflow_serve
from serving_helpers import TEXTS, same_predictions

pytestmark = pytest.mark.integration
BIN = Path(sys.executable).parent
TORCH_CPU_INDEX = "https://download.pytorch.org/whl/cpu"


@pytest.fixture(scope="module")
def model_dir(tiny_model_dir, tmp_path_factory) -> Path:
    from ttt_pipeline.classifier import inference_config
    from ttt_pipeline.config import TTTConfig
    from ttt_pipeline.defenses.vocabulary import training_vocabulary
    from ttt_pipeline.io.mlflow_model import save_classifier_model

    config = inference_config(TTTConfig(steps=2, lr=1e-2, batch_size=2), "masked_ttt")
    return save_classifier_model(tiny_model_dir, tmp_path_factory.mktemp("fresh-model") / "model", config,
                                 training_vocabulary(TEXTS * 2))


def _pip(venv: Path, *args: str, timeout: float = 900) -> None:
    # --no-compile: no bytecode written ahead (imports write their own); the installed packages are the same
    # PIP_RETRIES=0: requirements.txt names PyTorch's CPU index, which this machine cannot reach; one failed attempt
    # per project, not five, and pip goes on with the indexes it can reach
    proc = subprocess.run([str(venv / "bin" / "python"), "-m", "pip", "install", "-q", "--no-compile", *args],
                          capture_output=True, text=True, timeout=timeout, env={**os.environ, "PIP_RETRIES": "0"})
    assert proc.returncode == 0, proc.stderr[-4000:]


@pytest.fixture(scope="module")
def fresh_venv(model_dir, tmp_path_factory):
    """python -m venv; torch (the build installed here: the CPU one, from this machine's wheels or PyTorch's CPU
    index); then `pip install -r <model>/requirements.txt` only."""
    from importlib.metadata import version

    venv = tmp_path_factory.mktemp("fresh-venv") / "venv"
    t0 = time.monotonic()
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=300)
    torch_pin = f"torch=={version('torch')}"  # e.g. 2.13.0+cpu: the public pin in requirements.txt accepts it
    try:
        _pip(venv, torch_pin)
    except AssertionError:
        _pip(venv, torch_pin, "--extra-index-url", TORCH_CPU_INDEX)
    _pip(venv, "-r", str(model_dir / "requirements.txt"))
    print(f"\nfresh venv from the model's requirements.txt: {time.monotonic() - t0:.0f} s")
    yield venv
    # about 1.5 GB: not left for pytest's rotation of its tmp folders; removed in the background, since beside the
    # tier's other runs the removal takes about a minute of this worker's time (seconds alone)
    subprocess.Popen(["rm", "-rf", str(venv)], start_new_session=True, stdout=subprocess.DEVNULL,
                     stderr=subprocess.DEVNULL)


def test_the_project_is_not_installed_in_the_fresh_venv(fresh_venv, tmp_path):
    proc = subprocess.run([str(fresh_venv / "bin" / "python"), "-c", "import ttt_pipeline"], cwd=tmp_path,
                          capture_output=True, text=True, env={k: v for k, v in os.environ.items()
                                                               if k != "PYTHONPATH"})
    assert proc.returncode != 0 and "No module named 'ttt_pipeline'" in proc.stderr
    freeze = subprocess.run([str(fresh_venv / "bin" / "python"), "-m", "pip", "freeze"], capture_output=True,
                            text=True, check=True).stdout
    assert "ttt" not in freeze.lower()


def _predict_cli(model_dir: Path, texts: list[str], method: str, tmp: Path) -> list[dict]:
    src, out = tmp / f"{method}.jsonl", tmp / f"{method}-out.jsonl"
    src.write_text("".join(json.dumps({"text": t}) + "\n" for t in texts), encoding="utf-8")
    proc = subprocess.run([str(BIN / "ttt-pipeline"), "predict", "--model", str(model_dir), "--input", str(src),
                           "--output", str(out), "--method", method, "--device", "cpu"],
                          env={**os.environ, "HF_HUB_OFFLINE": "1"}, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return [{k: r[k] for k in ("label", "probability", "probabilities")}
            for r in map(json.loads, out.read_text().splitlines())]


def test_fresh_venv_serves_the_model_like_predict(fresh_venv, model_dir, tmp_path):
    with mlflow_serve(str(model_dir), fresh_venv / "bin", tmp_path) as server:
        served = {m: invoke(server, {"inputs": TEXTS, "params": {"method": m}}) for m in ("none", "masked_ttt")}
        assert invoke(server, {"inputs": TEXTS}) == served["masked_ttt"]  # the model's configured method
        log = server["log"].read_text()
    assert str(fresh_venv / "bin") in (fresh_venv / "bin" / "mlflow").read_text().splitlines()[0]
    assert "Traceback" not in log, log[-3000:]
    for method, preds in served.items():
        cli = _predict_cli(model_dir, TEXTS, method, tmp_path)
        assert [p["label"] for p in preds] == [p["label"] for p in cli], method
        assert same_predictions(preds, cli), method
    assert served["none"] != served["masked_ttt"]
