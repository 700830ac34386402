"""Speed and memory of the pipeline's hot paths, side by side in one run on the same reviews.

Data: MDSD electronics (bench/accuracy.py's reader and split), or the shipped demo reviews where MDSD is absent;
`--train-size` reviews train, `--test-size` are scored, corrupted by the tutorial composite (severity 3, seed 42).
Encoder: bench/common.py's MODEL (the JSON's "model"). Each figure is a ratio to a reference measured in this run:
- `finetune_speedup`: training samples/s of the presets' recipe (`precision: auto`) over the torch-ttt tutorial's
  loop (bench/accuracy.py), same reviews and epochs, MLM warm-ups excluded; `clean_delta`: the recipe's clean
  accuracy minus the tutorial's (paired interval); `roofline`: matmul GFLOP per training sample (torch's
  FlopCounterMode), a sustained GEMM rate at MiniLM's FFN shape and each recipe's share of it;
  `finetune_speedup_ceiling`: the most `finetune_speedup` can reach here without less arithmetic per sample.
- `ttt_fraction_of_limit`: masked TTT reviews/s over a quarter of the plain forward rate (a TTT step costs about
  four forwards), same model, padding, precision and batch.
- `repair_reviews_per_s`: `spell` alone, fresh word caches; `predict_reviews_per_s`: the model alone;
  `spell_overhead`: time(spell + model) / time(model) - 1; `spell_overhead_repair_alone`: time(repair) /
  time(model), the repair's share without the model's own variation from call to call (10-20%).
- `serve_p50_ms` / `serve_p95_ms`: one review per request, in turn, against `mlflow models serve` (the default
  defense) at the run's scoring precision; `serve_fp32_*` the same server at fp32, `serve_p50_speedup` their ratio.
- `training_step` (bench/step_profile.py): one training step of the recipe before the CPU work (per-tensor AdamW,
  the checkpoint's dropout) and now, their speedup and `of_gemm`, and the operator groups of a step and of a scoring
  batch (matrix products, dropout, optimizer, attention, norms/elementwise).
- `peak_rss_mb`: per stage, this process's VmHWM reset at the stage's start (scoring: the largest over repeats);
  `precision_check`: bf16 against fp32 on one linear layer, and whether `precision: auto` picked the faster.
Scoring figures: median and [min, max] of `--repeats`; each repeat times masked TTT, the model, spell + model and the
repair back to back, a ratio divides runs of one repeat. Each recipe trains once. Compare one CPU kind (`machine`).

    .venv/bin/python -m bench.speed --json            # MDSD: about 10-15 min on 2 cores
    .venv/bin/python -m bench.speed --quick --json    # smoke: tiny sizes
Last stdout line: one JSON object.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

import numpy as np
import torch

from bench import REPO
from bench.accuracy import tutorial_train
from bench.common import MODEL, have_mdsd, load_domain, log, model_device, scoring_amp
from bench.step_profile import step_figures, train_gflop_per_sample  # noqa: F401 (tests read it here)
from ttt_pipeline.config import load_config
from ttt_pipeline.corruption import corrupt_texts
from ttt_pipeline.evaluation.stats import paired_difference
from ttt_pipeline.modeling.precision import machine_summary, resolve_precision


def rss_reset() -> None:
    """Start a new peak: writing 5 to clear_refs resets VmHWM (Linux >= 4.0)."""
    try:
        Path("/proc/self/clear_refs").write_text("5")
    except OSError:
        pass


def rss_peak_mb() -> float | None:
    m = re.search(r"VmHWM:\s+(\d+) kB", Path("/proc/self/status").read_text()) if Path("/proc/self").exists() else None
    return round(int(m.group(1)) / 1024, 1) if m else None


def load_data(args) -> dict:
    """Train and test reviews with labels, and the corrupted copy of the test reviews."""
    if have_mdsd() and not args.demo:
        texts, labels = load_domain("electronics", 42)
        cut = int(0.8 * len(texts))
        train, test = (texts[:cut], labels[:cut]), (texts[cut:], labels[cut:])
        source, preset, classes = "mdsd-electronics", "mdsd-electronics", 4
    else:
        train, test, classes = demo_splits()
        source, preset = "demo", "demo"
    train = (train[0][:args.train_size], train[1][:args.train_size])
    test = (test[0][:args.test_size], test[1][:args.test_size])
    corrupted = corrupt_texts(test[0], "tutorial", 3, 42).texts
    return {"train": train, "test": test, "corrupted": corrupted, "source": source, "preset": preset,
            "classes": classes}


def demo_splits() -> tuple:
    """The demo preset's own split and label map (the library's download step, in a temporary store)."""
    from ttt_pipeline import steps
    from ttt_pipeline.data.prepare import load_prepared
    from ttt_pipeline.storage import StepStore

    cfg = load_config("demo")
    cfg.data.path = str((REPO / cfg.data.path).resolve()) if not Path(cfg.data.path).is_absolute() else cfg.data.path
    with tempfile.TemporaryDirectory() as tmp:
        ds, _ = load_prepared(steps.download(cfg, StepStore(tmp)).path)
        pick = lambda s: (list(ds[s]["text"]), list(ds[s]["label"]))  # noqa: E731
        return pick("train"), pick("test"), len(set(ds["train"]["label"]))


def train_ours(data: dict, args):
    """The preset's recipe through the library's finetune: (model, tokenizer, train samples/s, config)."""
    from ttt_pipeline.modeling.model import build_classifier
    from ttt_pipeline.modeling.tokenize import lengths_dataset
    from ttt_pipeline.modeling.train import finetune

    cfg = load_config(data["preset"], args.set)
    if not any(s.split("=", 1)[0].strip() == "model.name" for s in args.set):  # the presets name MiniLM, = MODEL
        cfg.model.name = MODEL  # the bench's encoder (TTT_BENCH_MODEL: bench/common.py), as the tutorial's
    ft = cfg.finetune.model_copy(update={"epochs": args.epochs, "early_stopping_patience": 0, "seed": args.seed,
                                         "mlm_warmup_max_steps": args.warmup_steps, "device": args.device})
    torch.manual_seed(args.seed)
    model, tok = build_classifier(cfg.model, [str(i) for i in range(data["classes"])])
    ds = lengths_dataset(tok, data["train"][0], cfg.model.max_length, label=data["train"][1])
    with tempfile.TemporaryDirectory() as work:
        result = finetune(model, tok, ds, None, ft, Path(work))
    return model.eval(), tok, result.train_samples_per_s, cfg


def tutorial_predict(model, collate, texts: list[str]) -> list[int]:
    preds = []
    with torch.no_grad():
        for i in range(0, len(texts), 32):
            ids, am, _ = collate([(t, 0) for t in texts[i:i + 32]])
            preds += model(ids, am)[0].argmax(-1).tolist()
    return preds


def timed(fn, repeats: int) -> tuple[list[float], object]:
    """Wall seconds of each of `repeats` calls, and the last call's result."""
    times, out = [], None
    for _ in range(repeats):
        t0 = time.perf_counter()
        out = fn()
        times.append(time.perf_counter() - t0)
    return times, out


