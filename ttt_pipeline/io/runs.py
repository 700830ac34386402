"""A pipeline run's headline from MLflow, and two runs side by side (`ttt-pipeline report` and `compare`).

Both read the pipeline (parent) run through `MlflowClient`; a stage's child run id is accepted and resolved to
its pipeline run. The tracking URI defaults to the demo preset's (`sqlite:///mlflow.db` in the current
folder), or $TTT_TRACKING_URI, else $MLFLOW_TRACKING_URI, or the one given.
"""

from __future__ import annotations

from typing import Any

from ttt_pipeline.errors import PipelineError
from ttt_pipeline.io.client import default_tracking_uri, open_client
from ttt_pipeline.reports.run import ROWS, difference_line, differences, fmt

SHOWN_PARAMS = ("evaluation.default_defense", "data.path", "data.label_names", "model.name", "finetune.alignment", "finetune.epochs", "finetune.lr", "corruption.families",
                "corruption.severities", "ttt.methods", "ttt.mask_prob", "ttt.steps", "ttt.lr")
REGISTRY_TAGS = ("registry.model_name", "registry.metric", "registry.version", "registry.decision", "registry.reason",
                 "registry.champion_before", "registry.champion_after")
TASK_TAGS = ("task", "task.labels", "task.data_digest")


def get_pipeline_run(client, run_id: str, uri: str):
    """The pipeline (parent) run for a run id (a stage's child run resolves to its parent)."""
    from mlflow.exceptions import MlflowException

    try:
        run = client.get_run(run_id)
    except MlflowException as exc:
        code = getattr(exc, "error_code", "") or ""
        if "RESOURCE_DOES_NOT_EXIST" in code or "NOT_FOUND" in code or "INVALID_PARAMETER" in code:
            raise PipelineError(f"no MLflow run {run_id!r} at {uri}",
                                "copy the id from `ttt-pipeline run` output (\"MLflow run ...\") or the MLflow UI, "
                                "and check --tracking-uri") from None
        raise PipelineError(f"MLflow tracking at {uri} failed: {exc.message.splitlines()[0]}",
                            "check that the tracking server is up and --tracking-uri is right") from None
    except Exception as exc:  # network failures surface as requests/urllib errors
        raise PipelineError(f"MLflow tracking at {uri} is unreachable ({type(exc).__name__})",
                            "start the servers (make servers) or pass --tracking-uri") from None
    parent = run.data.tags.get("mlflow.parentRunId")
    return get_pipeline_run(client, parent, uri) if parent else run


def run_summary(run, client=None) -> dict[str, Any]:
    m, p, t = run.data.metrics, run.data.params, run.data.tags
    defense = t.get("default_defense") or (p.get("evaluation.default_defense") or "none").replace("None", "none")
    out = {"run_id": run.info.run_id, "run_name": run.info.run_name, "status": run.info.status,
           "experiment_id": run.info.experiment_id, "start_time": run.info.start_time, "default_defense": defense,
           "task": {k.removeprefix("task.") if k != "task" else "name": t[k] for k in TASK_TAGS if k in t},
           "metrics": {k: m[k] for k, _ in ROWS if k in m},
           "params": {k: p[k] for k in SHOWN_PARAMS if k in p},
           "registry": {k.split(".", 1)[1]: t[k] for k in REGISTRY_TAGS if k in t},
           "differences": [{"what": label, **d} for label, d in differences(m, defense)]}
    for k in ("cached_tasks", "wall_s"):
        if k in m:
            out[k] = m[k]
    if client is not None and "registry.model_name" in t:
        from ttt_pipeline.io.model_registry import champion_run_id

        try:
            out["registry"]["is_champion"] = champion_run_id(client, t["registry.model_name"]) == run.info.run_id
        except Exception:  # a registry that cannot be read does not hide the run's metrics
            pass
    return out


