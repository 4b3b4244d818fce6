"""cfr's paper path: the float-TIFF reader, MVTec 3D-AD's layout and CFM's pre-processing, the
DINO ViT and Point-MAE loaders (tiny random weights in the real key layouts), and the whole
path on a tiny generated MVTec-layout folder (train → checkpoint → evaluate → serve, and the
reproduction's ``experiments`` with its tasks in process). No Ray."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from nshot.errors import CheckpointError, ConfigError
from nshot.methods.cfr.config import CfrConfig
from nshot.methods.cfr.mvtec3d import (
    cfm_preprocess,
    list_items,
    load_item,
    read_float_tiff,
    write_float_tiff,
)
from nshot.nn.hfvit import load_vit, write_tiny_vit
from nshot.nn.pointmae import load_pointmae, write_tiny_pointmae

SIDE = 100  # pixels of the generated scans (a multiple of 100: CFM's square padding is a no-op)


# --------------------------------------------------------------------------------------------
# a tiny MVTec 3D-AD folder: a dome on a tilted table, striped, with bumps as defects


def _scan(rng: np.random.Generator, defect: bool) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    c = (np.arange(SIDE) - SIDE / 2) * 0.001  # 1 mm pixels
    x, y = np.meshgrid(c, c)
    table = 0.6 + 0.02 * x - 0.01 * y  # the background plane (z: distance from the camera)
    cx, cy = rng.uniform(-0.005, 0.005, 2)
    r = np.hypot(x - cx, y - cy)
    dome = np.clip(0.02 * (1 - (r / 0.03) ** 2), 0, None)
    mask = np.zeros((SIDE, SIDE), bool)
    if defect:
        dx, dy = cx + rng.uniform(-0.01, 0.01), cy + rng.uniform(-0.01, 0.01)
        d = np.hypot(x - dx, y - dy)
        mask = (d < 0.004) & (dome > 0.006)
        dome = dome + np.where(mask, 0.004 * (1 - (d / 0.004) ** 2), 0.0)
    z = table - dome + rng.normal(0, 0.0002, x.shape)
    xyz = np.stack([x, y, z], -1).astype(np.float32)
    xyz[:3, :5] = 0  # a few invalid pixels, as the sensor leaves
    phase = rng.uniform(0, 6.3)
    stripes = 0.5 + 0.5 * np.sin(2 * np.pi * x / 0.008 + phase)
    rgb = np.where((dome > 0)[..., None], np.stack([stripes, 0.5 * stripes, 1 - stripes], -1), 0.4)
    if defect:
        rgb = np.where(mask[..., None], [0.1, 0.9, 0.1], rgb)
    return (rgb * 255).astype(np.uint8), xyz, mask


def write_tiny_mvtec3d(root: Path, cls: str = "bagel") -> Path:
    from PIL import Image

    rng = np.random.default_rng(0)
    plan = [("train", "good", 3), ("validation", "good", 1), ("test", "good", 2),
            ("test", "crack", 2)]  # fmt: skip
    for split, kind, n in plan:
        d = root / cls / split / kind
        for sub in ("rgb", "xyz", "gt"):
            (d / sub).mkdir(parents=True, exist_ok=True)
        for i in range(n):
            rgb, xyz, mask = _scan(rng, kind != "good")
            Image.fromarray(rgb).save(d / "rgb" / f"{i:03d}.png")
            write_float_tiff(d / "xyz" / f"{i:03d}.tiff", xyz)
            Image.fromarray((mask * 255).astype(np.uint8)).save(d / "gt" / f"{i:03d}.png")
    return root


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    """One torch thread: these tiny networks only lose time to thread hand-offs on 2 cores."""
    old = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(old)


@pytest.fixture(scope="module")
def paper_files(tmp_path_factory):
    import os

    os.environ.setdefault("NSHOT_CACHE", str(tmp_path_factory.mktemp("cfr-cache")))
    base = tmp_path_factory.mktemp("cfr-paper")
    return {
        "data": write_tiny_mvtec3d(base / "mvtec3d"),
        "dino": write_tiny_vit(base / "dino_vitb8.safetensors", width=48, depth=2, image_size=32),
        "pointmae": write_tiny_pointmae(
            base / "pointmae.safetensors", prefix="module.MAE_encoder."
        ),
    }


def paper_cfg(files: dict[str, Path], **over) -> CfrConfig:
    values = dict(
        data_path=str(files["data"]), dino_path=str(files["dino"]),
        pointmae_path=str(files["pointmae"]), classes=["bagel"], class_name="bagel", grid=32,
        rgb_dim=48, xyz_dim=96, pointmae_groups=16, pointmae_group_size=8, shots=[1, 2], shot=2,
        map_epochs=2, ret_epochs=2, coreset_proj=16, d_model=8, bank_subsample=500,
        max_queries=500, log_every=1, checkpoint_every=2, theta_sweep=[0.2, 0.4], job_gpus=0.0,
        preprocess="none",
    )  # fmt: skip
    return CfrConfig.from_preset("paper", **{**values, **over})


# --------------------------------------------------------------------------------------------
# TIFF


def test_float_tiff_reader_reads_its_writer_and_agrees_with_tifffile(tmp_path):
    rng = np.random.default_rng(0)
    a = rng.normal(size=(7, 5, 3)).astype(np.float32)
    a[0, 0] = 0
    assert np.array_equal(read_float_tiff(write_float_tiff(tmp_path / "a.tiff", a)), a)
    (tmp_path / "b.tiff").write_bytes(b"PNG not a tiff")
    with pytest.raises(ValueError, match="b.tiff: not a TIFF"):
        read_float_tiff(tmp_path / "b.tiff")
    tifffile = pytest.importorskip("tifffile")
    assert np.array_equal(tifffile.imread(tmp_path / "a.tiff"), a)
    for i, kw in enumerate([{}, {"compression": "zlib"}, {"compression": "zlib", "rowsperstrip": 2},
                            {"byteorder": ">"}]):  # fmt: skip
        tifffile.imwrite(tmp_path / f"t{i}.tiff", a, photometric="rgb", **kw)
        assert np.array_equal(read_float_tiff(tmp_path / f"t{i}.tiff"), a), kw


# --------------------------------------------------------------------------------------------
# MVTec 3D-AD: layout, pre-processing, one image


def test_layout_errors_name_the_missing_path(tmp_path):
    root = write_tiny_mvtec3d(tmp_path / "d")
    items = list_items(root, "bagel", "test")
    assert [it.defect for it in items] == ["crack", "crack", "good", "good"]
    assert items[0].gt is not None and items[-1].gt is None
    with pytest.raises(ConfigError, match=r"data_path.*carrot/train is missing"):
        list_items(root, "carrot", "train")
    (root / "bagel" / "test" / "crack" / "gt" / "001.png").unlink()
    with pytest.raises(ConfigError, match=r"crack/rgb/001.png has no gt/001.png"):
        list_items(root, "bagel", "test")
    (root / "bagel" / "train" / "good" / "xyz" / "002.tiff").unlink()
    with pytest.raises(ConfigError, match=r"train/good/rgb/002.png has no xyz/002.tiff"):
        list_items(root, "bagel", "train")


def test_cfm_preprocessing_removes_the_table_and_keeps_the_largest_cluster():
    rng = np.random.default_rng(1)
    _, xyz, _ = _scan(rng, False)
    xyz[80:86, 80:86] = xyz[80:86, 80:86] - [0, 0, 0.05]  # a small blob floating above the table
    out = cfm_preprocess(xyz, seed=0)
    valid = (out != 0).all(-1)
    c = (np.arange(SIDE) - SIDE / 2) * 0.001
    x, y = np.meshgrid(c, c)
    table = 0.6 + 0.02 * x - 0.01 * y
    height = np.where((xyz != 0).all(-1), table - xyz[..., 2], 0.0)
    assert not valid[height < 0.004].any()  # the table is gone
    assert valid[height > 0.008].sum() > 0.97 * (height[:80, :80] > 0.008).sum()  # the dome stays
    assert not valid[80:86, 80:86].any()  # the smaller cluster is dropped
    assert np.array_equal(cfm_preprocess(out, seed=5), out)  # a cleaned cloud stays as it is


def test_dbscan_labels_equal_scikit_learns_dbscan():
    from scipy.spatial import cKDTree
    from sklearn.cluster import DBSCAN

    from nshot.methods.cfr.mvtec3d import dbscan_labels

    rng = np.random.default_rng(0)
    for _ in range(4):
        blobs = [rng.uniform(0, 0.1, 3) + rng.normal(0, rng.uniform(0.002, 0.01), (n, 3))
                 for n in rng.integers(20, 500, rng.integers(2, 6))]  # fmt: skip
        pts = np.concatenate([*blobs, rng.uniform(0, 0.1, (150, 3))])
        ref = DBSCAN(eps=0.006, min_samples=30).fit(pts)
        got = dbscan_labels(pts, 0.006, 30)
        assert np.array_equal(got == -1, ref.labels_ == -1)  # the same noise
        core = ref.core_sample_indices_
        pairs = set(zip(ref.labels_[core].tolist(), got[core].tolist()))
        assert len(pairs) == len(set(ref.labels_[core].tolist())) == len(set(got[core].tolist()))
        to_ref = dict((g, r) for r, g in pairs)
        tree = cKDTree(pts[core])
        for i in np.setdiff1d(np.nonzero(got != -1)[0], core):  # a border point: a neighbour's
            near = {int(ref.labels_[core[j]]) for j in tree.query_ball_point(pts[i], 0.006)}
            assert to_ref[int(got[i])] in near


def test_one_image_is_resized_as_cfm_does(tmp_path):
    root = write_tiny_mvtec3d(tmp_path / "d")
    item = list_items(root, "bagel", "test")[0]
    with pytest.warns(UserWarning, match="background plane"):  # the table is still there
        rgb, xyz, mask = load_item(item, 32, "none")
    assert rgb.shape == (32, 32, 3) and rgb.dtype == np.uint8
    assert xyz.shape == (32, 32, 3) and mask.shape == (32, 32) and mask.any()
    full = read_float_tiff(item.xyz)
    idx = (np.arange(32) * SIDE / 32).astype(int)  # nearest: floor(i · in / out)
    assert np.array_equal(xyz, full[idx][:, idx])
    _, clean, _ = load_item(item, 32, "cfm")  # CFM's pre-processing first: the table is gone
    assert (clean != 0).all(-1).sum() < 0.6 * (xyz != 0).all(-1).sum()
    assert np.array_equal(clean[(clean != 0).all(-1)], xyz[(clean != 0).all(-1)])


# --------------------------------------------------------------------------------------------
# DINO ViT and Point-MAE from files


def _timm_vit_reference(state: dict[str, torch.Tensor], x: torch.Tensor) -> torch.Tensor:
    """timm's / DINO's ViT forward written from the state dict alone (patch tokens, final norm)."""
    import torch.nn.functional as F

    w = state["patch_embed.proj.weight"]
    d, p = w.shape[0], w.shape[-1]
    t = F.conv2d(x, w, state["patch_embed.proj.bias"], stride=p).flatten(2).transpose(1, 2)
    t = torch.cat([state["cls_token"].expand(len(x), -1, -1), t], 1) + state["pos_embed"]
    heads = max(1, d // 64)
    for i in range(len({k.split(".")[1] for k in state if k.startswith("blocks.")})):
        s = f"blocks.{i}."
        h = F.layer_norm(t, (d,), state[s + "norm1.weight"], state[s + "norm1.bias"], 1e-6)
        qkv = F.linear(h, state[s + "attn.qkv.weight"], state[s + "attn.qkv.bias"])
        q, k, v = qkv.reshape(len(x), -1, 3, heads, d // heads).permute(2, 0, 3, 1, 4)
        a = ((q @ k.transpose(-2, -1)) * (d // heads) ** -0.5).softmax(-1)
        o = (a @ v).transpose(1, 2).reshape(len(x), -1, d)
        t = t + F.linear(o, state[s + "attn.proj.weight"], state[s + "attn.proj.bias"])
        h = F.layer_norm(t, (d,), state[s + "norm2.weight"], state[s + "norm2.bias"], 1e-6)
        h = F.gelu(F.linear(h, state[s + "mlp.fc1.weight"], state[s + "mlp.fc1.bias"]))
        t = t + F.linear(h, state[s + "mlp.fc2.weight"], state[s + "mlp.fc2.bias"])
    return F.layer_norm(t, (d,), state["norm.weight"], state["norm.bias"], 1e-6)[:, 1:]


def test_dino_vit_loads_both_formats_like_timm_and_refuses_a_mismatched_file(tmp_path):
    from safetensors.torch import load_file, save_file

    f = write_tiny_vit(tmp_path / "vit.safetensors", width=128, depth=2, image_size=32)
    folder = write_tiny_vit(tmp_path / "vit-hf", fmt="hf", width=128, depth=2, image_size=32)
    a, b = load_vit(f), load_vit(folder)
    x = torch.rand(2, 3, 32, 32)
    tok = a.patch_tokens(x)
    assert tok.shape == (2, 128, 4, 4) and a.fmt == "timm" and b.fmt == "hf"
    state = load_file(str(f))
    ref = _timm_vit_reference(state, a.normalise(x)).transpose(1, 2).reshape(2, 128, 4, 4)
    assert torch.allclose(tok, ref, atol=1e-5)
    assert torch.allclose(b.patch_tokens(x), tok, atol=1e-5)  # the same seed in both formats
    bad = dict(state)
    del bad["blocks.1.attn.qkv.bias"]
    save_file(bad, str(tmp_path / "missing.safetensors"))
    with pytest.raises(CheckpointError, match="'blocks.1.attn.qkv.bias' is missing"):
        load_vit(tmp_path / "missing.safetensors")
    bad = {**state, "blocks.0.mlp.fc2.weight": torch.zeros(128, 7)}
    save_file(bad, str(tmp_path / "shape.safetensors"))
    with pytest.raises(CheckpointError, match=r"'blocks.0.mlp.fc2.weight' has shape \(128, 7\)"):
        load_vit(tmp_path / "shape.safetensors")
    save_file({**state, "head.weight": torch.zeros(3, 128)}, str(tmp_path / "x.safetensors"))
    with pytest.raises(CheckpointError, match="'head.weight' has no place"):
        load_vit(tmp_path / "x.safetensors")
    (tmp_path / "dino.pth").write_bytes(b"not read")
    with pytest.raises(CheckpointError, match="never unpickled"):
        load_vit(tmp_path / "dino.pth")


def test_pointmae_loads_the_official_layout_and_refuses_a_mismatched_file(tmp_path):
    from safetensors.torch import load_file, save_file

    f = write_tiny_pointmae(tmp_path / "pm.safetensors", prefix="module.MAE_encoder.")
    m = load_pointmae(f, num_group=16, group_size=8)
    assert m.out_dim == 96 and m.fetch == (1, 2, 3)
    pts = torch.rand(200, 3)
    hood, centres = m.group(pts)
    assert hood.shape == (16, 8, 3) and torch.equal(centres[0], pts[0])  # FPS from point 0
    assert torch.allclose(hood[:, 0], torch.zeros(16, 3))  # each centre is its own nearest
    feats, _ = m.group_features(pts)
    per_point = m.point_features(pts)
    assert feats.shape == (16, 96) and per_point.shape == (200, 96)
    assert torch.allclose(per_point[0], feats[0], atol=1e-4)  # at a centre: its own features
    grid = torch.zeros(12, 12, 3)
    grid[4:10, 4:10] = torch.rand(6, 6, 3) + 0.1
    out = m.grid_features(grid)
    assert out.shape == (12, 12, 96) and out[0, 0].abs().sum() == 0 and out[5, 5].abs().sum() > 0
    state = load_file(str(f))
    bad = {
        k: v for k, v in state.items() if k != "module.MAE_encoder.blocks.blocks.2.attn.qkv.weight"
    }
    save_file(bad, str(tmp_path / "missing.safetensors"))
    with pytest.raises(CheckpointError, match="'blocks.blocks.2.attn.qkv.weight' is missing"):
        load_pointmae(tmp_path / "missing.safetensors")
    bad = {**state, "module.MAE_encoder.pos_embed.2.weight": torch.zeros(32, 5)}
    save_file(bad, str(tmp_path / "shape.safetensors"))
    with pytest.raises(CheckpointError, match=r"'pos_embed.2.weight' has shape \(32, 5\)"):
        load_pointmae(tmp_path / "shape.safetensors")
    save_file({**state, "cls_head.weight": torch.zeros(2)}, str(tmp_path / "x.safetensors"))
    with pytest.raises(CheckpointError, match="'cls_head.weight' has no place"):
        load_pointmae(tmp_path / "x.safetensors")


def test_the_paper_backbone_is_a_kind_of_the_same_family(paper_files, tmp_path):
    """The paper preset swaps the backbone: kind dino-pointmae, loaded by nshot.nn.backbone on
    the device it is given, read back from its record only with the same weights, its widths
    and image side checked against the config's fields."""
    from nshot.methods.cfr.features import DinoPointMAE, make_extractors
    from nshot.nn.backbone import (
        BackboneSpec,
        backbone_from_record,
        backbone_problems,
        load_backbone,
    )

    cfg = paper_cfg(paper_files)
    bb = load_backbone(cfg.backbone_spec(), "cpu")
    assert isinstance(bb, DinoPointMAE) and (bb.rgb_dim, bb.xyz_dim, bb.image_size) == (48, 96, 32)
    rgb = np.random.default_rng(0).integers(0, 256, (1, 32, 32, 3), dtype=np.uint8)
    xyz = np.zeros((1, 32, 32, 3), np.float32)
    xyz[0, 8:24, 8:24] = np.random.default_rng(1).uniform(0.1, 1.0, (16, 16, 3))
    f2, f3 = bb(rgb, xyz)
    g2, g3 = make_extractors(cfg)(rgb, xyz)
    assert torch.equal(f2, g2) and torch.equal(f3, g3)
    assert bb.valid(xyz, f3)[0, 16, 16] and not bb.valid(xyz, f3)[0, 0, 0]
    rec = bb.record()
    assert rec["kind"] == "dino-pointmae" and rec["pointmae_path"] == str(paper_files["pointmae"])
    assert backbone_from_record(rec, "ckpt").fingerprint() == rec["sha256"]
    other = write_tiny_pointmae(tmp_path / "other.safetensors", seed=1)
    with pytest.raises(CheckpointError, match="other weights"):
        backbone_from_record({**rec, "pointmae_path": str(other)}, "ckpt")
    with pytest.raises(ConfigError, match="field 'rgb_dim': 64, but backbone 'dino-pointmae'"):
        make_extractors(cfg.replace(rgb_dim=64))
    with pytest.raises(ConfigError, match="field 'grid': 48, .* gives 32 pixels"):
        make_extractors(cfg.replace(grid=48))
    assert backbone_problems(BackboneSpec("dino-pointmae", {"dino_path": str(tmp_path / "x")})) == [
        f"field 'dino_path': {tmp_path / 'x'} does not exist",
        "field 'pointmae_path' is not set (Point-MAE's weights as .safetensors)",
    ]
    (tmp_path / "pm.pth").write_bytes(b"not read")
    with pytest.raises(ConfigError, match="field 'pointmae_path': .*never unpickled"):
        load_backbone(cfg.replace(pointmae_path=str(tmp_path / "pm.pth")).backbone_spec())


