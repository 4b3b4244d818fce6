"""cfr: the generator, the AUPRO metric, the config, the model (unit checks; no Ray)."""

from __future__ import annotations

import numpy as np
import pytest

from nshot.errors import ConfigError
from nshot.methods.cfr.config import CfrConfig
from nshot.methods.cfr.data import (
    DEFECTS,
    class_table,
    fewshot_indices,
    heightfield_sample,
    load_class,
)


@pytest.fixture(scope="module")
def smoke_cfg(tmp_path_factory):
    import os

    os.environ.setdefault("NSHOT_CACHE", str(tmp_path_factory.mktemp("cfr-cache")))
    return CfrConfig.from_preset("smoke")


@pytest.mark.parametrize("cls", ["bump", "cylinder", "saddle", "ring"])
def test_generator_masks_lie_inside_the_object_and_background_xyz_is_exactly_zero(cls):
    for i, defect in enumerate(DEFECTS):
        smp = heightfield_sample(cls, 32, defect, np.random.default_rng([7, i]))
        valid = smp.xyz.any(-1)
        assert smp.xyz.dtype == np.float32 and smp.rgb.dtype == np.uint8
        assert 0.15 < valid.mean() < 0.8
        assert np.all(smp.xyz[~valid] == 0.0)
        assert np.all(smp.xyz[valid][:, :2] > 0)  # x, y in (0, 1): a valid point is never 0
        assert not (smp.mask & ~valid).any()  # anomaly pixels only on the object
        assert (smp.mask.sum() > 0) == (defect != "good")


def test_defects_change_the_right_modality():
    rng = lambda: np.random.default_rng(3)  # noqa: E731 - the same draws for each defect
    good = heightfield_sample("bump", 32, "good", rng())
    geo = heightfield_sample("bump", 32, "geometric", rng())
    col = heightfield_sample("bump", 32, "colour", rng())
    # the same pose and noise draws up to the defect: geometry moves z, a stain moves only RGB
    for smp in (geo, col):
        assert smp.mask.any()
        assert np.all(smp.xyz.any(-1) == good.xyz.any(-1))
    assert np.abs(geo.xyz[..., 2] - good.xyz[..., 2])[geo.mask].max() > 0.01
    stain = np.abs(col.rgb.astype(int) - good.rgb.astype(int)).sum(-1)
    assert stain[col.mask].mean() > 60


def test_cached_table_is_deterministic_and_balanced(smoke_cfg):
    tab = class_table(smoke_cfg, "bump")
    assert tab.num_rows == smoke_cfg.n_train + smoke_cfg.n_test_good + smoke_cfg.n_test_bad
    again = class_table(smoke_cfg, "bump")  # read back from the verified cache
    assert again.equals(tab)
    data = load_class(smoke_cfg, "bump")
    test = data["test"]
    assert test.rgb.shape == (len(test), 32, 32, 3)
    bad = [d for d in test.defect if d != "good"]
    assert {d: bad.count(d) for d in set(bad)} == {"geometric": 2, "colour": 2, "both": 2}
    assert np.all(test.label == (test.mask.reshape(len(test), -1).any(1)))
    assert not data["train"].mask.any()


def test_fewshot_choice_follows_the_paper_code():
    assert list(fewshot_indices(20, 4, 42)) == sorted(
        np.random.default_rng(42).choice(20, size=4, replace=False).tolist()
    )
    assert len(set(fewshot_indices(20, 20, 42))) == 20


@pytest.mark.parametrize(
    ("overrides", "field"),
    [
        ({"system": "cfr", "use_retriever": False}, "use_retriever"),
        ({"theta_mode": "median"}, "theta_mode"),
        ({"classes": ["bump", "teapot"]}, "classes"),
        ({"class_name": "ring", "classes": ["bump"]}, "class_name"),
        ({"rgb_dim": 32}, "rgb_dim"),
        ({"shots": [1, 40]}, "shots"),
        ({"coreset_frac": 0.0}, "coreset_frac"),
        ({"bogus": 1}, "bogus"),
    ],
)
def test_config_errors_name_the_field(overrides, field):
    with pytest.raises(ConfigError, match=field):
        CfrConfig.from_preset("smoke", **overrides)


def test_steps_follow_the_stages_of_the_system():
    cfg = CfrConfig.from_preset("small")
    assert cfg.steps == cfg.map_epochs + cfg.ret_epochs
    assert cfg.replace(system="cfm").steps == cfg.map_epochs
    assert cfg.replace(system="cfm").cycles is False
    assert cfg.replace(system="btf").steps == 1
    assert cfg.replace(map_epochs=7).steps == 7 + cfg.ret_epochs
