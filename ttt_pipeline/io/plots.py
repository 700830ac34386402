"""Plots of a run, as pure functions: data in, a matplotlib Figure (or PNG files) out.

Figures are built with the object API (`matplotlib.figure.Figure`) on the Agg canvas, never pyplot: no global
figure registry, so plotting is safe from Prefect's worker threads and leaks nothing. Inputs are the stored
step outputs: `history.json` of the finetune step ({"epochs": [...], "mlm_warmup": [...], "dapt": [...]}) and
`results.json` of the evaluate step (rows of kind/set/family/severity/method/acc/recall/confusion...).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from ttt_pipeline.defenses import registry

# a combination of defenses, or one without a style of its own in the registry
_EXTRA = ["#8c564b", "#e377c2", "#bcbd22", "#17becf", "#ff7f0e"]


def _label(m: str) -> str:
    return registry.label(m)


def _style(m: str, i: int) -> dict:
    return registry.style(m) or dict(color=_EXTRA[i % len(_EXTRA)], marker="P" if "+" in m else "x")
DPI = 100


def _figure(w: float, h: float) -> Figure:
    fig = Figure(figsize=(w, h), dpi=DPI, layout="constrained")
    FigureCanvasAgg(fig)
    return fig


def save(fig: Figure, path: str | Path) -> Path:
    """Write a figure as PNG (parents created) and return the path."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, format="png", dpi=DPI)
    return path


def _smooth(values: list[float], window: int) -> np.ndarray:
    v = np.asarray(values, dtype=float)
    if window <= 1 or len(v) < window:
        return v
    kernel = np.ones(window) / window
    head = np.cumsum(v[: window - 1]) / np.arange(1, window)  # running mean while the window fills
    return np.concatenate([head, np.convolve(v, kernel, mode="valid")])


# ---------------------------------------------------------------- fine-tune


def _epoch_series(epochs: list[dict], key: str) -> list[tuple[int, float]]:
    return [(r["epoch"], r[key]) for r in epochs if r.get(key) is not None]


