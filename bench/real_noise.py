"""Do the defenses carry to noise this project did not write? Issue 61's table: real human misspellings, the tutorial
composite and nlpaug's `ext:*` families on a test set large enough to resolve 2-point effects (rt-polarity, about
5,800 snippets), and MDSD electronics (400 long reviews) for comparison.

Protocol, fixed before the test run. For each preset (`--preset`) and training seed (`--seeds`, finetune.seed) the
preset's recipe fine-tunes through the library's steps (download, tokenise, finetune; the split does not depend on
the seed). Methods: `none`; `spell` (the default defense); `spell_context` (spell with `ttt.spell.ranking=context`,
`ttt.spell.gate=3`); `anchored_tta` and its no-gradient control `anchored_tta_views` (the same views averaged).
Every masked method is scored once per mask seed (`--mask-seeds`). Two choices are made on the preset's validation
split only (its snippets corrupted as the test set is, seed `corruption.seed`), pooled over reviews x seeds:

1. Severity of `misspelling`: the one of 1-5 whose drop (clean minus corrupted, `none`) is closest to, but at
   least, 3 points; the largest severity where none reaches 3 (then `severity_reached_target` is false); `--quick`:
   3 only.
2. Anchored TTA's lr x steps x views, from LRS x STEPS x VIEWS (`--quick`: lr 1e-4, 1 step, 2 views): the highest
   mean validation gain of `anchored_tta` over `anchored_tta_views` (the same views) on `misspelling` at the chosen
   severity (in points, rounded to 0.001); ties to the smaller lr, then fewer steps, then fewer views.

The test run then scores every method with those values on clean, `misspelling` at the chosen severity, and the
other sets (`--sets`: `tutorial` and the `ext:*` families, at the preset's own severity, 3): `none`, `spell` and
`spell_context` on every test snippet; `anchored_tta`, `anchored_tta_views` and `none` beside them on a seeded sample
(seed 0) of `--tta-test-size` test snippets (default 1,000; 0: all), the same snippets on every set and seed, because
anchored TTA's gradient steps cost about 0.1 s a snippet on a 2-core CPU (7 sets x 3 seeds x 5,798 snippets would
take hours). Its comparisons (gain over `none`, minus its control) are paired on that sample. Reported with paired
95% bootstrap intervals over reviews (reviews x seeds x mask seeds pooled per review, stats.paired_difference):
the drop of `misspelling`; each defense's gain over `none` on every set; the default defense's recovered fraction
of the misspelling drop (metrics.recovered_fraction; interval: stats.recovered_fraction_interval, bootstrap over
reviews, seed 0); `anchored_tta` minus `anchored_tta_views` on every set. `harmed` lists the (defense, set) pairs
whose gain's interval lies below 0; `worst_ext` the default defense's lowest gain on an `ext:*` family.

    .venv/bin/python -m bench.real_noise                        # both presets, seeds 42 43 44, every test snippet
    .venv/bin/python -m bench.real_noise --quick --json         # smoke: 48 training, 40 val/test snippets, 1 seed

Steps, the two validation choices and the anchored-TTA scores are cached in `--store` (default
.cache/bench/store-real-noise, its raw downloads shared with the other benches'), so an interrupted run resumes. MDSD electronics is skipped with a message where its reviews are absent.
Last stdout line: one JSON object; without --json a readable table goes to stderr first.
"""

from __future__ import annotations

import argparse
import json
import random
import time
from pathlib import Path

import numpy as np

from bench import REPO
from bench.common import MDSD, MODEL, have_mdsd, log

PRESETS = ("rt-polarity", "mdsd-electronics")
METHODS = ("none", "spell", "spell_context", "anchored_tta", "anchored_tta_views")
CONTEXT_SPELL = ("ttt.spell.ranking=context", "ttt.spell.gate=3")
EXT_SETS = ("tutorial", "ext:keyboard", "ext:ocr", "ext:random_char", "ext:spelling")
SEVERITIES = (1, 2, 3, 4, 5)
TARGET_DROP = 3.0  # points
LRS, STEPS, VIEWS = (1e-4, 3e-4, 1e-3), (1, 2), (2,)
QUICK_GRID = ((1e-4,), (1,), (2,))
DIFF_KEYS = ("delta", "ci_low", "ci_high", "significant", "n")


