"""Crash safety: `kill -9` in the middle of fine-tuning, then the same command again, resumes from the last
completed epoch and ends where an uninterrupted run ends; a damaged file inside a cached model is rebuilt."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import threading
import time
from pathlib import Path

import pytest
from reliability_helpers import REPO, cli_args, cli_env, run_cli, write_config
from safetensors.torch import load_file
from tiny_config import tiny_config

from ttt_pipeline import steps
from ttt_pipeline.config import PipelineConfig
from ttt_pipeline.evaluation.scoring import headline
from ttt_pipeline.storage import MANIFEST, StepStore, file_digest

pytestmark = pytest.mark.slow
# Long enough epochs (a few seconds each) that the kill lands between epoch 1 and the end of training.
RESUMABLE = {"data": {"max_train_samples": 120}, "finetune": {"epochs": 3}}
COMPARED = ("train_loss", "train_mlm_loss", "lr", "val_loss", "val_acc", "val_macro_f1")


def _reference(cfg_dict: dict, out: dict) -> None:
    """The same config, uninterrupted, in another store (in this process, without Prefect)."""
    try:
        cfg = PipelineConfig.model_validate(cfg_dict)
        store = StepStore(cfg.store)
        data = steps.download(cfg, store)
        tokens = steps.tokenise(cfg, data, store)
        model = steps.finetune(cfg, data, tokens, store)
        corrupted = steps.corrupt(cfg, data, store)
        ev = steps.evaluate(cfg, data, model, corrupted, store)
        out.update(model=model, rows=steps.load_results([ev])["rows"])
    except BaseException as exc:  # surfaced by the test
        out["error"] = exc


def _finetune_entry(store: Path) -> Path | None:
    entries = [d for d in (store / "finetune").iterdir()
               if d.is_dir() and not d.name.startswith(".") and not d.name.endswith(".work")]
    assert len(entries) <= 1
    return entries[0] if entries else None


def _wait_for_epoch(store: Path, proc: subprocess.Popen, timeout: float) -> Path:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        assert proc.poll() is None, "the run ended before it could be killed: " + \
            (store.parent / "first.err").read_text()[-2000:]
        for work in (store / "finetune").glob("*.work") if (store / "finetune").is_dir() else []:
            state = work / "state.json"
            if (work / "last.pt").is_file() and state.is_file():
                try:
                    if len(json.loads(state.read_text())["history"]) >= 1:
                        return work
                except (json.JSONDecodeError, KeyError):
                    pass
        time.sleep(0.05)
    raise AssertionError("no completed epoch within the timeout")


def test_kill_9_mid_finetune_then_rerun_resumes_and_matches_an_uninterrupted_run(tmp_path, tiny_bert_dir):
    run_dir, ref_dir = tmp_path / "killed", tmp_path / "reference"
    cfg = tiny_config(run_dir, tiny_bert_dir, suite="reliability", **RESUMABLE)
    ref: dict = {}
    reference = threading.Thread(target=_reference,
                                 args=(tiny_config(ref_dir, tiny_bert_dir, suite="reliability", **RESUMABLE), ref))
    reference.start()
    try:
        _kill_rerun_compare(run_dir, cfg, reference, ref)
    finally:
        reference.join(timeout=900)  # never leave it training beside the next test (shared torch RNG)


def _kill_rerun_compare(run_dir: Path, cfg: dict, reference: threading.Thread, ref: dict) -> None:
    config = write_config(run_dir, cfg)
    with open(run_dir / "first.out", "w") as out, open(run_dir / "first.err", "w") as err:
        proc = subprocess.Popen(cli_args(config, "--json"), stdout=out, stderr=err, env=cli_env(run_dir), cwd=REPO,
                                start_new_session=True)  # its own group: the kill takes the Prefect server too
        try:
            work = _wait_for_epoch(run_dir / "store", proc, timeout=480)
        finally:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=60)
    assert proc.returncode == -signal.SIGKILL
    done = len(json.loads((work / "state.json").read_text())["history"])
    assert 1 <= done < 3, f"killed after epoch {done}"
    assert _finetune_entry(run_dir / "store") is None, "a killed fine-tune must leave no cache entry"

    second = run_cli(run_dir, cfg, "--json", timeout=600)
    assert second.returncode == 0, second.stderr[-3000:]
    summary = second.summary
    assert summary["cached"]["finetune"] is False and summary["cached"]["download"] is True
    entry = _finetune_entry(run_dir / "store")
    meta = json.loads((entry / MANIFEST).read_text())["meta"]
    assert meta["resumed_from_epoch"] >= 1 and meta["epochs_run"] == 3
    assert not work.exists(), "checkpoints are removed once the model is stored"

    reference.join(timeout=600)
    assert "error" not in ref, ref.get("error")
    ref_meta = ref["model"].meta
    assert ref_meta["resumed_from_epoch"] == 0
    assert meta["best_epoch"] == ref_meta["best_epoch"]
    assert meta["best_val_macro_f1"] == pytest.approx(ref_meta["best_val_macro_f1"], abs=1e-6)
    history = json.loads((entry / "history.json").read_text())["epochs"]
    ref_history = json.loads((Path(ref["model"].path) / "history.json").read_text())["epochs"]
    assert [r["epoch"] for r in history] == [1, 2, 3]
    for got, want in zip(history, ref_history, strict=True):
        for k in COMPARED:
            assert got[k] == pytest.approx(want[k], abs=1e-6), (got["epoch"], k)
    for name in ("encoder/model.safetensors", "head.safetensors"):
        got, want = load_file(str(entry / "model" / name)), load_file(str(Path(ref["model"].path) / "model" / name))
        assert got.keys() == want.keys()
        worst = max(float((got[k].float() - want[k].float()).abs().max()) for k in got)
        assert worst <= 1e-6, (name, worst)
    ref_head = headline(ref["rows"])
    for k in ("acc_clean", "acc_corrupted", "acc_ttt", "acc_clean_ttt"):
        assert summary[k] == pytest.approx(ref_head[k], abs=1e-6), k


def test_damaged_file_in_a_real_finetune_entry_is_rebuilt_not_used(tmp_path, tiny_bert_dir):
    cfg = PipelineConfig.model_validate(tiny_config(tmp_path, tiny_bert_dir, suite="reliability",
                                                    data={"max_train_samples": 30},
                                                    finetune={"epochs": 1}))
    store = StepStore(cfg.store)
    data = steps.download(cfg, store)
    tokens = steps.tokenise(cfg, data, store)
    first = steps.finetune(cfg, data, tokens, store)
    inputs = steps.finetune_inputs(cfg, tokens, data)
    assert steps.stored("finetune", inputs, store) is not None

    weights = Path(first.path) / "model" / "encoder" / "model.safetensors"
    good = {n: file_digest(Path(first.path) / "model" / n) for n in ("encoder/model.safetensors", "head.safetensors")}
    raw = bytearray(weights.read_bytes())
    raw[len(raw) // 2] ^= 0xFF  # one flipped bit pattern deep in the tensor data: still loads, silently wrong
    weights.write_bytes(bytes(raw))
    assert steps.stored("finetune", inputs, store) is None  # the digest check refuses it (and so does Prefect)

    second = steps.finetune(cfg, data, tokens, store)
    assert not second.cached and second.path == first.path
    # rebuilt bit-for-bit (training is seeded; history.json differs only in its timings), and verified again
    assert {n: file_digest(Path(second.path) / "model" / n) for n in good} == good
    assert steps.stored("finetune", inputs, store).digest == second.digest
    assert not [p for p in (Path(cfg.store) / "finetune").iterdir() if ".tmp-" in p.name or ".old-" in p.name]


def test_sigterm_mid_finetune_ends_within_10_s_with_one_line_then_the_same_command_resumes(tmp_path, tiny_bert_dir):
    """The measured failure: after SIGTERM the flow was marked Crashed and the process lived on for 40 s printing
    websocket errors of the stopped temporary Prefect server. The signal goes to the whole group, as Ctrl-C and
    `timeout` send it, so the server stops too."""
    cfg = tiny_config(tmp_path, tiny_bert_dir, suite="reliability", **RESUMABLE)
    config = write_config(tmp_path, cfg)
    with open(tmp_path / "first.out", "w") as out, open(tmp_path / "first.err", "w") as err:
        proc = subprocess.Popen(cli_args(config, "--json"), stdout=out, stderr=err, env=cli_env(tmp_path), cwd=REPO,
                                start_new_session=True)
        try:
            _wait_for_epoch(tmp_path / "store", proc, timeout=480)
            t0 = time.monotonic()
            os.killpg(proc.pid, signal.SIGTERM)
            proc.wait(timeout=60)
            elapsed = time.monotonic() - t0
        finally:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(timeout=60)
    stderr = (tmp_path / "first.err").read_text()
    assert proc.returncode == 128 + signal.SIGTERM and elapsed <= 10, (elapsed, stderr[-2000:])
    last = stderr.strip().splitlines()[-1]
    assert last.startswith("stopped (SIGTERM): the store (") and last.endswith("run the same command again to resume")
    assert "download, tokenise, finetune's checkpoint after epoch" in last and "of 3" in last, last
    assert "Traceback" not in stderr
    assert "machine: device cpu; fine-tuning fp32 (auto: CPU without native bf16 (TTT_CPU_NATIVE_BF16=0))" in stderr
    with pytest.raises(ProcessLookupError):  # nothing of the run is left: no server, no loader worker
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            os.killpg(proc.pid, 0)
            time.sleep(0.2)

    second = run_cli(tmp_path, cfg, "--json", timeout=600)
    assert second.returncode == 0, second.stderr[-3000:]
    assert second.summary["cached"]["download"] is True and second.summary["cached"]["finetune"] is False
    meta = json.loads((_finetune_entry(tmp_path / "store") / MANIFEST).read_text())["meta"]
    assert meta["resumed_from_epoch"] >= 1 and meta["epochs_run"] == 3