def format_report(s: dict) -> str:
    lines = [f"run {s['run_id']} ({s['run_name']}, {s['status']}); default defense: {s.get('default_defense')}"]
    width = max(len(label) for _, label in ROWS)
    for key, label in ROWS:
        if key in s["metrics"]:
            lines.append(f"  {label:<{width}}  {fmt(s['metrics'][key])}")
    if not s["metrics"]:
        lines.append("  (no headline metrics: the run failed or is still running)")
    for d in s.get("differences", []):
        lines.append(f"  {d['what']:<{width}}  {'  '.join(difference_line(d))}")
    for k, v in s["params"].items():
        lines.append(f"  {k:<{width}}  {v}")
    reg = s["registry"]
    if reg:
        champ = " (champion)" if reg.get("is_champion") else ""
        lines.append(f"  {'registered model':<{width}}  {reg.get('model_name')} v{reg.get('version') or '-'} "
                     f"{reg.get('decision', '')}{champ}: {reg.get('reason', '')}")
    return "\n".join(lines)


def task_difference(a: dict, b: dict) -> list[str]:
    """How two runs' tasks differ (the data, the label set); empty when they are runs of one task. Runs logged
    before the task tags are told apart by their data.path and data.label_names parameters."""
    out = []
    ta, tb = a.get("task") or {}, b.get("task") or {}
    if ta.get("name") and tb.get("name"):
        if ta["name"] != tb["name"]:
            out.append(f"task: A={ta['name']} B={tb['name']}")
        if ta.get("labels") != tb.get("labels"):
            out.append(f"labels: A={ta.get('labels')} B={tb.get('labels')}")
        return out
    for key in ("data.path", "data.label_names"):
        if a["params"].get(key) != b["params"].get(key):
            out.append(f"{key}: A={a['params'].get(key)} B={b['params'].get(key)}")
    return out


def same_reviews(a: dict, b: dict) -> bool:
    """Whether both runs scored the same data (content digest of the split reviews, when both logged it)."""
    da, db = (a.get("task") or {}).get("data_digest"), (b.get("task") or {}).get("data_digest")
    return da == db if da and db else not task_difference(a, b)


def compare_summaries(a: dict, b: dict) -> dict[str, Any]:
    """Side by side; B - A only for runs of one task (other data or labels: the columns, no differences)."""
    other_task = task_difference(a, b)
    metrics = {}
    for key, _ in ROWS:
        va, vb = a["metrics"].get(key), b["metrics"].get(key)
        if va is None and vb is None:
            continue
        both = va is not None and vb is not None and not other_task
        metrics[key] = {"a": va, "b": vb, "diff": (vb - va) if both else None}
    params = {k: {"a": a["params"].get(k), "b": b["params"].get(k)}
              for k in dict.fromkeys([*a["params"], *b["params"]]) if a["params"].get(k) != b["params"].get(k)}
    return {"a": a, "b": b, "metrics": metrics, "params_differing": params, "different_tasks": other_task}


def format_compare(c: dict) -> str:
    a, b = c["a"], c["b"]
    labels = dict(ROWS)
    width = max(len(label) for _, label in ROWS)
    col = 12

    def tag(s: dict) -> str:
        return s["run_id"][:col - 1] + ("*" if s["registry"].get("is_champion") else "")

    lines = [f"A: {a['run_id']} ({a['run_name']})", f"B: {b['run_id']} ({b['run_name']})", ""]
    other = c.get("different_tasks")
    if other:
        lines += ["A and B are runs of different tasks (" + "; ".join(other) + "): their accuracies are not "
                  "comparable, so no differences are shown, only the two columns.", ""]
    lines.append(f"{'':<{width}}  {'A':>{col}}  {'B':>{col}}" + ("" if other else f"  {'B - A':>{col}}"))
    for key, v in c["metrics"].items():
        diff = "" if other else f"  {'-' if v['diff'] is None else format(v['diff'], '+.3f'):>{col}}"
        lines.append(f"{labels[key]:<{width}}  {fmt(v['a']):>{col}}  {fmt(v['b']):>{col}}{diff}")
    if c["params_differing"]:
        lines += ["", "settings that differ:"]
        for k, v in c["params_differing"].items():
            lines.append(f"  {k:<{width - 2}}  A={v['a']}  B={v['b']}")
    if c.get("paired"):
        lines += ["", "B - A on the same reviews, accuracy points (95% paired bootstrap interval, McNemar p):"]
        for d in c["paired"]:
            lines.append(f"  {d['set'] + ' / ' + d['method']:<{width - 2}}  {'  '.join(difference_line(d))}")
    elif c.get("paired") is None and "paired" in c and not other:
        lines += ["", "no paired comparison: " + c.get("unpaired_reason", "a run has no stored per-review predictions")]
    if a["registry"] or b["registry"]:
        lines += [""] + [registry_line(n, s["registry"]) for n, s in (("A", a), ("B", b))]
    return "\n".join(lines)