def points(d) -> dict:
    """A stats.Difference in points (2 decimals), its significance and review count."""
    out = {k: getattr(d, k) for k in DIFF_KEYS}
    return out | {k: round(100 * out[k], 2) for k in ("delta", "ci_low", "ci_high")}


def overrides(preset: str, seed: int, args) -> list[str]:
    """The config's `--set`s for one preset and training seed (the bench's store, model, sizes, scoring)."""
    sets = [f"store={args.store}", f"model.name={MODEL}", f"finetune.seed={seed}", "ttt.score_clean=true",
            f"ttt.mask_seeds={args.mask_seeds}", "evaluation.signal_reviews=0", "attribution.enabled=false"]
    if preset == "mdsd-electronics":
        sets += [f"data.path={MDSD / 'electronics'}", "data.shift={}"]
    if args.test_size:
        sets.append(f"data.max_test_samples={args.test_size}")
    if args.quick:
        sets += ["data.max_train_samples=48", "finetune.epochs=1", "finetune.mlm_warmup_max_steps=2"]
    return sets


def config(preset: str, seed: int, args, *extra: str):
    from ttt_pipeline.config import load_config

    return load_config(preset, overrides(preset, seed, args) + list(extra))


def train(preset: str, seed: int, args) -> dict:
    """The recipe fine-tuned through the library's steps: its config, store, data and model outputs."""
    from ttt_pipeline import steps
    from ttt_pipeline.storage import StepStore

    cfg = config(preset, seed, args)
    st = StepStore(cfg.store)
    data = steps.download(cfg, st)
    model_out = steps.finetune(cfg, data, steps.tokenise(cfg, data, st), st)
    log(f"{preset} seed {seed}: model {'cached' if model_out.cached else 'trained'}")
    return {"preset": preset, "seed": seed, "cfg": cfg, "store": st, "data": data, "model": model_out}


def validation_sets(run: dict, severities, args) -> list:
    """Validation snippets (a seeded `--val-size` sample), clean and corrupted by `misspelling` at each severity."""
    from ttt_pipeline.corruption import corrupt_texts
    from ttt_pipeline.data.prepare import load_prepared
    from ttt_pipeline.evaluation.grid import TestSet

    val = load_prepared(run["data"].path)[0]["validation"]
    rows = list(zip(val["text"], val["label"]))
    if args.val_size and args.val_size < len(rows):
        rows = random.Random(0).sample(rows, args.val_size)
    texts, labels = [t for t, _ in rows], [y for _, y in rows]
    sets = [TestSet("clean", "clean", texts, labels)]
    for s in severities:
        cs = corrupt_texts(texts, "misspelling", s, run["cfg"].corruption.seed)
        sets.append(TestSet("corrupted", f"misspelling-{s}", cs.texts, labels, "misspelling", s))
    return sets


def score_sets(run: dict, sets: list, cfg) -> dict[tuple[str, str], np.ndarray]:
    """Every (set, method) of cfg.ttt.methods on `sets` with the run's model: correctness, reviews x mask seeds."""
    from ttt_pipeline import steps
    from ttt_pipeline.data.prepare import load_prepared
    from ttt_pipeline.evaluation import grid
    from ttt_pipeline.modeling.loading import load_model
    from ttt_pipeline.modeling.train import set_threads

    set_threads()
    machine = steps.runtime(cfg)
    model, tok = load_model(Path(run["model"].path) / "model", machine.device)
    train_texts = lambda: load_prepared(run["data"].path)[0]["train"]["text"]  # noqa: E731
    _, preds = grid.score_grid(grid.jobs(sets, cfg.ttt), model, tok, cfg.ttt, cfg.evaluation, cfg.model.max_length,
                               machine.device, grid.build_repairs(cfg.ttt, train_texts), amp=machine.score.dtype)
    out: dict[tuple[str, str], list] = {}
    for p in preds:
        out.setdefault((p["set"], p["method"]), []).append(np.asarray(p["pred"]) == np.asarray(p["label"]))
    return {k: np.stack(v, 1).astype(float) for k, v in out.items()}


