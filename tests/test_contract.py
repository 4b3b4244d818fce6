"""The Method contract, the registry and config validation."""

from __future__ import annotations

import importlib.metadata
import sys
import textwrap

import pytest

import nshot.method as m
from nshot.method import ConfigError, Method, UnknownMethodError, available, get, parse_overrides


def test_tail_is_registered_with_the_contract():
    assert "tail" in available()
    method = get("tail")
    assert isinstance(method, Method)
    d = method.describe()
    assert d["name"] == "tail" and d["presets"] == [
        "paper",
        "quickstart",
        "small",
        "small-v1",
        "smoke",
        "tabular",
    ]
    for fn in ("data", "train_loop", "evaluate", "predictor", "experiments"):
        assert callable(getattr(method, fn))
    for preset in ("smoke", "small", "paper", "tabular"):
        cfg = method.config(preset)
        assert cfg.preset == preset


def test_unknown_method_lists_the_available_ones():
    with pytest.raises(UnknownMethodError, match="unknown method 'nope'.*tail"):
        get("nope")


def test_unknown_field_is_named():
    with pytest.raises(ConfigError, match="field 'dept': unknown field"):
        get("tail").config("smoke", dept=3)


def test_out_of_range_value_is_named():
    with pytest.raises(ConfigError, match="field 'depth'.*greater than or equal to 1"):
        get("tail").config("smoke", depth=0)
    with pytest.raises(ConfigError, match="field 'lr'"):
        get("tail").config("small", lr=-1.0)


def test_cross_field_rule_names_the_field():
    with pytest.raises(ConfigError, match="field 'max_ways'.*dictionary"):
        get("tail").config("smoke", max_ways=30, dictionary_size=20)
    with pytest.raises(ConfigError, match="field 'heads'"):
        get("tail").config("smoke", heads=5)


def test_unknown_preset_is_named():
    with pytest.raises(ConfigError, match="field 'preset'.*'huge'"):
        get("tail").config("huge")


def test_replace_validates():
    cfg = get("tail").config("smoke")
    assert cfg.replace(depth=2).depth == 2
    with pytest.raises(ConfigError, match="field 'depth'"):
        cfg.replace(depth=-1)


def test_parse_overrides():
    assert parse_overrides(["a=1", "b=x", "c=[1,2]", "d=null"]) == {
        "a": 1,
        "b": "x",
        "c": [1, 2],
        "d": None,
    }
    with pytest.raises(ConfigError, match="key=value"):
        parse_overrides(["oops"])


def test_third_party_method_through_entry_points(tmp_path, monkeypatch):
    (tmp_path / "toy_nshot_plugin.py").write_text(
        textwrap.dedent(
            """
            from nshot.method import Method, MethodConfig, ResultsTable

            class ToyConfig(MethodConfig):
                PRESETS = {"smoke": {}, "small": {}, "paper": {}}

            class ToyMethod(Method):
                name = "toy_plugin"
                paper = "A toy"
                area = "test"
                Config = ToyConfig
                def data(self, cfg): return {}
                def train_loop(self, cfg): pass
                def evaluate(self, checkpoint, cfg): return {}
                def predictor(self, checkpoint): raise NotImplementedError
                def experiments(self, cfg, workdir): return ResultsTable("toy_plugin", cfg.preset, 1, {}, {})
            """
        )
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    ep = importlib.metadata.EntryPoint(
        name="toy_plugin", value="toy_nshot_plugin:ToyMethod", group=m.ENTRY_POINT_GROUP
    )
    real = importlib.metadata.entry_points

    def fake(**kw):
        if kw.get("group") == m.ENTRY_POINT_GROUP:
            return [ep]
        return real(**kw)

    monkeypatch.setattr(importlib.metadata, "entry_points", fake)
    monkeypatch.setattr(m, "_DISCOVERED", False)
    monkeypatch.setattr(m, "_REGISTRY", dict(m._REGISTRY))
    assert "toy_plugin" in available()
    assert get("toy_plugin").describe()["area"] == "test"
    sys.modules.pop("toy_nshot_plugin", None)


def test_results_table_schema():
    t = m.ResultsTable(
        method="x",
        preset="smoke",
        seeds=2,
        metrics={"acc": True, "err": False},
        rows={"a": {"acc": 0.5, "err": float("nan")}, "b": {"acc": None, "err": 1.0}},
        stds={"a": {"acc": 0.1}},
        runtime_s=3.0,
    )
    j = t.to_json()
    assert j["metrics"] == {"acc": {"higher_is_better": True}, "err": {"higher_is_better": False}}
    assert j["rows"]["a"] == {"acc": 0.5, "acc_std": 0.1, "err": None, "err_std": None}
    assert j["rows"]["b"]["acc"] is None and j["rows"]["b"]["err"] == 1.0
    assert set(j) >= {"method", "preset", "seeds", "metrics", "rows", "runtime_s"}
