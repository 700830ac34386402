"""Two runs of the same config at once, on one store, one MLflow database and one Prefect home: both finish
with the same figures, the finetune step is built once (the second run waits on the step's lock and reuses
it), and the cache holds only complete, verified entries."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from reliability_helpers import REPO, cli_args, cli_env, write_config
from tiny_config import tiny_config

from ttt_pipeline.storage import MANIFEST, StepStore

pytestmark = pytest.mark.slow
HEADLINE = ("acc_clean", "acc_corrupted", "acc_ttt", "acc_clean_ttt", "macro_f1_clean")


def test_two_runs_at_once_share_the_cache_safely(tmp_path, tiny_bert_dir):
    cfg = tiny_config(tmp_path, tiny_bert_dir, suite="reliability")
    config = write_config(tmp_path, cfg)
    env = cli_env(tmp_path)
    procs = [subprocess.Popen(cli_args(config, "--json"), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              text=True, env=env, cwd=REPO) for _ in range(2)]
    results = [p.communicate(timeout=900) for p in procs]
    for p, (_, err) in zip(procs, results):
        assert p.returncode == 0, err[-3000:]
        assert "Traceback" not in err
    # the input check of exactly one run built the download step (the other waited on its lock), and says so
    assert sum("(download prepared by this run's input check)" in out for out, _ in results) == 1
    a, b = (json.loads(out.strip().splitlines()[-1]) for out, _ in results)
    for k in HEADLINE:
        assert a[k] == b[k], k
    assert a["model_path"] == b["model_path"]
    assert sorted([a["cached"]["finetune"], b["cached"]["finetune"]]) == [False, True], "built exactly once"
    assert a["mlflow_run_id"] != b["mlflow_run_id"]  # two tracked runs, neither lost

    store = StepStore(cfg["store"])
    for step in ("download", "tokenise", "finetune", "corrupt", "evaluate"):
        entries = [d for d in (store.root / step).iterdir() if d.is_dir() and not d.name.startswith(".")
                   and not d.name.endswith(".work")]
        assert len(entries) == 1, (step, entries)
        assert store.load(step, entries[0].name) is not None, f"{step}: entry does not verify"
        assert (entries[0] / MANIFEST).is_file()
        leftovers = [d.name for d in (store.root / step).iterdir() if d.name.startswith(".")]
        assert not leftovers, (step, leftovers)


START = ("from ttt_pipeline.cli.main import start_prefect_server; start_prefect_server()\n"
         "from prefect.server.api.server import SubprocessASGIServer; print(SubprocessASGIServer().port)")


def test_two_temporary_servers_on_a_fresh_prefect_home_take_turns_migrating(tmp_path):
    """Unserialised, two servers migrating one fresh SQLite database fail about every second try here
    (`index ... already exists`, `database is locked`); three fresh homes make a regression visible."""
    for round_ in range(3):
        env = {**cli_env(tmp_path / f"round{round_}"), "PREFECT_SERVER_ANALYTICS_ENABLED": "false"}  # as `run` sets
        procs = [subprocess.Popen([sys.executable, "-c", START], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                  text=True, env=env, cwd=REPO) for _ in range(2)]
        results = [p.communicate(timeout=300) for p in procs]
        for p, (out, err) in zip(procs, results):
            assert p.returncode == 0, err[-3000:]
            assert "Traceback" not in err and "ERROR" not in err, err[-3000:]
            assert int(out.strip().splitlines()[-1]) > 0