def spread(values: list[float], digits: int = 3) -> dict:
    return {"median": round(statistics.median(values), digits), "min": round(min(values), digits),
            "max": round(max(values), digits), "n": len(values)}


def precision_figures(rows: int, repeats: int) -> dict:
    """A 384x1536 linear layer's forward and backward (MiniLM's FFN) in fp32 and under bf16 autocast: what
    `precision: auto` decides, measured (on an AVX2-only CPU bf16 is emulated, and many times slower)."""
    torch.manual_seed(0)
    layer, x = torch.nn.Linear(384, 1536), torch.randn(rows, 384, requires_grad=True)

    def step(bf16: bool) -> None:
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
            y = layer(x)
        y.float().sum().backward()

    step(False), step(True)  # warm-up: kernels chosen, memory allocated
    fp32, _ = timed(lambda: step(False), repeats)
    bf16, _ = timed(lambda: step(True), repeats)
    ratio = [b / f for b, f in zip(bf16, fp32)]
    return {"bf16_over_fp32": spread(ratio, 2), "auto_picks": resolve_precision("cpu", "auto").name,
            "auto_picks_faster": (resolve_precision("cpu", "auto").name == "bf16") == (statistics.median(ratio) < 1)}


def finetune_figures(data: dict, args) -> tuple[dict, object]:
    """Both recipes on the same reviews: speedup, clean accuracies and their paired difference; our model."""
    rss_reset()
    tut, ttok, collate, tut_res = tutorial_train(args.seed, *data["train"], data["classes"], args.epochs,
                                                 args.warmup_steps, args.device)
    tut_rss = rss_peak_mb()
    test_t, test_y = data["test"]
    tut_right = np.array(tutorial_predict(tut, collate, test_t)) == np.array(test_y)
    ids, am, y = collate(list(zip(*(part[:32] for part in data["train"]))))
    tut_gflop = train_gflop_per_sample(tut, lambda m=tut: m(ids, am, y)[1], len(y))
    del tut
    rss_reset()
    model, tok, ours_rate, cfg = train_ours(data, args)
    ours_rss = rss_peak_mb()
    ours_right = predict(model, tok, test_t, "none", cfg).argmax(-1) == np.array(test_y)
    delta = paired_difference(tut_right.astype(float), ours_right.astype(float), resamples=2000, seed=0)  # ours - tut
    figures = {"finetune_speedup": round(ours_rate / tut_res["train_samples_per_s"], 3),
               "train_samples_per_s": {"recipe": round(ours_rate, 2),
                                       "tutorial": round(tut_res["train_samples_per_s"], 2)},
               "clean_acc": {"recipe": float(ours_right.mean()), "tutorial": float(tut_right.mean())},
               "clean_delta": {k: getattr(delta, k) for k in ("delta", "ci_low", "ci_high", "n")},
               "precision": resolve_precision(args.device, cfg.finetune.precision).name,
               "rss": {"finetune_tutorial": tut_rss, "finetune": ours_rss}}
    figures["roofline"], figures["finetune_speedup_ceiling"] = roofline(
        tut_gflop, recipe_gflop_per_sample(model, tok, cfg, data, args), figures, args)
    return figures, (model, tok, cfg)