def registry_line(which: str, reg: dict) -> str:
    """What one run registered, under its own registered model's name, and whether it holds that model's alias."""
    name, version = reg.get("model_name"), reg.get("version")
    if not name or not version:
        return f"registry: {which} registered no model version"
    if reg.get("is_champion"):
        return f"registry: {which} holds the `champion` alias of {name} (v{version})"
    return f"registry: {which} is {name} v{version}, not its `champion`"


def report(run_id: str, tracking_uri: str | None = None) -> dict[str, Any]:
    """The summary of a pipeline run (or of the run of one of its stages)."""
    client, uri = open_client(tracking_uri or default_tracking_uri())
    return run_summary(get_pipeline_run(client, run_id, uri), client)


def run_predictions(client, pipeline_run):
    """The per-review predictions table of a pipeline run's evaluate stage (None for runs made before it)."""
    import tempfile

    import pandas as pd

    children = client.search_runs([pipeline_run.info.experiment_id],
                                  f"tags.mlflow.parentRunId = '{pipeline_run.info.run_id}' and "
                                  "attributes.run_name = 'evaluate'")
    if not children:
        return None
    with tempfile.TemporaryDirectory(prefix="ttt-preds-") as tmp:
        try:
            return pd.read_parquet(client.download_artifacts(children[0].info.run_id, "predictions.parquet", tmp))
        except Exception:  # an older run without stored predictions: the comparison is unpaired
            return None


def paired_runs(pa, pb, resamples: int = 2000, seed: int = 0) -> list[dict]:
    """B minus A for every (set, method) both runs scored on the same reviews (same labels in the same order),
    pooled over each run's mask seeds."""
    from ttt_pipeline.evaluation.stats import paired_difference

    out = []
    for (name, method), a in pa.groupby(["set", "method"], sort=False):
        b = pb[(pb["set"] == name) & (pb["method"] == method)]
        if b.empty:
            continue
        ca = a.pivot_table(index="index", columns=a["mask_seed"].fillna(-1), values="pred", aggfunc="first")
        cb = b.pivot_table(index="index", columns=b["mask_seed"].fillna(-1), values="pred", aggfunc="first")
        la = a.drop_duplicates("index").set_index("index")["label"].sort_index()
        lb = b.drop_duplicates("index").set_index("index")["label"].sort_index()
        if not la.equals(lb):
            continue  # not the same reviews: no paired comparison
        d = paired_difference(ca.to_numpy() == la.to_numpy()[:, None], cb.to_numpy() == lb.to_numpy()[:, None],
                              resamples=resamples, seed=seed)
        out.append({"set": name, "method": method, **d.to_dict()})
    return out


def compare(run_a: str, run_b: str, tracking_uri: str | None = None) -> dict[str, Any]:
    """Two pipeline runs side by side, with paired differences where both scored the same reviews."""
    client, uri = open_client(tracking_uri or default_tracking_uri())
    pipeline_a, pipeline_b = get_pipeline_run(client, run_a, uri), get_pipeline_run(client, run_b, uri)
    a, b = run_summary(pipeline_a, client), run_summary(pipeline_b, client)
    c = compare_summaries(a, b)
    c["paired"] = None
    if not same_reviews(a, b):  # paired differences only where both runs scored the same reviews
        c["unpaired_reason"] = "the runs scored different reviews (data content digests differ)"
    else:
        pa, pb = run_predictions(client, pipeline_a), run_predictions(client, pipeline_b)
        c["paired"] = paired_runs(pa, pb) if pa is not None and pb is not None else None
    return c