def pooled(per_seed: list[dict], key) -> np.ndarray:
    """One (set, method)'s correctness over the seeds, side by side: reviews x (seeds x mask seeds)."""
    return np.hstack([s[key] for s in per_seed])


def choose_severity(runs: list[dict], args) -> dict:
    """Rule 1 of the module doc, on validation: `none`'s drop per severity, pooled over seeds."""
    from ttt_pipeline.evaluation.stats import paired_difference

    severities = (3,) if args.quick else SEVERITIES
    cfg = config(runs[0]["preset"], runs[0]["seed"], args, "ttt.methods=[none,spell]")  # spell: the config needs a defense
    scored = [score_sets(r, validation_sets(r, severities, args), cfg) for r in runs]
    drops = {s: points(paired_difference(pooled(scored, (f"misspelling-{s}", "none")), pooled(scored, ("clean", "none"))))
             for s in severities}
    reached = [s for s in severities if drops[s]["delta"] >= TARGET_DROP]
    chosen = min(reached, key=lambda s: (drops[s]["delta"], s)) if reached else max(severities)
    return {"severity": chosen, "severity_reached_target": bool(reached), "validation_drops": drops,
            "validation_snippets": int(scored[0][("clean", "none")].shape[0])}


def tta_sets(lr: float, steps: int, views: int) -> list[str]:
    return [f"ttt.anchored_tta.lr={lr}", f"ttt.anchored_tta.steps={steps}", f"ttt.anchored_tta.views={views}"]


def choose_tta(runs: list[dict], severity: int, args) -> dict:
    """Rule 2 of the module doc: the grid on validation `misspelling` at the chosen severity, gain over the control."""
    lrs, step_counts, view_counts = QUICK_GRID if args.quick else (LRS, STEPS, VIEWS)
    sets = {r["seed"]: validation_sets(r, [severity], args)[1:] for r in runs}
    name = f"misspelling-{severity}"
    grid_rows = []
    for views in view_counts:
        control = [score_sets(r, sets[r["seed"]], config(r["preset"], r["seed"], args, *tta_sets(LRS[0], 1, views),
                   "ttt.methods=[anchored_tta_views]", "evaluation.default_defense=anchored_tta_views"))
                   for r in runs]
        base = pooled(control, (name, "anchored_tta_views")).mean()
        for lr in lrs:
            for steps in step_counts:
                scored = [score_sets(r, sets[r["seed"]], config(r["preset"], r["seed"], args, *tta_sets(lr, steps, views),
                          "ttt.methods=[anchored_tta]", "evaluation.default_defense=anchored_tta")) for r in runs]
                gain = 100 * (pooled(scored, (name, "anchored_tta")).mean() - base)
                grid_rows.append({"lr": lr, "steps": steps, "views": views, "gain_over_views": round(float(gain), 3)})
                log(f"  validation: anchored_tta lr {lr} steps {steps} views {views}: {gain:+.2f} points over views")
    best = max(g["gain_over_views"] for g in grid_rows)
    ties = [g for g in grid_rows if g["gain_over_views"] == best]
    chosen = min(ties, key=lambda g: (g["lr"], g["steps"], g["views"]))
    return {"chosen": {k: chosen[k] for k in ("lr", "steps", "views")}, "grid": grid_rows}


