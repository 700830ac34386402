"""`ttt-pipeline predict`: classify a file of reviews with a trained model, under any defense.

    ttt-pipeline predict --model models:/ttt-review-classifier@champion --input reviews.csv --output out.jsonl
    ttt-pipeline predict --model <run id | folder> --input reviews.txt --output out.csv --method masked_ttt \\
        --set ttt.steps=3

The formats, the checks and the streaming are those of `ttt_pipeline.io.predict`.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

from ttt_pipeline.defenses import registry
from ttt_pipeline.io import predict

FLAGS = {"input": "--input", "output": "--output", "skip_bad_rows": "--skip-bad-rows", "set": "--set",
         "method": "--method"}
PROGRESS_MIN = 200  # inputs at least this long get a progress bar


class ProgressBar:
    """A tqdm bar in reviews/s on stderr for long inputs (predict_texts reports after every batch)."""

    def __init__(self, total: int):
        self.bar = None
        if total >= PROGRESS_MIN:
            from tqdm import tqdm

            self.bar = tqdm(total=total, unit=" reviews", file=sys.stderr, dynamic_ncols=True, mininterval=1.0)

    def __call__(self, done: int, total: int) -> None:
        if self.bar is not None:
            self.bar.update(done - self.bar.n)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()


def _say(line: str) -> None:
    print(line, file=sys.stderr)


def cmd_predict(args) -> int:
    for k, v in {"TOKENIZERS_PARALLELISM": "false", "TRANSFORMERS_VERBOSITY": "error",
                 "HF_HUB_DISABLE_PROGRESS_BARS": "1", "MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR": "false"}.items():
        os.environ.setdefault(k, v)
    summary = predict.classify_file(args.model, args.input, args.output, text_column=args.text_column,
                                    method=args.method, settings=args.set, skip_bad_rows=args.skip_bad_rows,
                                    tracking_uri=args.tracking_uri, device=args.device, capture=args.capture,
                                    capture_text=not args.capture_no_text, names=FLAGS, report=_say,
                                    progress=None if args.quiet else ProgressBar)
    if args.json:
        sys.stdout.flush()
        print(json.dumps(summary))
    return 0


def _defenses_epilog() -> str:
    """The --method choices, one line per defense of the registry (`registry.describe`)."""
    rows = registry.describe()
    width = max(len(name) for name, _, _ in rows)
    lines = [f"  {name:<{width}}  {kind:<6}  {summary}" for name, kind, summary in rows]
    return "defenses for --method (a method is [repair+...+]engine):\n" + "\n".join(lines)


def add_command(subparsers) -> None:
    p = subparsers.add_parser("predict", help="classify a file of reviews with a trained model (any defense)",
                              description=__doc__.split("\n\n")[0], epilog=_defenses_epilog(),
                              formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", required=True, metavar="SOURCE",
                   help="model folder, MLflow run id, models:/<name>@<alias> or models:/<name>/<version>")
    p.add_argument("--input", required=True, metavar="FILE",
                   help=f"reviews ({', '.join(predict.INPUTS)}), read in chunks of ~{predict.CHUNK_ROWS} rows; a "
                   ".json array is read whole (use .jsonl for large inputs)")
    p.add_argument("--output", required=True, metavar="FILE",
                   help=f"input rows plus label, probability, probabilities ({', '.join(predict.OUTPUTS)})")
    p.add_argument("--text-column", default="text", help="column or field holding the review (default: text)")
    p.add_argument("--method", default=None,
                   help="defense: an engine, a repair, or repairs in front of an engine (spell+masked_ttt); the "
                   "defenses are listed below (default: the model's configured method)")
    p.add_argument("--set", action="append", default=[], metavar="ttt.KEY=VALUE",
                   help="override an inference setting, e.g. ttt.steps=3 (as in `run`)")
    p.add_argument("--skip-bad-rows", action="store_true",
                   help="classify the good rows and list the bad ones (default: bad rows stop the command)")
    p.add_argument("--tracking-uri", default=None,
                   help="MLflow tracking URI for run ids and models:/ (default: $TTT_TRACKING_URI, else "
                   "$MLFLOW_TRACKING_URI, else sqlite:///mlflow.db)")
    p.add_argument("--device", default="auto", help="auto, cpu or cuda (default: auto)")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    p.add_argument("--capture", default=None, metavar="URI",
                   help="also record every review, its prediction and its label-free descriptors into this traffic "
                   "store (a folder or fsspec URL, e.g. the config's monitoring.traffic_uri), for `ttt-pipeline "
                   "monitor`")
    p.add_argument("--capture-no-text", action="store_true",
                   help="with --capture: keep no review text in the store (descriptors and predictions only)")
    p.add_argument("--json", action="store_true", help="print a JSON summary on the last stdout line")
    p.add_argument("--debug", action="store_true", default=argparse.SUPPRESS, help=argparse.SUPPRESS)
    p.set_defaults(fn=cmd_predict)
