"""Content-addressed step outputs: atomic writes, digests checked on reuse, one writer per key.

A step's output lives in `<store>/<step>/<key>/` where key = hash(step, code version, inputs). The folder
appears only complete (written under a temp name, then renamed), carries a manifest with the digest of its
files, and is re-verified before reuse so a damaged entry is rebuilt, never used.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import tempfile
import time
import uuid
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterator

from filelock import FileLock

MANIFEST = "manifest.json"


def stable_hash(obj: Any) -> str:
    """sha256 of canonical JSON: equal inputs give equal keys across processes and machines."""
    blob = json.dumps(obj, sort_keys=True, separators=(",", ":"), default=str).encode()
    return hashlib.sha256(blob).hexdigest()


def file_digest(path: Path, chunk: int = 1 << 20) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(chunk):
            h.update(block)
    return h.hexdigest()


def tree_digest(root: Path, exclude: tuple[str, ...] = (MANIFEST,)) -> str:
    """Digest of every file's relative path and content under root (order independent of the filesystem)."""
    h = hashlib.sha256()
    root = Path(root)
    for p in sorted(q for q in root.rglob("*") if q.is_file() and q.name not in exclude):
        h.update(p.relative_to(root).as_posix().encode())
        h.update(b"\0")
        h.update(file_digest(p).encode())
    return h.hexdigest()


@contextlib.contextmanager
def atomic_dir(final: Path) -> Iterator[Path]:
    """Yield a temp folder beside `final`; on success it replaces `final` in one rename."""
    final = Path(final)
    final.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{final.name}.tmp-", dir=final.parent))
    try:
        yield tmp
        if final.exists():
            trash = final.parent / f".{final.name}.old-{uuid.uuid4().hex[:8]}"
            os.replace(final, trash)
            shutil.rmtree(trash, ignore_errors=True)
        os.replace(tmp, final)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)


def atomic_write_text(path: Path, text: str) -> None:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


@dataclass
class StepOutput:
    """What a step hands to the next: a path and a digest, plus small metadata (never objects)."""

    step: str
    key: str
    path: str
    digest: str
    cached: bool = False
    meta: dict[str, Any] = field(default_factory=dict)
    wall_s: float = 0.0

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


class StepStore:
    """Runs a builder at most once per key; later calls verify and reuse its output."""

    def __init__(self, root: str | Path):
        self.root = Path(root)

    def entry(self, step: str, key: str) -> Path:
        return self.root / step / key

    def load(self, step: str, key: str) -> StepOutput | None:
        folder = self.entry(step, key)
        man = folder / MANIFEST
        if not man.is_file():
            return None
        try:
            data = json.loads(man.read_text())
        except (OSError, json.JSONDecodeError):
            return None
        if tree_digest(folder) != data.get("digest"):
            return None
        return StepOutput(step=step, key=key, path=str(folder), digest=data["digest"], cached=True,
                          meta=data.get("meta", {}), wall_s=0.0)

    @staticmethod
    def key(step: str, inputs: dict[str, Any], version: str = "1") -> str:
        return stable_hash({"step": step, "version": version, "inputs": inputs})[:24]

    def run(self, step: str, inputs: dict[str, Any], build: Callable[[Path], dict[str, Any]],
            version: str = "1") -> StepOutput:
        """`build(tmp_dir)` writes the output into tmp_dir and returns metadata for the manifest."""
        key = self.key(step, inputs, version)
        hit = self.load(step, key)
        if hit is not None:
            return hit
        folder = self.entry(step, key)
        folder.parent.mkdir(parents=True, exist_ok=True)
        with FileLock(str(folder) + ".lock"):
            hit = self.load(step, key)  # another run may have finished it while we waited
            if hit is not None:
                return hit
            for stale in folder.parent.glob(f".{key}.tmp-*"):  # left by a killed build; we hold the lock
                shutil.rmtree(stale, ignore_errors=True)
            t0 = time.perf_counter()
            with atomic_dir(folder) as tmp:
                meta = build(tmp) or {}
                digest = tree_digest(tmp)
                (tmp / MANIFEST).write_text(json.dumps(
                    {"step": step, "key": key, "digest": digest, "inputs": inputs, "meta": meta},
                    indent=2, default=str))
            wall = time.perf_counter() - t0
        return StepOutput(step=step, key=key, path=str(folder), digest=digest, cached=False, meta=meta,
                          wall_s=wall)
