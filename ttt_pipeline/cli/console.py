"""What `ttt-pipeline run` shows in the terminal: quiet, named log lines while it works, then one compact table.

- Logging: Prefect's per-task `Finished in state Completed()` / `Cached(...)` lines (one per task, no stage name)
  and its temporary-server notices are dropped from the console (the Prefect UI still gets them); the stages log
  their own start and end (ttt_pipeline/flows/pipeline.py) and progress has its own lines (ttt_pipeline/tasks/progress.py).
- The summary: clean accuracy, corrupted accuracy with the corruption drop, and every defense's accuracy on the
  corrupted reviews with its paired gain over no defense (95% interval, verdict); the default defense first.
- The two commands that open the UIs (MLflow, Prefect).

Numbers come from the run summary only (the flow's paired statistics: ttt_pipeline.evaluation.robustness), never
recomputed here.
"""

from __future__ import annotations

import logging
import os
import shlex
import sys
import time
from pathlib import Path

from ttt_pipeline.errors import PipelineError
from ttt_pipeline.evaluation.stats import format_difference

QUIET_PREFIXES = ("Finished in state Completed", "Finished in state Cached", "Beginning flow run",
                  "Starting temporary server", "Stopping temporary server", "Created task run", "Executing '")


class QuietPrefect(logging.Filter):
    """Drops Prefect's routine lifecycle lines from a console handler; failures and warnings pass, except what
    the command prints itself when the run ends: a user error's traceback (as `error:` / `hint:` lines) and the
    final "Finished in state Failed(...)" line (any failure ends with an `error:` line)."""

    def filter(self, record: logging.LogRecord) -> bool:
        if not record.name.startswith("prefect"):
            return True
        message = record.getMessage()
        if message.startswith("Finished in state Failed("):
            return False
        if record.levelno <= logging.INFO:
            return not message.startswith(QUIET_PREFIXES)
        return not (record.exc_info and isinstance(record.exc_info[1], PipelineError))


class ConsoleFormatter(logging.Formatter):
    """`12:03:41  finetune: computed in 1 min 33 s`; other levels keep their level and logger name."""

    def format(self, record: logging.LogRecord) -> str:
        stamp = time.strftime("%H:%M:%S", time.localtime(record.created))
        if record.levelno == logging.INFO and not record.exc_info:
            return f"{stamp}  {record.getMessage()}"
        return f"{stamp}  {record.levelname} {record.name}: {super().format(record)}"


def setup_run_logging() -> logging.Handler:
    """The run command's console: one stderr handler on the root logger (Prefect keeps a user's root handler and
    propagates its run loggers to it), quiet Prefect lifecycle lines, MLflow's INFO chatter off."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(ConsoleFormatter())
    handler.addFilter(QuietPrefect())
    root = logging.getLogger()
    root.addHandler(handler)
    root.setLevel(logging.WARNING)
    logging.getLogger("mlflow").setLevel(logging.WARNING)
    return handler


def _points(d: dict) -> str:
    return format_difference(d)


def _corruption_words(cfg) -> str:
    if cfg is None:
        return ""
    c = cfg.corruption
    fams = ", ".join(c.families)
    sevs = ", ".join(str(s) for s in c.severities)
    return f"{fams} at severity {sevs}" if c.families != ["tutorial"] else "the torch-ttt tutorial's composite"


def summary_table(summary: dict, cfg=None) -> str:
    """The run's result in a few rows: accuracy, and each paired difference with its 95% interval."""
    if summary.get("labelled") is False:
        return label_free_table(summary)
    clean, corrupted = summary.get("acc_clean"), summary.get("acc_corrupted")
    gains = summary.get("gains") or {}
    default = (summary.get("defense_gain") or {}).get("method")
    methods = ([default] if default in gains else []) + [m for m in gains if m != default]
    rows: list[tuple[str, str, str, str]] = []
    if clean is not None:
        rows.append(("clean", f"{clean:.3f}", "", ""))
    if corrupted is not None:
        drop = summary.get("corruption_drop")
        rows.append(("corrupted, no defense", f"{corrupted:.3f}", "drop (clean - corrupted)" if drop else "",
                     _points(drop) if drop else ""))
        for m in methods:
            g = gains[m].get("corrupted")
            if not g:
                continue
            label = f"corrupted, {m}" + (" (default defense)" if m == default else "")
            rows.append((label, f"{corrupted + g['delta']:.3f}", "gain (vs no defense)", _points(g)))
    rows += _external_rows(summary, methods, default)
    rows += _shift_rows(summary, default)
    if not rows:
        return "no accuracy was scored"
    w0 = max(len(r[0]) for r in rows)
    w2 = max(len(r[2]) for r in rows)
    head = f"{'':<{w0}}  accuracy  {'paired difference, points [95% interval]':<{w2}}"
    lines = [head.rstrip()] + [f"{a:<{w0}}  {b:>8}  {c:<{w2}}  {d}".rstrip() for a, b, c, d in rows]
    notes = []
    n = (summary.get("corruption_drop") or summary.get("defense_gain") or {}).get("n")
    if n:
        notes.append(f"{n} test reviews")
    if cfg is not None and corrupted is not None:
        notes.append(f"corrupted = {_corruption_words(cfg)}")
    seeds = next((len(v["mask_seeds"]) for v in (summary.get("defense_gain"), summary.get("ttt_gain"))
                  if v and v.get("mask_seeds")), None)
    if seeds:
        notes.append(f"masked methods pooled over {seeds} mask seed{'s' if seeds != 1 else ''}")
    if notes:
        lines.append("(" + "; ".join(notes) + ")")
    lines += signal_lines(summary) + forecast_lines(summary)
    if summary.get("worst_case"):
        from ttt_pipeline.evaluation.robustness import flat_metrics
        from ttt_pipeline.reports.run import worst_case_table

        lines.append(worst_case_table(flat_metrics(summary), summary))
    return "\n".join(lines)


