"""Human-readable summaries of a run: the headline table (terminal and markdown)."""

from __future__ import annotations

ROWS = [("acc_clean", "clean accuracy"), ("acc_corrupted", "corrupted accuracy"),
        ("acc_ttt", "corrupted accuracy with masked TTT"), ("recovered_fraction", "recovered fraction of the drop"),
        ("acc_clean_ttt", "clean accuracy with masked TTT"), ("acc_tent", "corrupted accuracy with Tent"),
        ("acc_shift", "domain-shift accuracy"), ("acc_shift_ttt", "domain-shift accuracy with TTT"),
        ("macro_f1_clean", "clean macro-F1")]


def fmt(v) -> str:
    return "-" if v is None else f"{v:.3f}" if isinstance(v, float) else str(v)


def headline_table(summary: dict) -> str:
    lines = [(label, fmt(summary[key])) for key, label in ROWS if key in summary]
    width = max(len(label) for label, _ in lines) if lines else 10
    return "\n".join(f"{label:<{width}}  {value}" for label, value in lines)


def run_link(summary: dict, tracker=None) -> str:
    uri = summary.get("mlflow_tracking_uri", "")
    rid, eid = summary["mlflow_run_id"], summary.get("experiment_id", "")
    base = uri if uri.startswith("http") else "http://127.0.0.1:5000"
    return f"{base}/#/experiments/{eid}/runs/{rid}"


def headline_markdown(summary: dict, tracker=None) -> str:
    rows = "\n".join(f"| {label} | {fmt(summary[key])} |" for key, label in ROWS if key in summary)
    reg = summary.get("registry") or {}
    registry = (f"Model registry: version {reg.get('version')} {reg.get('decision', '')} "
                f"({reg.get('reason', '')})\n\n" if reg else "")
    return (f"# TTT pipeline run\n\n| metric | value |\n|---|---|\n{rows}\n\n"
            f"Cached tasks: {summary.get('cached_tasks', 0)}/5 · wall time {summary.get('wall_s', 0):.1f} s\n\n"
            f"{registry}MLflow run: [{summary['mlflow_run_id']}]({run_link(summary, tracker)})\n")
