"""bsr model: tube masking keeps a visible patch at every preset, the masked loss uses
transformers' token order (it equals VideoMAE's own loss when every token lies in the head),
the encoder moves into the classifier whole, layer-wise lr decay, VideoMAE's peak learning rates
and schedules, the linear probe; the backbone the config names (nshot.nn.backbone kinds
``videomae-scratch`` and ``videomae``), trainable, recorded in checkpoints, and checkpoints
written before the kinds still load."""

from __future__ import annotations

import pytest
import torch

from nshot.methods.bsr.config import BsrConfig


@pytest.mark.parametrize("preset", sorted(BsrConfig.PRESETS))
def test_tube_mask_is_shared_over_time_and_leaves_a_visible_patch(preset):
    from nshot.methods.bsr.model import tokens_per_clip, tube_mask

    cfg = BsrConfig.from_preset(preset)
    t, s = tokens_per_clip(cfg)
    mask = tube_mask(cfg, 5, torch.Generator().manual_seed(0))
    assert mask.shape == (5, t * s)
    spatial = mask.view(5, t, s)
    assert (spatial == spatial[:, :1]).all()  # the same spatial mask at every time
    assert (spatial[:, 0].sum(1) == cfg.n_masked).all() and cfg.n_masked <= s - 1
    assert len({tuple(m.tolist()) for m in spatial[:, 0]}) > 1  # drawn per clip


def test_masked_loss_matches_videomae_when_every_patch_is_in_the_head():
    from nshot.methods.bsr.model import build_pretrainer, masked_loss, patch_in_head, tube_mask

    cfg = BsrConfig.from_preset("smoke")
    assert patch_in_head(cfg).all()  # 16² grid, 4 patches: all centres inside the disc
    torch.manual_seed(0)
    model = build_pretrainer(cfg).eval()
    x = torch.randn(3, cfg.frames, 3, cfg.grid, cfg.grid)
    mask = tube_mask(cfg, 3, torch.Generator().manual_seed(1))
    with torch.no_grad():
        ours = masked_loss(cfg, model, x, mask)
        theirs = model(pixel_values=x, bool_masked_pos=mask).loss
    assert torch.allclose(ours, theirs, rtol=1e-3), (ours, theirs)
    # on the small grid the four corner patches lie outside the head and are left out
    assert patch_in_head(BsrConfig.from_preset("small")).sum() == 12


def test_encoder_moves_into_the_classifier_and_layer_decay():
    from nshot.methods.bsr.model import (
        build_classifier,
        build_pretrainer,
        encode,
        layer_decay_groups,  # fmt: skip
    )

    cfg = BsrConfig.from_preset("smoke", depth=2, heads=2)
    pre = build_pretrainer(cfg).eval()
    clf = build_classifier(cfg, pre.videomae.state_dict()).eval()
    x = torch.randn(2, cfg.frames, 3, cfg.grid, cfg.grid)
    with torch.no_grad():
        assert torch.allclose(encode(pre, x), encode(clf, x), atol=1e-6)
        assert clf(pixel_values=x).logits.shape == (2, 4)
    groups = layer_decay_groups(clf, cfg, lr=1.0, weight_decay=0.05)
    lrs = sorted({g["lr"] for g in groups})
    assert lrs == pytest.approx([cfg.layer_decay**k for k in (3, 2, 1, 0)])
    n = sum(p.numel() for g in groups for p in g["params"])
    assert n == sum(p.numel() for p in clf.parameters())


def test_learning_rates_are_videomaes_peaks_with_warm_up_then_cosine():
    """VideoMAE's ViT-S recipe: peak 1.5e-4 · 1024 / 256 = 6e-4 in pretraining, 5e-4 · 384 /
    256 = 7.5e-4 in fine-tuning, whatever our batch; warm-up then cosine."""
    from nshot.methods.bsr.evaluation import ft_lr_factor
    from nshot.methods.bsr.train import lr_at

    cfg = BsrConfig.from_preset("small")
    assert lr_at(cfg, cfg.warmup_steps) == pytest.approx(6e-4)
    assert lr_at(cfg.replace(batch=8), cfg.warmup_steps) == pytest.approx(6e-4)
    assert lr_at(cfg, 1) == pytest.approx(6e-4 / cfg.warmup_steps)
    assert lr_at(cfg, cfg.steps) == pytest.approx(cfg.min_lr)
    assert cfg.ft_base_lr * cfg.ft_lr_ref_batch / 256 == pytest.approx(7.5e-4)
    f = [ft_lr_factor(s, 10, 40) for s in range(41)]
    assert f[0] == pytest.approx(0.1) and f[9] == f[10] == 1.0 and f[40] == 0.0
    assert all(a >= b for a, b in zip(f[10:], f[11:], strict=False))


