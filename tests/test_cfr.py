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
    c = smoke_cfg
    assert tab.num_rows == c.n_train + c.n_test_good + c.n_test_bad + c.n_val_good + c.n_val_bad
    again = class_table(smoke_cfg, "bump")  # read back from the verified cache
    assert again.equals(tab)
    data = load_class(smoke_cfg, "bump")
    test = data["test"]
    assert test.rgb.shape == (len(test), 32, 32, 3)
    bad = [d for d in test.defect if d != "good"]
    assert {d: bad.count(d) for d in set(bad)} == {"geometric": 2, "colour": 2, "both": 2}
    assert np.all(test.label == (test.mask.reshape(len(test), -1).any(1)))
    assert not data["train"].mask.any()
    val = data["val"]
    assert list(val.label) == [0] * c.n_val_good + [1] * c.n_val_bad
    assert not any(np.array_equal(v, t) for v in val.rgb for t in test.rgb)  # other images


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


# --- the AUPRO metric -------------------------------------------------------------------------


def _square_defect_map():
    """10 × 10, one 4 × 4 defect (16 px, one component) and 84 normal pixels: defect scores
    8 × 0.8 and 8 × 0.4, normal scores 21 × 0.9, 21 × 0.6 and 42 × 0.1."""
    mask = np.zeros((10, 10), bool)
    mask[2:6, 2:6] = True
    score = np.zeros((10, 10))
    score[mask] = np.r_[np.full(8, 0.8), np.full(8, 0.4)]
    score[~mask] = np.r_[np.full(21, 0.9), np.full(21, 0.6), np.full(42, 0.1)]
    return score[None], mask[None]


def test_aupro_equals_its_analytic_value_and_a_perfect_map_gives_one():
    from nshot.methods.cfr.metrics import aupro, pro_curve

    score, mask = _square_defect_map()
    fpr, pro = pro_curve(score, mask)
    np.testing.assert_allclose(fpr, [0, 0.25, 0.25, 0.5, 0.5, 1.0])
    np.testing.assert_allclose(pro, [0, 0, 0.5, 0.5, 1.0, 1.0])
    # PRO is 0 up to FPR 0.25, then 0.5 up to 0.3 (interpolated at alpha): 0.5 · 0.05 / 0.3
    assert abs(aupro(score, mask, 0.3) - 1 / 12) < 1e-6
    # alpha 0.6: 0.5 · 0.25 + 1.0 · 0.1 = 0.225, over 0.6
    assert abs(aupro(score, mask, 0.6) - 0.225 / 0.6) < 1e-6
    assert aupro(mask.astype(float), mask, 0.3) == 1.0
    assert aupro(mask.astype(float), mask, 0.3, thresholds=99) == 1.0
    assert aupro(-mask.astype(float), mask, 0.3) == 0.0


def test_aupro_99_thresholds_agree_with_the_exact_curve_and_components_weigh_equally():
    from scipy import ndimage

    from nshot.methods.cfr.metrics import aupro

    rng = np.random.default_rng(0)
    masks = np.zeros((20, 32, 32), bool)
    for i in range(10):
        r, c = rng.integers(4, 28, 2)
        masks[i, r - 3 : r + 3, c - 2 : c + 3] = True
    maps = ndimage.uniform_filter(rng.normal(size=masks.shape) + 1.5 * masks, (1, 3, 3))
    for alpha in (0.3, 0.1):
        assert abs(aupro(maps, masks, alpha) - aupro(maps, masks, alpha, thresholds=99)) < 0.005
    # two components, one found and one missed: PRO 0.5 whatever their sizes (8-connectivity)
    m = np.zeros((1, 12, 12), bool)
    m[0, 1:3, 1:3] = True
    m[0, 3, 3] = True  # touches the first diagonally: the same component
    m[0, 6:12, 6:12] = True
    s = np.where(m, 0.0, 0.5)
    s[0, 1:4, 1:4] = np.where(m[0, 1:4, 1:4], 1.0, 0.5)
    assert abs(aupro(s, m, 0.3) - 0.5) < 1e-6


# --- the model --------------------------------------------------------------------------------