def test_predictions(run: dict, severity: int, args) -> dict[tuple[str, str], np.ndarray]:
    """The test run of the repairs on every test snippet: the corrupt and evaluate steps, misspelling at `severity`
    and the other sets at the preset's own; spell_context evaluated in its own config. Correctness keyed (set family
    or clean, method)."""
    from ttt_pipeline import steps

    preset, seed, st, data, model_out = run["preset"], run["seed"], run["store"], run["data"], run["model"]
    plain = "ttt.methods=[none,spell]"
    context = ["ttt.methods=[spell]", *CONTEXT_SPELL]
    other_sev = run["cfg"].corruption.severities[0]
    corruption = [(["corruption.families=[misspelling]", f"corruption.severities=[{severity}]"], ["clean", "misspelling"])]
    if args.sets:
        corruption.append(([f"corruption.families={json.dumps(list(args.sets))}", f"corruption.severities=[{other_sev}]"],
                           list(args.sets)))
    frames = []
    for corr, families in corruption:
        for methods, label in (([plain], None), (context, "spell_context")):
            cfg = config(preset, seed, args, *corr, *methods)
            out = steps.evaluate(cfg, data, model_out, steps.corrupt(cfg, data, st), st, families=families)
            frame = steps.read_predictions([out])
            if label:
                frame["method"] = label
            frames.append(frame)
    result: dict[tuple[str, str], np.ndarray] = {}
    for frame in frames:
        frame["set_key"] = frame["family"].fillna("clean").where(frame["kind"] != "clean", "clean")
        frame["correct"] = (frame["pred"] == frame["label"]).astype(float)
        frame["draw"] = frame["mask_seed"].fillna(-1)
        for (s, m), g in frame.groupby(["set_key", "method"]):
            result[(s, m)] = g.pivot(index="index", columns="draw", values="correct").sort_index().to_numpy()
    return result


ENGINES = ("anchored_tta", "anchored_tta_views")  # scored on the --tta-test-size sample, beside `none`


def report(per_seed: list[dict], tta_seed: list[dict], set_names: list[str], default: str) -> dict:
    """The table from the seeds' test correctness (module doc): drop, gains, recovered fraction, TTA vs control.
    The repairs' rows come from every test snippet, the engines' from their sample (`none` beside them)."""
    from ttt_pipeline.evaluation.stats import paired_difference, recovered_fraction_interval
    from ttt_pipeline.metrics import recovered_fraction

    def get(s: str, m: str, sample: bool = False) -> np.ndarray:
        return pooled(tta_seed if sample or m in ENGINES else per_seed, (s, m))

    def gain(s: str, m: str) -> dict:
        return points(paired_difference(get(s, "none", m in ENGINES), get(s, m)))

    acc = {s: {m: round(100 * float(get(s, m).mean()), 2) for m in METHODS} |
           {"none_tta_sample": round(100 * float(get(s, "none", True).mean()), 2)} for s in set_names}
    drop = paired_difference(get("misspelling", "none"), get("clean", "none"))
    gains = {m: {s: gain(s, m) for s in set_names} for m in METHODS[1:]}
    clean, corrupted, defended = (get(s, m, default in ENGINES).mean(1) for s, m in (  # paired on one set of snippets
        ("clean", "none"), ("misspelling", "none"), ("misspelling", default)))
    point = recovered_fraction(clean.mean(), corrupted.mean(), defended.mean())
    _, lo, hi = recovered_fraction_interval(clean, corrupted, defended, seed=0)
    tta = {s: points(paired_difference(get(s, "anchored_tta_views"), get(s, "anchored_tta"))) for s in set_names}
    harmed = [[m, s] for m in METHODS[1:] for s in set_names if gains[m][s]["ci_high"] < 0]
    ext = [s for s in set_names if s.startswith("ext:")]
    worst = min(ext, key=lambda s: gains[default][s]["delta"]) if ext else None
    return {"accuracy": acc, "misspelling_drop": points(drop), "gain_vs_none": gains,
            "recovered_fraction": {"method": default, "point": None if point is None else round(point, 4),
                                   "ci_low": None if np.isnan(lo) else round(lo, 4),
                                   "ci_high": None if np.isnan(hi) else round(hi, 4)},
            "tta_minus_views": tta, "harmed": harmed,
            "worst_ext": None if worst is None else {"set": worst, **gains[default][worst]}}


def selection(runs: list[dict], args) -> dict:
    """Both validation choices, made once per set of models and settings and kept in the store (a resumed run
    reads them instead of scoring the grid again)."""
    inputs = {"models": [r["model"].digest for r in runs], "quick": args.quick, "val_size": args.val_size,
              "mask_seeds": args.mask_seeds, "severities": SEVERITIES, "target": TARGET_DROP,
              "grid": QUICK_GRID if args.quick else (LRS, STEPS, VIEWS)}

    def build(tmp: Path) -> dict:
        severity = choose_severity(runs, args)
        return {**severity, "anchored_tta": choose_tta(runs, severity["severity"], args)}

    return runs[0]["store"].run("bench-real-noise-selection", inputs, build).meta


