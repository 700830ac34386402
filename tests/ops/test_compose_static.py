"""Static checks of the deployment files (no Docker engine needed): compose stack, GPU overlay, Dockerfile,
.env.example, prefect.yaml and scripts/serve.sh."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
SECRET_KEY = re.compile(r"PASSWORD|SECRET|TOKEN|AUTH_STRING|API_KEY", re.I)
REF = re.compile(r"^\$\{[A-Z_][A-Z0-9_]*(:?[?-][^}]*)?\}$")
CRED_URL = re.compile(r"://([^/@\s:]+):([^/@\s]+)@")


def load(name: str) -> dict:
    return yaml.safe_load((REPO / name).read_text())


@pytest.fixture(scope="module")
def base() -> dict:
    return load("docker-compose.yml")


@pytest.fixture(scope="module")
def gpu() -> dict:
    return load("docker-compose.gpu.yml")


def _env(svc: dict) -> dict:
    env = svc.get("environment") or {}
    if isinstance(env, list):
        env = dict(item.split("=", 1) if "=" in item else (item, None) for item in env)
    return env


def _strings(obj):
    if isinstance(obj, dict):
        for v in obj.values():
            yield from _strings(v)
    elif isinstance(obj, list):
        for v in obj:
            yield from _strings(v)
    elif isinstance(obj, str):
        yield obj


def test_required_services(base, gpu):
    assert {"postgres", "prefect-server", "mlflow", "worker-cpu"} <= set(base["services"])
    assert "worker-gpu" not in base["services"]  # CPU-only hosts: `docker compose up` needs no GPU
    assert set(gpu["services"]) == {"worker-gpu"}


def test_ports_only_on_loopback(base, gpu):
    for doc in (base, gpu):
        for name, svc in doc["services"].items():
            for p in svc.get("ports", []):
                if isinstance(p, dict):
                    assert p.get("host_ip") == "127.0.0.1", (name, p)
                else:
                    assert str(p).startswith("127.0.0.1:"), (name, p)
            assert svc.get("network_mode") != "host", name
    assert base["services"]["postgres"].get("ports") is None  # the database is reachable inside the stack only


def test_no_literal_secret(base, gpu):
    for doc in (base, gpu):
        for name, svc in doc["services"].items():
            for key, value in _env(svc).items():
                if SECRET_KEY.search(key):
                    assert value is not None and REF.match(str(value)), f"{name}.{key} holds a literal secret"
            for s in _strings(svc):
                for _user, password in CRED_URL.findall(re.sub(r"\$\{[^}]*\}", "VAR", s)):
                    assert password == "VAR", f"{name}: literal password in {s!r}"
    for s in _strings(base.get("configs", {})):
        assert "PASSWORD" not in s.upper() or "${" in s


def test_required_variables_are_documented_in_env_example(base, gpu):
    text = (REPO / "docker-compose.yml").read_text() + (REPO / "docker-compose.gpu.yml").read_text()
    required = set(re.findall(r"\$\{([A-Z_][A-Z0-9_]*)(?::?[?-])", text))
    example = dict(line.split("=", 1) for line in (REPO / ".env.example").read_text().splitlines()
                   if line and not line.startswith("#"))
    assert required <= set(example), required - set(example)
    assert ".env" in (REPO / ".gitignore").read_text().split() and ".env" in (REPO / ".dockerignore").read_text()


def test_healthchecks_and_healthy_dependencies(base, gpu):
    for doc in (base, gpu):
        for name, svc in doc["services"].items():
            assert svc.get("healthcheck", {}).get("test"), f"{name} has no healthcheck"
            deps = svc.get("depends_on", {})
            assert isinstance(deps, dict), f"{name}: depends_on must use the long form with conditions"
            for dep, spec in deps.items():
                assert spec.get("condition") == "service_healthy", (name, dep)
                assert dep in base["services"], (name, dep)
    assert set(base["services"]["prefect-server"]["depends_on"]) == {"postgres"}
    assert set(base["services"]["mlflow"]["depends_on"]) == {"postgres"}
    assert {"prefect-server", "mlflow"} <= set(base["services"]["worker-cpu"]["depends_on"])
    assert {"prefect-server", "mlflow"} <= set(gpu["services"]["worker-gpu"]["depends_on"])


def test_servers_are_wired_to_postgres_and_auth(base, gpu):
    s = base["services"]
    prefect_env = _env(s["prefect-server"])
    assert prefect_env["PREFECT_API_DATABASE_CONNECTION_URL"].startswith("postgresql+asyncpg://")
    auth = prefect_env["PREFECT_SERVER_API_AUTH_STRING"]
    for client in (s["worker-cpu"], gpu["services"]["worker-gpu"]):
        assert _env(client)["PREFECT_API_AUTH_STRING"].split(":")[0] == auth.split(":")[0]  # the same variable
        assert _env(client)["TTT_PIPELINE_HOME"]
    cmd = " ".join(s["mlflow"]["command"])
    assert "--backend-store-uri postgresql://" in cmd and "--app-name basic-auth" in cmd
    assert "--allowed-hosts" in cmd and "--artifacts-destination" in cmd
    assert any(str(v).endswith(":/mlflow") for v in s["mlflow"]["volumes"])
    assert _env(s["mlflow"])["MLFLOW_AUTH_CONFIG_PATH"]
    assert "authorization_function" in base["configs"]["mlflow-auth"]["content"]
    assert "worker start --pool cpu" in " ".join(s["worker-cpu"]["command"])


def test_gpu_overlay_reserves_nvidia_devices(gpu):
    svc = gpu["services"]["worker-gpu"]
    devices = svc["deploy"]["resources"]["reservations"]["devices"]
    assert any(d["driver"] == "nvidia" and "gpu" in d["capabilities"] for d in devices)
    cmd = " ".join(svc["command"])
    assert "--pool gpu" in cmd and "--limit 1" in cmd  # one heavy job per GPU worker


def test_dockerfile():
    text = (REPO / "Dockerfile").read_text()
    assert re.search(r"^FROM python:3\.11-slim\b", text, re.M)
    assert "torch==2.13.0" in text and "download.pytorch.org/whl/cpu" in text
    assert 'pip install -e ".[attribution,gdrive]"' in text  # the workers run attribution and gdown:// presets
    assert re.search(r"^USER (?!root)", text, re.M)


def _deployments() -> dict:
    return {d["name"]: d for d in load("prefect.yaml")["deployments"]}


def test_prefect_yaml():
    doc = load("prefect.yaml")
    deps = _deployments()
    assert set(deps) == {"ttt-pipeline", "evaluate-model", "finetune-gpu", "evaluate-gpu", "nightly-reevaluation",
                         "traffic-monitor"}
    for name in ("ttt-pipeline", "evaluate-model"):
        assert deps[name]["work_pool"]["name"] == "cpu" and not deps[name]["schedules"], name
    assert deps["finetune-gpu"]["work_pool"]["name"] == deps["evaluate-gpu"]["work_pool"]["name"] == "gpu"
    for d in deps.values():
        assert ":" not in d["entrypoint"]  # module paths: imported from the installed package
    assert doc["pull"] == [{"ttt_pipeline.flows.gpu_pool.enter_pipeline_home": {}}]
    assert "definitions" not in doc  # no copy of a preset: the form names one


def test_prefect_yaml_is_valid_for_prefect_deploy():
    """The shape `prefect deploy` reads (its own model), and the schedule and limit it hands to the server."""
    from prefect.cli.deploy._models import PrefectYamlModel
    from prefect.client.schemas.objects import ConcurrencyLimitConfig
    from prefect.client.schemas.schedules import CronSchedule

    doc = PrefectYamlModel.model_validate(load("prefect.yaml"))
    nightly = {d.name: d for d in doc.deployments}["nightly-reevaluation"]
    (sched,) = nightly.schedules
    assert sched.active is True and sched.cron == "30 1 * * *" and sched.timezone == "UTC"  # no DST gap in UTC
    CronSchedule(cron=sched.cron, timezone=sched.timezone)
    limit = ConcurrencyLimitConfig.model_validate(nightly.concurrency_limit.model_dump(exclude_none=True))
    assert limit.limit == 1 and limit.collision_strategy.value == "CANCEL_NEW"  # an overrunning night: next cancelled


def test_started_deployments_name_a_preset_with_overrides():
    """The UI's Run button and the nightly schedule run the deployment's parameters: preset demo, no overrides,
    which the flows resolve (on the worker, when the run starts) to the demo preset."""
    import inspect

    from ttt_pipeline.config import flow_config, load_config
    from ttt_pipeline.flows.evaluate_model import evaluate_model
    from ttt_pipeline.flows.pipeline import ttt_pipeline
    from ttt_pipeline.flows.reevaluate import nightly_reevaluation

    deps = _deployments()
    flows = {"ttt-pipeline": ttt_pipeline, "evaluate-model": evaluate_model,
             "nightly-reevaluation": nightly_reevaluation}
    for name, fl in flows.items():
        params = fl.validate_parameters(deps[name]["parameters"])  # as Prefect checks them against the flow
        assert params["preset"] == "demo" and params["overrides"] == {}, name
        assert flow_config(params.get("config"), params["preset"], params["overrides"]) == load_config("demo")
        for arg in ("config", "preset", "overrides"):  # no parameter: the demo preset, read when the flow runs
            assert inspect.signature(fl.fn).parameters[arg].default is None, (name, arg)
    assert {"threshold", "reference_seed"} <= set(deps["nightly-reevaluation"]["parameters"])
    assert nightly_reevaluation.retries == 0  # no champion (or a regression) fails once, not after retries


def test_the_forms_preset_mdsd_electronics_runs_that_preset():
    from ttt_pipeline.config import flow_config, load_config
    from ttt_pipeline.flows.evaluate_model import evaluate_model
    from ttt_pipeline.flows.pipeline import ttt_pipeline
    from ttt_pipeline.flows.reevaluate import nightly_reevaluation

    deps = _deployments()
    for name, fl in {"ttt-pipeline": ttt_pipeline, "nightly-reevaluation": nightly_reevaluation}.items():
        params = fl.validate_parameters({**deps[name]["parameters"], "preset": "mdsd-electronics"})
        cfg = flow_config(params.get("config"), params["preset"], params["overrides"])
        assert cfg == load_config("mdsd-electronics"), name
        assert cfg.attribution.enabled and cfg.tracking.experiment == "mdsd-electronics"
    form = {**deps["evaluate-model"]["parameters"], "preset": "mdsd-electronics",
            "overrides": {"model.classifier": "models:/my-classifier@prod", "data": {"max_test_samples": 100}}}
    params = evaluate_model.validate_parameters(form)
    cfg = flow_config(params.get("config"), params["preset"], params["overrides"])
    assert cfg.model.classifier == "models:/my-classifier@prod" and cfg.data.max_test_samples == 100
    assert cfg.data.shift == load_config("mdsd-electronics").data.shift  # a section's other fields stay the preset's


class _Configured(Exception):
    """Raised where a flow first uses its configuration: the test reads it and nothing else runs."""


@pytest.mark.parametrize("module, name", [("pipeline", "ttt_pipeline"), ("evaluate_model", "evaluate_model"),
                                          ("reevaluate", "nightly_reevaluation")])
def test_each_flow_runs_the_preset_its_form_names(module, name, monkeypatch):
    import importlib

    from ttt_pipeline.config import load_config

    mod = importlib.import_module(f"ttt_pipeline.flows.{module}")

    def configured(tracking):
        raise _Configured(tracking)

    from ttt_pipeline.io.tracking import Tracker  # the one class every flow opens its run with

    monkeypatch.setattr(Tracker, "from_config", staticmethod(configured))
    form = {"preset": "mdsd-electronics", "overrides": {"tracking.run_name": "from-the-form",
                                                         "model.classifier": "models:/my-classifier@prod"}}
    with pytest.raises(_Configured) as got:
        getattr(mod, name).fn(**form)
    (tracking,) = got.value.args
    assert tracking.experiment == load_config("mdsd-electronics").tracking.experiment == "mdsd-electronics"
    assert tracking.run_name == "from-the-form"


def test_flow_forms_describe_preset_and_overrides():
    """The UI form's help comes from the flows' docstrings (Prefect reads their Args): every preset is named."""
    from prefect.utilities.callables import parameter_schema

    from ttt_pipeline.config import PRESETS_DIR
    from ttt_pipeline.flows.evaluate_model import evaluate_model
    from ttt_pipeline.flows.pipeline import ttt_pipeline
    from ttt_pipeline.flows.reevaluate import nightly_reevaluation

    for fl in (ttt_pipeline, evaluate_model, nightly_reevaluation):
        props = parameter_schema(fl.fn).properties
        for arg in ("config", "preset", "overrides"):
            assert props[arg].get("description"), (fl.name, arg)
        for preset in PRESETS_DIR.glob("*.yaml"):
            assert preset.stem in props["preset"]["description"], (fl.name, preset.stem)


def test_serve_script_parses():
    assert subprocess.run(["bash", "-n", str(REPO / "scripts" / "serve.sh")]).returncode == 0


def test_serve_shares_make_runs_prefect_home(tmp_path):
    """`make run` records into PREFECT_HOME, else Prefect's ~/.prefect; `make servers` must serve that database."""
    script = (REPO / "scripts" / "serve.sh").read_text()
    assert "PREFECT_HOME" not in (REPO / "Makefile").read_text()
    line = next(x for x in script.splitlines() if x.startswith("export PREFECT_HOME="))
    probe = ["bash", "-c", f'set -u; RUN_DIR=/run-dir; {line}; echo "$PREFECT_HOME"']
    base = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path)}
    assert subprocess.run(probe, env=base, capture_output=True, text=True).stdout.strip() == f"{tmp_path}/.prefect"
    mine = subprocess.run(probe, env={**base, "PREFECT_HOME": "/mine"}, capture_output=True, text=True)
    assert mine.stdout.strip() == "/mine"
    from prefect.settings.models.root import Settings

    assert Settings.model_fields["home"].default == Path("~/.prefect")  # where `make run` records by default


