"""What `ttt-pipeline run` shows (issue 24): Prefect's lifecycle lines dropped, stage lines kept, progress with
rate and time left, the compact result table and the UI commands."""

from __future__ import annotations

import logging

from ttt_pipeline.cli.console import ConsoleFormatter, QuietPrefect, summary_table, ui_commands
from ttt_pipeline.config import load_config
from ttt_pipeline.tasks.progress import Reporter, duration, progress_line


def _diff(delta, lo, hi, n=129, **extra):
    return {"delta": delta, "ci_low": lo, "ci_high": hi, "p_mcnemar": 0.01, "helped": 3, "hurt": 1,
            "significant": lo > 0 or hi < 0, "n": n, **extra}


SUMMARY = {
    "acc_clean": 0.9, "acc_corrupted": 0.75, "corruption_drop": _diff(0.15, 0.09, 0.21),
    "gains": {"masked_ttt": {"corrupted": _diff(0.005, -0.02, 0.03)},
              "spell": {"corrupted": _diff(0.1, 0.05, 0.15), "clean": _diff(-0.01, -0.03, 0.01)}},
    "defense_gain": _diff(0.1, 0.05, 0.15, method="spell"),
    "ttt_gain": _diff(0.005, -0.02, 0.03, mask_seeds=[0]),
}


def test_summary_table_rows_and_numbers():
    cfg = load_config("demo", ["corruption.families=[keyboard]", "corruption.severities=[4]"])
    lines = summary_table(SUMMARY, cfg).splitlines()
    assert "accuracy" in lines[0] and "95% interval" in lines[0]
    assert lines[1].split() == ["clean", "0.900"]
    assert lines[2].startswith("corrupted, no defense") and "0.750" in lines[2]
    assert lines[2].endswith("drop (clean - corrupted)  +15.00 [+9.00, +21.00] significant")
    # the default defense first, its accuracy = corrupted + its paired gain
    assert lines[3].startswith("corrupted, spell (default defense)") and "0.850" in lines[3]
    assert lines[3].endswith("gain (vs no defense)      +10.00 [+5.00, +15.00] significant")
    assert lines[4].startswith("corrupted, masked_ttt ") and "0.755" in lines[4]
    assert lines[4].endswith("+0.50 [-2.00, +3.00] not significant")
    assert lines[5] == "(129 test reviews; corrupted = keyboard at severity 4; masked methods pooled over 1 mask seed)"
    assert len(lines) == 6


def test_the_summary_names_the_signal_ttt_adapts_on():
    """Issue 35: the head's perplexity and masked TTT's held-out MLM-loss change under the accuracy table."""
    signal = {"mlm_perplexity_clean": 312.4, "mlm_top1_clean": 0.081, "mlm_perplexity_corrupted": 655.0,
              "mlm_top1_corrupted": 0.05, "ttt_heldout_before": 5.74, "ttt_heldout_after": 5.7, "ttt_heldout_change": -0.04,
              "ttt_changed_share": 0.021}
    lines = summary_table({**SUMMARY, **signal}).splitlines()
    assert lines[-2] == ("MLM head: perplexity 312.4 on clean text (top-1 0.08), 655.0 on corrupted (top-1 0.05); "
                         "a pretrained BERT head reads reviews near 5-7")
    assert lines[-1] == ("masked TTT: held-out MLM loss 5.740 -> 5.700 nats (-0.040) on masks it did not step on; "
                         "it changed 2.1% of the corrupted-set predictions")
    assert not any(ln.startswith(("MLM head", "masked TTT:")) for ln in summary_table(SUMMARY).splitlines())


def test_ui_commands_name_both_uis(monkeypatch):
    monkeypatch.delenv("PREFECT_API_URL", raising=False)
    monkeypatch.setenv("PREFECT_HOME", "/tmp/ph")
    (m_name, m_cmd, m_url), (p_name, p_cmd, p_url) = ui_commands("sqlite:////x/mlflow.db", "http://127.0.0.1:5000/#/r")
    assert m_cmd.endswith("mlflow ui --backend-store-uri sqlite:////x/mlflow.db --host 127.0.0.1 --port 5000")
    assert m_url == "http://127.0.0.1:5000/#/r"
    assert p_cmd.startswith("PREFECT_HOME=/tmp/ph ") and p_cmd.endswith("prefect server start --host 127.0.0.1")
    assert p_url == "http://127.0.0.1:4200"
    monkeypatch.setenv("PREFECT_API_URL", "http://10.0.0.5:4200/api")
    assert ui_commands("http://10.0.0.5:5000")[1][2] == "http://10.0.0.5:4200"


def _record(name, msg, level=logging.INFO):
    return logging.LogRecord(name, level, __file__, 1, msg, None, None)