# --------------------------------------------------------------------------------------------
# the whole paper path


def test_paper_preset_names_the_fields_it_needs(tmp_path):
    from nshot.methods.cfr.experiments import run_experiments
    from nshot.methods.cfr.train import shot_features

    cfg = CfrConfig.from_preset("paper")
    assert cfg.features == "paper" and cfg.generator == "mvtec3d" and cfg.grid == 224
    with pytest.raises(ConfigError) as err:
        shot_features(cfg)
    for field in ("dino_path", "pointmae_path", "data_path"):
        assert f"field '{field}' is not set" in str(err.value)
    with pytest.raises(ConfigError, match="field 'dino_path' is not set"):
        run_experiments(cfg, tmp_path)  # before any Ray task starts


def test_paper_path_trains_evaluates_and_serves(paper_files, tmp_path):
    from nshot.method import get
    from nshot.methods.cfr.train import fit, run_record, shot_features
    from nshot.train.checkpoint import load_checkpoint, save_checkpoint

    cfg = paper_cfg(paper_files)
    shots = shot_features(cfg)
    assert len(shots.f2) == 2 and shots.f2[0].shape[1] == 48 and shots.f3[0].shape[1] == 96
    model = fit(cfg, shots)
    path = save_checkpoint(
        tmp_path / "ckpt", method="cfr", method_version=get("cfr").version,
        config=cfg.model_dump(), step=cfg.steps, model_state=model.state_dict(),
        extra={"run": run_record(cfg, model, cfg.steps)},
    )  # fmt: skip
    ckpt = load_checkpoint(path, method="cfr")
    cfr = get("cfr")
    metrics = cfr.evaluate(ckpt, cfg)
    assert set(metrics) >= {"i_auroc", "p_auroc", "aupro30"}
    assert all(np.isfinite(v) for v in metrics.values())
    predictor = cfr.predictor(ckpt)
    answer = predictor(predictor.Request.model_validate(predictor.example_request()))
    assert len(answer.anomaly_map) == 32 and 0 < answer.valid_fraction < 1


