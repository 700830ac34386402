"""Gate rules: a run's figures turned into a pass or a fail, for CI (`run` / `evaluate --fail-if RULE`).

A rule is `FIGURE OP NUMBER` or a bare `FIGURE`. FIGURE is a run's MLflow metric name (`corruption_drop_ci_low`,
`gain/spell/corrupted`, `harm/spell`, `acc_clean`: the MLflow run's Metrics tab), where `.` may stand for
a difference's companion (`corruption_drop.ci_low`), `drop` for `corruption_drop`, `gain` for `defense_gain` and a
path segment `default` for the recommended defense (`harm/default`, `worst/default.ci_high`). OP is one of
< <= > >= == !=; NUMBER is in the metric's own unit (accuracies and differences are fractions) unless it ends in
`pt`, percentage points (`drop.ci_low > 3pt` is `corruption_drop_ci_low > 0.03`). A bare figure holds when it is not
0 (the 1/0 flags: `harm/default`, `defense_gain_significant`). A rule that holds fails the gate.

MLflow's own `MetricThreshold` compares one metric with a baseline model's and raises; a gate over an interval's
bound, a flag or a threshold in points, with every rule's value reported, is what a CI job needs, hence this module.
"""

from __future__ import annotations

import dataclasses
import operator
import re

from ttt_pipeline.errors import ConfigError

OPS = {"<=": operator.le, ">=": operator.ge, "==": operator.eq, "!=": operator.ne, "<": operator.lt, ">": operator.gt}
_RULE = re.compile(r"\s*(?P<figure>[A-Za-z_][\w/:.\-]*?)\s*(?:(?P<op><=|>=|==|!=|<|>)\s*"
                   r"(?P<value>[-+]?(?:\d+\.?\d*|\.\d+))\s*(?P<unit>pt)?)?\s*")
ALIASES = {"drop": "corruption_drop", "gain": "defense_gain"}
COMPANIONS = ("ci_low", "ci_high", "p_mcnemar", "helped", "hurt", "significant")
# what a figure's name may start with: the headline scalars, the statistics and the per-set / per-method families
_KNOWN_ROOTS = re.compile(
    r"(acc_\w+|recovered_fraction|macro_f1_clean|corruption_drop|defense_gain|defense_clean_change|"
    r"defense_external_gain|external_drop|ttt_gain|ttt_clean_change|ttt_shift_change_\w+)"
    rf"(_({'|'.join(COMPANIONS)}))?|(worst|harm|gain|drop|mce|rel_mce|flip_rate|augment)/.+")
HINT = ("a rule is FIGURE OP NUMBER or a bare FIGURE, e.g. 'drop.ci_low > 3pt' or 'harm/default'; FIGURE is a "
        "metric name of the run (ttt-pipeline report RUN_ID lists them), OP one of < <= > >= == !=")


@dataclasses.dataclass(frozen=True)
class Rule:
    text: str
    figure: str  # the metric name, aliases resolved except `default` (the run's recommended defense)
    op: str | None  # None: a bare figure, holds when not 0
    value: float | None  # in the metric's unit (`pt` divided by 100)


@dataclasses.dataclass(frozen=True)
class Outcome:
    rule: Rule
    metric: str  # the metric the rule read
    value: float
    held: bool  # true: the rule holds, the gate fails


def parse_rule(text: str) -> Rule:
    """A rule from its text; a ConfigError naming the rule and the grammar when it is not one, or when its figure
    is no figure a run reports."""
    m = _RULE.fullmatch(text or "")
    if m is None:
        raise ConfigError(f"gate rule {text!r} is not FIGURE OP NUMBER or a bare FIGURE", HINT)
    value = None if m["value"] is None else float(m["value"]) / (100 if m["unit"] else 1)
    figure = _canonical(m["figure"])
    if not _KNOWN_ROOTS.fullmatch(figure):
        raise ConfigError(f"gate rule {text!r}: {m['figure']!r} is not a figure a run reports", HINT)
    return Rule(text.strip(), figure, m["op"], value)