def recipe_gflop_per_sample(model, tok, cfg, data: dict, args) -> dict:
    """The recipe's training loss (the library's TrainingLoss) on one batch at the mean padded width of the
    batches its length-grouped sampler draws over the run's epochs. FLOPs grow with the width plus a small
    squared term (attention: about 3% at 128 tokens), so the mean width gives the mean cost within a few percent."""
    from ttt_pipeline.modeling.train import TrainingLoss, class_weights, joint_training, training_sampler

    ft, (texts, labels) = cfg.finetune.model_copy(update={"seed": args.seed}), data["train"]
    lengths = [len(i) for i in tok(texts, truncation=True, max_length=cfg.model.max_length)["input_ids"]]
    sampler = training_sampler(ft, lengths, labels, class_weights(labels, data["classes"]))
    padded, rows = 0, 0
    for epoch in range(args.epochs):
        sampler.set_epoch(epoch)
        for batch in sampler:
            padded, rows = padded + len(batch) * max(lengths[i] for i in batch), rows + len(batch)
    width = round(padded / rows)
    pick = [i for i, n in enumerate(lengths) if n >= width][:ft.batch_size]
    enc = tok([texts[i] for i in pick], truncation=True, max_length=width, padding="max_length",
              return_tensors="pt")
    y = torch.tensor([labels[i] for i in pick])
    loss = TrainingLoss(model, tok, ft, joint_training(ft), None, torch.Generator().manual_seed(0), None)
    model.train()
    gflop = train_gflop_per_sample(model, lambda: loss(enc["input_ids"], enc["attention_mask"], y)[0], len(y))
    model.eval()
    return {"gflop_per_sample": round(gflop, 3), "width": width}


