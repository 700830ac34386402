"""Time the whole corruption suite (every family x severities 1-5).

Budget from the issue: 2,000 reviews of ~110 words in under 30 s on 2 cores.
The suite is single-process, so this measures one core; the 2-core budget
leaves room for the rest of the pipeline.  Uses the real MDSD electronics
reviews when ../shared/data/mdsd is present, synthetic reviews otherwise.

    .venv/bin/python -m bench.corruption_speed [--n 2000] [--data-dir PATH]

The last stdout line is one JSON object (for CI parsing).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from bench import REPO
from ttt_pipeline.corruption import SEVERITY_RATES, corrupt_texts, list_families
from ttt_pipeline.corruption.samples import synthetic_reviews

DEFAULT_DATA = REPO.parent / "shared" / "data" / "mdsd"


def load_reviews(data_dir: Path, n: int) -> list[str]:
    """The first `n` non-empty electronics review texts, read by the library's MDSD reader."""
    from ttt_pipeline.data.readers import read_mdsd_folder

    texts = [" ".join(t.split()) for t in read_mdsd_folder(data_dir / "electronics").text]
    return [t for t in texts if t][:n]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=2000)
    ap.add_argument("--data-dir", type=Path, default=DEFAULT_DATA)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)

    texts = load_reviews(args.data_dir, args.n) if args.data_dir.is_dir() else []
    source = f"MDSD electronics ({args.data_dir})"
    if len(texts) < args.n:
        print(f"note: found {len(texts)} MDSD reviews under {args.data_dir}; "
              f"using {args.n} synthetic reviews instead")
        texts = synthetic_reviews(args.n, seed=args.seed)
        source = "synthetic"
    mean_words = sum(len(t.split()) for t in texts) / max(len(texts), 1)
    print(f"texts: {len(texts)} from {source}, mean {mean_words:.1f} words")

    per_family: dict[str, float] = {}
    rates: dict[str, list[float]] = {}
    t_all = time.perf_counter()
    for fam in list_families():
        t0 = time.perf_counter()
        rates[fam] = [corrupt_texts(texts, fam, sev, args.seed).realised_edit_rate for sev in SEVERITY_RATES]
        per_family[fam] = time.perf_counter() - t0
    total = time.perf_counter() - t_all

    print(f"{'family':<13} {'seconds':>8}  realised edit rate at severity 1..5")
    for fam, secs in per_family.items():
        print(f"{fam:<13} {secs:8.2f}  " + " ".join(f"{r:6.3f}" for r in rates[fam]))
    print(f"{'target':<13} {'':>8}  " + " ".join(f"{r:6.3f}" for r in SEVERITY_RATES.values()))
    n_runs = len(per_family) * len(SEVERITY_RATES)
    print(json.dumps({
        "n_texts": len(texts), "source": source, "mean_words": round(mean_words, 1),
        "families": len(per_family), "severities": len(SEVERITY_RATES),
        "total_s": round(total, 3), "texts_per_s": round(len(texts) * n_runs / total, 1),
        "per_family_s": {k: round(v, 3) for k, v in per_family.items()},
    }))
    return 0


if __name__ == "__main__":
    sys.exit(main())
