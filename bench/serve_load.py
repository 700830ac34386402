"""Serving under load: concurrent clients against `mlflow models serve` of a registered model, per method.

For each method (the model's default defense, masked TTT): every request body is first answered alone, in turn (the
reference), then all of them again from `--clients` concurrent clients; reported per method: p50/p95/max latency of
the concurrent requests, requests/s, and the mismatches (a concurrent answer whose labels differ from the same body
answered alone: cross-talk between concurrent requests). Bodies hold one to three test reviews each, as in
tests/serving/test_serving_integration.py; the reviews are the shipped demo reviews.

    .venv/bin/python -m bench.serve_load --model models:/ttt-demo-reviews-negative-positive@champion \\
        --tracking-uri sqlite:///mlflow.db --json
Last stdout line: one JSON object.

`--sweep`: served throughput against what the model can do. The limit is the model's batched scoring rate in this
process (Classifier.predict_proba of 256 reviews sorted by length, its own batch size, the best of 3 passes). Then two servers at
once, request batching off (TTT_SERVE_BATCH_TEXTS=0: each request scored alone) and on (the default), each
loaded with the model's own method at each of `--sweep-clients` (1, 8, 32) concurrent clients in rounds off, on,
on, off (latencies pooled per arm): reviews/s, p50/p95
and `served_fraction_of_limit` (served reviews/s / limit) per setting, and the mismatches against the bodies
answered alone. The model scores at its stored precision (fp32 on a CPU without bf16 or int8 units).

`--capture-cost`: what traffic capture (io/traffic_recorder.py) costs a served request. Two servers of the same
model run at once, capture off and on (TTT_MONITORING_CAPTURE, records to a temporary folder); the model's own method
is loaded from `--clients` concurrent clients in `--rounds` rounds that alternate off, on, off, on, ... (so a change
in the machine's load falls on both); each arm's latencies are pooled over its rounds. Reported: p50/p95 per arm,
`p95_ratio` and `p50_ratio` (on / off; aim p95 <= 1.05), the records the captured server wrote, and the bodies whose
labels differ between the arms (0: capture never changes an answer).
"""

from __future__ import annotations

import argparse
import functools
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
    return {"requests": len(sent), "reviews": sum(len(b["inputs"]) for b in sent), "wall_s": round(wall, 3),
            "clients": args.clients, "distinct_bodies": len(alone),
            "p50_ms": round(statistics.median(lat), 1), "p95_ms": round(lat[int(0.95 * len(lat)) - 1], 1),
            "max_ms": round(lat[-1], 1), "requests_per_s": round(len(sent) / wall, 2), "mismatches": mismatches,
            "latencies_ms": [round(x, 2) for x in lat]}


def scoring_limit(folder: Path, texts: list[str]) -> dict:
    """The model's batched scoring rate in this process: reviews/s of predict_proba on 256 reviews, best of 3."""
    from ttt_pipeline.classifier import load_local

    clf = load_local(folder, device="cpu").prepare()
    batch = sorted((texts[i % len(texts)] for i in range(256)), key=len)  # its best: mini-batches of like lengths
    clf.predict_proba(batch[:32])
    best = min(_timed(lambda: clf.predict_proba(batch)) for _ in range(3))
    return {"reviews": len(batch), "batch_size": clf.config.get("batch_size"), "reviews_per_s": round(256 / best, 1)}


def _timed(fn) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def sweep(folder: Path, texts: list[str], args, tmp: Path) -> dict:
    """Batching off and on, at each client count (module doc)."""
    limit = scoring_limit(folder, texts)
    log(f"[serve-load] limit: {limit}")
    out = {"limit": limit, "settings": {}}
    with model_server(folder, tmp / "serve-off.log", env={"TTT_SERVE_BATCH_TEXTS": "0"}) as off_url, \
            model_server(folder, tmp / "serve-on.log") as on_url:
        urls = {"off": off_url, "on": on_url}
        for clients in args.sweep_clients:  # both servers up, rounds off, on, on, off: a drift falls on both
            rounds = {"off": [], "on": []}
            for batching in ("off", "on", "on", "off"):
                rounds[batching].append(load(urls[batching], texts, None,
                                             argparse.Namespace(requests=args.requests, clients=clients)))
            for batching, rows in rounds.items():
                row = pooled(rows)
                row["served_fraction_of_limit"] = round(row["reviews_per_s"] / limit["reviews_per_s"], 3)
                out["settings"][f"batching_{batching}_clients_{clients}"] = row
                log(f"[serve-load] batching {batching}, {clients} clients: {row}")
    return out


