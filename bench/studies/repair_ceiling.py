"""How much of the tutorial composite's drop could input repair win back at best? Measured on validation reviews.

The tutorial composite (torch-ttt's corruption) deletes words, shuffles inner letters and swaps, drops and repeats
characters. A word-level repair can at best turn every altered word back into the word it was; deleted words are
gone. This bench trains bench/defenses.py's model and scores, on the validation split of that bench (corrupted with
each of `--val-seeds`; the test reviews are never read):

- `clean`, `corrupted` (no defense), `spell` (the presets' default defense, with the training vocabulary);
- `restored`: the oracle repair, each corrupted text with every surviving word put back as it was written (the
  corruption's word pass run again on its own random stream, so the survivors are known exactly); what is left
  is the deletions.

Recovered fraction = (defended - corrupted) / (clean - corrupted), pooled over the draws per review, with the
paired bootstrap interval of `ttt_pipeline.evaluation.stats`. The oracle's fraction is the ceiling of every
word-level repair; spell's fraction divided by it is the share of the reachable gain that spell already takes.

    .venv/bin/python -m bench.studies.repair_ceiling [--seeds 51] [--split-seed 2029] [--val-seeds 7 8 9 10 11]

The last stdout line is one JSON object.
"""

from __future__ import annotations

import argparse
import json
import sys
import time

import numpy as np

from bench.common import load_domain, skipped_without_mdsd
from bench.defenses import Scorer, train_model
from ttt_pipeline.corruption import corrupt_texts
from ttt_pipeline.corruption.registry import get_family
from ttt_pipeline.corruption.rng import text_rng
from ttt_pipeline.corruption.tutorial import TUTORIAL_WORD_PROB, word_pass


def surviving_words(text: str, seed: int) -> list[str]:
    """The words of `text` that the tutorial composite (seed `seed`) keeps, as written before it alters them:
    its word pass run again on the same per-text random stream (the char pass draws after it)."""
    fam = get_family("tutorial")
    words = text.split()
    survivors = word_pass(words, TUTORIAL_WORD_PROB, text_rng(seed, fam.name, fam.fixed_stream, text))
    return [words[i] for i, _ in survivors]


def restored(texts: list[str], corrupted: list[str], seed: int) -> list[str]:
    """The oracle repair: each corrupted text with its surviving words as they were written."""
    out = []
    for text, bad in zip(texts, corrupted):
        kept = surviving_words(text, seed)
        # the replay must meet the corruption word for word (a word whose letters were all dropped leaves "")
        if len(kept) != len(bad.split(" ")):
            raise AssertionError(f"replay of the tutorial word pass diverged on {text[:60]!r}")
        out.append(" ".join(kept))
    return out


def main() -> None:
    from ttt_pipeline.evaluation.stats import paired_difference, recovered_fraction_interval

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--seeds", type=int, nargs="+", default=[51], help="training seeds")
    p.add_argument("--split-seed", type=int, default=2029)
    p.add_argument("--val-seeds", type=int, nargs="+", default=[7, 8, 9, 10, 11])
    p.add_argument("--train-size", type=int, default=1400)
    p.add_argument("--val-size", type=int, default=200)
    p.add_argument("--epochs", type=int, default=4)
    p.add_argument("--max-length", type=int, default=128)
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--warmup-steps", type=int, default=400)
    args = p.parse_args()
    if skipped_without_mdsd():
        return
    t0 = time.perf_counter()
    texts, labels = load_domain("electronics", args.split_seed)
    cut = int(0.8 * len(texts))
    train = (texts[:args.train_size], labels[:args.train_size])
    val_t, val_y = texts[cut - args.val_size:cut], labels[cut - args.val_size:cut]
    draws = {vs: corrupt_texts(val_t, "tutorial", 3, vs).texts for vs in args.val_seeds}
    oracle = {vs: restored(val_t, bad, vs) for vs, bad in draws.items()}
    scorer = Scorer(args, train[0])
    cols: dict[str, list[np.ndarray]] = {"clean": [], "corrupted": [], "spell": [], "restored": []}
    for seed in args.seeds:
        model, tok, _ = train_model(seed, train, args, augment=False)
        settings = scorer.base
        clean = scorer.run(model, tok, "none", val_t, val_y, settings)[0]
        for vs in args.val_seeds:  # the clean column repeats per draw, so every matrix has the same draws
            cols["clean"].append(clean)
            cols["corrupted"].append(scorer.run(model, tok, "none", draws[vs], val_y, settings)[0])
            cols["spell"].append(scorer.run(model, tok, "spell", draws[vs], val_y, settings)[0])
            cols["restored"].append(scorer.run(model, tok, "none", oracle[vs], val_y, settings)[0])
        print(f"[ceiling] seed {seed}: " + ", ".join(f"{k} {np.mean(v[-len(args.val_seeds):]):.4f}"
                                                      for k, v in cols.items()), file=sys.stderr)
    m = {k: np.column_stack(v) for k, v in cols.items()}
    kw = {"resamples": 2000, "seed": 0}
    out = {"accuracy": {k: float(v.mean()) for k, v in m.items()},
           "drop": paired_difference(m["corrupted"], m["clean"], **kw).to_dict()}
    for name in ("spell", "restored"):
        point, lo, hi = recovered_fraction_interval(m["clean"], m["corrupted"], m[name], **kw)
        out[name] = {"recovered_fraction": point, "recovered_ci": [lo, hi],
                     "gain": paired_difference(m["corrupted"], m[name], **kw).to_dict()}
    out["spell_vs_restored"] = paired_difference(m["restored"], m["spell"], **kw).to_dict()
    out["settings"] = {"seeds": args.seeds, "split_seed": args.split_seed, "val_seeds": args.val_seeds,
                       "val_reviews": len(val_t), "train": args.train_size, "epochs": args.epochs}
    out["wall_s"] = time.perf_counter() - t0
    print(json.dumps(out, default=float))


if __name__ == "__main__":
    main()