def test_real_validation_gets_synthetic_defects_and_a_tune_objective(paper_files, tmp_path):
    """MVTec 3D-AD's validation images are all normal: each gets an anomalous copy (a defect
    inside the object, changing only valid pixels inside its mask), so the Tune objective
    exists on real data; val_synthetic=false keeps the normal images alone."""
    from nshot.methods.cfr.data import load_class
    from nshot.methods.cfr.evaluation import class_test_features, validation_metrics
    from nshot.methods.cfr.train import fit, shot_features

    cfg = paper_cfg(paper_files)
    plain = load_class(cfg.replace(val_synthetic=False), "bagel")["val"]
    val = load_class(cfg, "bagel")["val"]
    n = len(plain)
    assert set(plain.label.tolist()) == {0} and len(val) == 2 * n
    assert val.label.tolist() == [0] * n + [1] * n
    assert {d for d in val.defect[n:]} <= {"synthetic-geometric", "synthetic-colour",
                                           "synthetic-both"}  # fmt: skip
    np.testing.assert_array_equal(val.rgb[:n], plain.rgb)
    for i in range(n):
        m = val.mask[n + i]
        valid = np.abs(plain.xyz[i]).sum(-1) > 0
        assert m.any() and not (m & ~valid).any()  # inside the object only
        changed = (val.rgb[n + i] != plain.rgb[i]).any(-1) | (val.xyz[n + i] != plain.xyz[i]).any(
            -1
        )
        assert changed.any() and not (changed & ~m).any()  # nothing outside the mask
    again = load_class(cfg, "bagel")["val"]  # seeded: the same defects
    np.testing.assert_array_equal(again.xyz, val.xyz)
    model = fit(cfg, shot_features(cfg))
    feats = class_test_features(cfg, "bagel", "val")
    got = validation_metrics(model, cfg, feats, banks_built=True)
    assert set(got) == {"val_aupro30", "val_i_auroc"} and all(np.isfinite(list(got.values())))
    plain_feats = class_test_features(cfg.replace(val_synthetic=False), "bagel", "val")
    assert validation_metrics(model, cfg, plain_feats, banks_built=True) == {}