def tta_predictions(run: dict, severity: int, tta: dict, args) -> dict[tuple[str, str], np.ndarray]:
    """`none`, `anchored_tta` and `anchored_tta_views` on the `--tta-test-size` sample of every set (module doc),
    correctness keyed as test_predictions'; cached in the store per model, sets and settings."""
    from ttt_pipeline import steps
    from ttt_pipeline.data.prepare import load_prepared

    preset, seed, st, data = run["preset"], run["seed"], run["store"], run["data"]
    methods = ["ttt.methods=[none,anchored_tta,anchored_tta_views]", "evaluation.default_defense=anchored_tta"]
    families = [("misspelling", severity)] + [(f, run["cfg"].corruption.severities[0]) for f in args.sets]
    inputs = {"model": run["model"].digest, "families": families, "tta": tta, "size": args.tta_test_size,
              "mask_seeds": args.mask_seeds}

    def build(tmp: Path) -> dict:
        from ttt_pipeline.evaluation.grid import TestSet

        test = load_prepared(data.path)[0]["test"]
        n = len(test["label"])
        keep = sorted(random.Random(0).sample(range(n), args.tta_test_size)) if 0 < args.tta_test_size < n \
            else list(range(n))
        labels = [test["label"][i] for i in keep]
        sets = [TestSet("clean", "clean", [test["text"][i] for i in keep], labels)]
        for family, sev in families:
            cfg = config(preset, seed, args, f"corruption.families=[{json.dumps(family)}]",
                         f"corruption.severities=[{sev}]")
            texts = steps.read_set(steps.corrupt(cfg, data, st), f"{family}-{sev}")
            sets.append(TestSet("corrupted", family, [texts[i] for i in keep], labels, family, sev))
        cfg = config(preset, seed, args, *tta_sets(tta["lr"], tta["steps"], tta["views"]), *methods)
        scored = score_sets(run, sets, cfg)
        np.savez(tmp / "correct.npz", **{f"{s}|{m}": v for (s, m), v in scored.items()}, index=np.asarray(keep))
        return {"snippets": len(keep)}

    out = st.run("bench-real-noise-tta", inputs, build)
    with np.load(Path(out.path) / "correct.npz") as z:
        return {tuple(k.split("|")): z[k] for k in z.files if "|" in k}


def run_preset(preset: str, args) -> dict:
    """One preset: train every seed, make both validation choices, score the test sets, the table."""
    if preset == "mdsd-electronics" and not have_mdsd():
        log(f"SKIP {preset}: MDSD reviews not found at {MDSD} (see ../shared/data/README.md)")
        return {"skipped": True, "reason": f"no data at {MDSD}"}
    t0 = time.perf_counter()
    seeds = args.seeds[:1] if args.quick else args.seeds
    runs = [train(preset, seed, args) for seed in seeds]
    chosen = selection(runs, args)
    severity, tta = chosen["severity"], chosen["anchored_tta"]["chosen"]
    log(f"{preset}: misspelling severity {severity} (validation drops "
        f"{ {s: d['delta'] for s, d in chosen['validation_drops'].items()} }); anchored_tta {tta}")
    per_seed = [test_predictions(r, severity, args) for r in runs]
    log(f"{preset}: spell rows scored; anchored TTA on {args.tta_test_size or 'every'} test snippets")
    tta_seed = [tta_predictions(r, severity, tta, args) for r in runs]
    set_names = ["clean", "misspelling", *args.sets]
    default = runs[0]["cfg"].evaluation.default_defense
    table = report(per_seed, tta_seed, set_names, default)
    return {"seeds": seeds, "test_snippets": int(per_seed[0][("clean", "none")].shape[0]),
            "tta_test_snippets": int(tta_seed[0][("clean", "none")].shape[0]),
            "selection": chosen, "default_defense": default,
            "sets": set_names, **table, "wall_s": round(time.perf_counter() - t0, 1)}


