"""nshot.nn.backbone: one function builds the backbone a config names, and both kinds of the
CLIP family answer the same interface: nshot's tiny CLIP (trained here in seconds) and a real
CLIP's Hugging Face folder written here with random weights."""

from __future__ import annotations

import pytest
import torch

from nshot.errors import CheckpointError, ConfigError
from nshot.nn.backbone import (
    BackboneSpec,
    CLIPBackbone,
    backbone_from_record,
    backbone_problems,
    load_backbone,
    prepare_backbone,
)

TEXTS = ["a photo of a circle", "a photo of a square", "a photo of a star"]
EMBED = 24  # the HF CLIP's declared joint dimension (the tiny CLIP's smoke preset has its own)


@pytest.fixture(scope="module")
def tiny_spec(nshot_cache):
    return BackboneSpec("tinyclip", {"preset": "smoke", "text": "word", "seed": 0})


@pytest.fixture(scope="module")
def hf_folder(tmp_path_factory):
    """A Hugging Face CLIP folder: transformers' CLIPConfig / CLIPModel with random weights,
    ``save_pretrained``, and a byte-level BPE tokenizer of CLIP's layout."""
    from transformers import CLIPConfig, CLIPModel, CLIPTokenizer

    from nshot.nn.hfclip import write_tiny_clip

    folder = write_tiny_clip(tmp_path_factory.mktemp("hfclip") / "clip", words=TEXTS[0].split())
    vocab = len(CLIPTokenizer.from_pretrained(str(folder), local_files_only=True))
    config = CLIPConfig(
        text_config={"vocab_size": vocab, "hidden_size": 32, "intermediate_size": 64,
                     "num_hidden_layers": 2, "num_attention_heads": 2,
                     "max_position_embeddings": 16, "bos_token_id": vocab - 2, "eos_token_id": 2},
        vision_config={"hidden_size": 48, "intermediate_size": 96, "num_hidden_layers": 3,
                       "num_attention_heads": 2, "image_size": 32, "patch_size": 8},
        projection_dim=EMBED,
    )  # fmt: skip
    torch.manual_seed(0)
    CLIPModel(config).save_pretrained(str(folder), safe_serialization=True)
    return folder


def _spec(folder, **more):
    return BackboneSpec("hfclip", {"clip_path": str(folder), "clip_arch": "any", **more})


def _features_of_the_declared_dim(bb: CLIPBackbone, embed: int) -> None:
    x = torch.rand(2, bb.in_chans, bb.image_size, bb.image_size,
                   generator=torch.Generator().manual_seed(0))  # fmt: skip
    with torch.no_grad():
        img, txt = bb.encode_image(x), bb.encode_text(TEXTS)
        assert img.shape == (2, embed) and txt.shape == (len(TEXTS), embed) == (3, bb.embed_dim)
        unit = bb.encode_image(x, normalize=True)
        torch.testing.assert_close(unit.norm(dim=-1), torch.ones(2))
        # a block hook runs at every image block's input, and is removed after the forward
        seen = []
        same = bb.encode_image(x, block_hook=lambda i, t: seen.append(i) or t)
        assert seen == list(range(bb.vision_depth)) and torch.equal(same, img)
        ramp = torch.linspace(-1, 1, bb.image_norm(bb.image_tower()).weight.shape[0])
        moved = bb.encode_image(x, block_hook=lambda i, t: t + ramp * (i == 0))
        assert not torch.allclose(moved, img) and torch.equal(bb.encode_image(x), img)
        # the image tower's own pooling and projection: the features again
        assert bb.image_projection().shape == (bb.image_norm(bb.image_tower()).weight.shape[0],
                                               embed)  # fmt: skip
        # prompt learning: the context slots holding "a photo of a" give the text features
        prompt = bb.prompt(["circle", "square"], 4)
        ctx = bb.context_embeddings("a photo of a")
        final, mid = bb.encode_prompt(bb.text_tower(), prompt, ctx, 0)
        assert final.shape == mid.shape == (2, embed)
        torch.testing.assert_close(final, txt[:2], atol=1e-5, rtol=0)
    # frozen, and g of a fine-tuning is the image tower with its projection
    assert not any(p.requires_grad for p in bb.model.parameters())
    names = [n for n, p in bb.model.named_parameters() if p in set(bb.image_parameters())]
    assert names and all(n.startswith(bb.image_prefixes) for n in names)
    assert len(bb.fingerprint()) == 64
    # a copy is independent; float64 image tower (the predictors' answers)
    other = bb.copy()
    assert other.fingerprint() == bb.fingerprint() and other.model is not bb.model
    other.cast_image_tower(torch.float64)
    with torch.no_grad():
        f64 = other.encode_image(x.double())
    assert f64.dtype == torch.float64
    torch.testing.assert_close(f64.float(), img, atol=1e-4, rtol=1e-4)
    pixels = bb.preprocess((torch.rand(20, 30, 3) * 255).to(torch.uint8).numpy())
    assert pixels.shape == (bb.in_chans, bb.image_size, bb.image_size)