def _share(d: dict | None) -> str:
    return "-" if d is None else f"{100 * d['share']:.1f}% [{100 * d['ci_low']:.1f}, {100 * d['ci_high']:.1f}]"


def label_free_table(summary: dict) -> str:
    """Unlabelled reviews (evaluation.unlabelled): per set, the predictions noise changed, and per defense the
    share it changed and the share of those it restored, each with its Wilson interval."""
    grid = summary["label_free"]
    methods = list(dict.fromkeys(m for row in grid for m in row["defenses"]))
    head = ["set", "changed (none)", *(f"{m}: {what}" for m in methods for what in ("changed", "restored"))]
    rows = [[row["set"], _share(row["changed"]),
             *(_share((row["defenses"].get(m) or {}).get(what)) for m in methods for what in ("changed", "restored"))]
            for row in grid]
    widths = [max(len(r[i]) for r in [head, *rows]) for i in range(len(head))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in [head, *rows]]
    pct = round(100 * summary["confidence"])
    lines.append(f"({summary['n']} unlabelled reviews; predictions against each review's clean prediction under none, "
                 f"{pct}% Wilson intervals; restored: of those none changed)")
    if summary.get("forecast_note"):
        lines.append(f"label-free drop forecast: {summary['forecast_note']}")
    return "\n".join(lines)


def signal_lines(summary: dict) -> list[str]:
    """The self-supervised signal masked TTT adapts on (README, "Is the TTT signal worth adapting to?")."""
    lines = []
    if (ppl := summary.get("mlm_perplexity_clean")) is not None:
        text = f"MLM head: perplexity {ppl:.1f} on clean text (top-1 {summary['mlm_top1_clean']:.2f})"
        if (bad := summary.get("mlm_perplexity_corrupted")) is not None:
            text += f", {bad:.1f} on corrupted (top-1 {summary['mlm_top1_corrupted']:.2f})"
        lines.append(text + "; a pretrained BERT head reads reviews near 5-7")
    if (before := summary.get("ttt_heldout_before")) is not None:
        change = summary["ttt_heldout_change"]
        text = (f"masked TTT: held-out MLM loss {before:.3f} -> {summary['ttt_heldout_after']:.3f} nats "
                f"({change:+.3f}) on masks it did not step on")
        if (share := summary.get("ttt_changed_share")) is not None:
            text += f"; it changed {100 * share:.1f}% of the corrupted-set predictions"
        lines.append(text)
    return lines


def forecast_lines(summary: dict) -> list[str]:
    """The label-free drop forecast's calibration (steps.calibrate) in one line: its held-out error and coverage,
    or why the run has none."""
    if (fc := summary.get("forecast_calibration")) is not None:
        coverage = "-" if fc["coverage"] is None else f"{100 * fc['coverage']:.0f}%"
        return [f"label-free drop forecast: {fc['model']} model on {fc['n_sets']} corrupted sets, held-out error "
                f"{100 * fc['loo_mae']:.1f} points, its interval covers {coverage} of them"]
    note = summary.get("forecast_calibration_note")
    return [f"label-free drop forecast: not calibrated ({note})"] if note else []


def _external_rows(summary: dict, methods: list[str], default: str | None) -> list[tuple[str, str, str, str]]:
    """The external generators' sets (`ext:` families, the held-out test), apart from the own suite."""
    acc, drop = summary.get("acc_external"), summary.get("external_drop")
    if acc is None:
        return []
    rows = [("external generators, no defense", f"{acc:.3f}", "drop (clean - external)" if drop else "",
             _points(drop) if drop else "")]
    for m in methods:
        g = (summary.get("gains") or {}).get(m, {}).get("external")
        if g:
            label = f"external, {m}" + (" (default defense)" if m == default else "")
            rows.append((label, f"{acc + g['delta']:.3f}", "gain (vs no defense)", _points(g)))
    return rows


