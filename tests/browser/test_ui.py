"""The results people look at, in a real browser: a tiny pipeline run against a real `prefect server`, then
a real `mlflow server` on that run's store, both opened in headless Chromium.

Checks: the MLflow run page (run, status, headline metrics, registry decision, child runs), its artifacts
(the PNG plots under plots/), the finetune run's logged MLflow Model and that model's page, the registered
model and version with its `champion` alias, the Prefect flow-run page
and the Prefect markdown (summary) and table (evaluation grid) artifacts. Screenshots are kept under
test-output/screenshots/. Every server is stopped at the end and its port is checked closed.

Chromium: Debian's `chromium` is installed with apt-get when missing and we are root; else the module skips.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest
import yaml

pytestmark = pytest.mark.browser

from netutil import free_port, listening
from tiny_config import tiny_config

REPO = Path(__file__).resolve().parents[2]
SHOTS = REPO / "test-output" / "screenshots"
VENV_BIN = Path(sys.executable).parent
MODEL_NAME = "ui-review-classifier"


# ----------------------------------------------------------------------------- chromium


def find_chromium() -> str | None:
    for name in ("chromium", "chromium-browser"):
        if shutil.which(name):
            return shutil.which(name)
    return None


@pytest.fixture(scope="module")
def chromium() -> str:
    exe = find_chromium()
    if exe:
        return exe
    if not hasattr(os, "geteuid") or os.geteuid() != 0 or not shutil.which("apt-get"):
        pytest.skip("chromium is not installed and cannot be installed here (needs root and apt-get): "
                    "run `apt-get install -y chromium`")
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    for cmd in (["apt-get", "install", "-y", "-q", "chromium"], ["apt-get", "update", "-q"],
                ["apt-get", "install", "-y", "-q", "chromium"]):
        try:
            proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=900)
        except subprocess.TimeoutExpired:
            pytest.skip(f"`{' '.join(cmd)}` timed out: install chromium by hand")
        if cmd[1] == "install" and proc.returncode == 0:
            break
    exe = find_chromium()
    if not exe:
        pytest.skip(f"apt-get could not install chromium: {proc.stderr.strip()[-300:]}")
    return exe


def run_chromium(exe: str, profile: Path, url: str, shot: Path, budget_ms: int, size: str,
                 timeout: float = 90) -> str:
    """One headless page load: the rendered DOM (stdout) and a screenshot of the same page state."""
    cmd = [exe, "--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--no-first-run",
           "--disable-background-networking", "--disable-component-update", "--disable-sync",
           f"--user-data-dir={profile}", f"--window-size={size}", f"--virtual-time-budget={budget_ms}",
           "--hide-scrollbars", "--dump-dom", f"--screenshot={shot}", url]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
                            start_new_session=True)
    try:
        out, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()
        raise
    return out


@pytest.fixture(scope="module")
def browse(chromium, tmp_path_factory):
    """browse(url, name, expect, ready=None, size=...) -> rendered DOM. Both UIs are single-page apps that
    render after their API calls and animations, so the page is loaded again with more virtual time until
    every `expect` string is in the DOM (and `ready(dom)` holds); the screenshot is of that same load."""
    SHOTS.mkdir(parents=True, exist_ok=True)
    profile = tmp_path_factory.mktemp("chromium-profile")

    def go(url: str, name: str, expect: list[str], ready=None, size: str = "1400,1000") -> str:
        dom = ""
        shot = SHOTS / f"{name}.png"
        for budget in (10000, 20000, 40000):
            shot.unlink(missing_ok=True)
            dom = run_chromium(chromium, profile, url, shot, budget, size)
            if all(e in dom for e in expect) and (ready is None or ready(dom)):
                break
        (SHOTS / f"{name}.html").write_text(dom, encoding="utf-8")
        assert shot.is_file() and shot.stat().st_size > 10_000, f"no screenshot of {url}"
        return dom

    return go


# ----------------------------------------------------------------------------- servers


class Server:
    """A server in its own process group: started, waited for, and stopped with everything it spawned."""

    def __init__(self, name: str, cmd: list[str], port: int, health: str, env: dict, log: Path):
        self.name, self.port, self.health = name, port, health
        self.log = log
        self.log_file = open(log, "w")  # noqa: SIM115 - closed in stop()
        self.proc = subprocess.Popen(cmd, env=env, stdout=self.log_file, stderr=subprocess.STDOUT,
                                     start_new_session=True, cwd=log.parent)

    def wait(self, timeout: float = 120) -> None:
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            if self.proc.poll() is not None:
                raise RuntimeError(f"{self.name} exited: {self.log.read_text()[-2000:]}")
            try:
                with urllib.request.urlopen(self.health, timeout=2) as r:
                    if r.status == 200:
                        return
            except OSError:
                pass
            time.sleep(0.5)
        raise RuntimeError(f"{self.name} did not answer {self.health} in {timeout}s: {self.log.read_text()[-2000:]}")

    def stop(self) -> None:
        if self.proc.poll() is None:
            try:
                os.killpg(self.proc.pid, signal.SIGTERM)
                self.proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                pass
        try:  # what is left of the group (uvicorn workers, services)
            os.killpg(self.proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        self.proc.wait(timeout=15)
        self.log_file.close()
        end = time.monotonic() + 15
        while listening(self.port) and time.monotonic() < end:
            time.sleep(0.3)


def api(url: str, body: dict | None = None):
    req = urllib.request.Request(url, data=json.dumps(body or {}).encode(), method="POST",
                                 headers={"content-type": "application/json"})
    with urllib.request.urlopen(req, timeout=10) as r:
        return json.loads(r.read())


@pytest.fixture(scope="module")
def stack(tmp_path_factory, tiny_bert_dir):
    """Prefect and MLflow servers on free ports, and one tiny pipeline run recorded in both."""
    tmp = tmp_path_factory.mktemp("ui")
    p_port, m_port = free_port(), free_port()
    prefect_url = f"http://127.0.0.1:{p_port}"
    mlflow_url = f"http://127.0.0.1:{m_port}"
    db = tmp / "mlflow.db"
    base = {k: v for k, v in os.environ.items() if not k.startswith(("PREFECT_", "MLFLOW_", "TTT_"))}
    env = {**base, "PREFECT_HOME": str(tmp / "prefect-home"), "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
           "DO_NOT_TRACK": "1", "PREFECT_UI_API_URL": f"{prefect_url}/api", "PREFECT_API_URL": f"{prefect_url}/api",
           "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}
    servers = [
        Server("prefect server", [str(VENV_BIN / "prefect"), "server", "start", "--host", "127.0.0.1",
                                  "--port", str(p_port)], p_port, f"{prefect_url}/api/health", env,
               tmp / "prefect-server.log"),
        # the MLflow server creates the store first; the pipeline run then logs into the same sqlite file
        Server("mlflow server", [str(VENV_BIN / "mlflow"), "server", "--backend-store-uri", f"sqlite:///{db}",
                                 "--default-artifact-root", (tmp / "mlruns").as_uri(), "--host", "127.0.0.1",
                                 "--port", str(m_port), "--workers", "1"], m_port, f"{mlflow_url}/health", env,
               tmp / "mlflow-server.log"),
    ]
    try:
        for s in servers:
            s.wait()
        cfg = tiny_config(tmp, tiny_bert_dir, "ui", corruption={"severities": [2, 4]},
                          tracking={"tracking_uri": f"sqlite:///{db}", "run_name": "ui-run"},
                          registry={"model_name": MODEL_NAME})
        (tmp / "tiny.yaml").write_text(yaml.safe_dump(cfg))
        proc = subprocess.run([sys.executable, "-m", "ttt_pipeline.cli.main", "run", "--config", str(tmp / "tiny.yaml"),
                               "--json"], capture_output=True, text=True, env=env, cwd=REPO, timeout=600)
        assert proc.returncode == 0, proc.stderr[-3000:]
        summary = json.loads(proc.stdout.strip().splitlines()[-1])
        flow_runs = api(f"{prefect_url}/api/flow_runs/filter")
        assert len(flow_runs) == 1, "the run must be recorded by the started Prefect server"
        artifacts = {a["key"]: a for a in api(f"{prefect_url}/api/artifacts/filter") if a.get("key")}
        yield {"tmp": tmp, "prefect": prefect_url, "mlflow": mlflow_url, "summary": summary,
               "flow_run": flow_runs[0], "artifacts": artifacts}
    finally:
        for s in servers:
            s.stop()
        left = [f"{s.name} on port {s.port}" for s in servers if listening(s.port)]
        assert not left, f"still listening after stop: {left}"


# ----------------------------------------------------------------------------- MLflow


def mlflow_run_url(stack) -> str:
    s = stack["summary"]
    return f"{stack['mlflow']}/#/experiments/{s['experiment_id']}/runs/{s['mlflow_run_id']}"


def test_mlflow_run_page_shows_the_run_and_its_metrics(stack, browse):
    s = stack["summary"]
    dom = browse(mlflow_run_url(stack), "mlflow-run", ["acc_ttt", "registry.decision", "evaluate", "reviews-train"],
                 size="1400,1700")  # tall enough for the metrics table
    assert "ui-run" in dom and s["mlflow_run_id"] in dom
    assert "Finished" in dom
    for child in ("download", "tokenise", "corrupt", "finetune", "evaluate"):
        assert f">{child}<" in dom, child  # the child-run links
    for metric in ("acc_clean", "acc_corrupted", "acc_ttt", "registry.candidate_value"):
        assert metric in dom, metric
    assert repr(s["acc_ttt"])[:6] in dom  # the value, not just the name
    assert "registry.decision" in dom and "promoted" in dom
    assert "reviews-train" in dom  # Datasets: the run page names the first of the reviews it read


def test_mlflow_artifacts_show_the_plots(stack, browse):
    from ttt_pipeline.io.plots import EVALUATION_PLOTS, FINETUNE_PLOTS

    names = FINETUNE_PLOTS + EVALUATION_PLOTS
    # the plots/ folder selected: the tree is expanded and lists every PNG
    def expanded(dom: str) -> bool:
        """The folder's subtree is displayed. Its expand animation (velocity.js, driven by animation frames)
        may still be running when headless Chromium's virtual time runs out, so that is not required."""
        if 'artifact-name="plots"' not in dom:
            return False
        sub = dom.split('artifact-name="plots"', 1)[1].split('artifact-name="', 1)[0]  # up to its first child
        return "<ul" in sub and "display: none" not in sub

    dom = browse(f"{mlflow_run_url(stack)}/artifacts/plots", "mlflow-plots-folder",
                 [f'artifact-name="{n}"' for n in names], ready=expanded)
    for name in names:
        assert f'artifact-name="{name}"' in dom, name
    assert expanded(dom)
    # one plot selected: rendered as an image from the fetched bytes
    dom = browse(f"{mlflow_run_url(stack)}/artifacts/plots/accuracy_vs_severity.png", "mlflow-plot-image",
                 ['alt="plots/accuracy_vs_severity.png"'])
    assert 'alt="plots/accuracy_vs_severity.png"' in dom
    assert "blob:" in dom.split('alt="plots/accuracy_vs_severity.png"')[1][:200]


