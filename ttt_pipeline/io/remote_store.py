"""The step store on shared storage: a local folder (default) or an fsspec URL (s3://, gs://, file://, memory://).

With a URL, every machine keeps a local working cache (`$TTT_STORE_CACHE`, default
`~/.cache/ttt-pipeline/stores/<hash of the URL>`) and the URL holds the shared copy. A step folder is keyed the
same way in both places (`<step>/<key>/`), so:

* `load` looks in the local cache first, else downloads the folder from the URL (into a temp folder, renamed in
  place only after its digest matched its manifest);
* `run` builds locally as before (one writer per key on this machine), then uploads the folder: every file
  first, `manifest.json` last, so a folder on the URL counts as present only once it is complete;
* `localise` turns a StepOutput produced on another machine (its `path` is that machine's cache) into the
  same output in this machine's cache, pulled by step and key and checked against its digest.

What this does not do: no locking across machines (two machines that build the same key at the same time both
build it and the second upload overwrites the first with identical content, since keys are content
addresses) and no garbage collection on the URL. Credentials come from fsspec's usual places (for s3fs: the
AWS environment variables or ~/.aws), never from the configuration.
"""

from __future__ import annotations

import hashlib
import json
import os
import time
from pathlib import Path
from typing import Any, Callable

from ttt_pipeline.errors import PipelineError
from ttt_pipeline.storage import MANIFEST, StepOutput, StepStore, atomic_dir, tree_digest


def is_url(root: str | Path) -> bool:
    return "://" in str(root)


def default_cache(url: str) -> Path:
    base = os.environ.get("TTT_STORE_CACHE")
    if base:
        return Path(base).expanduser().resolve() / hashlib.sha256(url.encode()).hexdigest()[:12]
    return Path.home() / ".cache" / "ttt-pipeline" / "stores" / hashlib.sha256(url.encode()).hexdigest()[:12]


class SyncedStepStore(StepStore):
    """A StepStore whose local root is a working cache of an fsspec URL."""

    def __init__(self, url: str, cache_dir: str | Path | None = None):
        import fsspec

        self.url = url.rstrip("/")
        super().__init__(Path(cache_dir) if cache_dir else default_cache(self.url))
        self.root.mkdir(parents=True, exist_ok=True)
        try:
            self.fs, self.base = fsspec.core.url_to_fs(self.url)
        except (ImportError, ValueError) as exc:
            raise PipelineError(f"store {url!r}: {exc}",
                                "install the fsspec backend of that scheme (e.g. pip install s3fs) "
                                "or use a local folder") from None
        self.base = self.base.rstrip("/")

    # -- remote layout ---------------------------------------------------------------------------------------
    def remote(self, step: str, key: str) -> str:
        return f"{self.base}/{step}/{key}"

    def remote_manifest(self, step: str, key: str) -> dict[str, Any] | None:
        path = f"{self.remote(step, key)}/{MANIFEST}"
        try:
            if not self.fs.exists(path):
                return None
            with self.fs.open(path, "rb") as f:
                return json.loads(f.read().decode())
        except (OSError, json.JSONDecodeError):
            return None

    def pull(self, step: str, key: str) -> bool:
        """Download <url>/<step>/<key> into the cache; False when the URL has no complete copy."""
        man = self.remote_manifest(step, key)
        if man is None:
            return False
        src = self.remote(step, key)
        with atomic_dir(self.entry(step, key)) as tmp:
            for rpath in self.fs.find(src):
                rel = rpath[len(src):].lstrip("/") if rpath.startswith(src) else rpath.split(f"/{key}/", 1)[1]
                if not rel or rel == MANIFEST:
                    continue
                dst = tmp / rel
                dst.parent.mkdir(parents=True, exist_ok=True)
                self.fs.get_file(rpath, str(dst))
            if tree_digest(tmp) != man.get("digest"):
                raise PipelineError(f"store {self.url}: {step}/{key} does not match its manifest digest",
                                    "delete that folder on the store; the next run rebuilds it")
            (tmp / MANIFEST).write_text(json.dumps(man, indent=2, default=str))
        return True

    def push(self, step: str, key: str) -> None:
        """Upload a cached folder unless the URL already holds it (content addresses: same key, same bytes)."""
        if self.remote_manifest(step, key) is not None:
            return
        folder = self.entry(step, key)
        dst = self.remote(step, key)
        files = sorted(p for p in folder.rglob("*") if p.is_file() and p.name != MANIFEST)
        for p in files:
            rpath = f"{dst}/{p.relative_to(folder).as_posix()}"
            self.fs.makedirs(rpath.rsplit("/", 1)[0], exist_ok=True)
            self.fs.put_file(str(p), rpath)
        self.fs.put_file(str(folder / MANIFEST), f"{dst}/{MANIFEST}")  # last: marks the folder complete

    # -- StepStore interface ---------------------------------------------------------------------------------
    def load(self, step: str, key: str) -> StepOutput | None:
        hit = super().load(step, key)
        if hit is None and self.pull(step, key):
            hit = super().load(step, key)
        return hit

    def run(self, step: str, inputs: dict[str, Any], build: Callable[[Path], dict[str, Any]],
            version: str = "1") -> StepOutput:
        out = super().run(step, inputs, build, version)
        for attempt in range(3):
            try:
                self.push(step, out.key)
                break
            except OSError:
                if attempt == 2:
                    raise
                time.sleep(2 ** attempt)
        return out

    def peek(self, step: str, key: str) -> StepOutput | None:
        """The output's path (in this cache) and digest from the manifest alone, without downloading."""
        local = super().load(step, key)
        if local is not None:
            return local
        man = self.remote_manifest(step, key)
        if man is None:
            return None
        return StepOutput(step=step, key=key, path=str(self.entry(step, key)), digest=man["digest"], cached=True,
                          meta=man.get("meta", {}))


def open_store(root: str | Path) -> StepStore:
    """A plain StepStore for a folder, a SyncedStepStore for an fsspec URL."""
    return SyncedStepStore(str(root)) if is_url(root) else StepStore(Path(root))


def peek(store: StepStore, step: str, key: str) -> StepOutput | None:
    return store.peek(step, key) if isinstance(store, SyncedStepStore) else store.load(step, key)


def localise(store: StepStore, out: dict | StepOutput) -> dict:
    """The same output with a path valid on this machine (pulled from the shared store when needed)."""
    o = out if isinstance(out, StepOutput) else StepOutput(**out)
    if (Path(o.path) / MANIFEST).is_file():  # produced on this machine (or on a shared mount)
        return o.to_dict()
    hit = store.load(o.step, o.key)
    if hit is None or hit.digest != o.digest:
        where = getattr(store, "url", str(store.root))
        raise PipelineError(
            f"step output {o.step}/{o.key} (made at {o.path}) is not in the store {where}",
            "in deployments mode every worker must share the store: set `store` to an fsspec URL "
            "(s3://bucket/prefix) or to a folder mounted at the same path on every worker")
    hit.cached = o.cached
    hit.wall_s = o.wall_s
    return hit.to_dict()