def training_curves(history: dict) -> Figure:
    """Per epoch: classification losses, validation scores and (joint/dapt training) the MLM loss; plus the
    MLM-head warm-up and DAPT curves per step when present."""
    epochs = history.get("epochs") or []
    panels: list[tuple[str, str, str, list[tuple[str, str, str]]]] = [
        ("Classification loss per epoch", "epoch", "cross-entropy",
         [("train_loss", "train", "-o"), ("val_loss", "validation", "--s")]),
        ("Validation scores per epoch", "epoch", "score",
         [("val_acc", "validation accuracy", "-o"), ("val_macro_f1", "validation macro-F1", "-s")])]
    if _epoch_series(epochs, "train_mlm_loss"):
        panels.append(("MLM loss per epoch (joint training)", "epoch", "MLM loss",
                       [("train_mlm_loss", "train MLM loss", "-^")]))
    steps = [(k, t) for k, t in (("mlm_warmup", "MLM-head warm-up loss"), ("dapt", "Domain-adaptive MLM loss"))
             if history.get(k)]
    n = len(panels) + len(steps)
    cols = min(3, n)
    nrows = -(-n // cols)
    fig = _figure(4.8 * cols, 3.6 * nrows)
    axes = fig.subplots(nrows, cols, squeeze=False).ravel()
    x = [r["epoch"] for r in epochs]
    for ax, (title, xlabel, ylabel, series) in zip(axes, panels):
        for key, label, style in series:
            pts = _epoch_series(epochs, key)
            if pts:
                ax.plot(*zip(*pts), style, label=label)
        ax.set(title=title, xlabel=xlabel, ylabel=ylabel)
        if ylabel == "score":
            ax.set_ylim(0, 1.02)
        if x:
            ax.set_xticks(x)
    for ax, (key, title) in zip(axes[len(panels):], steps):
        vals = history[key]
        ax.plot(range(1, len(vals) + 1), vals, color="#bbbbbb", lw=0.8, label="per step")
        w = max(1, len(vals) // 20)
        if w > 1:
            ax.plot(range(1, len(vals) + 1), _smooth(vals, w), color="#1f77b4", label=f"running mean ({w})")
        ax.set(title=f"{title} ({len(vals)} steps)", xlabel="step", ylabel="MLM loss")
    for ax in axes[:n]:
        ax.grid(alpha=0.3)
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=8)
    for ax in axes[n:]:
        ax.set_visible(False)
    fig.suptitle("Fine-tuning")
    return fig


# ---------------------------------------------------------------- evaluation


def clean_accuracy(rows: list[dict], method: str) -> float | None:
    vals = [r["acc"] for r in rows if r["kind"] == "clean" and r["method"] == method]
    return float(np.mean(vals)) if vals else None


def severity_series(rows: list[dict]) -> dict[str, dict[str, list[tuple]]]:
    """family -> method -> [(severity, accuracy, ci_low, ci_high)] sorted by severity, from the corrupted rows
    (accuracy averaged over mask seeds; the interval of the first seed's row, or the accuracy itself)."""
    from ttt_pipeline.evaluation.scoring import seed_means

    out: dict[str, dict[str, list[tuple]]] = {}
    for r in seed_means(rows):
        if r["kind"] != "corrupted":
            continue
        acc = float(r["acc"])
        out.setdefault(r["family"], {}).setdefault(r["method"], []).append(
            (int(r["severity"]), acc, float(r.get("acc_ci_low", acc)), float(r.get("acc_ci_high", acc))))
    for fam in out.values():
        for m in fam:
            fam[m].sort()
    return out


def accuracy_vs_severity(rows: list[dict]) -> Figure:
    """One panel per corruption family: accuracy against severity per method; dotted lines: clean accuracy."""
    series = severity_series(rows)
    fams = list(series) or ["(no corrupted sets)"]
    cols = min(3, len(fams))
    nrows = -(-len(fams) // cols)
    fig = _figure(4.6 * cols, 3.6 * nrows)
    axes = fig.subplots(nrows, cols, squeeze=False).ravel()
    methods = list(dict.fromkeys(r["method"] for r in rows))
    for ax, fam in zip(axes, fams):
        for i, m in enumerate(methods):
            pts = series.get(fam, {}).get(m)
            if pts:
                sev, acc, lo, hi = map(np.asarray, zip(*pts))
                dx = (i - (len(methods) - 1) / 2) * 0.06  # equal values stay visible side by side
                ax.errorbar(sev + dx, acc, yerr=[np.maximum(acc - lo, 0), np.maximum(hi - acc, 0)], capsize=3,
                            label=_label(m), **_style(m, i))
            clean = clean_accuracy(rows, m)
            if clean is not None:
                ax.axhline(clean, ls=":", lw=1, color=_style(m, i)["color"], label=f"clean, {_label(m)}")
        ax.set(title=fam, xlabel="severity", ylabel="accuracy", ylim=(0, 1.02), xlim=(0.5, 5.5), xticks=range(1, 6))
        ax.grid(alpha=0.3)
    for ax in axes[len(fams):]:
        ax.set_visible(False)
    handles, labels = axes[0].get_legend_handles_labels()
    if handles:
        fig.legend(handles, labels, fontsize=8, loc="outside lower center", ncols=min(4, len(handles)))
    fig.suptitle("Accuracy versus corruption severity per defense, 95% bootstrap intervals (dotted: clean text)")
    return fig


def aggregate_confusion(rows: list[dict], kind: str, method: str) -> np.ndarray | None:
    """Summed confusion matrix (true x predicted) of every row of this kind and method; None if none."""
    mats = [np.asarray(r["confusion"], dtype=np.int64) for r in rows if r["kind"] == kind and r["method"] == method]
    return np.sum(mats, axis=0) if mats else None


def recall_from_confusion(m: np.ndarray) -> np.ndarray:
    support = m.sum(1).astype(float)
    return np.divide(np.diag(m).astype(float), support, out=np.full(len(m), np.nan), where=support > 0)


def confusion_panels(rows: list[dict], default_defense: str | None = None) -> list[tuple[str, np.ndarray]]:
    """(title, matrix) for clean, corrupted (all corrupted sets pooled), corrupted under the recommended defense
    (`evaluation.default_defense`), then the registry's headline defenses (masked TTT, Tent) when they were scored and
    are not the default."""
    panels = []
    wanted = [("clean", "clean", "none"), ("corrupted", "corrupted", "none")]
    if default_defense and default_defense != "none":
        wanted.append((f"corrupted + {_label(default_defense)} (default)", "corrupted", default_defense))
    wanted += [(f"corrupted + {_label(m)}", "corrupted", m) for m in registry.headline_methods() if m != default_defense]
    for title, kind, method in wanted:
        m = aggregate_confusion(rows, kind, method)
        if m is not None:
            panels.append((title, m))
    return panels


def confusion_matrices(rows: list[dict], label_names: list[str], default_defense: str | None = None) -> Figure:
    """Row-normalised confusion matrices (colour) with counts (text)."""
    panels = confusion_panels(rows, default_defense) or [("(no results)", np.zeros((len(label_names), len(label_names)), int))]
    k = len(label_names)
    size = max(3.4, 0.55 * k + 1.8)
    fig = _figure(size * len(panels) + 1.0, size + 0.9)
    axes = fig.subplots(1, len(panels), squeeze=False)[0]
    im = None
    for ax, (title, m) in zip(axes, panels):
        support = m.sum(1, keepdims=True)
        norm = np.divide(m, support, out=np.zeros(m.shape), where=support > 0)
        im = ax.imshow(norm, vmin=0, vmax=1, cmap="Blues")
        acc = np.trace(m) / max(1, m.sum())
        ax.set(title=f"{title}\nacc {acc:.3f}, n={int(m.sum())}", xlabel="predicted", ylabel="true",
               xticks=range(k), yticks=range(k), xticklabels=label_names, yticklabels=label_names)
        if k <= 12:
            for i in range(k):
                for j in range(k):
                    ax.text(j, i, str(int(m[i, j])), ha="center", va="center", fontsize=8,
                            color="white" if norm[i, j] > 0.5 else "black")
    if im is not None:
        fig.colorbar(im, ax=list(axes), shrink=0.8, label="share of true class")
    fig.suptitle("Confusion matrices")
    return fig


def per_class_recall(rows: list[dict], label_names: list[str], default_defense: str | None = None) -> Figure:
    """Grouped bars: recall of every class on clean, corrupted and defended corrupted text."""
    panels = confusion_panels(rows, default_defense)
    k = len(label_names)
    fig = _figure(max(6.0, 0.9 * k * max(1, len(panels)) / 2 + 3), 4.0)
    ax = fig.subplots()
    width = 0.8 / max(1, len(panels))
    colors = ["#7f7f7f", "#d62728", "#2ca02c", "#1f77b4"]
    for i, (title, m) in enumerate(panels):
        rec = recall_from_confusion(m)
        ax.bar(np.arange(k) + (i - (len(panels) - 1) / 2) * width, np.nan_to_num(rec), width, label=title,
               color=colors[i % len(colors)])
    ax.set(title="Per-class recall", xlabel="class", ylabel="recall", ylim=(0, 1.05), xticks=range(k),
           xticklabels=label_names)
    ax.grid(axis="y", alpha=0.3)
    if panels:
        ax.legend(fontsize=8)
    return fig


def grid_table(rows: list[dict], comparisons: list[dict] | None = None) -> list[dict]:
    """The evaluation grid as flat table rows (no matrices), for table artifacts: accuracy (mean over mask
    seeds) and, for a defense, its paired difference from `none` on the same set with interval and verdict."""
    from ttt_pipeline.evaluation.scoring import seed_means
    from ttt_pipeline.evaluation.stats import verdict

    diffs = {(c["set"], c["method"]): c for c in comparisons or [] if c["comparison"] == "method"}
    out = []
    for r in seed_means(rows):
        d = diffs.get((r["set"], r["method"]))
        out.append({"kind": r["kind"], "set": r["set"], "family": r.get("family") or "",
                    "severity": "" if r.get("severity") is None else int(r["severity"]),
                    "method": r["method"], "mask_seeds": len(r.get("mask_seeds") or []) or "",
                    "acc": round(float(r["acc"]), 4), "macro_f1": round(float(r["macro_f1"]), 4),
                    "vs_none": "" if d is None else round(d["delta"], 4),
                    "ci_low": "" if d is None else round(d["ci_low"], 4),
                    "ci_high": "" if d is None else round(d["ci_high"], 4),
                    "p_mcnemar": "" if d is None else round(d["p_mcnemar"], 4),
                    "verdict": "" if d is None else verdict(d), "n": int(r["n"]),
                    "samples_per_s": round(float(r.get("samples_per_s", 0.0)), 1)})
    return out


# ---------------------------------------------------------------- files

FINETUNE_PLOTS = ("training_curves.png",)
EVALUATION_PLOTS = ("accuracy_vs_severity.png", "confusion_matrices.png", "per_class_recall.png")


def write_finetune_plots(history: dict, out_dir: str | Path) -> list[Path]:
    return [save(training_curves(history), Path(out_dir) / "training_curves.png")]


def write_evaluation_plots(results: dict, out_dir: str | Path, default_defense: str | None = None) -> list[Path]:
    rows, names = results["rows"], results["label_names"]
    out = Path(out_dir)
    return [save(accuracy_vs_severity(rows), out / "accuracy_vs_severity.png"),
            save(confusion_matrices(rows, names, default_defense), out / "confusion_matrices.png"),
            save(per_class_recall(rows, names, default_defense), out / "per_class_recall.png")]


def png_size(path: str | Path) -> tuple[int, int]:
    """(width, height) read from a PNG header."""
    with open(path, "rb") as f:
        head = f.read(24)
    if head[:8] != b"\x89PNG\r\n\x1a\n":
        raise ValueError(f"{path} is not a PNG file")
    return int.from_bytes(head[16:20], "big"), int.from_bytes(head[20:24], "big")