def pooled(rows: list[dict]) -> dict:
    """Rounds of `load` as one: latencies pooled, rates over the summed wall time, mismatches summed."""
    lat_s = [x / 1000 for r in rows for x in r["latencies_ms"]]
    wall, reviews = sum(r["wall_s"] for r in rows), sum(r["reviews"] for r in rows)
    return {**latency_summary(lat_s, wall), "reviews": reviews, "rounds": len(rows), "clients": rows[0]["clients"],
            "max_ms": round(1000 * max(lat_s), 1), "reviews_per_s": round(reviews / wall, 1),
            "mismatches": sum(r["mismatches"] for r in rows)}


def latency_summary(lat_s: list[float], wall_s: float) -> dict:
    lat = sorted(1000 * s for s in lat_s)
    return {"requests": len(lat), "p50_ms": round(statistics.median(lat), 1),
            "p95_ms": round(lat[int(0.95 * len(lat)) - 1], 1), "requests_per_s": round(len(lat) / wall_s, 2)}


def capture_cost(folder: Path, texts: list[str], args, tmp: Path) -> dict:
    """Capture off against on, rounds alternating between two servers of `folder` (module doc)."""
    from ttt_pipeline.io import traffic_recorder as rec

    traffic = tmp / "traffic"
    on_env = {rec.ENV_CAPTURE: "1", rec.ENV_URI: str(traffic), rec.ENV_MODEL_NAME: "bench",
              rec.ENV_MODEL_VERSION: "1"}
    sent = bodies(texts, args.requests, None)
    arms = {"off": {"lat": [], "wall": 0.0, "labels": None}, "on": {"lat": [], "wall": 0.0, "labels": None}}
    with model_server(folder, tmp / "serve-off.log") as off_url, \
            model_server(folder, tmp / "serve-on.log", env=on_env) as on_url:
        urls = {"off": off_url, "on": on_url}
        for url in urls.values():  # warm both: first requests load lazy parts
            for body in sent[:5]:
                invoke(url, body)
        for r in range(2 * args.rounds):
            arm = ("off", "on")[r % 2]
            t0 = time.perf_counter()
            with ThreadPoolExecutor(max_workers=args.clients) as pool:
                answers = list(pool.map(functools.partial(invoke, urls[arm]), sent))
            arms[arm]["wall"] += time.perf_counter() - t0
            arms[arm]["lat"] += [s for _, s in answers]
            arms[arm]["labels"] = arms[arm]["labels"] or [labels for labels, _ in answers]
        time.sleep(7)  # the writer flushes every flush_seconds (5 s): count what the running server wrote
        written = records(traffic)
    out = {arm: latency_summary(a["lat"], a["wall"]) for arm, a in arms.items()}
    out["p95_ratio"] = round(out["on"]["p95_ms"] / out["off"]["p95_ms"], 3)
    out["p50_ratio"] = round(out["on"]["p50_ms"] / out["off"]["p50_ms"], 3)
    out["label_mismatches"] = sum(a != b for a, b in zip(arms["off"]["labels"], arms["on"]["labels"]))
    out["records_written"], out["reviews_sent"] = written, sum(len(b["inputs"]) for b in sent) * args.rounds
    out["rounds"], out["clients"] = args.rounds, args.clients
    return out


def records(traffic: Path) -> int:
    import pyarrow.parquet as pq

    return sum(pq.ParquetFile(p).metadata.num_rows for p in traffic.rglob("*.parquet"))


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
    p.add_argument("--capture-cost", action="store_true",
                   help="capture off against on, the model's own method, instead of the per-method load")
    p.add_argument("--rounds", type=int, default=3, help="--capture-cost: rounds per arm")
    p.add_argument("--sweep", action="store_true",
                   help="the scoring limit, then batching off and on at each --sweep-clients count")
    p.add_argument("--sweep-clients", type=int, nargs="+", default=[1, 8, 32])
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
        if args.sweep:
            out["sweep"] = sweep(folder, texts, args, Path(tmp))
            print(json.dumps(out) if args.json else json.dumps(out, indent=1))
            return
        if args.capture_cost:
            out["capture"] = capture_cost(folder, texts, args, Path(tmp))
            log(f"[serve-load] capture: {out['capture']}")
            print(json.dumps(out) if args.json else json.dumps(out, indent=1))
            return
        with model_server(folder, Path(tmp) / "serve.log") as url:
            for method in args.methods:
                out["methods"][method] = load(url, texts, None if method == "default" else method, args)
                out["methods"][method].pop("latencies_ms")
                log(f"[serve-load] {method}: {out['methods'][method]}")
    print(json.dumps(out) if args.json else json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
