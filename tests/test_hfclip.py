"""nshot.nn.hfclip: real CLIP checkpoints by path (a Hugging Face folder, or an OpenAI /
open_clip state dict in safetensors), checked on a tiny random CLIP written here (no network),
and against open_clip itself when it is importable (a throwaway GPU-side environment)."""

from __future__ import annotations

import gzip
import json
import re

import numpy as np
import pytest
import torch

from nshot.errors import CheckpointError

TEXTS = ["a photo of a cat", "this is a dog", "a photo of a circle with a long name"]


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """``(hf folder, openai safetensors file)`` of one random tiny CLIP."""
    from safetensors.torch import save_file

    from nshot.nn.hfclip import hf_to_openai, load_pretrained_clip, write_tiny_clip

    root = tmp_path_factory.mktemp("hfclip")
    folder = write_tiny_clip(root / "hf", seed=3)
    clip = load_pretrained_clip(folder)
    single = root / "oa" / "open_clip_model.safetensors"
    single.parent.mkdir()
    save_file(hf_to_openai(clip.model), str(single))
    return folder, single


def test_both_formats_give_the_same_features_and_logits(tiny):
    from nshot.nn.hfclip import load_pretrained_clip

    folder, single = tiny
    a = load_pretrained_clip(folder)
    b = load_pretrained_clip(single, tokenizer=folder)
    assert a.fmt == "hf" and b.fmt == "openai"
    assert b.model.config.text_config.hidden_act == "quick_gelu"  # OpenAI weights by default
    x = torch.rand(4, 3, 32, 32, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        for fa, fb in (
            (a.encode_image(x), b.encode_image(x)),
            (a.encode_text(TEXTS), b.encode_text(TEXTS)),
            (a.logits(x, TEXTS), b.logits(x, TEXTS)),
        ):
            assert fa.shape == fb.shape
            assert float((fa - fb).abs().max()) <= 1e-5
    # open_clip's tokenization: start, BPE, end, zero padding; whole words are one token each
    ids = a.tokenize(TEXTS)
    assert ids[0, 0] == a.tokenizer.bos_token_id and ids[0].tolist().count(a.eos_id) == 1
    assert len(a.token_ids("a photo of a")) == 4
    # the end token is pooled: the text features do not depend on the zero padding
    one = a.encode_text(TEXTS[:1])
    assert float((one - a.encode_text(TEXTS)[:1]).abs().max()) <= 1e-5


def test_the_mapping_round_trips_and_infers_the_architecture(tiny):
    from safetensors.torch import load_file

    from nshot.nn.hfclip import hf_to_openai, load_pretrained_clip, openai_to_hf

    folder, single = tiny
    state = load_file(str(single))
    config, hf_state = openai_to_hf(state)
    v, t = config.vision_config, config.text_config
    assert (v.patch_size, v.image_size, v.hidden_size, v.num_hidden_layers) == (8, 32, 64, 2)
    assert (t.hidden_size, t.max_position_embeddings, config.projection_dim) == (64, 32, 32)
    ref = load_pretrained_clip(folder).model.state_dict()
    assert set(hf_state) == set(ref)
    for k, val in hf_state.items():
        assert torch.equal(val, ref[k]), k
    back = hf_to_openai(load_pretrained_clip(single, tokenizer=folder).model)
    assert set(back) == set(state) and all(torch.equal(back[k], state[k]) for k in state)


def test_bad_inputs_give_one_clear_error_naming_the_path_or_key(tiny, tmp_path):
    from safetensors.torch import load_file, save_file

    from nshot.nn.hfclip import clip_problems, load_pretrained_clip

    folder, single = tiny
    with pytest.raises(CheckpointError, match="does not exist"):
        load_pretrained_clip(tmp_path / "nope")
    pickle = tmp_path / "ViT-B-32.pt"
    pickle.write_bytes(b"\x80\x04not read")
    with pytest.raises(CheckpointError, match="pickle") as err:
        load_pretrained_clip(pickle)
    assert str(pickle) in str(err.value) and "safetensors" in str(err.value)
    hf_pickle = tmp_path / "hfbin"
    hf_pickle.mkdir()
    (hf_pickle / "config.json").write_text(json.dumps({"model_type": "clip"}))
    (hf_pickle / "pytorch_model.bin").write_bytes(b"x")
    with pytest.raises(CheckpointError, match="pickle"):
        load_pretrained_clip(hf_pickle)
    bert = tmp_path / "bert"
    bert.mkdir()
    (bert / "config.json").write_text(json.dumps({"model_type": "bert"}))
    with pytest.raises(CheckpointError, match="not a CLIP checkpoint"):
        load_pretrained_clip(bert)
    state = load_file(str(single))
    bad = dict(state)
    bad["transformer.resblocks.0.attn.in_proj_weight"] = torch.zeros(10, 64)
    save_file(bad, str(tmp_path / "shape.safetensors"))
    with pytest.raises(CheckpointError, match="resblocks.0.attn.in_proj_weight"):
        load_pretrained_clip(tmp_path / "shape.safetensors", tokenizer=folder)
    gone = {k: v for k, v in state.items() if k != "visual.ln_post.weight"}
    save_file(gone, str(tmp_path / "gone.safetensors"))
    with pytest.raises(CheckpointError, match="visual.ln_post.weight"):
        load_pretrained_clip(tmp_path / "gone.safetensors", tokenizer=folder)
    extra = {**state, "visual.attnpool.weight": torch.zeros(2)}
    save_file(extra, str(tmp_path / "extra.safetensors"))
    with pytest.raises(CheckpointError, match="visual.attnpool.weight"):
        load_pretrained_clip(tmp_path / "extra.safetensors", tokenizer=folder)
    # an OpenAI-format file alone: the tokenizer is required, never downloaded
    with pytest.raises(CheckpointError, match="tokenizer"):
        load_pretrained_clip(single)
    assert any("tokenizer" in p for p in clip_problems(single))
    assert clip_problems(single, folder) == [] and clip_problems(folder) == []
    assert clip_problems(None) == ["the CLIP path is not set"]
    partial = tmp_path / "partial"
    partial.mkdir()
    (partial / "config.json").write_text((folder / "config.json").read_text())
    assert "model.safetensors is missing" in clip_problems(partial)[0]
    (partial / "model.safetensors").write_bytes((folder / "model.safetensors").read_bytes())
    assert "no tokenizer files" in clip_problems(partial)[0]


def test_open_clip_bpe_file_and_preprocessing(tiny, tmp_path):
    from PIL import Image

    from nshot.nn.hfclip import bpe_tokenizer, image_folder, load_image, load_pretrained_clip

    folder, _ = tiny
    clip = load_pretrained_clip(folder)
    merges = json.loads((folder / "tokenizer.json").read_text())["model"]["merges"]
    gz = tmp_path / "bpe_simple_vocab_16e6.txt.gz"
    lines = ["#version: 0.2"] + [m if isinstance(m, str) else " ".join(m) for m in merges]
    gz.write_bytes(gzip.compress("\n".join(lines).encode()))
    tok = bpe_tokenizer(gz)  # open_clip's merges file: the same vocabulary rebuilt
    for text in TEXTS:
        assert tok(text).input_ids == clip.tokenizer(text).input_ids
    # 224-style preprocessing: shorter side resized, centre crop, [0, 1], channels first
    for c in ("cat", "dog"):
        (tmp_path / "imgs" / c).mkdir(parents=True)
    arr = np.zeros((40, 80, 3), dtype=np.uint8)
    arr[:, 30:50] = 255  # a white band in the centre survives the crop
    Image.fromarray(arr).save(tmp_path / "imgs" / "cat" / "0.png")
    Image.fromarray(arr).convert("L").save(tmp_path / "imgs" / "dog" / "0.jpg")
    x = load_image(tmp_path / "imgs" / "cat" / "0.png", 20)
    assert x.shape == (3, 20, 20) and x.dtype == np.float32
    assert x[:, :, 10].min() > 0.9 and x[:, :, 0].max() < 0.1
    assert load_image(tmp_path / "imgs" / "dog" / "0.jpg", 20).shape == (3, 20, 20)
    f = image_folder(tmp_path / "imgs")
    assert f.classes == ("cat", "dog") and f.labels.tolist() == [0, 1]
    with pytest.raises(CheckpointError, match="class folder"):
        image_folder(tmp_path / "imgs" / "cat")


def test_against_open_clip_itself():
    """The OpenAI-format mapping and the BPE file against open_clip's own ViT-B-32 (random
    weights, perturbed): runs only where open_clip is importable (never in the default
    environment)."""
    open_clip = pytest.importorskip("open_clip")
    from pathlib import Path

    from transformers import CLIPModel

    from nshot.nn.hfclip import bpe_tokenizer, openai_to_hf

    torch.manual_seed(0)
    model = open_clip.create_model("ViT-B-32", pretrained=None, force_quick_gelu=True).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.02 * torch.randn_like(p))
    config, state = openai_to_hf(model.state_dict())
    hf = CLIPModel(config).eval()
    hf.load_state_dict(state, strict=True)
    x = torch.rand(2, 3, 224, 224, generator=torch.Generator().manual_seed(1))
    texts = ["a photo of a cat", "A Photo of  the Golden-Retriever's toy, 2 dogs!"]
    ids = open_clip.get_tokenizer("ViT-B-32")(texts)
    with torch.no_grad():
        di = (model.encode_image(x) - hf.get_image_features(pixel_values=x).pooler_output).abs()
        dt = (model.encode_text(ids) - hf.get_text_features(input_ids=ids).pooler_output).abs()
    assert float(di.max()) <= 1e-4 and float(dt.max()) <= 1e-4
    tok = bpe_tokenizer(Path(open_clip.__file__).parent / "bpe_simple_vocab_16e6.txt.gz")
    for row, text in zip(ids, texts, strict=True):
        mine = [tok.bos_token_id, *tok(text, add_special_tokens=False).input_ids, tok.eos_token_id]
        assert mine == [int(v) for v in row if int(v) != 0]