def test_linear_probe_standardises_and_fits_the_support():
    import numpy as np

    from nshot.methods.bsr.model import fit_probe

    rng = np.random.default_rng(0)
    y = np.repeat(np.arange(3), 4)
    emb = rng.normal(size=(12, 6)) * 1e-3 + 5.0  # tiny spread on a large offset
    emb[:, 0] += y * 1e-2  # the class lives in one feature
    probe = fit_probe(emb, y)
    assert (probe.predict(emb) == y).all()
    p = probe.predict_proba(emb[:2], 4)
    assert p.shape == (2, 4) and (p[:, 3] == 0).all() and np.allclose(p.sum(1), 1)


def test_reconstruction_references_exact_on_one_shape_and_the_ridge_reads_the_visible_patches():
    """The references of ``mae_mse``: when every clip is a positive multiple of one pattern,
    every tubelet's normalised target is the same in every clip, so the position-mean
    predictor and the ridge from the visible patches are exact; on clips of independent noise
    the position mean is not (a wrong token order would fail the first half too); on clips
    that mix two patterns, the ridge reads the mix off the visible patches."""
    import numpy as np

    from nshot.methods.bsr.train import (
        Clips,
        PositionMean,
        held_out_mse,
        montage_m,
        ridge_references,
    )

    cfg = BsrConfig.from_preset("smoke")
    m = montage_m(cfg, "A")
    rng = np.random.default_rng(0)
    pattern = rng.normal(size=(cfg.frames, 3, m.shape[1])).astype(np.float32)
    scale = rng.uniform(0.5, 2.0, size=(40, 1, 1, 1)).astype(np.float32)
    same = Clips(scale * pattern, m, cfg.grid)
    train, val = np.arange(30), np.arange(30, 40)
    assert held_out_mse(cfg, PositionMean.fit(cfg, same, train), same, val) < 1e-6
    refs = ridge_references(cfg, same, train, val, visible=(1, 2), reps=2)
    for k, entry in refs.items():
        assert len(entry["ridge"]) == 2 and max(entry["ridge"]) < 1e-6
        assert max(entry["position_mean"]) < 1e-6
        assert all(len(v) == int(k) for v in entry["visible"])
    noise = Clips(rng.normal(size=(40, cfg.frames, 3, m.shape[1])).astype(np.float32), m, cfg.grid)
    assert held_out_mse(cfg, PositionMean.fit(cfg, noise, train), noise, val) > 0.3
    # two patterns mixed in proportions that vary by clip: the visible patches tell the mix,
    # so the ridge must beat the position mean by far (one that ignored them would not)
    a = rng.uniform(0.5, 2.0, size=(40, 1, 1, 1)).astype(np.float32)
    b = rng.uniform(-1.0, 1.0, size=(40, 1, 1, 1)).astype(np.float32)
    mixed = Clips(a * pattern + b * np.roll(pattern, 1, axis=-1), m, cfg.grid)
    for entry in ridge_references(cfg, mixed, train, val, visible=(1,), reps=2).values():
        assert max(entry["ridge"]) < 0.5 * min(entry["position_mean"])


