"""Where reviews come from: a local path, Google Drive (gdown://ID) or the Hugging Face hub (hf://NAME[:CONFIG]).

Remote sources are fetched once into a raw cache and verified (size > 0, sha256 when configured); every
failure names the source and the offline alternative.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from ttt_pipeline.data.readers import read_local
from ttt_pipeline.errors import DataError, DownloadError
from ttt_pipeline.storage import file_digest, stable_hash, tree_digest

GDRIVE_URL = "https://drive.google.com/uc?id={id}"
OFFLINE_HINT = "offline, use a local file or folder instead (e.g. --set data.path=data/demo/reviews.jsonl)"


@dataclass
class Source:
    kind: str  # local | gdown | hf
    ref: str
    config: str | None = None

    @classmethod
    def parse(cls, text: str) -> "Source":
        if text.startswith("gdown://"):
            ref = text[len("gdown://"):].strip("/")
            if not ref:
                raise DataError(f"source '{text}': missing Google Drive file id", "write gdown://<file-id>")
            return cls("gdown", ref)
        if text.startswith("hf://"):
            ref = text[len("hf://"):].strip("/")
            name, _, config = ref.partition(":")
            if not name:
                raise DataError(f"source '{text}': missing dataset name", "write hf://<dataset>[:<config>]")
            return cls("hf", name, config or None)
        return cls("local", text)


def gdrive_url(file_id: str) -> str:
    """The download URL; TTT_GDRIVE_URL overrides it (a local stand-in server in tests)."""
    return os.environ.get("TTT_GDRIVE_URL", GDRIVE_URL).format(id=file_id)


def fetch_gdown(file_id: str, raw_dir: Path, sha256: str | None = None) -> Path:
    import gdown

    out = Path(raw_dir) / f"gdown-{file_id}.pt"
    if out.is_file() and out.stat().st_size > 0 and (sha256 is None or file_digest(out) == sha256):
        return out
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_suffix(".part")
    url = gdrive_url(file_id)
    try:
        got = gdown.download(url=url, output=str(tmp), quiet=True)
    except Exception as exc:  # gdown raises requests/IO errors of many types
        got = None
        reason = f"{type(exc).__name__}: {str(exc).splitlines()[0][:200] if str(exc) else ''}"
    else:
        reason = "no file was returned"
    if not got or not tmp.is_file() or tmp.stat().st_size == 0:
        tmp.unlink(missing_ok=True)
        raise DownloadError(f"download of gdown://{file_id} failed ({reason})", OFFLINE_HINT)
    if sha256 and file_digest(tmp) != sha256:
        actual = file_digest(tmp)
        tmp.unlink(missing_ok=True)
        raise DownloadError(f"gdown://{file_id}: sha256 {actual[:12]}… does not match data.sha256 {sha256[:12]}…",
                            "the file changed upstream or the download was damaged; check data.sha256")
    os.replace(tmp, out)
    return out


def fetch_hf(name: str, config: str | None) -> dict[str, pd.DataFrame]:
    import datasets

    try:
        ds = datasets.load_dataset(name, config)
    except Exception as exc:  # hub, network and script errors come in many types
        raise DownloadError(f"hf://{name}{':' + config if config else ''} could not be loaded "
                            f"({type(exc).__name__})", OFFLINE_HINT) from None
    if isinstance(ds, datasets.Dataset):
        return {"train": ds.to_pandas()}
    return {split: d.to_pandas() for split, d in ds.items()}


def load_source(text: str, raw_dir: Path, pt_columns: list[str], sha256: str | None = None):
    """(frames by split or {'all': frame}, digest of the raw input)."""
    src = Source.parse(text)
    if src.kind == "gdown":
        path = fetch_gdown(src.ref, raw_dir, sha256)
        return {"all": read_local(path, pt_columns)}, file_digest(path)
    if src.kind == "hf":
        frames = fetch_hf(src.ref, src.config)
        digest = stable_hash({k: pd.util.hash_pandas_object(v.astype(str), index=False).tolist()
                              for k, v in frames.items()})
        return frames, digest
    path = Path(src.ref).expanduser().resolve()
    if sha256 and path.is_file() and file_digest(path) != sha256:  # before parsing: an unexpected file is not read
        raise DataError(f"{path}: sha256 does not match data.sha256", "update data.sha256 or the file")
    frame = read_local(path, pt_columns)
    return {"all": frame}, (tree_digest(path) if path.is_dir() else file_digest(path))


MDSD_HINT = ("the MDSD reviews (Multi-Domain Sentiment Dataset: Blitzer, Dredze, Pereira, ACL 2007) are not shipped: "
             "download the ACL 2007 set (domain_sentiment_data.tar.gz) from "
             "https://www.cs.jhu.edu/~mdredze/datasets/sentiment/ and set {field} to its electronics folder "
             "(docs/data.md has the files' checksums)")


def missing_path_hint(path: Path | str, field: str) -> str:
    """The hint of a missing local source: where relative paths start, and where a preset's data comes from."""
    hint = f"check {field} (relative paths start at the current folder; `./` in a config file at that file)"
    return f"{hint}; {MDSD_HINT.format(field=field)}" if "mdsd" in str(path).lower() else hint


def existing_local(text: str, field: str) -> Path | None:
    """A local source's resolved path (an error naming `field` when it is missing); None for a remote source."""
    src = Source.parse(text)
    if src.kind != "local":
        return None
    path = Path(src.ref).expanduser().resolve()
    if not path.exists():
        raise DataError(f"{path}: no such file or folder", missing_path_hint(path, field))
    return path


def source_fingerprint(text: str, field: str = "data.path") -> str:
    """Cheap identity of a source for cache keys, before any download: content digest for local paths.
    `field` names the config field in the error of a missing path."""
    path = existing_local(text, field)
    if path is None:
        return text
    return tree_digest(path) if path.is_dir() else file_digest(path)