def _image_folder(root, classes, per_class, seed):
    """Class folders of small random RGB PNGs, a class-dependent mean colour."""
    from PIL import Image

    rng = np.random.default_rng(seed)
    for c, name in enumerate(classes):
        (root / name).mkdir(parents=True, exist_ok=True)
        for i in range(per_class):
            base = np.full((36, 40, 3), 60 + 120 * c, dtype=np.float64)
            img = np.clip(base + rng.normal(0, 30, base.shape), 0, 255).astype(np.uint8)
            Image.fromarray(img).save(root / name / f"{i}.png")
    return root


def _b64_png(arr):
    import base64
    import io

    from PIL import Image

    buf = io.BytesIO()
    Image.fromarray(arr).save(buf, format="PNG")
    return base64.b64encode(buf.getvalue()).decode()


@pytest.mark.ray
def test_dirclip_paper_path_trains_resumes_evaluates_and_serves_on_a_tiny_clip(
    tiny, ray_session, nshot_cache, tmp_path, capsys
):
    """The ``paper`` preset's code path end to end on a tiny random CLIP in the Hugging Face
    format and an ImageFolder: validation names what is missing; two UCAT steps under Ray
    Train (in-process) with a checkpoint holding g only; a run interrupted after step 1 and
    resumed ends with the same weights; evaluation on val/, and zero-shot on two image folders
    of other classes (``eval_paths``); the predictor reads the CLIP from
    the recorded clip_path and answers over HTTP with the in-process model's probabilities."""
    from fastapi.testclient import TestClient

    from nshot.method import ConfigError, get
    from nshot.methods.dirclip.model import SCALE, DirClip
    from nshot.methods.dirclip.paper_data import check_paper
    from nshot.nn.backbone import backbone_of
    from nshot.nn.hfclip import load_pretrained_clip, load_recorded_clip, preprocess_image
    from nshot.serve.bare import make_app
    from nshot.train import Scaling, fit, load_checkpoint

    folder, single = tiny
    dirclip = get("dirclip")
    with pytest.raises(ConfigError) as err:
        check_paper(dirclip.config("paper"))
    assert "'clip_path' is not set" in str(err.value) and "'data_path' is not set" in str(err.value)
    with pytest.raises(ConfigError, match="tokenizer"):
        check_paper(dirclip.config("paper", clip_path=str(single), data_path=str(tmp_path)))
    data = tmp_path / "data"
    _image_folder(data / "train", ["zero", "one"], 8, 0)
    _image_folder(data / "val", ["zero", "one"], 3, 1)
    (data / "class_names.json").write_text(json.dumps({"zero": "digit zero"}))
    cfg = dirclip.config(
        "paper", clip_path=str(folder), data_path=str(data), clip_arch="any", steps=2,
        batch_size=4, val_images=10, val_every=1, val_pgd_steps=1, pgd_steps=2, apgd_steps=2,
        apgd_images=4, warmup=0, log_every=1, checkpoint_every=1,
    )  # fmt: skip
    with pytest.raises(ConfigError, match="clip_arch"):
        from nshot.methods.dirclip.model import base_clip

        base_clip(cfg.replace(clip_arch="ViT-B-32"))
    runs = tmp_path / "runs"
    res = fit("dirclip", cfg, scaling=Scaling(workers=0), storage=runs, name="p")
    ckpt = load_checkpoint(res.checkpoint, method="dirclip")
    weights = ckpt.weights()
    rec = ckpt.extra["model"]
    assert ckpt.step == 2 and rec["class_names"] == ["one", "digit zero"]
    assert rec["clip_path"] == str(folder) and len(rec["clip_sha256"]) == 64
    g = ("clip.vision_model.", "clip.visual_projection.")
    assert weights and all(k.removeprefix("best.").startswith(g) for k in weights)
    assert {"ce", "lam_kl", "adv_acc", "clean_acc", "val_h"} <= set(ckpt.metrics)
    # interrupted after the step-1 checkpoint, resumed: the weights of the uninterrupted run
    faulty = cfg.replace(fail_at_step=2)
    with pytest.raises(Exception, match="injected fault"):
        fit("dirclip", faulty, scaling=Scaling(workers=0), storage=runs, name="f")
    again = fit("dirclip", faulty, scaling=Scaling(workers=0), storage=runs, name="f", resume=True)
    resumed = load_checkpoint(again.checkpoint, method="dirclip")
    wb = resumed.weights()
    assert resumed.step == 2 and set(wb) == set(weights)
    assert not torch.equal(weights["clip.visual_projection.weight"],
                           load_pretrained_clip(folder).model.visual_projection.weight)  # fmt: skip
    for k in weights:
        torch.testing.assert_close(wb[k], weights[k], atol=1e-6, rtol=0, msg=k)
    metrics = dirclip.evaluate(ckpt, cfg)
    for k in ("clean", "pgd", "apgd", "h", "ece_clean", "ece_adv", "au", "pu"):
        assert k in metrics and 0.0 <= metrics[k] <= 1.0, k
    # zero-shot on two more image folders with other classes (eval_paths, as `nshot eval
    # --set` gives it): one in test/ with a class_names.json, one named NAME=PATH holding its
    # class folders itself; the metrics on val/ are the same as without them
    _image_folder(tmp_path / "shapes" / "test", ["circle", "square", "gold_star"], 2, 2)
    (tmp_path / "shapes" / "class_names.json").write_text(json.dumps({"circle": "round"}))
    _image_folder(tmp_path / "pets_folder", ["cat", "dog"], 2, 3)
    zcfg = cfg.replace(eval_paths=[str(tmp_path / "shapes"), f"pets={tmp_path / 'pets_folder'}"])
    check_paper(zcfg)
    capsys.readouterr()
    zs = dirclip.evaluate(ckpt, zcfg)
    progress = capsys.readouterr().err
    assert "zero-shot shapes (1/2): 6 images of 3 classes" in progress
    assert "zero-shot pets (2/2): 4 images of 2 classes" in progress
    assert {k: v for k, v in zs.items() if not k.startswith("zs/")} == metrics
    for d in ("shapes", "pets", "mean"):
        for k in ("clean", "pgd", "apgd", "h", "ece_clean", "ece_adv", "au", "pu"):
            assert 0.0 <= zs[f"zs/{d}/{k}"] <= 1.0, (d, k)
    for k in ("clean", "pgd", "ece_adv", "au_adv"):
        assert zs[f"zs/mean/{k}"] == pytest.approx((zs[f"zs/shapes/{k}"] + zs[f"zs/pets/{k}"]) / 2)
    # the shapes' clean accuracy and ECE, recomputed here on the prompts of its own classes
    from nshot.methods.dirclip.dirichlet import ece
    from nshot.methods.dirclip.model import load_model
    from nshot.nn.hfclip import FolderImages, image_folder

    tuned = load_model(ckpt)[0]
    shapes = image_folder(tmp_path / "shapes" / "test")
    xz = torch.from_numpy(FolderImages(shapes.paths, tuned.backbone.image_size)[:])
    with torch.no_grad():
        text = tuned.text_features_of(["round", "gold star", "square"], rec["template"])
        lz = tuned.logits(xz, text_features=text)
    yz = torch.from_numpy(shapes.labels)
    assert zs["zs/shapes/clean"] == pytest.approx(float((lz.argmax(-1) == yz).double().mean()))
    assert zs["zs/shapes/ece_clean"] == pytest.approx(ece(lz.softmax(-1), yz), abs=1e-6)
    # the predictor: the CLIP from the recorded clip_path, g's selected weights put in
    rng = np.random.default_rng(5)
    arrays = [rng.integers(0, 256, (30, 44, 3), dtype=np.uint8) for _ in range(3)]
    names = ["digit zero", "one", "a photo"]
    body = {"images": [(a / 255.0).tolist() for a in arrays], "class_names": names}
    with TestClient(make_app("dirclip", str(res.checkpoint))) as client:
        got = client.post("/dirclip/predict", json=body)
        assert got.status_code == 200, got.text
        answer = got.json()["predictions"]
        png = client.post("/dirclip/predict", json={"images_b64": [_b64_png(a) for a in arrays],
                                                     "class_names": names})  # fmt: skip
        assert png.status_code == 200 and png.json()["predictions"] == answer
        bad = [
            ({**body, "images": [[[[0.0, 0.5, 1.5]]]]}, "images[0]"),
            ({**body, "images": [[[[0.0, 0.5]]]]}, "images[0]"),
            ({**body, "class_names": ["one", "one"]}, "class_names"),
            ({**body, "class_names": ["one", " "]}, "class_names[1]"),
            ({"images_b64": ["bm90IGFuIGltYWdl"], "class_names": names}, "images_b64[0]"),
            ({**body, "extra": 1}, None),
        ]
        for b, field in bad:
            r = client.post("/dirclip/predict", json=b)
            assert r.status_code == 422, (field, r.text)
            assert field is None or field in r.text, (field, r.text)
    model = DirClip(backbone_of(load_pretrained_clip(folder)), rec["class_names"],
                    rec["template"]).eval()  # fmt: skip
    model.load_state_dict({**model.state_dict(), **{k.removeprefix("best."): v
                                                    for k, v in weights.items()
                                                    if k.startswith("best.")}})  # fmt: skip
    x = torch.from_numpy(np.stack([preprocess_image(a, 32) for a in arrays]))
    with torch.no_grad():
        text = model.text_features_of(names, rec["template"])
        probs = SCALE * torch.nn.functional.normalize(model.features(x), dim=-1) @ text.T
        probs = probs.double().softmax(-1)  # float32 here; the server's g runs in float64
    served = torch.tensor([[p["probs"][n] for n in names] for p in answer], dtype=torch.float64)
    torch.testing.assert_close(served, probs, atol=1e-5, rtol=0)
    assert all(0.0 <= p["uncertainty"]["au"] <= 1.0 for p in answer)
    # `--conformal caos`: g's unit features of a labelled support set (here the queries
    # themselves, so support and query features coincide) give sets; the answer is unchanged
    from nshot.serve.conformal import ConformalPredictor

    pred = dirclip.predictor(ckpt)
    labelled = {**body, "support_images": body["images"], "support_labels": names}
    ep = pred.one_shot_embeddings(pred.Request.model_validate(labelled))
    assert ep.support_emb.shape == ep.query_emb.shape and ep.support_labels.tolist() == [0, 1, 2]
    np.testing.assert_allclose(ep.support_emb, ep.query_emb, atol=1e-6)
    np.testing.assert_allclose(np.linalg.norm(ep.query_emb, axis=1), 1.0, atol=1e-6)
    wrapped = ConformalPredictor(pred, alpha=0.4)
    sets = wrapped(wrapped.Request.model_validate(labelled))
    assert len(sets.sets) == 3 and all(set(s) <= set(names) for s in sets.sets)
    assert [p.probs for p in sets.predictions] == [p["probs"] for p in answer]
    for b, field in (({**labelled, "support_labels": names[:2]}, "support_labels"),
                     ({**labelled, "support_labels": ["one", "two", "one"]}, "support_labels[1]"),
                     ({**body, "support_labels": names}, "support_labels")):  # fmt: skip
        with pytest.raises(ValueError, match=rf"^[\s\S]*{re.escape(field)}: "):
            pred.Request.model_validate(b)
    # the serving machine lacks the CLIP, or has another one at that path: errors name clip_path
    with pytest.raises(CheckpointError, match="field 'clip_path'.*does not exist"):
        load_recorded_clip({**ckpt.config, "clip_path": str(tmp_path / "gone")}, rec, "ck")
    with pytest.raises(CheckpointError, match="field 'clip_path'.*not the one"):
        load_recorded_clip(ckpt.config, {**rec, "clip_sha256": "0" * 64}, "ck")