def test_mlflow_registry_shows_the_champion(stack, browse):
    dom = browse(f"{stack['mlflow']}/#/models/{MODEL_NAME}", "mlflow-model", ["Version 1", "champion"])
    assert MODEL_NAME in dom and "Version 1" in dom and "champion" in dom
    assert stack["summary"]["registry"]["alias"] == "champion"


def logged_model(stack) -> tuple[str, str]:
    """(finetune run id, id of the MLflow Model it logged), read from the store the UI shows."""
    from mlflow.tracking import MlflowClient

    client = MlflowClient(f"sqlite:///{stack['tmp'] / 'mlflow.db'}")
    [ft] = client.search_runs([stack["summary"]["experiment_id"]],
                              f"tags.mlflow.parentRunId = '{stack['summary']['mlflow_run_id']}' and "
                              "tags.stage = 'finetune'")
    [output] = ft.outputs.model_outputs
    return ft.info.run_id, output.model_id


def test_mlflow_fine_tune_run_lists_its_logged_model(stack, browse):
    run_id, model_id = logged_model(stack)
    exp = stack["summary"]["experiment_id"]
    dom = browse(f"{stack['mlflow']}/#/experiments/{exp}/runs/{run_id}", "mlflow-finetune-run",
                 ["Logged models (1)", f"/models/{model_id}"], size="1400,1400")
    assert "Logged models (1)" in dom and f"/models/{model_id}" in dom  # the link to the logged model
    assert MODEL_NAME in dom  # and the registered model it became


