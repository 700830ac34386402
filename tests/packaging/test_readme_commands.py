"""Every command in the README, as written, from a plain shell.

The shell has no activated virtualenv (PATH is the system's), and its folder looks like a user's checkout: `.venv`
(this test's interpreter's environment), a store, an MLflow database and a registered champion made by a real
`ttt-pipeline run --config demo` (the tiny BERT for speed, so the run takes seconds; the model is registered under
the demo's name, `ttt-demo-reviews-negative-positive`). Each command is then run as written, with only its
placeholders filled: RUN_ID / RUN_A / RUN_B (the two runs' ids) and the ports (free ones; servers are started,
asked for a page, and stopped). The ```python block runs as a script.

Commands are the lines of the ```bash blocks and the inline code spans of the prose that start like a command
(`make `, `ttt-pipeline `, `.venv/bin/`, `mlflow `, `prefect `, `curl `). Commands that take minutes or need what
this machine lacks run as written elsewhere, and COVERED says where; a README command that is neither run here nor
listed there fails the test, so a new command cannot slip in unchecked.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
import tomllib
import urllib.request
from contextlib import contextmanager
from pathlib import Path

import pandas as pd
import pytest
from netutil import free_port

REPO = Path(__file__).resolve().parents[2]
VENV = Path(sys.executable).parent.parent
NAME = "ttt-demo-reviews-negative-positive"

COVERED = {  # command -> where it runs as written (minutes of work, or a machine this one is not)
    "make run": "tests/flows/test_demo_preset.py (`make run` from an empty store, slow suite)",
    "make test": ".ci/run",
    "make setup": ".ci/run",
    "make lint": ".ci/run",
    "make test-slow": ".ci/run",
    "make test-integration": ".ci/run",
    "make test-browser": ".ci/run",
    "make bench": "make -n below: its three benches; their --quick modes run in tests/bench (slow suite)",
    "make servers": "tests/ops/test_integration_servers.py (scripts/serve.sh start, the target's script; make -n below)",
    "make serve-model": "tests/serving/test_serving_integration.py (scripts/serve_model.sh, the target's script)",
    "python3 -m pip wheel --no-deps -w dist .":
        "tests/packaging/test_wheel.py (pip wheel --no-deps of this checkout)",
    "pip install torch==2.13.0 --index-url https://download.pytorch.org/whl/cpu":
        "tests/serving/test_fresh_env_serving.py (torch's CPU build from this index into a fresh venv)",
    "pip install dist/ttt_pipeline-0.1.0-py3-none-any.whl":
        "tests/packaging/test_wheel.py (the wheel in a fresh venv: `ttt-pipeline` and the demo preset from any folder)",
    ".venv/bin/python -m bench.real_noise --preset rt-polarity --json":
        "tests/bench/test_real_noise_bench.py (its --quick mode, slow suite; the full run takes about two CPU hours)",
}
INLINE_PREFIXES = ("make ", "ttt-pipeline ", ".venv/bin/", "mlflow ", "prefect ", "curl ")
README = REPO / "README.md"


def readme_blocks(kind: str) -> list[str]:
    return re.findall(rf"```{kind}\n(.*?)```", README.read_text(), re.S)


def fenced_commands() -> list[str]:
    """The ```bash lines: continuations joined, comments dropped, blanks squeezed."""
    out = []
    for block in readme_blocks("bash"):
        for line in block.replace("\\\n", " ").splitlines():
            line = re.sub(r"\s{2,}#.*$", "", line).strip()
            if line and not line.startswith("#"):
                out.append(" ".join(line.split()))
    return out


def inline_commands(text: str | None = None) -> list[str]:
    """The prose's inline code spans that start like a command (INLINE_PREFIXES), blanks squeezed; fenced blocks
    are left out (fenced_commands reads them)."""
    prose = re.sub(r"```.*?```", "", README.read_text() if text is None else text, flags=re.S)
    spans = (" ".join(span.split()) for span in re.findall(r"(?<!`)`([^`\n]+(?:\n[^`\n]+)*)`(?!`)", prose))
    return [span for span in spans if span.startswith(INLINE_PREFIXES)]


def readme_commands() -> list[str]:
    """Every command the README shows, fenced or inline, each once, in order."""
    return list(dict.fromkeys(fenced_commands() + inline_commands()))


def runs_here(cmd: str) -> bool:
    """Whether a test of this file runs `cmd` as written (the CLI, the servers, the request)."""
    return cmd not in COVERED and (cmd.startswith(("PATH=", "curl ", ".venv/bin/ttt-pipeline "))
                                   or cmd.split()[:2] in ([".venv/bin/mlflow", "ui"], [".venv/bin/prefect", "server"]))


def plain_env(home: Path) -> dict:
    return {"PATH": "/usr/local/bin:/usr/bin:/bin", "HOME": str(home), "LANG": "C.UTF-8", "HF_HUB_OFFLINE": "1",
            "PREFECT_HOME": str(home / "prefect-home"), "TTT_PROGRESS": "lines", "TTT_CPU_NATIVE_BF16": "0",
            "PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS": "300"}


def sh(cmd: str, home: Path, timeout: int = 600) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", "-c", cmd], cwd=home, env=plain_env(home), capture_output=True, text=True,
                          timeout=timeout)


@contextmanager
def serving(cmd: str, home: Path, url: str, timeout: float = 120):
    """Start a README server command, wait until `url` answers 200, stop the whole process group after."""
    log = open(home / f"server-{time.monotonic_ns()}.log", "w")
    proc = subprocess.Popen(["bash", "-c", cmd], cwd=home, env=plain_env(home), stdout=log,
                            stderr=subprocess.STDOUT, start_new_session=True)
    try:
        deadline = time.monotonic() + timeout
        while True:
            assert proc.poll() is None, f"{cmd!r} exited: {Path(log.name).read_text()[-2000:]}"
            try:
                with urllib.request.urlopen(url, timeout=5) as r:
                    if r.status == 200:
                        break
            except OSError:
                pass
            assert time.monotonic() < deadline, f"{url} did not answer: {Path(log.name).read_text()[-2000:]}"
            time.sleep(1)
        yield proc
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
        log.close()


def fast_sets(tiny_bert_dir) -> str:
    """Settings appended to a README `run` so that it takes seconds: the tiny BERT, one short epoch, few reviews."""
    return (f"--set model.name={tiny_bert_dir} --set model.max_length=48 --set finetune.epochs=1 "
            "--set finetune.mlm_warmup_max_steps=2 --set data.max_train_samples=60 --set data.max_test_samples=24")


@pytest.fixture(scope="module")
def checkout(tmp_path_factory, tiny_bert_dir):
    """A user's folder after two `ttt-pipeline run --config demo` runs (the second served from the cache)."""
    home = tmp_path_factory.mktemp("readme")
    (home / ".venv").symlink_to(VENV)
    ids = []
    for _ in range(2):
        proc = sh(f".venv/bin/ttt-pipeline run --config demo {fast_sets(tiny_bert_dir)} --json", home, timeout=900)
        assert proc.returncode == 0, proc.stderr[-3000:]
        summary = json.loads(proc.stdout.strip().splitlines()[-1])
        ids.append(summary["mlflow_run_id"])
    assert summary["registry"]["model_name"] == NAME
    assert summary["next_commands"][1].endswith(f"ttt-pipeline serve --model {NAME}"), summary["next_commands"]
    (home / "reviews.csv").write_text('text\nBattery died after two days.\n"Great sound, works well."\n')
    return home, ids


def test_every_readme_command_is_checked():
    unchecked = [c for c in readme_commands() if not runs_here(c) and c not in COVERED]
    assert not unchecked, f"README commands no test runs: {unchecked}; run them here or name their test in COVERED"
    stale = [c for c in COVERED if c not in readme_commands()]
    assert not stale, f"COVERED names commands the README no longer shows: {stale}"
    ci = (REPO / ".ci" / "run").read_text().splitlines()
    for cmd, where in COVERED.items():
        if where == ".ci/run":
            assert cmd in ci, f"{cmd!r} is not a line of .ci/run"
    # the wheel the README installs is the one this checkout builds
    version = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["version"]
    assert f"pip install dist/ttt_pipeline-{version}-py3-none-any.whl" in readme_commands()
    # `make bench`, `make servers` and `make serve-model` expand to commands that exist in a plain checkout
    dry = subprocess.run(["make", "-n", "bench", "servers", "serve-model"], cwd=REPO, capture_output=True, text=True,
                         env={**plain_env(REPO), "HOME": os.environ.get("HOME", "/root")})
    assert dry.returncode == 0, dry.stderr
    for module in ("bench.corruption_speed", "bench.ttt_engine", "bench.accuracy"):  # run as modules of bench/
        assert f"python -m {module}" in dry.stdout and (REPO / f"{module.replace('.', '/')}.py").is_file()
    for script in ("scripts/serve.sh", "scripts/serve_model.sh"):
        assert script in dry.stdout and (REPO / script).is_file()
    bench_tests = subprocess.run(["make", "-n", "test-bench"], cwd=REPO, capture_output=True, text=True,
                                 env={**plain_env(REPO), "HOME": os.environ.get("HOME", "/root")})
    assert bench_tests.returncode == 0 and "pytest -q -m bench" in bench_tests.stdout, bench_tests.stderr


def test_serve_means_serving_a_model():
    """`make servers` starts the Prefect and MLflow servers; "serve" is only ever serving a model (`make
    serve-model`, `ttt-pipeline serve`): no `make serve` target, and neither the README nor the Makefile's help
    nor the operations guide names one."""
    env = {**plain_env(REPO), "HOME": os.environ.get("HOME", "/root")}
    gone = subprocess.run(["make", "-n", "serve"], cwd=REPO, capture_output=True, text=True, env=env)
    assert gone.returncode != 0 and "No rule to make target 'serve'" in gone.stderr, gone.stdout + gone.stderr
    dry = subprocess.run(["make", "-n", "servers"], cwd=REPO, capture_output=True, text=True, env=env)
    assert dry.returncode == 0 and "scripts/serve.sh start" in dry.stdout, dry.stderr
    shown = subprocess.run(["make", "help"], cwd=REPO, capture_output=True, text=True, env=env).stdout
    assert "| servers |" in shown and "| serve |" not in shown
    for doc in (README, REPO / "docs" / "operations.md", REPO / "docs" / "security.md", REPO / "Makefile"):
        assert not re.search(r"make serve\b(?!-)", doc.read_text()), doc


def test_inline_commands_are_collected():
    """Inline spans that start like a command are commands; other code spans, and fenced lines, are not."""
    text = ("Run `make run` or `.venv/bin/ttt-pipeline report\n    RUN_ID`; set `finetune.epochs` and `TORCH=cuda`.\n"
            "```bash\nmake lint\n```\nThen `mlflow ui` and ``curl x``.\n")
    assert inline_commands(text) == ["make run", ".venv/bin/ttt-pipeline report RUN_ID", "mlflow ui"]


@pytest.mark.integration
def test_cli_commands_as_written(checkout):
    home, (run_a, run_b) = checkout
    fill = {"RUN_ID": run_a, "RUN_A": run_a, "RUN_B": run_b}
    cmds = [c for c in readme_commands() if runs_here(c) and c.startswith(".venv/bin/ttt-pipeline ")
            and not c.startswith((".venv/bin/ttt-pipeline run ", ".venv/bin/ttt-pipeline evaluate "))]
    assert len(cmds) == 5, cmds  # report, compare, reevaluate, monitor, predict
    for cmd in cmds:
        filled = re.sub(r"\b(RUN_ID|RUN_A|RUN_B)\b", lambda m: fill[m.group(1)], cmd)
        proc = sh(filled, home)
        assert proc.returncode == 0, f"{cmd}\n{proc.stdout[-1500:]}\n{proc.stderr[-3000:]}"
        assert "Traceback" not in proc.stderr, proc.stderr[-3000:]
        if " reevaluate --json" in cmd:
            assert json.loads(proc.stdout.strip().splitlines()[-1])["verdict"] == "ok"  # the champion, re-scored
        if " monitor " in cmd:  # nothing was served with capture on: an empty window, not an error
            assert json.loads(proc.stdout.strip().splitlines()[-1])["verdict"] == "no_traffic"
        if " report " in cmd or " compare " in cmd:
            assert run_a[:8] in proc.stdout, proc.stdout[-1500:]
    rows = [json.loads(line) for line in (home / "predictions.jsonl").read_text().splitlines()]
    assert len(rows) == 2 and all(r["label"] in ("negative", "positive") for r in rows)


@pytest.mark.integration
def test_own_reviews_run_as_written(checkout, tiny_bert_dir):
    """The README's run on a user's CSV: the demo's reviews written as a CSV with the command's own file name and
    columns, the command as written with fast_sets appended (and attribution off: TRAK has its own tests)."""
    home, _ = checkout
    [cmd] = [c for c in readme_commands() if runs_here(c) and c.startswith(".venv/bin/ttt-pipeline run ")]
    setting = dict(re.findall(r"--set '?(data\.\w+)=([^' ]+)", cmd))
    polarity = {1: "negative", 2: "negative", 4: "positive", 5: "positive"}
    rows = [json.loads(line) for line in (REPO / "data" / "demo" / "reviews.jsonl").read_text().splitlines()]
    pd.DataFrame({setting["data.text_column"]: [r["text"] for r in rows if r["rating"] in polarity],
                  setting["data.label_column"]: [polarity[r["rating"]] for r in rows if r["rating"] in polarity]}
                 ).to_csv(home / setting["data.path"], index=False)
    proc = sh(f"{cmd} {fast_sets(tiny_bert_dir)} --set attribution.enabled=false --json", home, timeout=900)
    assert proc.returncode == 0, f"{proc.stdout[-1500:]}\n{proc.stderr[-3000:]}"
    assert "Traceback" not in proc.stderr, proc.stderr[-3000:]
    summary = json.loads(proc.stdout.strip().splitlines()[-1])
    assert summary["registry"]["model_name"].endswith("-negative-positive"), summary["registry"]


USER_MODEL = """\
import mlflow
from transformers import pipeline
mlflow.set_tracking_uri("sqlite:///mlflow.db")
with mlflow.start_run():
    info = mlflow.transformers.log_model(pipeline("text-classification", model="{folder}"), name="model",
                                         registered_model_name="{name}", pip_requirements=["transformers", "torch"])
mlflow.MlflowClient().set_registered_model_alias("{name}", "{alias}", info.registered_model_version)
"""


def register_user_model(home: Path, folder: Path, uri: str) -> None:
    """`models:/NAME@ALIAS` as a user of the HF Trainer makes it: a text-classification pipeline logged with
    MLflow's transformers flavour into the folder's own sqlite:///mlflow.db, and the alias set on its version."""
    name, alias = re.fullmatch(r"models:/([^@/]+)@(\w+)", uri).groups()
    script = USER_MODEL.format(folder=folder, name=name, alias=alias)
    proc = sh(f".venv/bin/python - <<'EOF'\n{script}\nEOF", home)
    assert proc.returncode == 0, proc.stderr[-3000:]


@pytest.mark.integration
def test_own_model_runs_as_written_in_an_empty_folder(tmp_path):
    """The README's two `evaluate` lines in a folder that holds nothing but the virtualenv: the first on a binary
    classifier saved with save_pretrained at the line's path (id2label negative / positive), the second on one
    whose labels are LABEL_0 / LABEL_1, registered in MLflow under the line's name and alias. Each runs to a
    summary that names the registered model and the commands to use next, and those commands work."""
    from hf_models import save_classifier

    home = tmp_path / "newcomer"
    home.mkdir()
    (home / ".venv").symlink_to(VENV)
    folder_cmd, uri_cmd = [c for c in readme_commands() if c.startswith(".venv/bin/ttt-pipeline evaluate ")]
    assert "--set" not in folder_cmd  # a polarity classifier needs no settings
    save_classifier(home / re.search(r"--model (\S+)", folder_cmd).group(1))
    summaries = []
    for cmd in (folder_cmd, uri_cmd):
        if cmd is uri_cmd:
            register_user_model(home, save_classifier(tmp_path / "generic", labels=None),
                                re.search(r"--model (\S+)", cmd).group(1))
        proc = sh(f"{cmd} --json", home, timeout=900)
        assert proc.returncode == 0, f"{cmd}\n{proc.stdout[-1500:]}\n{proc.stderr[-3000:]}"
        assert "Traceback" not in proc.stderr, proc.stderr[-3000:]
        summary = json.loads(proc.stdout.strip().splitlines()[-1])
        name = summary["registry"]["model_name"]
        assert name.startswith("ttt-demo-reviews-negative-positive-") and 0.0 <= summary["acc_clean"] <= 1.0
        assert f"registered model: {name} v1, now the champion" in proc.stdout
        predict, serve, reevaluate = summary["next_commands"]
        assert f"predict --model models:/{name}@champion " in predict and serve.endswith(f" serve --model {name}")
        assert all(f"  {c}\n" in proc.stdout for c in summary["next_commands"])  # the terminal lists them too
        # the demo's test reviews were split off by the preset: said once, with the way to bring one's own
        terminal = proc.stdout.strip().rsplit("\n", 1)[0]  # the lines before --json's
        assert terminal.count("split off by the preset") == 1 and "--set data.test_path=FILE" in terminal
        assert sum("split off by the preset" in note for note in summary["notes"]) == 1
        summaries.append(summary)
    assert " reevaluate --model path/to/hf-classifier --config demo" in summaries[0]["next_commands"][2]
    (home / "reviews.csv").write_text('text\nBattery died after two days.\n"Great sound, works well."\n')
    predict, _, reevaluate = summaries[0]["next_commands"]
    assert sh(predict, home).returncode == 0
    rows = [json.loads(line) for line in (home / "predictions.jsonl").read_text().splitlines()]
    assert len(rows) == 2 and all(r["label"] in ("negative", "positive") for r in rows)
    night = sh(f"{reevaluate} --json", home, timeout=900)
    assert night.returncode == 0, night.stderr[-3000:]
    outcome = json.loads(night.stdout.strip().splitlines()[-1])
    assert outcome["verdict"] == "ok" and outcome["model_name"] == summaries[0]["registry"]["model_name"]


@pytest.mark.integration
def test_python_snippet_as_written(checkout):
    home, _ = checkout
    [snippet] = readme_blocks("python")
    script = snippet.rstrip().splitlines()
    script[-1] = f"print(__import__('json').dumps({script[-1].split('  #')[0].strip()}))"
    proc = sh(".venv/bin/python - <<'EOF'\n" + "\n".join(script) + "\nEOF", home)
    assert proc.returncode == 0, proc.stderr[-3000:]
    [row] = json.loads(proc.stdout.strip().splitlines()[-1])
    assert row["label"] in ("negative", "positive") and 0.0 <= row["probability"] <= 1.0


@pytest.mark.integration
def test_servers_as_written(checkout):
    home, _ = checkout
    [ui] = [c for c in readme_commands() if c.startswith(".venv/bin/mlflow ui ")]
    port = free_port()
    with serving(ui.replace("--port 5000", f"--port {port}"), home, f"http://127.0.0.1:{port}/"):
        pass
    [prefect] = [c for c in readme_commands() if c.startswith(".venv/bin/prefect server ")]
    port = free_port()
    with serving(f"PREFECT_SERVER_API_PORT={port} {prefect}", home, f"http://127.0.0.1:{port}/api/health",
                 timeout=180):
        pass
    [serve] = [c for c in readme_commands() if c.startswith("PATH=")]
    [curl] = [c for c in readme_commands() if c.startswith("curl ")]
    port = free_port()
    with serving(serve.replace("--port 5001", f"--port {port}"), home, f"http://127.0.0.1:{port}/ping",
                 timeout=180):
        proc = sh(curl.replace("127.0.0.1:5001", f"127.0.0.1:{port}"), home, timeout=120)
    assert proc.returncode == 0, proc.stderr
    [pred] = json.loads(proc.stdout)["predictions"]
    assert pred["label"] in ("negative", "positive") and pred["truncated"] is False
    assert set(pred) == {"label", "probability", "probabilities", "method", "truncated"}
