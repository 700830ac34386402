"""The heavy steps as their own flows, deployed on the `gpu` work pool, and the orchestrator's side of them.

`finetune` and `evaluate` take only JSON: the configuration, the StepOutput dicts of their inputs (paths and
digests) and the MLflow parent run id. They localise their inputs from the shared store (a no-op when the
store is a shared folder), run the same Prefect tasks as the in-process pipeline, and log their MLflow child
run under the given parent.

`run_heavy_steps` is what `ttt-pipeline` calls when `execution.mode == "deployments"`: one finetune run,
then one evaluate run per corruption family (plus `clean` for the clean and shifted sets), all submitted at
once so that every idle GPU worker takes one. A worker started with `--limit 1` runs one heavy job at a time.
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

from prefect import flow, get_run_logger

from ttt_pipeline import steps
from ttt_pipeline.config import PipelineConfig, absolute_paths
from ttt_pipeline.errors import PipelineError
from ttt_pipeline.io.remote_store import localise, open_store, peek
from ttt_pipeline.storage import StepOutput, StepStore
from ttt_pipeline.tasks import evaluate_task, finetune_task, log_step_task


def run_task(task_fn, *args, **kwargs) -> tuple[dict, bool]:
    """(result, served_from_cache): a Prefect cache hit or a verified store hit both count."""
    state = task_fn(*args, return_state=True, **kwargs)
    result = state.result()
    return result, state.name == "Cached" or bool(result.get("cached"))


def enter_pipeline_home() -> dict:
    """Prefect pull step (see prefect.yaml): the run's working directory is the worker's project home.

    Read when the run starts, on the worker (a `{{ $VAR }}` template in prefect.yaml would be filled in on the
    deploying machine whenever that variable is set there), so relative paths of a configuration (store
    `.cache`, `sqlite:///mlflow.db`, `data/...`) mean the same folder for every run of that worker.

    The home is $TTT_PIPELINE_HOME; when it is unset, the worker's current folder. A process worker starts each
    run in a fresh temporary folder unless its pool sets `working_dir`, so its current folder is the one it
    was started in, which it hands on as $PWD; with a `working_dir`, the run's own folder is that one.
    """
    import tempfile

    from prefect.logging import get_logger

    home = os.environ.get("TTT_PIPELINE_HOME")
    source = "TTT_PIPELINE_HOME"
    if not home:
        here = Path.cwd().resolve()
        throwaway = here.parent == Path(tempfile.gettempdir()).resolve() and here.name.endswith("prefect")
        if not throwaway:
            home, source = str(here), "the current folder; TTT_PIPELINE_HOME is unset"
        else:
            home = os.environ.get("PWD")
            source = "$PWD, the folder the worker was started in; TTT_PIPELINE_HOME is unset"
            if not home:
                raise RuntimeError("TTT_PIPELINE_HOME is not set on this worker and $PWD, the folder it was started "
                                   "in, is unknown: start the worker with TTT_PIPELINE_HOME=/path/to/project")
    path = Path(home).expanduser().resolve()
    if not path.is_dir():
        raise RuntimeError(f"the project home {home} ({source}) is not a folder on this worker")
    get_logger("ttt_pipeline.home").info("project home: %s (%s)", path, source)
    return {"directory": str(path)}


def nproc_per_node() -> int:
    """Processes for data-parallel fine-tuning on this worker: TTT_NPROC_PER_NODE, else 1."""
    try:
        return max(1, int(os.environ.get("TTT_NPROC_PER_NODE", "1")))
    except ValueError:
        return 1


@flow(name="finetune")
def finetune_flow(config: PipelineConfig, data: dict, tokens: dict, parent_run_id: str | None = None) -> dict:
    """Fine-tune on a GPU worker (data-parallel over TTT_NPROC_PER_NODE processes when > 1)."""
    cfg = config
    store = open_store(cfg.store)
    data, tokens = localise(store, data), localise(store, tokens)
    nproc, launched = nproc_per_node(), False
    if nproc > 1 and steps.stored("finetune", steps.finetune_inputs(cfg, StepOutput(**tokens),
                                                                    StepOutput(**data)), store) is None:
        get_run_logger().info("data-parallel fine-tuning on %d processes (torchrun)", nproc)
        from ttt_pipeline.tasks.distributed import launch_finetune

        launch_finetune(cfg, data, tokens, nproc)  # writes the step output into the store
        launched = True
    model, cached = run_task(finetune_task, cfg, data, tokens)  # served from the store after a torchrun
    cached = cached and not launched
    model["cached"] = cached
    if parent_run_id:
        log_step_task(cfg, "finetune", [model, data], parent_run_id, cached)
    publish_output(model)
    return model


@flow(name="evaluate")
def evaluate_flow(config: PipelineConfig, data: dict, model: dict, corrupted: dict,
                  families: list[str] | None = None) -> dict:
    """Score one share of the evaluation grid (`families`; "clean" = the clean and shifted sets)."""
    cfg = config
    store = open_store(cfg.store)
    data, model, corrupted = (localise(store, d) for d in (data, model, corrupted))
    out, cached = run_task(evaluate_task, cfg, data, model, corrupted, families)
    out["cached"] = cached
    publish_output(out)
    return out


OUTPUT_ARTIFACT = "ttt step output"


def publish_output(out: dict) -> None:
    """The output's step, key and digest as a table artifact of this flow run: the orchestrator reads it from
    the Prefect API (no result storage has to be shared between machines) and the UI shows it."""
    from prefect.artifacts import create_table_artifact

    create_table_artifact([{k: out[k] for k in ("step", "key", "digest", "path", "cached")}],
                          description=OUTPUT_ARTIFACT)


# ---------------------------------------------------------------------------------------------------------------
# The orchestrator's side: submit, wait, read the outputs back from the store.


def evaluation_shares(cfg: PipelineConfig) -> list[list[str]]:
    """One evaluate run per corruption family, plus one for the clean and shifted sets."""
    return [["clean"]] + [[f] for f in cfg.corruption.families]


def _wait(flow_run_ids: list, timeout_s: float, poll_s: float = 2.0) -> list:
    from prefect.client.orchestration import get_client

    deadline = time.monotonic() + timeout_s
    pending = {str(i): None for i in flow_run_ids}
    with get_client(sync_client=True) as client:
        while True:
            for fid in [k for k, v in pending.items() if v is None]:
                fr = client.read_flow_run(fid)
                if fr.state is not None and fr.state.is_final():
                    pending[fid] = fr
            if all(v is not None for v in pending.values()):
                return [pending[str(i)] for i in flow_run_ids]
            if time.monotonic() > deadline:
                late = [k for k, v in pending.items() if v is None]
                raise TimeoutError(f"heavy deployment runs {late} not finished after {timeout_s:.0f}s "
                                   "(is a worker polling the gpu pool? `prefect worker start --pool gpu`)")
            time.sleep(poll_s)


def _submit(name: str, parameters: dict[str, Any], run_name: str):
    from prefect.deployments import run_deployment

    try:
        return run_deployment(name, parameters=parameters, timeout=0, flow_run_name=run_name,
                              tags=["ttt-pipeline", "heavy"])
    except Exception as exc:
        if "not found" in str(exc).lower() or type(exc).__name__ == "ObjectNotFound":
            raise PipelineError(f"deployment {name!r} not found on the Prefect server",
                                "run `prefect --no-prompt deploy --all` in the project folder first") from None
        raise


def _check(runs: list, what: str) -> None:
    bad = [f"{r.name} ({r.state.type.value}: {r.state.message})" for r in runs if not r.state.is_completed()]
    if bad:
        raise PipelineError(f"{what} failed on the gpu pool: {'; '.join(bad)}",
                            "open these flow runs in the Prefect UI for their logs")


def _published(flow_run_id) -> dict:
    """The StepOutput reference a heavy run published (see publish_output)."""
    import json

    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterFlowRunId

    with get_client(sync_client=True) as client:
        arts = client.read_artifacts(artifact_filter=ArtifactFilter(
            flow_run_id=ArtifactFilterFlowRunId(any_=[flow_run_id])))
    for a in arts:
        if a.description == OUTPUT_ARTIFACT:
            rows = json.loads(a.data) if isinstance(a.data, str) else a.data
            return rows[0]
    raise PipelineError(f"flow run {flow_run_id} completed without publishing its step output",
                        "are the gpu workers running the same version of the package?")


def _collect(store: StepStore, flow_run_id, what: str) -> dict:
    """The output a run made, from the shared store, by the key it reported (never recomputed here: a GPU
    worker on another package version may key differently)."""
    ref = _published(flow_run_id)
    out = peek(store, ref["step"], ref["key"])
    if out is None or out.digest != ref["digest"]:
        raise PipelineError(f"{what}: output {ref['step']}/{ref['key']} (made at {ref['path']}) is not in the "
                            f"store {getattr(store, 'url', store.root)}",
                            "every worker must share `store` (a common mount or an fsspec URL)")
    out.cached = bool(ref.get("cached"))
    return out.to_dict()


def run_heavy_steps(cfg: PipelineConfig, data: dict, tokens: dict, corrupted: dict,
                     parent_run_id: str) -> tuple[dict, list[dict], bool, bool]:
    """Fine-tune, then the evaluation fan-out, as deployment runs on the gpu pool.

    Returns (model output, evaluation outputs, finetune cached, evaluation cached).
    """
    logger = get_run_logger()
    ex = cfg.execution
    cfg = absolute_paths(cfg)
    store = open_store(cfg.store)
    run = _submit(ex.finetune_deployment, {"config": cfg.model_dump(mode="json"), "data": data, "tokens": tokens,
                                           "parent_run_id": parent_run_id}, "finetune")
    logger.info("finetune submitted to %s as flow run %s", ex.finetune_deployment, run.id)
    _check(_wait([run.id], ex.timeout_s), "fine-tuning")
    model = _collect(store, run.id, "fine-tuning")
    outs, ev_cached = evaluate_on_gpu(cfg, data, model, corrupted, evaluation_shares(cfg))
    return model, outs, model["cached"], ev_cached


def evaluate_on_gpu(cfg: PipelineConfig, data: dict, model: dict, corrupted: dict,
                    shares: list[list[str]]) -> tuple[list[dict], bool]:
    """One evaluate deployment run per share, submitted together; (outputs in this machine's cache, cached)."""
    logger = get_run_logger()
    cfg = absolute_paths(cfg)
    store = open_store(cfg.store)
    params = cfg.model_dump(mode="json")
    runs = [_submit(cfg.execution.evaluate_deployment,
                    {"config": params, "data": data, "model": model, "corrupted": corrupted, "families": fams},
                    f"evaluate-{'-'.join(fams)}") for fams in shares]
    logger.info("evaluation fanned out over %d runs: %s", len(runs), [" ".join(f) for f in shares])
    _check(_wait([r.id for r in runs], cfg.execution.timeout_s), "evaluation")
    # the orchestrator reads each results.json to log the evaluate stage: pulled when the store is a URL
    outs = [localise(store, _collect(store, r.id, "evaluation")) for r in runs]
    return outs, all(o["cached"] for o in outs)