def gemm_gflops(dtype: torch.dtype, device: str, repeats: int = 10) -> float:
    """A sustained 4096x384 by 384x1536 product (MiniLM's FFN on 4096 tokens), median of `repeats`."""
    a, b = (torch.randn(*shape, dtype=dtype, device=device) for shape in ((4096, 384), (384, 1536)))
    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
    timed(lambda: (a @ b, sync()), 3)
    times, _ = timed(lambda: (a @ b, sync()), repeats)
    return 2 * 4096 * 384 * 1536 / statistics.median(times) / 1e9


def roofline(tut_gflop: float, recipe: dict, figures: dict, args) -> tuple[dict, float]:
    """Each recipe's achieved GFLOP/s against the GEMM rate in its precision; and the speedup ceiling."""
    rates = figures["train_samples_per_s"]
    dtypes = {"tutorial": "float32", "recipe": "bfloat16" if figures["precision"] == "bf16" else "float32"}
    gemm = {d: round(gemm_gflops(getattr(torch, d), args.device), 1) for d in set(dtypes.values())}
    out: dict = {"gemm_gflops": gemm}
    for name, gflop in (("tutorial", tut_gflop), ("recipe", recipe["gflop_per_sample"])):
        out[name] = {"gflop_per_sample": round(gflop, 3), "gflops": round(rates[name] * gflop, 1),
                     "of_gemm": round(rates[name] * gflop / gemm[dtypes[name]], 3)}
    out["recipe"]["width"] = recipe["width"]
    return out, round(gemm[dtypes["recipe"]] / recipe["gflop_per_sample"] / rates["tutorial"], 2)


def predict(model, tok, texts: list[str], method: str, cfg, repairs=None) -> np.ndarray:
    from ttt_pipeline.evaluation.scoring import predict_texts

    served = cfg.ttt.model_copy(update={"signal_every": 0})  # no held-out probes: a served model's speed
    return predict_texts(model, tok, texts, method, served, cfg.model.max_length, cfg.ttt.batch_size,
                         model_device(model), repairs=repairs, amp=scoring_amp(model, served.precision))


def scoring_figures(trained, data: dict, args) -> dict:
    """TTT against its limit, the repair alone, the model with and without it: medians over repeats. Each repeat
    times the four back to back, and each ratio divides runs of one repeat, so a drift of the machine's speed
    between blocks of repeats does not read as overhead. The model's own call-to-call noise remains (10-20% on 2
    cores): spell_overhead_repair_alone leaves the model's second run out."""
    from ttt_pipeline.defenses import registry

    model, tok, cfg = trained
    texts = data["corrupted"]

    def fresh_spell():  # a new repair, its word caches empty (the dictionary loads once per process, untimed)
        return registry.build_repairs("spell", cfg.ttt, {"vocabulary": data["train"][0]})

    def once(fn, stage: str | None = None) -> float:
        """Seconds of one call; with a stage, its peak resident memory joins that stage's."""
        rss_reset()
        seconds = timed(fn, 1)[0][0]
        if stage:
            peaks.setdefault(stage, []).append(rss_peak_mb())
        return seconds

    fresh_spell()
    peaks: dict[str, list] = {}
    ttt_s, plain_s, spell_s, repair_s = [], [], [], []
    for _ in range(args.repeats):  # the model alone beside both runs it is the reference of
        ttt_s.append(once(lambda: predict(model, tok, texts, "masked_ttt", cfg), "masked_ttt"))
        plain_s.append(once(lambda: predict(model, tok, texts, "none", cfg), "predict"))
        spell, repair = fresh_spell(), fresh_spell()
        spell_s.append(once(lambda r=spell: predict(model, tok, texts, "spell", cfg, repairs=r)))
        repair_s.append(once(lambda r=repair: r[0](list(texts))))
    rss = {name: None if None in values else max(values) for name, values in peaks.items()}
    n = len(texts)
    fraction = [(n / t) / (n / p / 4) for t, p in zip(ttt_s, plain_s)]
    overhead = [s / p - 1 for s, p in zip(spell_s, plain_s)]
    repair_share = [r / p for r, p in zip(repair_s, plain_s)]
    return {"ttt_fraction_of_limit": spread(fraction), "ttt_reviews_per_s": spread([n / t for t in ttt_s], 1),
            "predict_reviews_per_s": spread([n / t for t in plain_s], 1),
            "repair_reviews_per_s": spread([n / t for t in repair_s], 1),
            "spell_overhead": spread(overhead), "spell_overhead_repair_alone": spread(repair_share, 4), "rss": rss}