def test_pretraining_starts_from_a_videomae_checkpoint_on_disk(tmp_path):
    """``init_weights``: a saved VideoMAE pretrainer (its encoder ending in the LayerNorm of
    VideoMAE's pre-training checkpoints) is loaded whole, a bare encoder (VideoMAEModel) or a
    video classifier, which have none, into the encoder alone; a checkpoint of another width
    or depth, a folder without safetensors (a pickle is never read) and non-finite weights are
    refused naming the field."""
    import torch
    from transformers import VideoMAEForPreTraining, VideoMAEForVideoClassification, VideoMAEModel

    from nshot.errors import NshotError
    from nshot.methods.bsr.model import vmae_config
    from nshot.methods.bsr.train import new_pretrainer

    cfg = BsrConfig.from_preset("smoke", backbone="videomae")
    torch.manual_seed(123)
    saved = VideoMAEForPreTraining(vmae_config(cfg, pretraining=True))
    assert any(k.startswith("videomae.layernorm.") for k in saved.state_dict())
    saved.save_pretrained(tmp_path / "full")
    model, _ = new_pretrainer(cfg.replace(init_weights=str(tmp_path / "full")))
    for name, t in saved.state_dict().items():
        torch.testing.assert_close(model.state_dict()[name], t, rtol=0, atol=0, msg=name)
    encoder = VideoMAEModel(vmae_config(cfg))
    encoder.save_pretrained(tmp_path / "encoder")
    model, _ = new_pretrainer(
        cfg.replace(init_weights=str(tmp_path / "encoder" / "model.safetensors"))
    )
    fresh, _ = new_pretrainer(cfg.replace(backbone="videomae-scratch"))
    for name, t in model.state_dict().items():
        want = (
            encoder.state_dict()[name[9:]]
            if name.startswith("videomae.") and name[9:] in encoder.state_dict()
            else fresh.state_dict()[name]
        )
        torch.testing.assert_close(t, want, rtol=0, atol=0, msg=name)
    clf = VideoMAEForVideoClassification(vmae_config(cfg))  # its head is left out
    clf.save_pretrained(tmp_path / "classifier")
    model, _ = new_pretrainer(cfg.replace(init_weights=str(tmp_path / "classifier")))
    for name, t in clf.videomae.state_dict().items():
        torch.testing.assert_close(model.videomae.state_dict()[name], t, rtol=0, atol=0)
    VideoMAEForPreTraining(vmae_config(cfg.replace(width=48))).save_pretrained(tmp_path / "wide")
    VideoMAEForPreTraining(vmae_config(cfg.replace(depth=2))).save_pretrained(tmp_path / "deep")
    (tmp_path / "pickled").mkdir()
    torch.save({}, tmp_path / "pickled" / "pytorch_model.bin")
    bad = saved.state_dict()
    bad["videomae.embeddings.patch_embeddings.projection.bias"][0] = float("nan")
    from safetensors.torch import save_file

    (tmp_path / "nan").mkdir()
    save_file(
        {k: v.contiguous() for k, v in bad.items()}, str(tmp_path / "nan" / "model.safetensors")
    )
    cases = (("wide", "shapes"), ("deep", "lacks"), ("pickled", "pickled"), ("nan", "not finite"))
    for where, match in cases:
        with pytest.raises(NshotError, match=rf"field 'init_weights'.*{match}"):
            new_pretrainer(cfg.replace(init_weights=str(tmp_path / where)))


def test_pretrainer_starts_and_decays_as_videomae():
    """VideoMAE's pre-training initialisation (Xavier-uniform Linear layers with zero bias,
    LayerNorms 1 / 0, the mask token within ±0.02) and its weight-decay exemptions (biases,
    1-D parameters, the mask token)."""
    import math

    from nshot.methods.bsr.model import build_pretrainer, pretrain_param_groups

    torch.manual_seed(0)
    model = build_pretrainer(BsrConfig.from_preset("small"))
    linears = [(n, m) for n, m in model.named_modules() if isinstance(m, torch.nn.Linear)
               and not n.startswith("encoder_to_decoder")]  # fmt: skip
    assert len(linears) > 10
    for name, m in linears:
        fan_out, fan_in = m.weight.shape
        bound = math.sqrt(6.0 / (fan_in + fan_out))
        assert m.weight.abs().max() <= bound + 1e-7, name
        assert abs(float(m.weight.std()) - bound / math.sqrt(3)) < 0.15 * bound, name
        assert m.bias is None or not m.bias.any(), name
    for name, m in model.named_modules():
        if isinstance(m, torch.nn.LayerNorm):
            assert (m.weight == 1).all() and not m.bias.any(), name
    token = model.mask_token
    assert token.abs().max() <= 0.02 and token.std() > 0.005
    decay, exempt = pretrain_param_groups(model, 0.05)
    assert decay["weight_decay"] == 0.05 and exempt["weight_decay"] == 0.0
    assert all(p.ndim >= 2 for p in decay["params"])
    assert any(p is model.mask_token for p in exempt["params"])
    assert len(decay["params"]) + len(exempt["params"]) == len(list(model.parameters()))