def test_paper_reproduction_has_every_row_and_the_real_defect_types(
    paper_files, tmp_path, monkeypatch
):
    """``experiments`` with its Ray tasks run in this process (the tasks are plain functions;
    ``run_jobs`` itself is covered by the smoke reproduction in test_cfr_ray.py)."""
    from nshot.method import get
    from nshot.methods.cfr import experiments
    from nshot.methods.cfr.experiments import METRICS, SYSTEMS

    seen = []

    def in_process(jobs, **_):
        seen.extend(j.num_gpus for j in jobs)
        return {j.key: j.fn(*j.args, **j.kwargs) for j in jobs}

    monkeypatch.setattr(experiments, "run_jobs", in_process)
    cfg = paper_cfg(paper_files, shots=[1])
    table = get("cfr").experiments(cfg, tmp_path)
    assert seen == [0.0]  # one (class, k) job, job_gpus GPUs
    assert list(table.rows) == list(SYSTEMS) and set(table.metrics) == set(METRICS)
    for system in SYSTEMS:
        for m in ("i_auroc_k1", "aupro30_k1", "replaced_frac_normal"):
            assert np.isfinite(table.rows[system][m]), (system, m)
    assert "MVTec 3D-AD" in table.notes[0] and "Point-MAE (" in table.notes[1]
    assert set(table.extra["per_type"]["k1"]["cfr"]) == {"crack"}  # the defect folders