def _canonical(name: str) -> str:
    head, _, companion = name.partition(".")
    head = head if "/" in head else ALIASES.get(head, head)
    return f"{head}_{companion}" if companion else head


def _metric(figure: str, tag: str) -> str:
    """The figure with a `default` path segment (`harm/default`, `worst/default_ci_low`) naming the defense `tag`."""
    segs = figure.split("/")
    for i in range(1, len(segs)):
        if segs[i] == "default" or segs[i].startswith("default_"):
            segs[i] = tag + segs[i][len("default"):]
    return "/".join(segs)


def check(rules: list[Rule], figures: dict[str, float], default_defense: str | None) -> list[Outcome]:
    """Each rule read against a run's figures (`figures`: metric name -> value). A figure the run does not have
    is a ConfigError that lists the ones it has."""
    from ttt_pipeline.evaluation.scoring import method_tag

    tag = method_tag(default_defense or "none")
    out = []
    for rule in rules:
        metric = _metric(rule.figure, tag)
        if metric not in figures:
            known = sorted(figures)
            shown = ", ".join(known[:40]) + (f" and {len(known) - 40} more" if len(known) > 40 else "")
            raise ConfigError(f"gate rule {rule.text!r}: this run has no figure {metric!r}",
                              f"the run's figures: {shown}")
        value = float(figures[metric])
        held = bool(value) if rule.op is None else bool(OPS[rule.op](value, rule.value))
        out.append(Outcome(rule, metric, value, held))
    return out


def run_figures(summary: dict) -> dict[str, float]:
    """A run summary's figures: its MLflow metrics (robustness.flat_metrics) and its numeric headline keys."""
    from ttt_pipeline.evaluation.robustness import flat_metrics

    out = {k: float(v) for k, v in summary.items()
           if isinstance(v, (int, float)) and not isinstance(v, bool) and _KNOWN_ROOTS.fullmatch(k)}
    out.update(flat_metrics(summary))
    return out


def markdown(outcomes: list[Outcome], summary: dict, title: str = "ttt-pipeline gate") -> str:
    """The job summary: verdict, one row per rule with the value it read, the run's headline and its MLflow run."""
    held = [o for o in outcomes if o.held]
    verdict = f"failed: {len(held)} of {len(outcomes)} rules hold" if held else f"passed: no rule of {len(outcomes)} holds"
    lines = [f"## {title}: {verdict}", "", "| rule | figure | value | holds (fails the gate) |", "|---|---|---|---|"]
    lines += [f"| `{o.rule.text}` | `{o.metric}` | {o.value:.4g} | {'**yes**' if o.held else 'no'} |" for o in outcomes]
    lines += ["", *headline_lines(summary)]
    if summary.get("mlflow_run_id"):
        lines.append(f"MLflow run `{summary['mlflow_run_id']}` (`ttt-pipeline report {summary['mlflow_run_id']}`)")
    return "\n".join(lines) + "\n"


def headline_lines(summary: dict) -> list[str]:
    def acc(key: str) -> str:
        return f"{summary[key]:.3f}" if isinstance(summary.get(key), (int, float)) else "-"

    def points(d: dict | None) -> str:
        return "-" if not d else f"{100 * d['delta']:+.2f} [{100 * d['ci_low']:+.2f}, {100 * d['ci_high']:+.2f}] points"

    gain = summary.get("defense_gain")
    named = f" `{gain['method']}`" if gain and gain.get("method") else ""
    return [f"- accuracy: clean {acc('acc_clean')}, corrupted {acc('acc_corrupted')}, "
            f"under the recommended defense {acc('acc_default')}",
            f"- drop under noise: {points(summary.get('corruption_drop'))}",
            f"- recommended defense{named} wins back: {points(gain)}", ""]