def serve_figures(trained, data: dict, args) -> dict:
    """p50/p95 of one review per request against `mlflow models serve` of the model (local environment), with the
    default defense: at the run's scoring precision (`ttt.precision`, the served model's own) and, as the reference
    of the same run, at fp32 (`serve_fp32_*`: how the served model scored before it used the CPU's bf16 units)."""
    model, tok, cfg = trained
    out = {"serve_method": cfg.evaluation.defense}
    for arm, precision in (("fp32", "fp32"), ("", cfg.ttt.precision)):
        ms = serve_latencies(trained, data, args, precision)
        prefix = f"serve_{arm}_" if arm else "serve_"
        out.update({f"{prefix}p50_ms": round(float(np.percentile(ms, 50)), 1),
                    f"{prefix}p95_ms": round(float(np.percentile(ms, 95)), 1)})
        out["serve_requests"] = len(ms)
    out["serve_p50_speedup"] = round(out["serve_fp32_p50_ms"] / out["serve_p50_ms"], 3)
    return out


def serve_latencies(trained, data: dict, args, precision: str) -> list[float]:
    """Milliseconds of each request, in turn, one test review each, the served model at `precision`."""
    from ttt_pipeline.classifier import inference_config
    from ttt_pipeline.defenses.vocabulary import training_vocabulary
    from ttt_pipeline.io.mlflow_model import save_classifier_model
    from ttt_pipeline.modeling.model import save_model

    model, tok, cfg = trained
    with tempfile.TemporaryDirectory() as tmp:
        folder = save_model(model, tok, Path(tmp) / "model")
        served = save_classifier_model(folder, Path(tmp) / "mlflow-model",
                                       inference_config(cfg.ttt.model_copy(update={"precision": precision}),
                                                        cfg.evaluation.defense),
                                       training_vocabulary(data["train"][0]))
        with model_server(served, Path(tmp) / "serve.log") as url:
            latencies = [post(url, text) for text in data["test"][0][:args.requests]]
    return sorted(1000 * t for t in latencies)


class model_server:
    """`mlflow models serve` on a free loopback port, with `env` added to its environment, stopped (the whole
    process group) on exit."""

    def __init__(self, model_path: Path, log_path: Path, env: dict[str, str] | None = None):
        import socket

        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = s.getsockname()[1]
        self.model_path, self.log_path, self.extra_env = model_path, log_path, env or {}

    def __enter__(self) -> str:
        bin_dir = Path(sys.executable).parent  # MLflow starts `uvicorn` from PATH
        env = {**os.environ, "PATH": f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '')}", "HF_HUB_OFFLINE": "1",
               "TTT_DEVICE": "cpu", "TOKENIZERS_PARALLELISM": "false", **self.extra_env}
        self.log = open(self.log_path, "w")
        self.proc = subprocess.Popen([str(bin_dir / "mlflow"), "models", "serve", "-m", str(self.model_path),
                                      "--env-manager", "local", "-h", "127.0.0.1", "-p", str(self.port)], env=env,
                                     stdout=self.log, stderr=subprocess.STDOUT, start_new_session=True)
        url, deadline = f"http://127.0.0.1:{self.port}", time.monotonic() + 240
        while time.monotonic() < deadline and self.proc.poll() is None:
            try:
                with urllib.request.urlopen(f"{url}/ping", timeout=2) as r:
                    if r.status == 200:
                        return url
            except OSError:
                time.sleep(0.5)
        self.__exit__()
        raise SystemExit(f"mlflow models serve did not answer: {self.log_path.read_text()[-2000:]}")

    def __exit__(self, *exc) -> None:
        import signal

        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
        self.log.close()