def test_coreset_size_is_an_int_and_the_greedy_coreset_covers_the_clusters():
    import torch

    from nshot.methods.cfr.model import coreset_size, greedy_coreset

    assert coreset_size(1234, 0.1) == 123 and isinstance(coreset_size(1234, 0.1), int)
    assert coreset_size(5, 0.01) == 1 and coreset_size(10, 1.0) == 10
    g = torch.Generator().manual_seed(0)
    centres = torch.tensor([[0.0, 0.0], [10.0, 0.0], [0.0, 10.0], [10.0, 10.0]])
    x = (centres[:, None, :] + 0.1 * torch.randn(4, 25, 2, generator=g)).reshape(100, 2)
    idx = greedy_coreset(x, 0.04, proj=8, seed=0)
    assert idx.dtype == torch.long and len(idx) == 4 and len(set(idx.tolist())) == 4
    assert sorted({int(i) // 25 for i in idx}) == [0, 1, 2, 3]  # one row from every cluster


def test_mappings_retriever_and_banks_have_the_papers_shapes(smoke_cfg):
    import torch

    from nshot.methods.cfr.model import BANKS, build_model

    m = build_model(smoke_cfg, dict.fromkeys(BANKS, 5))
    c2, c3 = smoke_cfg.rgb_dim, smoke_cfg.xyz_dim
    assert m.f23.w12.weight.shape == (2 * ((c2 + c3) // 2), c2)
    assert m.f32.w3.weight.shape == (c2, (c2 + c3) // 2)
    assert all(p.bias is None for p in m.retriever.modules() if isinstance(p, torch.nn.Linear))
    f2, f3 = torch.randn(50, c2), torch.randn(50, c3)
    assert m.mapping_loss(f2, f3, True) > m.mapping_loss(f2, f3, False) > 0
    m.set_banks(f2, f3, seed=0)
    assert m.bank_sizes() == dict.fromkeys(BANKS, 5)
    # with one candidate the retriever returns Wout Wv of the nearest key's value
    m.retriever.top_k = 1
    q = m.kv_keys[2:3] * 3.0
    want = m.retriever.wout(m.retriever.wv(m.kv_values[2:3]))
    torch.testing.assert_close(m.retrieve(q), want)


def test_scoring_normalisations_and_replacement(smoke_cfg):
    import torch

    from nshot.methods.cfr.model import BANKS, Scored, build_model

    raw = torch.tensor([[0.0, 1.0], [2.0, 3.0]])
    s = Scored(raw=raw, replaced=0, valid=3)
    torch.testing.assert_close(s.aupro_map, raw / 2.0)  # mean over S != 0
    assert abs(s.image_score - 3.0 / 2.0**0.5) < 1e-6
    torch.testing.assert_close(s.pixel_map, raw / 1.5**0.5)  # mean over all pixels

    torch.manual_seed(0)
    m = build_model(smoke_cfg, dict.fromkeys(BANKS, 8)).eval()
    h = w = 8
    f2, f3 = torch.rand(h, w, smoke_cfg.rgb_dim), torch.randn(h, w, smoke_cfg.xyz_dim)
    valid = torch.zeros(h, w, dtype=torch.bool)
    valid[2:7, 1:6] = True
    m.set_banks(f2[valid], f3[valid], seed=0)
    none = m.score(f2, f3, valid, "cfr_cyclic_only", theta=0.0)
    assert none.replaced == 0 and none.valid == 25
    assert torch.all(none.raw[~valid] == 0) and torch.all(none.raw[valid] >= 0)
    every = m.score(f2, f3, valid, "cfr", theta=-1.0)  # every valid pixel is replaced
    assert every.replaced == 25 and not torch.allclose(every.raw, none.raw)
    rnd = m.score(f2, f3, valid, "cfr_random_replace", theta=-1.0)
    torch.testing.assert_close(rnd.raw, every.raw)  # all pixels: random = the same set
    assert m.score(f2, f3, valid, "cfr", theta=3.0).replaced == 0
    for system in ("patchcore_rgb", "patchcore_3d", "btf"):
        sc = m.score(f2, f3, valid, system)
        assert torch.all(sc.raw[~valid] == 0) and sc.raw[valid].max() > 0
        # PatchCore's image score is the plain max (PatchCore's own); the others are normalised
        plain = system != "btf"
        assert (sc.image_score == float(sc.raw.max())) is plain
        assert abs(sc.image_score - s_norm(sc.raw)) < 1e-6 or plain


def s_norm(raw):
    nz = raw[raw != 0]
    return float((raw / nz.mean().sqrt()).max())


def test_a_stage_steps_only_its_own_part_also_through_the_ddp_dispatch(smoke_cfg):
    """Under DDP every parameter gets a gradient (zero for the part a stage does not train):
    Adam must neither move the mappings in stage 3 (on their stage-1 momentum) nor count
    stage-1 steps for the retriever."""
    import torch

    from nshot.methods.cfr.train import _Dispatch, epoch, new_model, new_optimizer, shot_features

    class Ddp(torch.nn.Module):  # what `_call` sees of DDP: a `module` and a forward
        def __init__(self, inner):
            super().__init__()
            self.module = inner

        def forward(self, *args):
            return self.module(*args)

    cfg = smoke_cfg.replace(system="cfr")
    shots = shot_features(cfg)
    model = new_model(cfg, shots)
    opt = new_optimizer(cfg, model)
    fwd = Ddp(_Dispatch(model))
    epoch(cfg, model, opt, shots, 1, forward=fwd)  # stage 1
    assert all(p not in opt.state for p in model.retriever.parameters())
    model.set_banks(shots.all_f2, shots.all_f3, 0)
    before = [p.detach().clone() for p in model.mapping_parameters()]
    epoch(cfg, model, opt, shots, cfg.map_epochs + 1, forward=fwd)  # stage 3
    assert all(torch.equal(a, p) for a, p in zip(before, model.mapping_parameters(), strict=True))
    assert all(int(opt.state[p]["step"]) == len(shots.f2) for p in model.retriever.parameters())


def test_frozen_extractors_are_seeded_and_zero_off_the_object(smoke_cfg):
    import torch

    from nshot.methods.cfr.features import valid_mask
    from nshot.nn.backbone import load_backbone

    smp = heightfield_sample("ring", 32, "good", np.random.default_rng(1))
    ext = load_backbone(smoke_cfg.backbone_spec())
    f2, f3 = ext(smp.rgb[None], smp.xyz[None])
    assert f2.shape == (1, 32, 32, smoke_cfg.rgb_dim) and f3.shape == (1, 32, 32, smoke_cfg.xyz_dim)
    valid = torch.from_numpy(valid_mask(smp.xyz[None]))
    assert torch.all(f3[~valid] == 0) and torch.all(f3[valid].abs().sum(-1) > 0)
    again = load_backbone(smoke_cfg.backbone_spec()).rgb(smp.rgb[None])
    torch.testing.assert_close(f2, again)
    other = load_backbone(smoke_cfg.replace(feature_seed=1).backbone_spec()).rgb(smp.rgb[None])
    assert not torch.allclose(f2, other)


def test_the_config_names_its_backbone_and_a_record_reads_it_back(smoke_cfg):
    """The presets swap the backbone (``features`` -> kind), not the code: the smoke config's
    random extractors through nshot.nn.backbone equal the ones the method uses, a record
    rebuilds them (the same weights) and refuses other weights."""
    import torch

    from nshot.errors import CheckpointError
    from nshot.methods.cfr.features import make_extractors
    from nshot.nn.backbone import (
        BackboneSpec,
        backbone_from_record,
        backbone_problems,
        load_backbone,
    )

    spec = smoke_cfg.backbone_spec()
    assert spec == BackboneSpec("random-features", {"rgb_dim": 30, "xyz_dim": 16, "seed": 0})
    paper = CfrConfig.from_preset("paper", dino_path="d", pointmae_path="p").backbone_spec()
    assert paper.kind == "dino-pointmae" and paper.options["pointmae_groups"] == 1024
    bb = load_backbone(spec)
    assert (bb.rgb_dim, bb.xyz_dim, bb.image_size) == (30, 16, None)
    smp = heightfield_sample("bump", 32, "good", np.random.default_rng(2))
    used = make_extractors(smoke_cfg)(smp.rgb[None], smp.xyz[None])
    for a, b in zip(bb(smp.rgb[None], smp.xyz[None]), used, strict=True):
        assert torch.equal(a, b)
    rec = json_roundtrip(bb.record())
    assert rec["kind"] == "random-features" and len(rec["sha256"]) == 64
    again = backbone_from_record(rec, "ckpt")
    assert again.fingerprint() == bb.fingerprint() and again.record() == rec
    with pytest.raises(CheckpointError, match="ckpt: .*other weights"):
        backbone_from_record({**rec, "sha256": "0" * 64}, "ckpt")
    twin = bb.copy()
    twin.model.w1.add_(1.0)
    assert twin.fingerprint() != bb.fingerprint()
    assert backbone_problems(BackboneSpec("random-features", {"rgb_dim": 31})) == [
        "field 'rgb_dim': must be a positive multiple of 3 (three CNN layers)"
    ]
    with pytest.raises(ConfigError, match=r"unknown option\(s\) \['width'\]"):
        load_backbone(BackboneSpec("random-features", {"width": 3}))


def test_no_cfr_module_names_a_device():
    """The device comes from the trainer or the job (local_device), never from cfr's code."""
    from pathlib import Path

    root = Path(__file__).resolve().parents[1] / "methods" / "cfr"
    for f in root.glob("*.py"):
        text = f.read_text()
        assert '"cuda' not in text and "'cuda" not in text, f.name


def json_roundtrip(obj):
    import json

    return json.loads(json.dumps(obj))


def test_mesh_generator_masks_lie_on_the_visible_surface_and_background_is_zero():
    from nshot.methods.cfr.data import mesh_sample

    for cls in ("box", "cylinder", "sphere", "capsule"):
        for i, defect in enumerate(("good", "both")):
            smp = mesh_sample(cls, 32, defect, np.random.default_rng([5, i]))
            valid = smp.xyz.any(-1)
            assert 0.1 < valid.mean() < 0.6, cls
            assert np.all(smp.xyz[~valid] == 0.0) and np.all(smp.xyz[valid][:, 2] > 0.0)
            assert not (smp.mask & ~valid).any(), cls
            assert (smp.mask.sum() > 0) == (defect != "good"), cls


def test_mesh_classes_belong_to_the_mesh_generator():
    cfg = CfrConfig.from_preset("smoke", generator="mesh", classes=["sphere"], class_name="sphere")
    assert cfg.classes == ["sphere"]
    with pytest.raises(ConfigError, match="classes"):
        CfrConfig.from_preset("smoke", generator="mesh")  # bump is a height-field class


# --- generator version 2: MVTec 3D-AD's classes and defect taxonomy ----------------------------


def _v2_test_set(cfg):
    """Every anomalous test image of ``cfg``'s classes (generator version 2) with its clean
    twin, from the same seeds as the cached tables (``data._rows``)."""
    from nshot.methods.cfr.config import TAXONOMY_CLASSES
    from nshot.methods.cfr.taxonomy import taxonomy_pair

    out = []
    for cls in cfg.classes:
        for i in range(cfg.n_test_bad):
            idx = cfg.n_test_good + i
            rng = np.random.default_rng([cfg.data_seed, TAXONOMY_CLASSES.index(cls), 1, idx])
            out.append((cls, *taxonomy_pair(cls, cfg.grid, DEFECTS[1 + i % 3], rng)))
    return out


def test_small_uses_generator_v2_and_a_share_of_its_defects_is_invisible_to_each_modality():
    """The structure generator version 2 declares, on small's own test set: at least a quarter
    of the defects (a third by construction: the geometric ones) leave the RGB image exactly as
    the clean object's, at least a quarter (the colour ones) leave the point cloud exactly as
    it; every defect changes at least one modality at its pixels, a combined one both."""
    cfg = CfrConfig.from_preset("small")
    assert cfg.generator == "heightfield" and cfg.generator_version == 2
    assert len(cfg.classes) == 10
    rgb_blind = depth_blind = 0
    pairs = _v2_test_set(cfg)
    for cls, smp, clean in pairs:
        m = smp.mask
        assert m.sum() >= 3, cls
        valid = smp.xyz.any(-1)
        assert np.array_equal(valid, clean.xyz.any(-1)) and not (m & ~valid).any(), cls
        assert np.all(smp.xyz[~valid] == 0.0)
        rgb_moved = (smp.rgb != clean.rgb).any(-1)
        depth_moved = (smp.xyz != clean.xyz).any(-1)
        assert not (rgb_moved & ~m).any() and not (depth_moved & ~m).any(), cls  # only there
        rgb_blind += not rgb_moved[m].any()
        depth_blind += not depth_moved[m].any()
        assert rgb_moved[m].any() or depth_moved[m].any(), (cls, smp.defect)
        assert rgb_moved[m].any() == (smp.defect in ("colour", "both")), (cls, smp.defect)
        assert depth_moved[m].any() == (smp.defect in ("geometric", "both")), (cls, smp.defect)
        if smp.defect in ("geometric", "both"):  # a real change of shape, not noise
            assert np.abs(smp.xyz[..., 2] - clean.xyz[..., 2])[m].max() > 0.02, cls
    assert rgb_blind >= 0.25 * len(pairs) and depth_blind >= 0.25 * len(pairs)


def test_v2_colour_defects_use_the_objects_own_palette():
    """A colour defect paints one of the class's three palette colours (times the image's
    exposure, 0.95–1.05, plus noise), visibly different from the clean surface there."""
    from nshot.methods.cfr.taxonomy import PALETTES

    cfg = CfrConfig.from_preset("small", n_test_bad=6)
    for cls, smp, clean in _v2_test_set(cfg):
        if smp.defect not in ("colour", "both"):
            continue
        painted = smp.rgb[smp.mask].astype(float)
        assert np.abs(painted - clean.rgb[smp.mask]).sum(-1).mean() > 20, cls
        ratio = painted.mean(0) / 255 / np.asarray(PALETTES[cls])  # one row per palette colour
        assert np.any(np.all(np.abs(ratio - 1) < 0.08, 1)), (cls, ratio)


def test_v2_texture_is_fixed_per_class_and_the_pose_varies():
    """Two normal images of a class at the same pose, from different draws, differ only by
    the exposure factor and the noise (version 1 drew the stripes per image)."""
    from nshot.methods.cfr.taxonomy import taxonomy_pair

    pose = ((0.05, -0.03), 0.7, 1.0)
    for cls in CfrConfig.from_preset("small").classes:
        a, _ = taxonomy_pair(cls, 64, "good", np.random.default_rng(1), pose=pose)
        b, _ = taxonomy_pair(cls, 64, "good", np.random.default_rng(2), pose=pose)
        obj = a.xyz.any(-1)
        ca, cb = a.rgb[obj].astype(float), b.rgb[obj].astype(float)
        assert np.abs(ca / ca.mean() - cb / cb.mean()).mean() < 0.05, cls
        c, _ = taxonomy_pair(cls, 64, "good", np.random.default_rng(3))  # a drawn pose
        assert not np.array_equal(c.xyz.any(-1), obj), cls


def test_generator_v1_stays_reproducible_by_its_config_field(smoke_cfg):
    from nshot.methods.cfr.data import table_key

    v1 = CfrConfig.from_preset(
        "small", generator="mesh", generator_version=1, classes=["box"], class_name="box"
    )
    assert table_key(v1, "box").startswith("cfr-mesh-box-")  # the version-1 cache key
    assert smoke_cfg.generator_version == 1  # smoke keeps version 1
    assert "-v2-" in table_key(CfrConfig.from_preset("small"), "bagel")
    with pytest.raises(ConfigError, match="generator_version"):
        CfrConfig.from_preset("small", generator="mesh")
    with pytest.raises(ConfigError, match="classes"):
        CfrConfig.from_preset("small", classes=["bump"], class_name="bump")


def test_v2_tables_hold_the_generated_images(tmp_path, monkeypatch):
    from nshot.methods.cfr.taxonomy import taxonomy_sample

    monkeypatch.setenv("NSHOT_CACHE", str(tmp_path))
    cfg = CfrConfig.from_preset("small", classes=["foam", "tire"], class_name="tire", n_train=2,
                                n_test_good=2, n_test_bad=3, n_val_good=1, n_val_bad=3,
                                shots=[1], shot=1)  # fmt: skip
    test = load_class(cfg, "tire")["test"]
    assert test.defect == ["good", "good", "geometric", "colour", "both"]
    rng = np.random.default_rng([0, 9, 1, 3])  # data seed, class index (tire: 9), test, image
    smp = taxonomy_sample("tire", 64, "colour", rng)
    assert np.array_equal(test.rgb[3], smp.rgb) and np.array_equal(test.mask[3], smp.mask)
