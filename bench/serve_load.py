"""Serving under load: concurrent clients against `mlflow models serve` of a registered model, per method.

For each method (the model's default defense, masked TTT): every request body is first answered alone, in turn (the
reference), then all of them again from `--clients` concurrent clients; reported per method: p50/p95/max latency of
the concurrent requests, requests/s, and the mismatches (a concurrent answer whose labels differ from the same body
answered alone: cross-talk between concurrent requests). Bodies hold one to three test reviews each, as in
tests/serving/test_serving_integration.py; the reviews are the shipped demo reviews.

    .venv/bin/python -m bench.serve_load --model models:/ttt-demo-reviews-negative-positive@champion \\
        --tracking-uri sqlite:///mlflow.db --json
Last stdout line: one JSON object.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from bench.common import log
from bench.speed import model_server


def bodies(texts: list[str], n: int, method: str | None) -> list[dict]:
    """`n` bodies of one to three reviews; `method` None: the model's own (no params)."""
    params = {} if method is None else {"params": {"method": method}}
    return [{"inputs": [texts[(7 * i + k) % len(texts)] for k in range(1 + i % 3)], **params} for i in range(n)]


def invoke(url: str, body: dict) -> tuple[list[str], float]:
    req = urllib.request.Request(f"{url}/invocations", json.dumps(body).encode(), {"Content-Type": "application/json"})
    t0 = time.perf_counter()
    with urllib.request.urlopen(req, timeout=300) as r:
        answer = json.loads(r.read())
    return [p["label"] for p in answer["predictions"]], time.perf_counter() - t0


def load(url: str, texts: list[str], method: str, args) -> dict:
    """One method: the bodies alone, then from `args.clients` concurrent clients."""
    sent = bodies(texts, args.requests, method)
    alone = {}
    for body in sent:
        key = json.dumps(body, sort_keys=True)
        if key not in alone:
            alone[key] = invoke(url, body)[0]
    t0 = time.perf_counter()
    with ThreadPoolExecutor(max_workers=args.clients) as pool:
        answers = list(pool.map(lambda b: invoke(url, b), sent))
    wall = time.perf_counter() - t0
    lat = sorted(1000 * s for _, s in answers)
    mismatches = sum(labels != alone[json.dumps(b, sort_keys=True)] for b, (labels, _) in zip(sent, answers))
    return {"requests": len(sent), "clients": args.clients, "distinct_bodies": len(alone),
            "p50_ms": round(statistics.median(lat), 1), "p95_ms": round(lat[int(0.95 * len(lat)) - 1], 1),
            "max_ms": round(lat[-1], 1), "requests_per_s": round(len(sent) / wall, 2), "mismatches": mismatches}


def main(argv=None) -> None:
    import mlflow

    from ttt_pipeline.modeling.precision import machine_summary

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", required=True, help="models:/NAME@ALIAS, runs:/... or a model folder")
    p.add_argument("--tracking-uri", default="sqlite:///mlflow.db")
    p.add_argument("--methods", nargs="+", default=["default", "masked_ttt"],
                   help="`default`: the model's own method (its default defense)")
    p.add_argument("--clients", type=int, default=8)
    p.add_argument("--requests", type=int, default=200)
    p.add_argument("--json", action="store_true")
    args = p.parse_args(argv)
    from ttt_pipeline.preset_files import PRESETS_DIR

    reviews = (PRESETS_DIR / "demo" / "reviews.jsonl").read_text(encoding="utf-8").splitlines()
    texts = [json.loads(line)["text"] for line in reviews if line.strip()]
    mlflow.set_tracking_uri(args.tracking_uri)
    os.environ["MLFLOW_TRACKING_URI"] = args.tracking_uri
    out = {"model": args.model, "machine": machine_summary(), "methods": {}}
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(args.model) if Path(args.model).is_dir() else Path(
            mlflow.artifacts.download_artifacts(artifact_uri=args.model, dst_path=tmp))
        with model_server(folder, Path(tmp) / "serve.log") as url:
            for method in args.methods:
                out["methods"][method] = load(url, texts, None if method == "default" else method, args)
                log(f"[serve-load] {method}: {out['methods'][method]}")
    print(json.dumps(out) if args.json else json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