def post(url: str, text: str) -> float:
    body = json.dumps({"inputs": [text]}).encode()
    req = urllib.request.Request(f"{url}/invocations", body, {"Content-Type": "application/json"})
    t0 = time.perf_counter()
    with urllib.request.urlopen(req, timeout=60) as r:
        json.loads(r.read())
    return time.perf_counter() - t0


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--json", action="store_true", help="one JSON object on the last stdout line")
    p.add_argument("--quick", action="store_true", help="tiny sizes: a smoke run of every figure")
    p.add_argument("--demo", action="store_true", help="the shipped demo reviews even where MDSD is present")
    p.add_argument("--train-size", type=int, default=800)
    p.add_argument("--test-size", type=int, default=400)
    p.add_argument("--epochs", type=int, default=2)
    p.add_argument("--warmup-steps", type=int, default=50, help="MLM-head warm-up of both recipes (untimed)")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--requests", type=int, default=200, help="serving requests (one review each)")
    p.add_argument("--seed", type=int, default=42)
    p.add_argument("--no-serve", action="store_true", help="skip the model server")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help="a setting of the recipe's preset, as `ttt-pipeline run --set` (e.g. finetune.num_workers=0)")
    p.add_argument("--device", choices=["cpu", "cuda"], default="cpu",
                   help="where both recipes train and the model scores (the spelling repair runs on the CPU)")
    args = p.parse_args(argv)
    if args.quick:
        args.train_size, args.test_size, args.epochs = min(args.train_size, 64), min(args.test_size, 48), 1
        args.warmup_steps, args.repeats, args.requests = min(args.warmup_steps, 1), 2, min(args.requests, 20)
    return args


def main(argv=None) -> None:
    args = parse_args(argv)
    t0 = time.perf_counter()
    data = load_data(args)
    log(f"[speed] {data['source']}: {len(data['train'][0])} training, {len(data['test'][0])} test reviews")
    out = {"model": MODEL, "source": data["source"], "train": len(data["train"][0]), "test": len(data["test"][0]),
           "precision_check": precision_figures(512 if args.quick else 4096, args.repeats)}
    log(f"[speed] precision: {out['precision_check']}")
    ft, trained = finetune_figures(data, args)
    log(f"[speed] fine-tuning: {ft}")
    out["training_step"] = step_figures(trained, data, ft["roofline"]["recipe"]["width"], ft["roofline"]["gemm_gflops"],
                                        args)
    log(f"[speed] training step: {out['training_step']}")
    scoring = scoring_figures(trained, data, args)
    log(f"[speed] scoring: {scoring}")
    serve = {} if args.no_serve else serve_figures(trained, data, args)
    out.update({k: v for k, v in {**ft, **scoring}.items() if k != "rss"}, **serve)
    out["peak_rss_mb"] = {**ft["rss"], **scoring["rss"]}
    out["settings"] = {k: getattr(args, k) for k in ("epochs", "warmup_steps", "repeats", "requests", "seed", "set",
                                                      "quick")} | {"model": MODEL}
    out["machine"] = machine_summary() | {"device": args.device, "gpu": torch.cuda.get_device_name(0)
                                                                        if args.device == "cuda" else None}
    out["wall_s"] = round(time.perf_counter() - t0, 1)
    print(json.dumps(out, default=float) if args.json else json.dumps(out, indent=1, default=float))


if __name__ == "__main__":
    main()