def cell(d: dict) -> str:
    return f"{d['delta']:+.2f} [{d['ci_low']:+.2f}, {d['ci_high']:+.2f}]{'*' if d['significant'] else ''}"


def table(preset: str, r: dict) -> str:
    """A readable table of one preset's result (points; * where the interval excludes 0)."""
    if r.get("skipped"):
        return f"{preset}: skipped ({r['reason']})"
    sel, tta = r["selection"], r["selection"]["anchored_tta"]["chosen"]
    rf = r["recovered_fraction"]
    lines = [f"{preset}: {r['test_snippets']} test snippets (anchored TTA: {r['tta_test_snippets']}) x seeds "
             f"{r['seeds']}; misspelling severity "
             f"{sel['severity']}; anchored_tta lr {tta['lr']} steps {tta['steps']} views {tta['views']}",
             f"misspelling drop (none): {cell(r['misspelling_drop'])}; {r['default_defense']} recovers "
             f"{rf['point']} [{rf['ci_low']}, {rf['ci_high']}] of it",
             "gain vs none, points [95% interval]:",
             f"{'set':<16}{'acc none':>9}  " + "".join(f"{m:<28}" for m in METHODS[1:]) + "tta - views"]
    for s in r["sets"]:
        lines.append(f"{s:<16}{r['accuracy'][s]['none']:>9.2f}  "
                     + "".join(f"{cell(r['gain_vs_none'][m][s]):<28}" for m in METHODS[1:])
                     + cell(r["tta_minus_views"][s]))
    lines.append(f"harmed (interval below 0): {r['harmed'] or 'none'}; worst ext: {r['worst_ext']}")
    return "\n".join(lines)


def shared_raw(store: Path) -> None:
    """A store without raw downloads of its own reads the other benches' (.cache/bench/raw: rt-polarity's file)."""
    shared = REPO / ".cache" / "bench" / "raw"
    if shared.is_dir() and not (store / "raw").exists() and store.resolve() != shared.parent.resolve():
        store.mkdir(parents=True, exist_ok=True)
        (store / "raw").symlink_to(shared, target_is_directory=True)


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--json", action="store_true", help="the JSON line only (no table)")
    p.add_argument("--quick", action="store_true", help="smoke: 48 training, 40 val/test snippets, 1 epoch, 1 seed, "
                   "one grid point, severity 3 only")
    p.add_argument("--preset", nargs="+", default=list(PRESETS), choices=PRESETS)
    p.add_argument("--seeds", type=int, nargs="+", default=[42, 43, 44], help="training seeds (finetune.seed)")
    p.add_argument("--test-size", type=int, help="cap on test snippets (data.max_test_samples; default the preset's)")
    p.add_argument("--val-size", type=int, help="validation snippets sampled (seed 0) for the choices (default all)")
    p.add_argument("--sets", nargs="*", default=list(EXT_SETS), help="sets besides clean and misspelling")
    p.add_argument("--tta-test-size", type=int, default=1000, help="test snippets the anchored TTA rows are scored "
                   "on (a seeded sample, the same on every set and seed; 0: all)")
    p.add_argument("--mask-seeds", type=int, default=1, help="mask seeds of the masked methods (ttt.mask_seeds)")
    p.add_argument("--store", type=Path, default=REPO / ".cache" / "bench" / "store-real-noise")
    args = p.parse_args(argv)
    if args.quick:
        args.test_size, args.val_size = args.test_size or 40, args.val_size or 40
    args.store = args.store.resolve()
    shared_raw(args.store)
    t0 = time.perf_counter()
    results = {preset: run_preset(preset, args) for preset in args.preset}
    out = {"model": MODEL, "quick": args.quick, "mask_seeds": args.mask_seeds, "presets": results,
           "wall_s": round(time.perf_counter() - t0, 1)}
    if not args.json:
        log("\n\n".join(table(k, v) for k, v in results.items()))
    print(json.dumps(out))


if __name__ == "__main__":
    main()
