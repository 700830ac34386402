"""The run's HTML report (reports/flips.py) from the stored outputs: the clean test reviews (download), each
corrupted copy (corrupt) and every review's prediction (evaluate). Not stored: it is rebuilt in seconds from what
is, and its headline comes from the run's statistics."""

from __future__ import annotations

from ttt_pipeline.config import PipelineConfig
from ttt_pipeline.storage import StepOutput


def flip_report(cfg: PipelineConfig, data: StepOutput, corrupt_out: StepOutput, eval_outs: list[StepOutput],
                summary: dict, cap: int | None = None) -> str:
    """The report's HTML for the run whose headline and statistics are `summary`."""
    from ttt_pipeline.data.prepare import load_prepared
    from ttt_pipeline.reports import flips
    from ttt_pipeline.steps.outputs import load_results, read_predictions, read_set

    ds, _ = load_prepared(data.path)
    preds = read_predictions(eval_outs)
    label_names = load_results(eval_outs)["label_names"]
    clean = list(ds["test"]["text"])
    names = list(dict.fromkeys(preds.loc[preds["kind"] == "corrupted", "set"]))
    default = cfg.evaluation.defense
    repair = _repair(cfg, default, ds)
    sections = [flips.set_section(preds, name, clean, read_set(corrupt_out, name), label_names, default,
                                  cap or flips.CAP, repair) for name in names]
    title = f"Robustness report: {cfg.model.classifier or cfg.model.name} on {cfg.data.path}"
    return flips.render(title, flips.headline_rows({"default_defense": default, **summary}), sections)


def _repair(cfg: PipelineConfig, method: str | None, ds):
    """The method's text repairs as one function (None when it repairs nothing), built as the evaluate step
    builds them: the same settings, the same training vocabulary."""
    from ttt_pipeline.defenses import registry
    from ttt_pipeline.steps.evaluate_step import training_texts

    if not method or not registry.parse(method).repairs:
        return None
    fixes = registry.build_repairs(method, cfg.ttt, {"vocabulary": training_texts(ds)})

    def repair(texts: list[str]) -> list[str]:
        for fix in fixes:
            texts = fix(texts)
        return texts

    return repair