def test_dirclip_eval_paths_problems_are_named_in_one_error(tiny, tmp_path):
    """``eval_paths``: check_paper names every problem of every entry in one ConfigError (a
    missing folder, one class folder, a name given twice, a bad or reserved name); a good
    entry passes; the toy backbone refuses the field; ``small`` leaves it empty."""
    from nshot.method import ConfigError, get
    from nshot.methods.dirclip.paper_data import check_paper

    folder, _ = tiny
    dirclip = get("dirclip")
    _image_folder(tmp_path / "data" / "train", ["zero", "one"], 1, 0)
    _image_folder(tmp_path / "data" / "val", ["zero", "one"], 1, 1)
    _image_folder(tmp_path / "a" / "val", ["x", "y"], 1, 2)
    _image_folder(tmp_path / "b" / "a", ["x", "y"], 1, 3)  # named "a" too
    _image_folder(tmp_path / "one", ["x"], 1, 4)
    paper = dict(clip_path=str(folder), data_path=str(tmp_path / "data"), clip_arch="any")
    check_paper(dirclip.config("paper", **paper, eval_paths=[str(tmp_path / "a")]))
    bad = [str(tmp_path / "a"), str(tmp_path / "missing"), str(tmp_path / "one"),
           str(tmp_path / "b" / "a"), f"mean={tmp_path / 'a'}"]  # fmt: skip
    with pytest.raises(ConfigError) as err:
        check_paper(dirclip.config("paper", **paper, eval_paths=bad))
    msg = str(err.value)
    assert "'eval_paths[0]'" not in msg and "clip_path" not in msg, msg
    assert f"'eval_paths[1]': {tmp_path / 'missing'} is not a directory" in msg
    assert f"'eval_paths[2]': {tmp_path / 'one'} has 1 class folder(s)" in msg
    assert "'eval_paths[3]': the name 'a' is eval_paths[0]'s too" in msg
    assert "'eval_paths[4]': the name 'mean' is reserved" in msg
    assert msg.count("eval_paths[") == 4 + 1, msg  # four problems, one naming eval_paths[0]
    with pytest.raises(ConfigError, match="eval_paths.*backbone=clip"):
        dirclip.config("small", eval_paths=[str(tmp_path / "a")])
    assert dirclip.config("small").eval_paths == []


