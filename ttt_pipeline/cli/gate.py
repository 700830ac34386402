"""`run` / `evaluate --fail-if RULE`: the rules parsed before any work, read against the run's figures after it
(evaluation.gate), one line per rule, the job summary written (io.job_summary) and exit EXIT_GATE when a rule holds."""

from __future__ import annotations

import os

EXIT_GATE = 3  # as `reevaluate`'s regression: the check ran and found what it looks for


def add_arguments(parser) -> None:
    parser.add_argument("--fail-if", action="append", default=[], metavar="RULE", dest="fail_if",
                        help="exit 3 when the rule holds, e.g. 'drop.ci_low > 3pt' (the drop's interval lies above 3 "
                        "points) or 'harm/default' (the recommended defense harms a set); repeatable")
    parser.add_argument("--gate-summary", default=None, metavar="FILE",
                        help="where the rules' markdown summary goes (default: $GITHUB_STEP_SUMMARY when set, else "
                        "gate-summary.md)")


def rules(args) -> list:
    from ttt_pipeline.evaluation.gate import parse_rule

    return [parse_rule(text) for text in getattr(args, "fail_if", None) or []]


def apply(summary: dict, cfg, args) -> int:
    """Read the rules against the run; print each, write the job summary, store the outcome in `summary["gate"]`;
    the exit status."""
    from ttt_pipeline.evaluation.gate import check, markdown, run_figures
    from ttt_pipeline.io.job_summary import write_job_summary

    parsed = rules(args)
    if not parsed:
        return 0
    outcomes = check(parsed, run_figures(summary), cfg.evaluation.defense)
    for o in outcomes:
        print(f"gate: {'HOLDS' if o.held else 'holds not'}: {o.rule.text}  ({o.metric} = {o.value:.4g})")
    written = write_job_summary(markdown(outcomes, summary), args.gate_summary, os.environ)
    held = [o.rule.text for o in outcomes if o.held]
    print(f"gate: {'failed' if held else 'passed'} ({len(held)} of {len(outcomes)} rules hold); summary: {written}")
    summary["gate"] = {"passed": not held, "held": held, "summary": str(written),
                       "rules": [{"rule": o.rule.text, "metric": o.metric, "value": o.value, "holds": o.held}
                                 for o in outcomes]}
    return EXIT_GATE if held else 0