def test_mlflow_logged_model_page_shows_the_registered_version(stack, browse):
    _, model_id = logged_model(stack)
    exp = stack["summary"]["experiment_id"]
    dom = browse(f"{stack['mlflow']}/#/experiments/{exp}/models/{model_id}", "mlflow-logged-model",
                 [model_id, "Model versions", MODEL_NAME], size="1400,1400")
    assert model_id in dom and "Ready" in dom and "finetune" in dom  # status, source run
    assert "Model versions" in dom and MODEL_NAME in dom  # the registered version (tag mlflow.modelVersions)


def test_mlflow_registered_version_has_the_alias_and_its_source(stack, browse):
    dom = browse(f"{stack['mlflow']}/#/models/{MODEL_NAME}/versions/1", "mlflow-model-version",
                 ["champion", "Version 1", "Schema"], size="1400,1200")
    assert "champion" in dom and "Version 1" in dom
    assert "Source Run" in dom and "finetune" in dom and "Schema" in dom  # lineage and the model's signature


# ----------------------------------------------------------------------------- Prefect


def test_prefect_flow_run_page(stack, browse):
    fr = stack["flow_run"]
    dom = browse(f"{stack['prefect']}/runs/flow-run/{fr['id']}", "prefect-flow-run",
                 [fr["name"], "Completed", "register-model"])
    assert fr["name"] in dom and "ttt-pipeline" in dom and "Completed" in dom
    assert "register-model" in dom  # the registry task ran in this flow run


