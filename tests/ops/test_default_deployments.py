"""Acceptance: the deployments as a new user starts them, with their default parameters (issue 27).

scripts/serve.sh starts a Prefect server, a process worker per pool and MLflow (free ports, 127.0.0.1, its own
PREFECT_HOME in tmp); `prefect --no-prompt deploy --all` deploys prefect.yaml from another folder; then, through
the API and the `cpu` worker, with no parameters passed:

1. `nightly-reevaluation` before any pipeline run: fails once (no retry) and says there is no champion yet, in
   the state message and a markdown artifact;
2. `ttt-pipeline`: the demo preset end to end (full demo training, a few minutes on 2 cores); registers the
   champion;
3. `nightly-reevaluation` again: completes on that champion.

The worker's project home (TTT_PIPELINE_HOME, which only says where relative paths resolve) is an empty temporary
folder, so the run's `.cache`, `mlflow.db` and `mlruns/` land there; the deployments name the demo preset, whose
reviews the worker reads from the package installed there.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from netutil import free_port, listening

REPO = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent
pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def stack(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("defaults")
    home = tmp / "home"
    home.mkdir()
    ports = {"prefect": free_port(), "mlflow": free_port()}
    env = {**os.environ,
           "TTT_RUN_DIR": str(tmp / "run"), "PREFECT_HOME": str(tmp / "prefect-home"),
           "TTT_PREFECT_PORT": str(ports["prefect"]), "TTT_MLFLOW_PORT": str(ports["mlflow"]),
           "TTT_MLFLOW_BACKEND": f"sqlite:///{tmp}/mlflow-server.db", "TTT_MLFLOW_ARTIFACTS": str(tmp / "artifacts"),
           "TTT_PIPELINE_HOME": str(home), "TTT_BIN": str(BIN), "TTT_SERVE_WAIT_S": "240",
           "PREFECT_API_URL": f"http://127.0.0.1:{ports['prefect']}/api",
           "PREFECT_WORKER_QUERY_SECONDS": "2", "PREFECT_WORKER_PREFETCH_SECONDS": "5",
           "PREFECT_LOGGING_LEVEL": "INFO", "HF_HUB_OFFLINE": "1"}
    for var in ("PREFECT_API_KEY", "TTT_TRACKING_URI", "MLFLOW_TRACKING_URI"):  # the config's URI, as shipped
        env.pop(var, None)
    serve = ["bash", str(REPO / "scripts" / "serve.sh")]
    t0 = time.monotonic()
    started = subprocess.run([*serve, "start"], env=env, capture_output=True, text=True, timeout=400)
    try:
        assert started.returncode == 0, started.stdout[-3000:] + started.stderr[-3000:]
        elsewhere = tmp / "elsewhere"  # deploy from a folder that is not the project
        elsewhere.mkdir()
        deployed = subprocess.run([str(BIN / "prefect"), "--no-prompt", "deploy", "--all",
                                   "--prefect-file", str(REPO / "prefect.yaml")],
                                  env=env, cwd=elsewhere, capture_output=True, text=True, timeout=300)
        assert deployed.returncode == 0, deployed.stdout[-4000:] + deployed.stderr[-4000:]
        yield {"tmp": tmp, "home": home, "env": env, "run": tmp / "run"}
    finally:
        stopped = subprocess.run([*serve, "stop"], env=env, capture_output=True, text=True, timeout=180)
        print(stopped.stdout, stopped.stderr)
        assert stopped.returncode == 0, stopped.stdout + stopped.stderr
        assert not [p for p in ports.values() if listening(p)], "a port is still listening"
        print(f"default-deployments stack wall time: {time.monotonic() - t0:.0f}s")


def _run(stack, name: str, timeout: int):
    """Run a deployment with its own (default) parameters and wait for it: (flow run, its states, artifacts)."""
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterFlowRunId
    from prefect.deployments import run_deployment
    from prefect.settings import PREFECT_API_URL, temporary_settings

    t0 = time.monotonic()
    with temporary_settings(updates={PREFECT_API_URL: stack["env"]["PREFECT_API_URL"]}):
        fr = run_deployment(name, timeout=timeout, poll_interval=2)
        with get_client(sync_client=True) as c:
            states = c.read_flow_run_states(fr.id)
            arts = c.read_artifacts(artifact_filter=ArtifactFilter(flow_run_id=ArtifactFilterFlowRunId(any_=[fr.id])))
    print(f"{name}: {fr.state.type.value} after {time.monotonic() - t0:.0f}s")
    return fr, states, arts


def _worker_log(stack) -> str:
    return (stack["run"] / "worker-cpu.log").read_text(errors="replace")


def _champion(stack):
    from mlflow.tracking import MlflowClient

    from ttt_pipeline.config import load_config

    client = MlflowClient(f"sqlite:///{stack['home'] / 'mlflow.db'}")
    return client, client.get_model_version_by_alias(load_config("demo").model_name(), "champion")


@pytest.fixture(scope="module")
def night_before(stack):
    return _run(stack, "nightly-reevaluation/nightly-reevaluation", timeout=300)


@pytest.fixture(scope="module")
def pipeline(stack, night_before):
    return _run(stack, "ttt-pipeline/ttt-pipeline", timeout=2700)  # 1429 s measured on 2 busy cores


@pytest.fixture(scope="module")
def night_after(stack, pipeline):
    return _run(stack, "nightly-reevaluation/nightly-reevaluation", timeout=1200)


def test_nightly_without_a_champion_fails_once_and_says_what_to_do(stack, night_before):
    fr, states, arts = night_before
    assert fr.state.is_failed(), f"{fr.state.type}: {fr.state.message}\n{_worker_log(stack)[-4000:]}"
    assert "has no version at alias 'champion': no champion yet" in fr.state.message
    assert "run the ttt-pipeline deployment once" in fr.state.message  # the hint travels with it
    assert fr.run_count == 1 and not [s for s in states if s.name in ("AwaitingRetry", "Retrying")]
    assert fr.parameters["preset"] == "demo" and not fr.parameters["overrides"]  # prefect.yaml's
    (note,) = [a for a in arts if a.key == "nightly-reevaluation"]
    assert note.type == "markdown" and "No champion yet" in note.data and "NO CHAMPION" in note.description


def test_pipeline_with_its_default_parameters_completes_and_registers_the_champion(stack, pipeline):
    from ttt_pipeline.config import load_config

    fr, _, arts = pipeline
    assert fr.state.is_completed(), f"{fr.state.type}: {fr.state.message}\n{_worker_log(stack)[-4000:]}"
    assert fr.work_pool_name == "cpu" and str(fr.id) in _worker_log(stack)
    assert f"project home: {stack['home'].resolve()} (TTT_PIPELINE_HOME)" in _worker_log(stack)
    assert any(a.key == "ttt-pipeline-summary" for a in arts)
    home = stack["home"]
    assert (home / "mlflow.db").is_file() and (home / ".cache" / "finetune").is_dir()  # relative to the home
    client, champion = _champion(stack)
    run = client.get_run(champion.run_id)
    parent_id = run.data.tags.get("mlflow.parentRunId", champion.run_id)
    params = client.get_run(parent_id).data.params
    demo = load_config("demo").flat()
    assert params["data.path"] == load_config("demo").data.path  # the preset's reviews, in the installed package
    for key in ("data.label_column", "finetune.epochs", "finetune.joint_passes", "finetune.precision"):
        assert params[key] == demo[key], key  # the demo preset, as prefect.yaml deploys it
    metrics = client.get_run(parent_id).data.metrics
    assert 0.0 <= metrics["acc_ttt"] <= 1.0 and 0.0 <= metrics["acc_clean"] <= 1.0


def test_nightly_with_a_champion_completes_on_it(stack, night_after):
    fr, _, arts = night_after
    assert fr.state.is_completed(), f"{fr.state.type}: {fr.state.message}\n{_worker_log(stack)[-4000:]}"
    assert any(a.key == "nightly-reevaluation" and "No champion" not in (a.data or "") for a in arts)
    client, champion = _champion(stack)
    exp = client.get_experiment_by_name("ttt-pipeline")
    nights = client.search_runs([exp.experiment_id], "tags.ttt_run_kind = 'nightly-reevaluation'")
    assert len(nights) == 1 and nights[0].info.status == "FINISHED"
    assert nights[0].data.tags["model_version"] == str(champion.version)
    assert 0.0 <= nights[0].data.metrics["robust_acc_ref"] <= 1.0