def test_serve_service_serves_the_champion_on_loopback(base):
    """`serve`: `ttt-pipeline serve` of the task's model from the MLflow server, following the champion on the
    Prefect server's events, published on 127.0.0.1 only, healthy when /ping answers, started on request (profile)
    once a champion exists."""
    svc = base["services"]["serve"]
    cmd = svc["command"]
    assert cmd[:2] == ["ttt-pipeline", "serve"]
    model = cmd[cmd.index("--model") + 1]
    assert re.fullmatch(r"\$\{TTT_SERVE_MODEL:-ttt-[a-z0-9-]+\}", model), model
    assert cmd[cmd.index("--follow") + 1] == "events"
    port = cmd[cmd.index("--port") + 1]
    assert svc["ports"] == [f"127.0.0.1:${{TTT_SERVE_PORT:-{port}}}:{port}"]
    assert svc["healthcheck"]["test"] == ["CMD", "curl", "-fsS", f"http://localhost:{port}/ping"]
    assert set(svc["depends_on"]) == {"mlflow", "prefect-server"}
    assert all(d == {"condition": "service_healthy"} for d in svc["depends_on"].values())
    env = _env(svc)
    assert env["MLFLOW_TRACKING_URI"] == "http://mlflow:5000" and env["PREFECT_API_URL"].startswith(
        "http://prefect-server:4200/")
    assert {"MLFLOW_TRACKING_USERNAME", "MLFLOW_TRACKING_PASSWORD", "PREFECT_API_AUTH_STRING"} <= set(env)
    assert svc["profiles"] == ["serve"]  # `docker compose up` does not start it before a champion exists


def test_serve_model_script(tmp_path):
    """scripts/serve_model.sh (make serve-model): parses, serves on 127.0.0.1 by default with the venv's bin on
    PATH (MLflow starts uvicorn from PATH), and refuses a missing sqlite store instead of creating an empty one."""
    script = REPO / "scripts" / "serve_model.sh"
    assert subprocess.run(["bash", "-n", str(script)]).returncode == 0
    text = script.read_text()
    assert 'HOST="${TTT_HOST:-127.0.0.1}"' in text and 'export PATH="$BIN:$PATH"' in text
    assert "--env-manager local" in text
    env = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path), "TTT_TRACKING_URI": f"sqlite:///{tmp_path}/none.db"}
    proc = subprocess.run(["bash", str(script)], env=env, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2 and f"no MLflow database at {tmp_path}/none.db" in proc.stderr
    assert not (tmp_path / "none.db").exists()
    assert "serve-model:" in (REPO / "Makefile").read_text()