def _shift_rows(summary: dict, default: str | None) -> list[tuple[str, str, str, str]]:
    """The shifted domains (data.shift): their mean accuracy without and with the recommended defense, and its
    paired gain on each domain."""
    acc = summary.get("acc_shift")
    if acc is None:
        return []
    rows = [("shifted domains, no defense", f"{acc:.3f}", "", "")]
    if default and summary.get("acc_shift_default") is not None:
        rows.append((f"shifted domains, {default}", f"{summary['acc_shift_default']:.3f}", "", ""))
    for dom, g in ((summary.get("gains") or {}).get(default, {}).get("shift") or {}).items():
        rows.append((f"  {dom}, {default}", "", "gain (vs no defense)", _points(g)))
    return rows


def _bin(name: str) -> str:
    """The command as this interpreter's environment has it (.venv/bin/mlflow), relative when under cwd."""
    exe = Path(sys.executable).parent / name
    if not exe.exists():
        return name
    try:
        return str(exe.relative_to(Path.cwd()))
    except ValueError:
        return str(exe)


def ui_commands(tracking_uri: str, run_url: str | None = None) -> list[tuple[str, str, str]]:
    """(UI, command, what to open) for MLflow and Prefect, as this run recorded into them."""
    from ttt_pipeline.errors import redact

    if tracking_uri.startswith(("http://", "https://")):
        mlflow = ("MLflow", "(server already running)", run_url or redact(tracking_uri))
    else:
        mlflow = ("MLflow", f"{_bin('mlflow')} ui --backend-store-uri {tracking_uri} --host 127.0.0.1 --port 5000",
                  run_url or "http://127.0.0.1:5000")
    api = os.environ.get("PREFECT_API_URL", "")
    if api:
        ui = os.environ.get("PREFECT_UI_URL") or api.removesuffix("/api")
        prefect = ("Prefect", "(server already running)", ui)
    else:
        home = os.environ.get("PREFECT_HOME")
        prefix = f"PREFECT_HOME={shlex.quote(home)} " if home else ""
        prefect = ("Prefect", f"{prefix}{_bin('prefect')} server start --host 127.0.0.1", "http://127.0.0.1:4200")
    return [mlflow, prefect]


def ui_lines(tracking_uri: str, run_url: str | None = None) -> str:
    rows = ui_commands(tracking_uri, run_url)
    width = max(len(c) for _, c, _ in rows)
    return "\n".join(f"  {name + ':':<8} {cmd:<{width}}  then open {url}" for name, cmd, url in rows)


def _change(d: dict | None) -> str:
    if not d:
        return "-"
    return f"{100 * d['delta']:+.2f} points [{100 * d['ci_low']:+.2f}, {100 * d['ci_high']:+.2f}]"


def nightly_lines(s: dict) -> str:
    """What `ttt-pipeline reevaluate` prints: the verdict, the changes with their intervals, the alarm's power."""
    if s["verdict"] == "no_champion":
        return f"verdict: no_champion ({s['model_name']}: nothing was re-evaluated)"
    lines = [f"verdict: {s['verdict']}  ({s['model_name']} v{s['model_version']}, defense {s['defense']}, "
             f"night {s['night']})",
             f"robust accuracy (reference suite, {s['defense']}): {s['robust_acc_ref']:.3f}"]
    ref = s.get("reference")
    lines.append(f"change against {ref['against']}: {_change(ref)}" if ref else
                 "change: no paired baseline yet (no previous night, no stored predictions of the champion's run)")
    mdd = s.get("min_detectable_drop")
    n = s.get("reference_n")
    lines.append(f"alarm power: {n} reviews detect a drop of at least {100 * mdd:.1f} points below "
                 f"-{100 * s['threshold']:.1f} (80% power); smaller regressions pass unseen" if mdd is not None else
                 f"alarm power: {n} reviews cannot detect any drop at this threshold")
    new = s.get("new_data")
    if new:
        d = new["drift"]
        lines.append(f"new data ({new['n']} reviews): accuracy {new['acc']:.3f} vs test {new['acc_reference']:.3f}, "
                     f"change {_change(new)}; words unseen in training {d['unseen_word_share']['new']:.3f} "
                     f"(test {d['unseen_word_share']['test']:.3f}); mean words {d['mean_words']['new']:.1f} "
                     f"(training {d['mean_words']['train']:.1f}); label-share shift {d['label_share_shift']:.3f}")
    return "\n".join(lines)