def test_prefect_markdown_summary_artifact(stack, browse):
    art = stack["artifacts"]["ttt-pipeline-summary"]
    assert art["type"] == "markdown" and art["flow_run_id"] == stack["flow_run"]["id"]
    dom = browse(f"{stack['prefect']}/artifacts/artifact/{art['id']}", "prefect-summary",
                 ["TTT pipeline run", "clean accuracy"])
    assert "TTT pipeline run" in dom
    for label in ("clean accuracy", "corrupted accuracy", "corrupted accuracy with masked TTT"):
        assert label in dom, label
    assert f"{stack['summary']['acc_clean']:.3f}" in dom
    assert stack["summary"]["mlflow_run_id"] in dom  # the link to the MLflow run
    # the TTT gain with its interval and verdict, the numbers the run printed and logged
    from ttt_pipeline.reports.run import difference_line

    points, interval, p_value, verdict = difference_line(stack["summary"]["ttt_gain"])
    assert "masked TTT - none, corrupted" in dom
    for cell in (points, interval, p_value, verdict.split(" (")[0]):
        assert cell in dom, cell


def test_prefect_evaluation_grid_table_artifact(stack, browse):
    art = stack["artifacts"]["evaluation-grid"]
    assert art["type"] == "table"
    rows = json.loads(art["data"]) if isinstance(art["data"], str) else art["data"]
    assert {(r["set"], r["method"]) for r in rows} >= {("clean", "none"), ("keyboard-4", "masked_ttt")}
    dom = browse(f"{stack['prefect']}/artifacts/artifact/{art['id']}", "prefect-grid", ["keyboard-4", "masked_ttt"])
    for cell in ("tutorial-2", "keyboard-2", "keyboard-4", "masked_ttt", "macro_f1", "vs_none", "ci_low", "verdict"):
        assert cell in dom, cell
    # the grid's paired difference is what the stored per-review predictions give, recomputed here
    import pandas as pd
    from mlflow.tracking import MlflowClient

    from ttt_pipeline.evaluation.robustness import compare_methods

    client = MlflowClient(f"sqlite:///{stack['tmp'] / 'mlflow.db'}")
    s = stack["summary"]
    ev = client.search_runs([s["experiment_id"]], f"tags.mlflow.parentRunId = '{s['mlflow_run_id']}' and "
                            "attributes.run_name = 'evaluate'")[0]
    preds = pd.read_parquet(client.download_artifacts(ev.info.run_id, "predictions.parquet", str(stack["tmp"])))
    d = compare_methods(preds, ["keyboard-4"], "masked_ttt", resamples=2000, seed=0)
    row = next(r for r in rows if (r["set"], r["method"]) == ("keyboard-4", "masked_ttt"))
    assert (row["vs_none"], row["ci_low"], row["ci_high"]) == (round(d.delta, 4), round(d.ci_low, 4), round(d.ci_high, 4))
    assert row["verdict"] == ("significant" if d.significant else "not significant") and row["verdict"] in dom


def test_the_runs_report_lists_exactly_the_reviews_the_noise_flipped(stack, browse):
    """The report (report.html, an artifact of the parent run) renders from the file alone, and each set's flipped
    table holds one row per review whose prediction differs between the clean and the corrupted set."""
    import re

    import pandas as pd
    from mlflow.tracking import MlflowClient

    s = stack["summary"]
    url = s["report"] if s["report"].startswith("file:") else Path(s["report"]).as_uri()
    dom = browse(url, "report", ["flipped:"])
    assert not re.search(r"(src|href)=\"?https?:", dom)  # nothing fetched from elsewhere
    client = MlflowClient(f"sqlite:///{stack['tmp'] / 'mlflow.db'}")
    ev = client.search_runs([s["experiment_id"]], f"tags.mlflow.parentRunId = '{s['mlflow_run_id']}' and "
                            "attributes.run_name = 'evaluate'")[0]
    preds = pd.read_parquet(client.download_artifacts(ev.info.run_id, "predictions.parquet",
                                                      str(stack["tmp"] / "report-check")))
    clean = preds[(preds["set"] == "clean") & (preds["method"] == "none")].set_index("index")["pred"]
    for name in ("keyboard-2", "keyboard-4"):
        noisy = preds[(preds["set"] == name) & (preds["method"] == "none")].set_index("index")["pred"]
        want = sorted(int(i) for i in noisy.index[noisy.to_numpy() != clean.loc[noisy.index].to_numpy()])
        section = dom.split(f'data-set="{name}"', 1)[1].split("</section>", 1)[0]
        table = section.split('<table class="flipped">', 1)[1].split("</table>", 1)[0]
        assert [int(i) for i in re.findall(r"<tr><td>(\d+)</td>", table)] == want[:50], name
        assert f'flipped: <span class="count">{len(want)}</span>' in section
