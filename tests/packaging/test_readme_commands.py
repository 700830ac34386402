"""Every command in the README, as written, from a plain shell (issue 33).

The shell has no activated virtualenv (PATH is the system's), and its folder looks like a user's checkout: `.venv`
(this test's interpreter's environment), a store, an MLflow database and a registered champion made by a real
`ttt-pipeline run --config demo` (the tiny BERT for speed, so the run takes seconds; the model is registered under
the demo's name, `ttt-demo-reviews-negative-positive`). Each ```bash block line is then run as written, with only
its placeholders filled: RUN_ID / RUN_A / RUN_B (the two runs' ids) and the ports (free ones; servers are started,
asked for a page, and stopped). The ```python block runs as a script.

Commands that take minutes or need what this machine lacks run as written elsewhere, and COVERED says where; a
README command that is neither run here nor listed there fails the test, so a new command cannot slip in unchecked.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
import urllib.request
from contextlib import contextmanager
from pathlib import Path

import pytest
from netutil import free_port

pytestmark = pytest.mark.integration
REPO = Path(__file__).resolve().parents[2]
VENV = Path(sys.executable).parent.parent
NAME = "ttt-demo-reviews-negative-positive"

COVERED = {  # command -> where it runs as written (minutes of work, or a machine this one is not)
    "make run": "tests/flows/test_demo_preset.py (`make run` from an empty store, slow suite)",
    "make test": ".ci/run",
    "make setup": ".ci/run",
    "make lint": ".ci/run",
    "make bench": "make -n below: its three benches; their --quick modes run in tests/bench (slow suite)",
    "make test-bench": "make -n below: pytest -m bench (the benches' MiniLM checks; minutes, not in CI)",
    "make serve-model": "tests/serving/test_serving_integration.py (scripts/serve_model.sh, the target's script)",
    ".venv/bin/ttt-pipeline explain RUN_ID --example 71":
        "tests/attribution/test_trak.py::test_stage_logs_and_explain (a tiny random model explains no flip)",
}


def readme_blocks(kind: str) -> list[str]:
    return re.findall(rf"```{kind}\n(.*?)```", (REPO / "README.md").read_text(), re.S)


def readme_commands() -> list[str]:
    """The ```bash lines: continuations joined, comments dropped, blanks squeezed."""
    out = []
    for block in readme_blocks("bash"):
        for line in block.replace("\\\n", " ").splitlines():
            line = re.sub(r"\s{2,}#.*$", "", line).strip()
            if line and not line.startswith("#"):
                out.append(" ".join(line.split()))
    return out


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


@pytest.fixture(scope="module")
def checkout(tmp_path_factory, tiny_bert_dir):
    """A user's folder after two `ttt-pipeline run --config demo` runs (the second served from the cache)."""
    home = tmp_path_factory.mktemp("readme")
    (home / ".venv").symlink_to(VENV)
    sets = (f"--set model.name={tiny_bert_dir} --set model.max_length=48 --set finetune.epochs=1 "
            "--set finetune.mlm_warmup_max_steps=2 --set data.max_train_samples=60 --set data.max_test_samples=24")
    ids = []
    for _ in range(2):
        proc = sh(f".venv/bin/ttt-pipeline run --config demo {sets} --json", home, timeout=900)
        assert proc.returncode == 0, proc.stderr[-3000:]
        summary = json.loads(proc.stdout.strip().splitlines()[-1])
        ids.append(summary["mlflow_run_id"])
    assert summary["registry"]["model_name"] == NAME
    (home / "reviews.csv").write_text('text\nBattery died after two days.\n"Great sound, works well."\n')
    return home, ids


def test_every_readme_command_is_checked():
    ran_here = {c for c in readme_commands() if c.startswith((".venv/bin/", "PATH=", "curl "))}
    unchecked = [c for c in readme_commands() if c not in ran_here and c not in COVERED
                 and not c.startswith("make ")]
    assert not unchecked, f"README commands no test runs: {unchecked}; run them here or name their test in COVERED"
    makes = {c for c in readme_commands() if c.startswith("make ")}
    assert makes <= set(COVERED), f"make targets no test runs: {makes - set(COVERED)}"
    ci = (REPO / ".ci" / "run").read_text().splitlines()
    for cmd, where in COVERED.items():
        if where == ".ci/run":
            assert cmd in ci, f"{cmd!r} is not a line of .ci/run"
    # `make bench` and `make serve-model` expand to commands that exist in a plain checkout
    dry = subprocess.run(["make", "-n", "bench", "serve-model"], cwd=REPO, capture_output=True, text=True,
                         env={**plain_env(REPO), "HOME": os.environ.get("HOME", "/root")})
    assert dry.returncode == 0, dry.stderr
    for script in ("bench/corruption_speed.py", "bench/ttt_engine.py", "bench/accuracy.py", "scripts/serve_model.sh"):
        assert script in dry.stdout and (REPO / script).is_file()
    bench_tests = subprocess.run(["make", "-n", "test-bench"], cwd=REPO, capture_output=True, text=True,
                                 env={**plain_env(REPO), "HOME": os.environ.get("HOME", "/root")})
    assert bench_tests.returncode == 0 and "pytest -q -m bench" in bench_tests.stdout, bench_tests.stderr


def test_cli_commands_as_written(checkout):
    home, (run_a, run_b) = checkout
    fill = {"RUN_ID": run_a, "RUN_A": run_a, "RUN_B": run_b}
    cmds = [c for c in readme_commands() if c.startswith(".venv/bin/ttt-pipeline") and c not in COVERED]
    assert len(cmds) == 4, cmds  # report, compare, reevaluate, predict
    for cmd in cmds:
        filled = re.sub(r"\b(RUN_ID|RUN_A|RUN_B)\b", lambda m: fill[m.group(1)], cmd)
        proc = sh(filled, home)
        assert proc.returncode == 0, f"{cmd}\n{proc.stdout[-1500:]}\n{proc.stderr[-3000:]}"
        assert "Traceback" not in proc.stderr, proc.stderr[-3000:]
        if " reevaluate --json" in cmd:
            assert json.loads(proc.stdout.strip().splitlines()[-1])["verdict"] == "ok"  # the champion, re-scored
        if " report " in cmd or " compare " in cmd:
            assert run_a[:8] in proc.stdout, proc.stdout[-1500:]
    rows = [json.loads(line) for line in (home / "predictions.jsonl").read_text().splitlines()]
    assert len(rows) == 2 and all(r["label"] in ("negative", "positive") for r in rows)


def test_python_snippet_as_written(checkout):
    home, _ = checkout
    [snippet] = readme_blocks("python")
    script = snippet.rstrip().splitlines()
    script[-1] = f"print(__import__('json').dumps({script[-1].split('  #')[0].strip()}))"
    proc = sh(".venv/bin/python - <<'EOF'\n" + "\n".join(script) + "\nEOF", home)
    assert proc.returncode == 0, proc.stderr[-3000:]
    [row] = json.loads(proc.stdout.strip().splitlines()[-1])
    assert row["label"] in ("negative", "positive") and 0.0 <= row["probability"] <= 1.0


def test_servers_as_written(checkout):
    home, _ = checkout
    by_start = {c.split()[0] + " " + c.split()[1]: c for c in readme_commands()}
    ui = by_start[".venv/bin/mlflow ui"]
    port = free_port()
    with serving(ui.replace("--port 5000", f"--port {port}"), home, f"http://127.0.0.1:{port}/"):
        pass
    prefect = by_start[".venv/bin/prefect server"]
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
    assert pred["label"] in ("negative", "positive") and set(pred) == {"label", "probability", "probabilities"}