@pytest.mark.ray
def test_atha_paper_path_adapts_evaluates_and_reproduces_on_a_tiny_clip(
    tiny, ray_session, nshot_cache, tmp_path
):
    """The ``paper`` preset's code path end to end on a tiny random CLIP and one image-folder
    domain: validation names what is missing; CoOp's prompt route reproduces the CLIP's own
    text features; ρ = 0 is CoOp + LoRA; the ATHA hooks act and are removed; one report under
    Ray Train (in-process), evaluation and the reproduction's table."""
    from nshot.method import ConfigError, get
    from nshot.methods.atha.data import sample_episode
    from nshot.methods.atha.model import EpisodeModel
    from nshot.methods.atha.paper_data import check_paper, folder_pool
    from nshot.nn.backbone import load_backbone
    from nshot.train import Scaling, fit, load_checkpoint

    folder, _ = tiny
    atha = get("atha")
    with pytest.raises(ConfigError) as err:
        check_paper(atha.config("paper"))
    assert "'clip_path' is not set" in str(err.value) and "'data_path' is not set" in str(err.value)
    names = ["cat", "dog", "circle", "square", "ring"]
    _image_folder(tmp_path / "data" / "shapes", names, 12, 2)
    cfg = atha.config(
        "paper", clip_path=str(folder), data_path=str(tmp_path / "data"), clip_arch="any",
        txtlayer=0, rho_block=1, epochs=2, queries=2, eval_episodes=1, episodes_1shot=2,
        episodes_5shot=1, job_gpus=0.0,
    )  # fmt: skip
    bb = load_backbone(cfg.backbone_spec())
    zero = EpisodeModel(bb, names[:2], cfg, "zero_shot", shots=1, seed=0)
    a = EpisodeModel(bb, names[:2], cfg, "atha", shots=1, seed=3)
    b = EpisodeModel(bb, names[:2], cfg, "coop_lora", shots=1, seed=3)
    x = torch.rand(3, 3, 32, 32, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        ref = bb.encode_text([f"a photo of a {n}" for n in names[:2]])
        assert float((zero.text_features()[0] - ref).abs().max()) <= 1e-5
        assert not torch.equal(a(x), b(x))  # ρ⁺ = 0.8 at rho_block: the hooks act
        assert all(not layer._forward_pre_hooks for layer in a.image.encoder.layers)
        a.rho_plus.zero_()
        assert torch.equal(a(x), b(x))
    assert a.lora_parameters() and not zero.lora_parameters()
    pool = folder_pool(cfg, "shapes", 32)
    ep = sample_episode(pool, seed=0, episode=0, n_way=5, shots=1, queries=2)
    assert ep.support_x.shape == (5, 3, 32, 32) and ep.query_x.shape == (10, 3, 32, 32)
    res = fit("atha", cfg, scaling=Scaling(workers=0), storage=tmp_path / "runs", name="p")
    ckpt = load_checkpoint(res.checkpoint, method="atha")
    assert ckpt.extra["backbone"] == "clip" and not dict(ckpt.weights())
    for k in ("acc_1shot_avg", "acc_1shot_shapes", "acc_1shot_avg_coop_lora"):
        assert 0.0 <= ckpt.metrics[k] <= 1.0, k
    assert atha.evaluate(ckpt, cfg)["acc_1shot_avg"] == ckpt.metrics["acc_1shot_avg"]
    with pytest.raises(ConfigError, match="job_gpus"):  # the CPU cluster has no GPU
        atha.experiments(cfg.replace(job_gpus=1.0), tmp_path / "exp")
    # Ray tasks of one episode each give the table of one task of every episode, in process
    table = atha.experiments(cfg.replace(episodes_per_job=1), tmp_path / "exp")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("NSHOT_IN_PROCESS", "1")
        one = atha.experiments(cfg.replace(episodes_per_job=2), tmp_path / "exp1")
    assert table.rows == one.rows and table.samples == one.samples
    assert set(table.rows) == set(cfg.systems)
    assert table.rows["coop_lora"]["paired_gain_vs_coop_lora"] == 0.0
    unit = table.extra["unit"]
    assert unit["rho0_max_abs_logit_diff"] == 0.0 and unit["prompt_max_abs_diff"] <= 1e-5
    assert unit["anchor_rel_error"] <= 1e-3 and unit["head_tail_overlap"] == 0.0
    # the predictor reads the CLIP the checkpoint records and adapts on the request's support:
    # over HTTP, the probabilities of the same episode run in this process
    from fastapi.testclient import TestClient

    from nshot.methods.atha.serve import SEED
    from nshot.methods.atha.train import adapt
    from nshot.nn.hfclip import preprocess_image
    from nshot.serve.bare import make_app

    assert len(ckpt.extra["clip"]["clip_sha256"]) == 64
    rng = np.random.default_rng(9)
    imgs = [rng.integers(0, 256, (36, 40, 3), dtype=np.uint8) for _ in range(5)]
    body = {
        "class_names": names[:2],
        "support": [{"image": _b64_png(imgs[0]), "label": names[0]},
                    {"image": imgs[1].tolist(), "label": names[1]}],
        "queries": [_b64_png(imgs[2]), imgs[3].tolist(), _b64_png(imgs[4])],
        "epochs": 2,
    }  # fmt: skip
    with TestClient(make_app("atha", str(res.checkpoint))) as client:
        got = client.post("/atha/predict", json=body)
        assert got.status_code == 200, got.text
        bad = {**body, "support": [{"image": imgs[0].tolist(), "label": "bird"}]}
        r = client.post("/atha/predict", json=bad)
        assert r.status_code == 422 and "support[0].label" in r.text
    x = torch.from_numpy(np.stack([preprocess_image(a, 32) for a in imgs]))
    ref = adapt(bb, names[:2], x[:2], torch.tensor([0, 1]), x[2:], cfg, "atha", shots=1,
                seed=SEED, epochs=2)  # fmt: skip
    served = torch.tensor(got.json()["probs"], dtype=torch.float32)
    torch.testing.assert_close(served, ref.probs, atol=1e-5, rtol=0)
    assert got.json()["rates"] == ref.rates and got.json()["epochs_run"] == 2


def test_example_runs_on_a_tiny_clip(run_example, capsys):
    run_example("clip_paper", ["--tiny"])
    out = capsys.readouterr().out
    diff = float(out.split("max |Δ logit| = ")[1].split()[0])
    assert diff <= 1e-5 and "zero-shot accuracy:" in out and "patch 8, width 64" in out