def test_the_tiny_clip_through_the_interface(tiny_spec):
    prepare_backbone(tiny_spec)  # trained and cached on first use
    bb = load_backbone(tiny_spec)
    assert bb.kind == "tinyclip" and bb.weights_in_checkpoint
    _features_of_the_declared_dim(bb, bb.model.cfg.embed_dim)
    assert bb.unknown_words(["a photo of a zebra"]) == 1
    # the record is the architecture; the checkpoint holds the weights
    rec = bb.record()
    again = backbone_from_record(rec, "ckpt")
    assert again.model.cfg == bb.model.cfg and again.fingerprint() != bb.fingerprint()
    again.model.load_state_dict(bb.model.state_dict())
    assert again.fingerprint() == bb.fingerprint()
    big = {"clip": {**rec["clip"], "vision_width": 100_000}}
    with pytest.raises(CheckpointError, match="vision_width"):
        backbone_from_record(big, "ckpt")


def test_a_hugging_face_clip_through_the_same_function(hf_folder, tmp_path):
    bb = load_backbone(_spec(hf_folder))
    assert bb.kind == "hfclip" and not bb.weights_in_checkpoint
    assert (bb.embed_dim, bb.image_size, bb.vision_depth, bb.text_depth) == (EMBED, 32, 3, 2)
    _features_of_the_declared_dim(bb, EMBED)
    # the record points at the folder and fingerprints the CLIP as read; read back, checked
    rec = bb.record()
    assert rec["clip_path"] == str(hf_folder) and len(rec["clip_sha256"]) == 64
    assert backbone_from_record(rec, "ckpt").fingerprint() == rec["clip_sha256"]
    with pytest.raises(CheckpointError, match="field 'clip_path'.*not the one"):
        backbone_from_record({**rec, "clip_sha256": "0" * 64}, "ckpt")
    with pytest.raises(CheckpointError, match="field 'clip_path'.*does not exist"):
        backbone_from_record({**rec, "clip_path": str(tmp_path / "gone")}, "ckpt")
    with pytest.raises(ConfigError, match="clip_arch"):
        load_backbone(_spec(hf_folder, clip_arch="ViT-B-32"))


def test_problems_are_named_before_any_weight_is_read(tmp_path):
    assert backbone_problems(BackboneSpec("tinyclip", {"preset": "smoke"})) == []
    problems = backbone_problems(BackboneSpec("hfclip", {"clip_arch": "ViT-B-16"}))
    assert len(problems) == 1 and "'clip_path' is not set" in problems[0]
    assert "openai/clip-vit-base-patch16" in problems[0]
    with pytest.raises(ConfigError, match="does not exist"):
        prepare_backbone(_spec(tmp_path / "none"))
    with pytest.raises(ConfigError, match="unknown; known: .*hfclip.*tinyclip"):
        load_backbone(BackboneSpec("resnet"))
    with pytest.raises(ConfigError, match="unknown option"):
        load_backbone(BackboneSpec("hfclip", {"path": "x"}))
    with pytest.raises(CheckpointError, match="no backbone recorded"):
        backbone_from_record({"something": 1}, "ckpt")


def test_the_minilm_text_backbone_is_memoised(monkeypatch):
    """Kind ``minilm``: frozen sentence embeddings under the trained projections of the tiny
    CLIP's MiniLM tower and tgdt's MiniLM text encoder; a text is embedded once per process."""
    import numpy as np

    from nshot.data import sources
    from nshot.nn.text import SentenceEncoder

    calls = []

    def fake(texts):
        calls.append(list(texts))
        return np.stack([np.full(sources.MINILM_DIM, len(t), np.float32) for t in texts])

    monkeypatch.setattr(sources, "embed_texts", fake)
    enc = load_backbone(BackboneSpec("minilm"))
    assert isinstance(enc, SentenceEncoder) and enc.dim == 384 and not enc.weights_in_checkpoint
    assert enc.fingerprint() == sources.MINILM_SHA256 == enc.record()["sha256"]
    first = enc.embed(["b", "aa", "b"])
    again = enc.embed(["aa", "ccc"])
    assert first.shape == (3, 384) and calls == [["aa", "b"], ["ccc"]]
    assert torch.equal(first[1], again[0])
    with pytest.raises(ConfigError, match="unknown option"):
        load_backbone(BackboneSpec("minilm", {"size": 1}))