@pytest.mark.parametrize("head_pool", ["mean", "position"])
def test_classifier_starts_as_videomae_fine_tuning(head_pool):
    """VideoMAE's fine-tuning initialisation: Linear layers a normal truncated at ±0.02, zero
    biases, the head scaled by 0.001 (near-uniform first predictions), LayerNorm eps 1e-6; a
    pretrained encoder is loaded over it."""
    from nshot.methods.bsr.model import HEAD_INIT_SCALE, build_classifier, build_pretrainer

    cfg = BsrConfig.from_preset("smoke", head_pool=head_pool)
    torch.manual_seed(0)
    clf = build_classifier(cfg)
    head = clf.classifier
    for name, m in clf.named_modules():
        if isinstance(m, torch.nn.Linear) and m is not head:
            assert m.weight.abs().max() <= 0.02 and m.weight.std() > 0.005, name
            assert m.bias is None or not m.bias.any(), name
        if isinstance(m, torch.nn.LayerNorm):
            assert m.eps == 1e-6 and (m.weight == 1).all() and not m.bias.any(), name
    assert head.weight.abs().max() <= 0.02 * HEAD_INIT_SCALE and not head.bias.any()
    with torch.no_grad():
        probs = clf(pixel_values=torch.randn(3, cfg.frames, 3, cfg.grid, cfg.grid)).logits
    assert probs.abs().max() < 1e-2  # near-uniform first predictions
    pre = build_pretrainer(cfg)
    loaded = build_classifier(cfg, pre.videomae.state_dict())
    got = dict(loaded.videomae.named_parameters())
    for name, p in pre.videomae.named_parameters():
        if not name.startswith("layernorm."):
            assert torch.equal(got[name], p), name


