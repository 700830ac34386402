"""CUDA out-of-memory during fine-tuning: halve the batch once, say so, and record it; never retry blindly.

An OOM is not transient: the same batch size fails the same way, so a plain retry only burns GPU time. The
one useful fallback is a smaller batch. `run_with_oom_fallback` calls the training callable with the
configured batch size; on `torch.cuda.OutOfMemoryError` it frees the CUDA cache and calls it once more with
half the batch. A second OOM becomes a PipelineError that names the sizes and the fix. Anything else (CPU
`MemoryError`, bugs) passes through untouched. Under torchrun (a process group is up) there is no fallback:
ranks must agree on the batch size, so the OOM is reported as an error at once.

`memory_errors(stage, hint)` wraps each pipeline step: running out of memory in any way (torch's CPU allocator,
Python, CUDA after the fallback) becomes an `OutOfMemory` error naming the stage and the settings that lower
memory, which the command prints as `error:` / `hint:` instead of a traceback.
"""

from __future__ import annotations

import ctypes
import functools
import gc
import logging
import sys
from contextlib import contextmanager
from typing import Callable, Iterator, TypeVar

import torch

from ttt_pipeline.errors import PipelineError

log = logging.getLogger(__name__)
T = TypeVar("T")


def _free_cuda() -> None:
    gc.collect()  # the failed attempt's model and activations are garbage once its frames are gone
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


def _distributed() -> bool:
    return torch.distributed.is_available() and torch.distributed.is_initialized()


def run_with_oom_fallback(train: Callable[[int], T], batch_size: int, what: str = "fine-tuning") -> tuple[T, dict]:
    """(train's result, metadata); metadata holds `oom_halved_batch_size` (and the original) after a fallback.

    `train(batch_size)` must start from scratch for the batch size it is given (a fresh model, its own
    checkpoints): the failed attempt's state is not reused.
    """
    try:
        return train(batch_size), {}
    except torch.cuda.OutOfMemoryError as exc:
        smaller = batch_size // 2
        if _distributed():  # one rank retrying alone would leave the others waiting in an all-reduce
            raise PipelineError(f"CUDA out of memory in data-parallel {what} at batch size {batch_size} per rank",
                                "set a smaller finetune.batch_size (each rank uses it) or a shorter "
                                "model.max_length") from None
        if smaller < 1:
            raise PipelineError(f"CUDA out of memory in {what} at batch size 1",
                                "use a shorter model.max_length, a smaller model or a larger GPU") from None
        log.warning("CUDA out of memory in %s at batch size %d (%s); retrying once with batch size %d",
                    what, batch_size, str(exc).splitlines()[0][:120] if str(exc) else "no detail", smaller)
    _free_cuda()  # outside the except block: the exception (and the frames it pins) is released by now
    try:
        result = train(smaller)
    except torch.cuda.OutOfMemoryError:
        pass
    else:
        return result, {"oom_halved_batch_size": smaller, "oom_original_batch_size": batch_size}
    _free_cuda()
    raise PipelineError(f"CUDA out of memory in {what} at batch size {batch_size} and again at {smaller}",
                        f"set finetune.batch_size below {smaller} or a shorter model.max_length, "
                        "or use a larger GPU")


class OutOfMemory(PipelineError):
    """A stage ran out of memory: names the stage and the settings that lower its memory."""


_MEMORY_WORDS = ("can't allocate memory", "cannot allocate memory", "out of memory", "not enough memory")


# oneDNN's error when it cannot build a kernel, whatever the cause; under `ulimit -v 4000000` its allocation fails
# with it in masked TTT's adaptation
_ONEDNN_PRIMITIVE = "could not create a primitive"


def is_out_of_memory(exc: BaseException) -> bool:
    """Python's MemoryError, CUDA's OutOfMemoryError, a RuntimeError of torch's CPU allocator
    (`DefaultCPUAllocator: can't allocate memory`), which has no class of its own, or oneDNN's `could not create
    a primitive` while the process runs under an address-space or data-size limit (its other causes, an
    unsupported kernel for example, pass through as they are)."""
    if isinstance(exc, (MemoryError, torch.cuda.OutOfMemoryError)):
        return True
    if not isinstance(exc, RuntimeError):
        return False
    text = str(exc).lower()
    return any(w in text for w in _MEMORY_WORDS) or (_ONEDNN_PRIMITIVE in text and memory_limit() is not None)


def memory_limit() -> int | None:
    """The process's address-space or data-size limit in bytes (`ulimit -v` / `-d`), None when unlimited."""
    try:
        import resource
    except ImportError:  # not POSIX
        return None
    limits = [resource.getrlimit(r)[0] for r in (resource.RLIMIT_AS, resource.RLIMIT_DATA)]
    finite = [x for x in limits if x != resource.RLIM_INFINITY]
    return min(finite) if finite else None


@functools.cache
def _glibc():
    """glibc, opened on first use; None where there is none (not Linux, or musl)."""
    try:
        return ctypes.CDLL("libc.so.6") if sys.platform.startswith("linux") else None
    except OSError:
        return None


def release_freed_memory() -> None:
    """Give the heap pages a finished stage freed back to the system. glibc keeps freed blocks in its heap for
    reuse, and the fine-tuning steps' activations of many sizes leave it fragmented: on the demo the heap held
    three times what was live when the evaluate step began, and the process stayed at that size to the end. torch has no CPU cache to empty, so this asks glibc itself (`malloc_trim`);
    it changes no result, only what the process holds between stages."""
    _free_cuda()  # garbage collected first, so what the stage dropped is free to give back
    libc = _glibc()
    if libc is not None and hasattr(libc, "malloc_trim"):
        libc.malloc_trim(0)


@contextmanager
def memory_errors(stage: str, hint: str) -> Iterator[None]:
    """Out of memory anywhere in a stage becomes `error: out of memory in <stage>` and a hint with the settings
    that lower memory, instead of a traceback; every other error passes through untouched. The stage's freed
    memory goes back to the system when it ends (`release_freed_memory`)."""
    try:
        yield
    except (MemoryError, RuntimeError) as exc:
        if isinstance(exc, PipelineError) or not is_out_of_memory(exc):
            raise
        detail = str(exc).strip().splitlines()[0][:160] if str(exc).strip() else type(exc).__name__
        raise OutOfMemory(f"out of memory in {stage} ({detail})", hint) from exc
    finally:
        release_freed_memory()
