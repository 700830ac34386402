"""Acceptance: real servers, real workers, real deployments.

scripts/serve.sh starts a Prefect server (own PREFECT_HOME in tmp, free port, 127.0.0.1), an MLflow server
and one process worker on each pool (`cpu`, `gpu`); `prefect --no-prompt deploy --all` deploys prefect.yaml
from a folder that is *not* the project (entrypoints import the installed package); `ttt-pipeline` is triggered
through the API with execution.mode=deployments. Everything is stopped afterwards and no port may be left
listening.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from netutil import free_port, listening
from tiny_config import tiny_config

REPO = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent
pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def stack(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("servers")
    ports = {"prefect": free_port(), "mlflow": free_port()}
    home = tmp / "home"  # TTT_PIPELINE_HOME of the workers (relative config paths land here)
    home.mkdir()
    env = {**os.environ,
           "TTT_RUN_DIR": str(tmp / "run"), "PREFECT_HOME": str(tmp / "prefect-home"),
           "TTT_PREFECT_PORT": str(ports["prefect"]), "TTT_MLFLOW_PORT": str(ports["mlflow"]),
           "TTT_MLFLOW_BACKEND": f"sqlite:///{tmp}/mlflow-server.db", "TTT_MLFLOW_ARTIFACTS": str(tmp / "artifacts"),
           "TTT_PIPELINE_HOME": str(home), "TTT_BIN": str(BIN), "TTT_SERVE_WAIT_S": "240",
           "PREFECT_API_URL": f"http://127.0.0.1:{ports['prefect']}/api",
           "PREFECT_WORKER_QUERY_SECONDS": "2", "PREFECT_WORKER_PREFETCH_SECONDS": "5",
           "PREFECT_LOGGING_LEVEL": "INFO", "HF_HUB_OFFLINE": "1"}
    env.pop("PREFECT_API_KEY", None)
    env.pop("TTT_TRACKING_URI", None)
    serve = ["bash", str(REPO / "scripts" / "serve.sh")]
    t0 = time.monotonic()
    started = subprocess.run([*serve, "start"], env=env, capture_output=True, text=True, timeout=400)
    try:
        assert started.returncode == 0, started.stdout[-3000:] + started.stderr[-3000:]
        yield {"tmp": tmp, "env": env, "ports": ports, "run": tmp / "run", "t0": t0}
    finally:
        stopped = subprocess.run([*serve, "stop"], env=env, capture_output=True, text=True, timeout=180)
        print(stopped.stdout, stopped.stderr)
        assert stopped.returncode == 0, stopped.stdout + stopped.stderr
        assert not [p for p in ports.values() if listening(p)], "a port is still listening"
        print(f"integration stack wall time: {time.monotonic() - t0:.0f}s")


@pytest.fixture(scope="module")
def deployed(stack):
    elsewhere = stack["tmp"] / "elsewhere"  # not the project folder: nothing may be read from the cwd
    elsewhere.mkdir()
    proc = subprocess.run([str(BIN / "prefect"), "--no-prompt", "deploy", "--all",
                           "--prefect-file", str(REPO / "prefect.yaml")],
                          env={**stack["env"], "TTT_PIPELINE_HOME": "/deploy-time/value/must/not/stick"},
                          cwd=elsewhere, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    return stack


@pytest.fixture(scope="module")
def pipeline_run(deployed, tiny_bert_dir):
    from prefect.deployments import run_deployment
    from prefect.settings import PREFECT_API_URL, temporary_settings

    tmp = deployed["tmp"]
    mlflow_url = f"http://127.0.0.1:{deployed['ports']['mlflow']}"
    cfg = tiny_config(tmp / "work", tiny_bert_dir, suite="ops", tracking_uri=mlflow_url,
                      execution={"mode": "deployments", "timeout_s": 400})
    cfg["tracking"]["experiment"] = "integration"
    t0 = time.monotonic()
    with temporary_settings(updates={PREFECT_API_URL: deployed["env"]["PREFECT_API_URL"]}):
        fr = run_deployment("ttt-pipeline/ttt-pipeline", parameters={"config": cfg}, timeout=480, poll_interval=2)
    return {**deployed, "flow_run": fr, "mlflow_url": mlflow_url, "run_s": time.monotonic() - t0}


def _client(stack):
    from prefect.client.orchestration import get_client
    from prefect.settings import PREFECT_API_URL, temporary_settings

    class Ctx:
        def __enter__(self):
            self.ts = temporary_settings(updates={PREFECT_API_URL: stack["env"]["PREFECT_API_URL"]})
            self.ts.__enter__()
            self.c = get_client(sync_client=True).__enter__()
            return self.c

        def __exit__(self, *exc):
            self.c.__exit__(*exc)
            self.ts.__exit__(*exc)

    return Ctx()


def _logs(stack, name: str) -> str:
    return (stack["run"] / f"{name}.log").read_text(errors="replace")


def test_pipeline_completes_with_heavy_steps_on_the_gpu_pool(pipeline_run):
    from prefect.client.schemas.filters import DeploymentFilter, DeploymentFilterName

    fr = pipeline_run["flow_run"]
    assert fr.state.is_completed(), f"{fr.state.type}: {fr.state.message}\n{_logs(pipeline_run, 'worker-cpu')[-4000:]}"
    assert fr.work_pool_name == "cpu"
    assert str(fr.id) in _logs(pipeline_run, "worker-cpu")
    with _client(pipeline_run) as c:
        heavy = c.read_flow_runs(deployment_filter=DeploymentFilter(
            name=DeploymentFilterName(any_=["finetune-gpu", "evaluate-gpu"])))
        by_flow = {}
        for r in heavy:
            by_flow.setdefault(c.read_flow(r.flow_id).name, []).append(r)
        parents = {c.read_task_run(r.parent_task_run_id).flow_run_id for r in heavy if r.parent_task_run_id}
    assert len(by_flow["finetune"]) == 1
    assert sorted(r.name for r in by_flow["evaluate"]) == ["evaluate-clean", "evaluate-tutorial"]  # fan-out
    gpu_log = _logs(pipeline_run, "worker-gpu")
    for r in heavy:
        assert r.state.is_completed(), (r.name, r.state.message)
        assert r.work_pool_name == "gpu", r.name
        assert f"submitting flow run '{r.id}'" in gpu_log, f"{r.name} did not run on the gpu worker"
        assert f"submitting flow run '{r.id}'" not in _logs(pipeline_run, "worker-cpu")
    assert parents == {fr.id}  # linked as subflows of the orchestrating run
    print(f"ttt-pipeline through the API: {pipeline_run['run_s']:.0f}s")


def test_mlflow_holds_the_run_tree(pipeline_run):
    from mlflow.tracking import MlflowClient

    client = MlflowClient(pipeline_run["mlflow_url"])
    exp = client.get_experiment_by_name("integration")
    parents = client.search_runs([exp.experiment_id], f"tags.`prefect.flow_run_id` = '{pipeline_run['flow_run'].id}'")
    assert len(parents) == 1
    parent = parents[0]
    assert parent.info.status == "FINISHED"
    assert parent.data.params["execution.mode"] == "deployments"
    children = client.search_runs([exp.experiment_id], f"tags.mlflow.parentRunId = '{parent.info.run_id}'")
    by_name = {c.info.run_name: c for c in children}
    assert {"download", "tokenise", "corrupt", "finetune", "evaluate"} <= set(by_name)
    assert all(c.info.status == "FINISHED" for c in children)
    ev = by_name["evaluate"].data.metrics
    for k in ("acc/clean/none", "acc/clean/ttt", "acc/tutorial/3/none", "acc/tutorial/3/ttt"):
        assert 0.0 <= ev[k] <= 1.0, k
    assert parent.data.metrics["acc_ttt"] == pytest.approx(ev["acc_ttt"])
    assert client.get_run(by_name["finetune"].info.run_id).outputs.model_outputs  # the MLflow Model


def test_deployments_as_the_api_returns_them(deployed):
    with _client(deployed) as c:
        nightly = c.read_deployment_by_name("nightly-reevaluation/nightly-reevaluation")
        pipeline = c.read_deployment_by_name("ttt-pipeline/ttt-pipeline")
        ft = c.read_deployment_by_name("finetune/finetune-gpu")
        ev = c.read_deployment_by_name("evaluate/evaluate-gpu")
        brought = c.read_deployment_by_name("evaluate-model/evaluate-model")
    assert len(nightly.schedules) == 1
    sched = nightly.schedules[0]
    assert sched.active and sched.schedule.cron == "30 1 * * *" and sched.schedule.timezone == "UTC"
    assert nightly.global_concurrency_limit.limit == 1  # a night that overruns: the next one is cancelled
    assert nightly.concurrency_options.collision_strategy.value == "CANCEL_NEW"
    assert {"config", "preset", "overrides", "threshold", "reference_seed"} <= set(
        nightly.parameter_openapi_schema["properties"])
    for d in (nightly, pipeline, brought):  # the form: a preset by name plus overrides
        assert d.parameters["preset"] == "demo" and d.parameters["overrides"] == {}, d.name
    assert nightly.work_pool_name == "cpu" and pipeline.work_pool_name == "cpu" and brought.work_pool_name == "cpu"
    assert ft.work_pool_name == "gpu" and ev.work_pool_name == "gpu"
    schema = pipeline.parameter_openapi_schema  # the UI renders the pydantic config as a form
    # `config` defaults to None (the demo preset, read when the flow runs, never at import): the form offers
    # the PipelineConfig object or nothing
    config = schema["properties"]["config"]
    assert {"$ref": "#/definitions/PipelineConfig"} in config["anyOf"] and config["default"] is None
    assert {"DataConfig", "FinetuneConfig", "ExecutionConfig"} <= set(schema["definitions"])
    for d in (nightly, pipeline, ft, ev, brought):
        assert "." in d.entrypoint and ":" not in d.entrypoint  # module path: the installed package
        assert d.pull_steps == [{"ttt_pipeline.flows.gpu_pool.enter_pipeline_home": {}}]  # resolved on the worker, at run time