def test_the_config_names_its_backbone_and_bsr_trains_it(tmp_path):
    """``backbone_spec()``: ``videomae-scratch`` (VideoMAE of the config's shape, seeded) for
    smoke and small, ``videomae`` for paper and wherever ``init_weights`` is given; loaded
    trainable it is the pretrainer masked pretraining starts from (training mode, gradients
    on), loaded frozen it is the same weights; ``videomae`` without weights names the field
    before any weight is read; records rebuild the architecture and keep where the initial
    weights came from."""
    from transformers import VideoMAEForPreTraining

    from nshot.errors import CheckpointError, ConfigError
    from nshot.methods.bsr.config import ARCH_FIELDS
    from nshot.methods.bsr.model import PretrainedVideoMAE, ScratchVideoMAE, vmae_config
    from nshot.methods.bsr.train import new_pretrainer
    from nshot.nn.backbone import (
        backbone_from_record,
        backbone_problems,
        load_backbone,
        prepare_backbone,
    )
    from nshot.nn.hfclip import clip_fingerprint

    cfg = BsrConfig.from_preset("smoke")
    spec = cfg.backbone_spec()
    assert spec.kind == "videomae-scratch" and "init_weights" not in spec.options
    assert {f: spec.options[f] for f in ARCH_FIELDS} == {f: getattr(cfg, f) for f in ARCH_FIELDS}
    assert spec.options["seed"] == cfg.seed
    assert BsrConfig.from_preset("small").backbone_spec().kind == "videomae-scratch"
    paper = BsrConfig.from_preset("paper")
    assert paper.backbone_spec().kind == "videomae"
    problems = backbone_problems(paper.backbone_spec())
    assert len(problems) == 1 and "field 'init_weights' is not set" in problems[0]
    with pytest.raises(ConfigError, match="init_weights"):
        prepare_backbone(paper.backbone_spec())
    assert BsrConfig.from_preset("smoke", init_weights="/x").backbone == "videomae"
    with pytest.raises(ConfigError, match="field 'init_weights'.*videomae-scratch"):
        cfg.replace(init_weights="/x")

    trained = load_backbone(spec, trainable=True)
    assert isinstance(trained, ScratchVideoMAE) and trained.model.training
    assert all(p.requires_grad for p in trained.model.parameters())
    model, _ = new_pretrainer(cfg)
    frozen = load_backbone(spec)
    assert not frozen.model.training and not any(p.requires_grad for p in frozen.model.parameters())
    for name, t in model.state_dict().items():  # the same seed, the same initial weights
        assert torch.equal(t, trained.model.state_dict()[name]), name
        assert torch.equal(t, frozen.model.state_dict()[name]), name
    assert trained.fingerprint() == frozen.fingerprint() == clip_fingerprint(model)
    assert trained.encoder is trained.model.videomae
    record = trained.record()
    assert record == {"kind": "videomae-scratch", **{f: getattr(cfg, f) for f in ARCH_FIELDS}}
    back = backbone_from_record(record, "ckpt")
    assert isinstance(back, ScratchVideoMAE)
    shapes = {k: v.shape for k, v in model.state_dict().items()}
    assert {k: v.shape for k, v in back.model.state_dict().items()} == shapes

    torch.manual_seed(5)
    saved = VideoMAEForPreTraining(vmae_config(cfg, pretraining=True))
    saved.save_pretrained(tmp_path / "vmae")
    hf = BsrConfig.from_preset("smoke", init_weights=str(tmp_path / "vmae"))
    assert backbone_problems(hf.backbone_spec()) == []
    read = load_backbone(hf.backbone_spec(), trainable=True)
    assert isinstance(read, PretrainedVideoMAE) and read.model.training
    assert read.fingerprint() == clip_fingerprint(saved)  # a pretrainer is read whole
    record = read.record()
    assert record["kind"] == "videomae" and record["init_weights"] == str(tmp_path / "vmae")
    assert record["init_sha256"] == clip_fingerprint(saved)
    (tmp_path / "vmae" / "model.safetensors").unlink()  # a record is not read from its path
    again = backbone_from_record(record, "ckpt")
    assert isinstance(again, PretrainedVideoMAE) and again.record() == record
    with pytest.raises(CheckpointError, match="ckpt.*options"):
        backbone_from_record({"kind": "videomae", "grid": 16}, "ckpt")


@pytest.mark.parametrize("old_config", [False, True])
def test_checkpoints_written_before_the_backbones_still_load(tmp_path, old_config):
    """A checkpoint whose extra has no backbone record and whose config has no ``backbone``
    field (with or without ``init_weights``) loads its pretrainer from its config's shape;
    a new checkpoint keeps the backbone's record."""
    from nshot.methods.bsr.config import VERSION
    from nshot.methods.bsr.model import backbone_record, load_model
    from nshot.methods.bsr.train import new_backbone
    from nshot.train.checkpoint import load_checkpoint, save_checkpoint

    cfg = BsrConfig.from_preset("smoke")
    bb = new_backbone(cfg)
    config = cfg.model_dump()
    del config["backbone"]
    if old_config:
        config["init_weights"] = str(tmp_path / "gone")  # read once, when pretraining began
    path = save_checkpoint(tmp_path / "ckpt", method="bsr", method_version=VERSION,
                           config=config, step=4, model_state=bb.model.state_dict(),
                           extra={"renderer": {}})  # fmt: skip
    ckpt = load_checkpoint(path, method="bsr")
    model, got, extra = load_model(ckpt)
    assert got.backbone == ("videomae" if old_config else "videomae-scratch")
    assert backbone_record(got, extra)["kind"] == "videomae-scratch"
    assert not model.training
    for name, t in bb.model.state_dict().items():
        assert torch.equal(model.state_dict()[name], t), name
    assert backbone_record(cfg, {"backbone": bb.record()}) == bb.record()