def test_prefect_lifecycle_lines_are_dropped_and_stage_lines_kept():
    q = QuietPrefect()
    assert not q.filter(_record("prefect.task_runs", "Finished in state Completed()"))
    assert not q.filter(_record("prefect.task_runs", "Finished in state Cached(type=COMPLETED)"))
    assert not q.filter(_record("prefect.flow_runs", "Beginning flow run 'x' for flow 'ttt-pipeline'"))
    # a failure ends the command with its own `error:` line: Prefect's final state line would repeat it
    assert not q.filter(_record("prefect.task_runs", "Finished in state Failed('boom')", logging.ERROR))
    assert not q.filter(_record("prefect.flow_runs", "Finished in state Failed('Flow run encountered ...')"))
    assert q.filter(_record("prefect.flow_runs", "fine-tune: computed in 1 min 33 s"))
    out = ConsoleFormatter().format(_record("prefect.flow_runs", "fine-tune: started (train the classifier)"))
    assert out[2] == ":" and out.endswith("  fine-tune: started (train the classifier)")


def test_progress_line_has_rate_and_time_left():
    assert duration(7.4) == "7 s" and duration(157) == "2 min 37 s" and duration(3720) == "1 h 02 min"
    assert progress_line("fine-tuning", 120, 450, "steps", 60.0) == \
        "fine-tuning: 120/450 steps (27%), 2.0 steps/s, about 2 min 45 s left"
    assert progress_line("evaluation", 10, 100, "reviews", 20.0) == \
        "evaluation: 10/100 reviews (10%), 2.0 s per review, about 3 min 00 s left"
    assert progress_line("evaluation", 100, 100, "reviews", 50.0).endswith("done in 50 s")


def test_reporter_prints_plain_lines_when_not_a_terminal(monkeypatch, capsys):
    clock = iter([0.0, 1.0, 30.0, 31.0, 40.0])
    monkeypatch.setattr("ttt_pipeline.tasks.progress.time.monotonic", lambda: next(clock))
    monkeypatch.setattr("ttt_pipeline.tasks.progress._artifact", lambda key: None)  # no Prefect server for a unit test
    rep = Reporter("test-progress", mode="lines")
    for done in (1, 2, 60, 61, 100):
        rep("finetune", done, 100, {"loss": 0.5})
    err = capsys.readouterr().err.splitlines()
    # the first update, one after 20 s, and the last: not one line per step
    assert [ln.split(":")[1].split()[0] for ln in err] == ["1/100", "60/100", "100/100"]
    assert err[1] == "  fine-tuning (may stop early): 60/100 steps (60%), 2.0 steps/s, about 20 s left, loss 0.500"
    assert "done in 40 s" in err[2]


def test_a_fast_stage_still_shows_its_rate_at_each_quarter(monkeypatch, capsys):
    """A stage shorter than the 20 s line interval (evaluation on a fast machine) prints at 25/50/75%, each
    with its rate and time left, not just its first and last update."""
    clock = iter(0.1 * i for i in range(200))
    monkeypatch.setattr("ttt_pipeline.tasks.progress.time.monotonic", lambda: next(clock))
    monkeypatch.setattr("ttt_pipeline.tasks.progress._artifact", lambda key: None)
    rep = Reporter("test-progress", mode="lines")
    for done in range(8, 101, 8):
        rep("evaluate", min(done, 100), 100, {})
    rep("evaluate", 100, 100, {})
    err = capsys.readouterr().err.splitlines()
    assert [ln.split(":")[1].split()[0] for ln in err] == ["8/100", "32/100", "56/100", "80/100", "100/100"]
    assert all("scorings/s, about" in ln for ln in err[1:4]), err


def test_a_user_errors_traceback_stays_off_the_terminal_and_a_bugs_stays_on():
    """The command prints a PipelineError as `error:` / `hint:`; Prefect's traceback of it is noise. An unexpected
    exception keeps Prefect's traceback (the command's `error:` line then says it looks like a bug)."""
    from ttt_pipeline.errors import PipelineError
    from ttt_pipeline.modeling.oom import OutOfMemory

    q = QuietPrefect()

    def failed(exc):
        try:
            raise exc
        except Exception:
            import sys

            r = _record("prefect.task_runs", "Task run failed with exception", logging.ERROR)
            r.exc_info = sys.exc_info()
            return r

    assert not q.filter(failed(PipelineError("bad value", "fix it")))
    assert not q.filter(failed(OutOfMemory("out of memory in evaluate (x)", "lower ttt.batch_size")))
    assert q.filter(failed(ValueError("a bug")))
    assert q.filter(_record("ttt_pipeline.steps", "Finished in state Failed(x)", logging.ERROR))  # not Prefect's


def test_the_shifted_domains_have_their_rows():
    shifted = {**SUMMARY, "acc_shift": 0.8, "acc_shift_default": 0.81,
               "gains": {**SUMMARY["gains"], "spell": {**SUMMARY["gains"]["spell"],
                                                        "shift": {"kitchen": _diff(0.01, -0.01, 0.03)}}}}
    lines = summary_table(shifted).splitlines()
    [none] = [ln for ln in lines if ln.startswith("shifted domains, no defense")]
    [spell] = [ln for ln in lines if ln.startswith("shifted domains, spell")]
    [kitchen] = [ln for ln in lines if ln.startswith("  kitchen, spell")]
    assert "0.800" in none and "0.810" in spell
    assert "gain (vs no defense)" in kitchen and "+1.00 [-1.00, +3.00]" in kitchen
    assert not any(ln.startswith("shifted") for ln in summary_table(SUMMARY).splitlines())
