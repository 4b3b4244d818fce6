"""atha: config, the token update's unit checks (rho = 0 is CoOp + LoRA bit for bit, disjoint
head and tail sets, anchors that reconstruct), the MiniLM prompt route, the episodes, the
predictor's 422s over HTTP, experiments on smoke and the example on two Ray Train workers."""

from __future__ import annotations

import base64
import io

import numpy as np
import pytest
import torch

from nshot.method import ConfigError, get

NAMES = ["circle", "square", "star"]


@pytest.fixture(scope="module")
def smoke_clip(nshot_cache):
    from nshot.train.clip import pretrained_clip

    return pretrained_clip("smoke", text="word")


@pytest.fixture(scope="module")
def backbone(smoke_clip):
    from nshot.nn.backbone import backbone_of

    return backbone_of(smoke_clip).freeze()


@pytest.fixture(scope="module")
def cfg():
    return get("atha").config("smoke")


def test_config_validation_names_the_field():
    atha = get("atha")
    with pytest.raises(ConfigError, match="minus_ratio"):
        atha.config("small", add_ratio=0.7, minus_ratio=0.4)
    for field, bad in (("domains", ["eurosat"]), ("lora_r", 0), ("epochs", 500),
                       ("clip_path", "/x.pt")):  # fmt: skip
        with pytest.raises(ConfigError, match=field):
            atha.config("small", **{field: bad})
    assert atha.config("small").text == "minilm" and atha.config("smoke").text == "word"


def test_clip_seed_maps_training_seeds_to_the_tiny_clip_they_adapt():
    """clip_seed (default 0): every training seed adapts the one tiny CLIP of that seed, so the
    backbone spec (the cache's key) is the same for each while the config's seed, which draws
    the pools, episodes and LoRA initialisations, still varies; per_seed: seed s adapts the
    CLIP of seed s. Nothing is pre-trained."""
    from nshot.methods.atha.config import clip_seed_for

    atha = get("atha")
    for preset in ("smoke", "small"):
        assert atha.config(preset).clip_seed == 0
    cfg = atha.config("small", seeds=3)
    assert [clip_seed_for(cfg, s) for s in (0, 1, 2)] == [0, 0, 0]
    specs = [cfg.replace(seed=s).backbone_spec().to_dict() for s in (0, 1, 2)]
    assert all(spec == specs[0] for spec in specs) and specs[0]["seed"] == 0
    assert [clip_seed_for(cfg.replace(seed=s)) for s in (0, 1, 2)] == [0, 0, 0]
    assert [clip_seed_for(atha.config("small", clip_seed=4), s) for s in (0, 1, 2)] == [4, 4, 4]
    per = atha.config("small", clip_seed="per_seed", seeds=3)
    assert [clip_seed_for(per, s) for s in (0, 1, 2)] == [0, 1, 2]
    assert [per.replace(seed=s).backbone_spec().to_dict()["seed"] for s in (0, 1, 2)] == [0, 1, 2]
    assert per.model_dump()["clip_seed"] == "per_seed"  # the resolved config carries it
    for bad in (-1, "per-seed", "1", 1.5, True, None):
        with pytest.raises(ConfigError, match="clip_seed"):
            atha.config("small", clip_seed=bad)


def test_the_context_learns_at_coops_rate_carried_to_the_logit_scale():
    """small's context takes CoOp's step (2e-3 at CLIP's logit scale 100) at ATHA's s: 0.1 at
    one shot (s = 2), 0.05 above (s = 4); smoke and paper keep the authors' 2e-3 as is; the
    tail sweep's fields are validated."""
    from nshot.methods.atha.config import sweep_row
    from nshot.methods.atha.train import ctx_learning_rate

    atha = get("atha")
    small = atha.config("small")
    assert small.lr_ctx_logit_scale == 100.0
    assert ctx_learning_rate(small, small.scale_1shot) == pytest.approx(0.1)
    assert ctx_learning_rate(small, small.scale_kshot) == pytest.approx(0.05)
    for preset in ("smoke", "paper"):
        cfg = atha.config(preset)
        assert ctx_learning_rate(cfg, cfg.scale_1shot) == cfg.lr_ctx == 2e-3
    assert [sweep_row(v) for v in small.sweep_rho_minus] == [
        "tail_rho0p2", "tail_rho0p4", "tail_rho0p8"]  # fmt: skip
    assert small.sweep_episodes == 30 and small.experiment == "comparison"
    for bad in ([0.4, 0.4], [-0.1]):
        with pytest.raises(ConfigError, match="sweep_rho_minus"):
            atha.config("small", sweep_rho_minus=bad)


def test_paper_preset_validates_and_names_what_is_missing():
    from nshot.methods.atha.paper_data import check_paper

    cfg = get("atha").config("paper")
    assert cfg.backbone == "clip" and cfg.epochs == 100 and cfg.episodes_1shot == 800
    with pytest.raises(ConfigError, match="'clip_path' is not set") as err:
        check_paper(cfg)
    assert "'data_path' is not set" in str(err.value)


def test_rho_zero_forward_equals_coop_lora_bit_for_bit(backbone, cfg):
    from nshot.methods.atha.model import EpisodeModel

    x = torch.rand(4, 3, 32, 32, generator=torch.Generator().manual_seed(0))
    a = EpisodeModel(backbone, NAMES, cfg, "atha", shots=1, seed=3)
    b = EpisodeModel(backbone, NAMES, cfg, "coop_lora", shots=1, seed=3)
    with torch.no_grad():
        assert not torch.equal(a(x), b(x))  # rho+ starts at 0.8 in one block: it acts
        a.rho_plus.zero_()
        assert torch.equal(a(x), b(x))
        # and the untouched model is the pre-trained CLIP's image tower, bit for bit
        assert torch.equal(b.image_features(x), backbone.encode_image(x))


def test_rho_minus_init_starts_the_tail_push_and_tail_fixed_holds_it(backbone, cfg):
    """``rho_minus_init`` starts rho- of ``rho_block`` for the systems with a tail push (0 by
    default: the authors' initialisation, every earlier number unchanged); ``tail_fixed`` is
    the tail push alone, held at it: rho+ = 0, no learnable rate, CoOp + LoRA at rho- = 0."""
    from nshot.methods.atha.model import SYSTEM_SPEC, EpisodeModel
    from nshot.methods.atha.train import adapt

    assert cfg.rho_minus_init == 0.0 and get("atha").config("small").rho_minus_init == 0.0
    for system in ("atha", "atha_tail_only", "random_tokens", "tail_fixed"):
        m = EpisodeModel(backbone, NAMES, cfg, system, shots=1, seed=0)
        assert float(m.rho_minus.detach().abs().sum()) == 0.0
    c4 = cfg.replace(rho_minus_init=0.4)
    for system, spec in SYSTEM_SPEC.items():
        m = EpisodeModel(backbone, NAMES, c4, system, shots=1, seed=0)
        want = torch.zeros(backbone.vision_depth)
        if spec.tail or spec.tail_fixed:
            want[c4.rho_block] = 0.4
        assert torch.equal(m.rho_minus.detach(), want), system
        assert m.rho_minus.requires_grad is spec.tail
    fixed = EpisodeModel(backbone, NAMES, c4, "tail_fixed", shots=1, seed=3)
    assert float(fixed.rho_plus.abs().sum()) == 0.0 and not fixed.rate_parameters()
    base = EpisodeModel(backbone, NAMES, c4, "coop_lora", shots=1, seed=3)
    x = torch.rand(4, 3, 32, 32, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        assert not torch.equal(fixed(x), base(x))  # the tail push acts
        fixed.rho_minus.zero_()
        assert torch.equal(fixed(x), base(x))
    g = torch.Generator().manual_seed(1)
    sx, qx = torch.rand(3, 3, 32, 32, generator=g), torch.rand(6, 3, 32, 32, generator=g)
    res = adapt(backbone, NAMES, sx, torch.arange(3), qx, c4, "tail_fixed", shots=1, seed=0,
                epochs=2)  # fmt: skip
    assert res.rates["tail"][c4.rho_block] == pytest.approx(0.4) and sum(res.rates["head"]) == 0


def test_head_and_tail_sets_are_disjoint_and_the_update_acts_on_them_only():
    from nshot.methods.atha.model import atha_update, select_tokens

    g = torch.Generator().manual_seed(0)
    s = torch.randint(0, 3, (6, 64), generator=g).float()  # many ties
    for gen in (None, torch.Generator().manual_seed(1)):
        head, tail = select_tokens(s, 19, 12, gen)
        for h, t in zip(head.tolist(), tail.tolist()):
            assert len(set(h)) == 19 and len(set(t)) == 12 and not set(h) & set(t)
    with pytest.raises(ValueError, match="exceeds"):
        select_tokens(s, 40, 30)
    x = torch.randn(2, 10, 8, generator=g)
    anchors = torch.randn(3, 8, generator=g)
    y = atha_update(x, anchors, torch.tensor(1.0), torch.tensor(1.0), add_ratio=0.3,
                    minus_ratio=0.2)  # fmt: skip
    changed = (y != x).any(-1).sum(-1)
    assert changed.tolist() == [5, 5]  # 3 head + 2 tail tokens per image
    sim = (
        torch.nn.functional.normalize(x, dim=-1) @ torch.nn.functional.normalize(anchors, dim=-1).T
    )
    best = sim.max(-1).values
    top = best.argsort(dim=1, descending=True)[:, :3]
    for b in range(2):  # head tokens got their best anchor added
        for l_ in top[b].tolist():
            c = int(sim[b, l_].argmax())
            assert torch.allclose(y[b, l_], x[b, l_] + anchors[c])


def test_inverted_anchors_reconstruct(backbone, cfg):
    from nshot.methods.atha.model import EpisodeModel

    m = EpisodeModel(backbone, NAMES, cfg, "atha", shots=1, seed=0)
    with torch.no_grad():
        _, t = m.text_features()
        a = m.anchors(t)
        back = (a * m.image.norm.weight + m.image.norm.bias) @ backbone.image_projection()
    assert ((back - t).norm(dim=-1) <= 1e-4 * t.norm(dim=-1)).all()


def test_peft_lora_has_the_rslora_scaling_and_starts_at_zero(backbone, cfg):
    from nshot.methods.atha.model import EpisodeModel

    m = EpisodeModel(backbone, NAMES, cfg, "clip_lora", shots=1, seed=0)
    qkv = m.image.blocks[0].attn.qkv
    assert qkv.scaling["default"] == pytest.approx(cfg.lora_alpha / cfg.lora_r**0.5)
    assert all(not p.requires_grad for n, p in m.named_parameters() if "lora_" not in n)
    assert float(qkv.lora_B["default"].weight.abs().sum()) == 0.0
    assert not m.ctx.requires_grad and not m.rho_plus.requires_grad  # CLIP-LoRA only
    # the backbone stays pristine: LoRA went into a copy
    assert not any("lora_" in n for n, _ in backbone.model.named_parameters())


def test_minilm_prompt_route_reproduces_the_sentence_embedding(nshot_cache):
    """[CLS] + the word embeddings of "a photo of a" as context + the name + [SEP] through
    MiniLM's BERT, mean-pooled and normalised, equals sentence-transformers' embedding of
    "a photo of a {name}" (then the same projection)."""
    from nshot.methods.atha.model import EpisodeModel
    from nshot.nn.backbone import backbone_of
    from nshot.nn.clip import TinyCLIP
    from nshot.train.clip import clip_config

    torch.manual_seed(0)
    clip = TinyCLIP(clip_config("smoke", "minilm")).eval()
    cfg = get("atha").config("smoke", text="minilm", txtlayer=4)
    names = ["circle", "plus sign", "zero"]
    m = EpisodeModel(backbone_of(clip).freeze(), names, cfg, "coop_lora", shots=1, seed=0)
    with torch.no_grad():
        got, _ = m.text_features()
        want = clip.encode_text([f"a photo of a {n}" for n in names])
    assert (got - want).abs().max() < 1e-5


def test_episodes_are_shared_and_nested(nshot_cache):
    from nshot.methods.atha.data import domain_pool, sample_episode

    pool = domain_pool("digits", 16, 0)
    one = sample_episode(pool, seed=0, episode=3, n_way=5, shots=1, queries=3)
    five = sample_episode(pool, seed=0, episode=3, n_way=5, shots=5, queries=3)
    other = sample_episode(pool, seed=0, episode=4, n_way=5, shots=1, queries=3)
    assert one.names == five.names and np.array_equal(one.query_x, five.query_x)
    assert np.array_equal(one.support_x, five.support_x[::5])  # the first shot of each class
    assert not np.array_equal(one.query_x, other.query_x)
    assert one.support_x.shape == (5, 3, 32, 32) and one.query_y.tolist() == sorted(
        [0, 1, 2, 3, 4] * 3
    )
    assert set(one.names) <= {"zero", "one", "two", "three", "four", "five", "six", "seven",
                              "eight", "nine"}  # fmt: skip


def _png(arr: np.ndarray, mode: str = "RGB") -> str:
    from PIL import Image

    buf = io.BytesIO()
    Image.fromarray(arr, mode=mode).save(buf, format="PNG")
    return base64.b64encode(buf.getvalue()).decode()


@pytest.fixture(scope="module")
def checkpoint(smoke_clip, cfg, tmp_path_factory):
    from nshot.train.checkpoint import load_checkpoint, save_checkpoint

    path = save_checkpoint(
        tmp_path_factory.mktemp("atha-ckpt") / "checkpoint_00000060",
        method="atha",
        method_version=get("atha").version,
        config=cfg.model_dump(),
        step=60,
        model_state=smoke_clip.state_dict(),
        metrics={},
        extra={"clip_config": smoke_clip.cfg.to_dict(), "clip_preset": "smoke", "text": "word"},
    )
    return load_checkpoint(path, method="atha")


def test_textile_domain_reads_three_classes_and_says_how_to_install_it(
    nshot_cache, tmp_path, monkeypatch
):
    """The optional textile domain: one label per conformal-clip-data folder (nominal, local,
    global), 32 × 32 grey replicated to RGB, at most 3-way episodes; without the package, an
    error naming the field and the install command. Stand-in JPEGs, a different mean grey per
    folder, show which folder each label came from."""
    import sys

    from PIL import Image

    from nshot.errors import NshotError
    from nshot.methods.atha import data

    for c, folder in enumerate(data.TEXTILE_FOLDERS):
        (tmp_path / folder).mkdir()
        for i in range(24):
            grey = np.full((250, 250), 40 + 80 * c, np.uint8)
            Image.fromarray(grey).save(tmp_path / folder / f"textile_{i:04d}.jpg")
    monkeypatch.setattr(data, "textile_root", lambda: tmp_path)
    pool = data.domain_pool("textile", 20, seed=3)
    assert pool.images.shape == (60, 3, 32, 32) and pool.names == data.TEXTILE_NAMES
    for c in range(3):
        mean = pool.images[pool.labels == c].mean() * 255
        assert abs(mean - (40 + 80 * c)) < 3, (c, mean)
    ep = data.sample_episode(pool, seed=0, episode=0, n_way=5, shots=1, queries=4)
    assert ep.names == list(data.TEXTILE_NAMES) and ep.query_x.shape[0] == 12
    monkeypatch.undo()
    monkeypatch.setitem(sys.modules, "conformal_clip_data", None)  # not installed
    with pytest.raises(NshotError, match=r"field 'domains'.*nshot\[atha-textile\]"):
        data.textile_root()


def test_predictor_answers_and_refuses_bad_episodes_with_422(checkpoint):
    from fastapi.testclient import TestClient

    from nshot.serve.bare import make_app

    pred = get("atha").predictor(checkpoint)
    good = pred.example_request()
    ans = pred(pred.Request.model_validate(good))
    assert len(ans.labels) == 2 and ans.epochs_run == 2 and len(ans.rates.head) == 2
    assert ans.unknown_words == 0 and all(abs(sum(p) - 1) < 1e-4 for p in ans.probs)
    off = pred(pred.Request.model_validate({**good, "use_atha": False}))
    assert off.rates.head == [0.0, 0.0] and off.probs != ans.probs
    names, sup = good["class_names"], good["support"]
    grey = _png(np.zeros((8, 8), dtype=np.uint8), "L")
    cases = {
        "support": {**good, "support": []},
        "class_names": {**good, "class_names": [names[0], names[0]]},
        "support[1].label": {**good, "support": [sup[0], {**sup[1], "label": "moon"}]},
        "support[0].image": {**good, "support": [{**sup[0], "image": "not png"}, sup[1]]},
        "queries[0]": {**good, "queries": [grey]},
        "queries[1]": {**good, "queries": [good["queries"][0], [[[1, 2, 3, 4]]]]},
        "epochs": {**good, "epochs": 0},
    }
    with TestClient(make_app("atha", str(checkpoint.path))) as client:
        for field, body in cases.items():
            got = client.post("/atha/predict", json=body)
            assert got.status_code == 422, (field, got.text)
            detail = got.json()["detail"][0]
            assert field in (detail.get("field") or "") or field in got.text, (field, got.text)
        for value in (300, -1, 1.5):  # arrays are 0–255 integers
            img = [[[0, 0, 0]] * 8 for _ in range(8)]
            img[3][4] = [0, value, 0]
            got = client.post("/atha/predict", json={**good, "queries": [img]})
            assert got.status_code == 422, (value, got.text)
            assert "queries[0]" in got.text or "queries.0." in got.text, (value, got.text)
        got = client.post("/atha/predict", json={**good, "class_names": [names[0], ""]})
        assert got.status_code == 422 and "class_names" in got.text, got.text
        no_image = {**good, "class_names": [*names, "star"]}
        got = client.post("/atha/predict", json=no_image)
        assert got.status_code == 422 and "'star' has no image" in got.text
        many = {**good, "support": [sup[0]] * 11 + [sup[1]]}
        got = client.post("/atha/predict", json=many)
        assert got.status_code == 422 and "at most 10" in got.text
        got = client.post("/atha/predict", json={**good, "epochs": 11})
        assert got.status_code == 422 and "max_epochs" in got.text
        assert got.json()["detail"][0]["field"] == "epochs"


def test_conformal_sets_wrap_the_predictor(checkpoint):
    """`nshot serve atha --conformal caos`: the frozen encoder's unit image features give CAOS
    prediction sets over the request's class names; labels and probs stay the adapted
    model's."""
    from nshot.serve.conformal import ConformalPredictor

    inner = get("atha").predictor(checkpoint)
    body = inner.example_request()
    sup = body["support"]
    body = {**body, "support": sup + sup}  # two shots per class: k + 1 = 2 support rows
    req = inner.Request.model_validate(body)
    ep = inner.one_shot_embeddings(req)
    assert ep.support_emb.shape == (4, 32) and ep.query_emb.shape == (2, 32)
    assert ep.classes == req.class_names and ep.support_labels.tolist() == [0, 1, 0, 1]
    np.testing.assert_allclose(np.linalg.norm(ep.query_emb, axis=1), 1.0, atol=1e-5)
    wrapped = ConformalPredictor(inner, alpha=0.4)
    answer = wrapped(wrapped.Request.model_validate(body))
    assert len(answer.sets) == 2 and all(set(s) <= set(req.class_names) for s in answer.sets)
    assert answer.probs == inner(req).probs
    one_shot = inner.Request.model_validate(inner.example_request())  # 2 rows < k + 1 = 3
    with pytest.raises(ValueError, match="^support: conformal sets need at least k"):
        ConformalPredictor(inner, alpha=0.4, k=2).sets(one_shot)


def test_conformal_sets_cover_over_fresh_shape_episodes(checkpoint, caos_coverage):
    """`--conformal caos` on atha: marginal coverage over 5-way 3-shot episodes of fresh
    source-style shapes (arrays of 0–255), sets from the frozen encoder's features."""
    from nshot.data.shapes import SHAPES, render_shapes
    from nshot.serve.conformal import ConformalPredictor

    cp = ConformalPredictor(get("atha").predictor(checkpoint), "caos", alpha=0.2, k=1)
    d = render_shapes(400, seed=11, side=32)
    images, shapes = d["image"], d["shape"]
    rng = np.random.default_rng(4)
    episodes = []
    for _ in range(8):
        classes = rng.choice(len(SHAPES), 5, replace=False)
        names = [SHAPES[c] for c in classes]
        support, queries, truth = [], [], []
        for c, name in zip(classes, names):
            rows = rng.choice(np.flatnonzero(shapes == c), 5, replace=False)
            support += [{"image": images[i].tolist(), "label": name} for i in rows[:3]]
            queries += [images[i].tolist() for i in rows[3:]]
            truth += [name, name]
        body = {"class_names": names, "support": support, "queries": queries}
        episodes.append((cp.Request.model_validate(body), truth))
    caos_coverage(cp, episodes, 0.2, informative=5)


def test_experiments_on_smoke_have_every_row_metric_and_claim(monkeypatch, tmp_path):
    monkeypatch.setenv("NSHOT_IN_PROCESS", "1")  # the jobs in this process, off Ray
    from nshot.claims import evaluate
    from nshot.methods.atha.config import SYSTEMS
    from nshot.train.clip import VERSION

    atha = get("atha")
    cfg = atha.config("smoke", domains=["sketch"], episodes_1shot=1)
    table = atha.experiments(cfg, tmp_path)
    assert list(table.rows) == list(SYSTEMS)
    assert set(table.metrics) == {
        "acc_1shot_avg",
        "acc_1shot_sketch",
        "acc_5shot_avg",
        "acc_src_8way",
        "paired_gain_vs_coop_lora",
    }
    assert table.rows["atha"]["acc_5shot_avg"] is not None
    assert table.rows["coop"]["acc_5shot_avg"] is None
    assert table.rows["coop_lora"]["paired_gain_vs_coop_lora"] == 0.0
    unit = table.extra["unit"]
    assert unit["rho0_max_abs_logit_diff"] == 0.0 and unit["head_tail_overlap"] == 0.0
    assert unit["anchor_rel_error"] <= 1e-4
    assert len(table.extra["rates_per_block"]["atha"]["head"]) == 2
    san = table.extra["sanity"]  # the claim's figure and the paired diagnostic beside it
    paired = san["paired_5shot_minus_1shot"]
    assert set(paired) == {"atha", "coop_lora"} and set(paired["atha"]) == {"sketch"}
    assert san["paired_min_5shot_minus_1shot"] == min(min(v.values()) for v in paired.values())
    ref = table.extra["domain_references"]["sketch"]  # many-shot probes beside the episodes
    assert ref["classes"] == 8 and all(0.0 <= ref[k] <= 1.0 for k in ("clip_features",
                                                                      "image_statistics"))  # fmt: skip
    tiny = table.extra["tiny_clip"]  # clip_workers=0: the in-process CLIP the fixtures share
    assert tiny["folder"] == f"tinyclip-smoke-word-s0-v{VERSION}" and tiny["world_size"] == 1
    targets = table.extra["targets"]  # the target precondition's figures
    assert targets["ways"] == {"sketch": 5} and targets["chance"] == {"sketch": 0.2}
    assert targets["zero_shot"]["sketch"] == table.rows["zero_shot"]["acc_1shot_sketch"]
    assert targets["min_zero_shot_above_chance"] == pytest.approx(
        targets["zero_shot"]["sketch"] - 0.2
    )
    assert 0.0 <= targets["coop_mean_abs_change"] <= 1.0
    results = table.to_json()
    claims = evaluate(atha.claims, results)
    # the paper's claims speak of small and paper only (the tail sweep's of its own
    # experiment); the unit checks hold on every preset
    assert len(claims) == 12
    assert [c["id"] for c in claims if c["kind"] == "headline"] == ["atha_beats_coop_lora_paired"]
    assert all(c.get("applies") is False for c in claims if c["id"] != "unit_checks")
    assert [c["holds"] for c in claims if c["id"] == "unit_checks"] == [True]


def test_seeds_combine_into_per_seed_samples_and_the_headline_reads_them():
    """With several training seeds each seed is summarised on its own (per-episode samples,
    95 % intervals), then the rows are the means over seeds and the samples the per-seed
    values, paired by seed; the headline's paired test reads them, and its premise (the
    precondition on the tiny CLIP) makes it not evaluable when it fails."""
    from nshot.claims import evaluate
    from nshot.methods.atha.experiments import combine_seeds, summarise

    atha = get("atha")
    cfg = atha.config("small", domains=["sketch", "digits"],
                      systems=["atha", "coop_lora", "coop", "zero_shot"], seeds=3)  # fmt: skip
    rng = np.random.default_rng(0)
    tables = {}
    for seed in range(3):
        acc = {(s, d, k): list(rng.uniform(0.3, 0.5, 4) + (0.02 * k if s == "atha" else 0.0))
               for s in cfg.systems for d in cfg.domains for k in (1, 5)}  # fmt: skip
        tables[seed] = summarise(cfg.replace(seed=seed), acc, 0.9 + 0.01 * seed)
        tables[seed].extra.update(unit={"rho0_max_abs_logit_diff": 0.0, "head_tail_overlap": 0.0,
                                        "anchor_rel_error": 1e-7 * (seed + 1)},
                                  domain_references={}, rates_per_block={},
                                  tiny_clip={"folder": f"s{seed}"})  # fmt: skip
    table = combine_seeds(cfg, tables)
    assert table.seeds == 3 and set(table.extra["per_seed"]) == {"0", "1", "2"}
    per_seed = [tables[s].rows["atha"]["acc_1shot_avg"] for s in range(3)]
    assert table.samples["atha"]["acc_1shot_avg"] == pytest.approx(per_seed)
    assert table.rows["atha"]["acc_1shot_avg"] == pytest.approx(np.mean(per_seed))
    assert table.stds["atha"]["acc_1shot_avg"] == pytest.approx(np.std(per_seed, ddof=1))
    assert table.rows["zero_shot"]["acc_src_8way"] == pytest.approx(0.91)  # each seed's CLIP
    assert table.extra["unit"]["anchor_rel_error"] == pytest.approx(3e-7)  # the worst seed
    acc5 = table.extra["acc_5shot"]["atha"]["sketch"]
    assert acc5 == pytest.approx(np.mean([tables[s].extra["acc_5shot"]["atha"]["sketch"]
                                          for s in range(3)]))  # fmt: skip
    results = table.to_json()
    heads = [c for c in evaluate(atha.claims, results) if c["kind"] == "headline"]
    assert len(heads) == 1 and heads[0]["effect"]["n"] == 3 and heads[0]["premise"] is True
    assert heads[0]["holds"] is (heads[0]["lhs"] > heads[0]["rhs"] and heads[0]["p"] < 0.05)
    # the target precondition from the means over seeds; CoOp's move, the mean over seeds
    targets = table.extra["targets"]
    zs = {d: table.rows["zero_shot"][f"acc_1shot_{d}"] for d in cfg.domains}
    assert targets["zero_shot"] == pytest.approx(zs)
    assert targets["min_zero_shot_above_chance"] == pytest.approx(min(zs.values()) - 0.2)
    moves = [tables[s].extra["targets"]["coop_mean_abs_change"] for s in range(3)]
    assert targets["coop_mean_abs_change"] == pytest.approx(np.mean(moves))
    control = [c for c in evaluate(atha.claims, results)
               if c["id"] == "targets_between_chance_and_ceiling"][0]  # fmt: skip
    assert control["kind"] == "control" and control["holds"] is True
    for key, bad in (("min_zero_shot_above_chance", 0.05), ("max_zero_shot", 0.97),
                     ("coop_mean_abs_change", 0.01)):  # fmt: skip
        broken = {**results, "extra": {**results["extra"],
                                       "targets": {**targets, key: bad}}}  # fmt: skip
        out = {c["id"]: c for c in evaluate(atha.claims, broken)}
        assert out["targets_between_chance_and_ceiling"]["holds"] is False, key
        assert out["atha_beats_coop_lora_paired"]["holds"] is None, key  # not judged
        assert out["atha_beats_coop_lora_paired"]["premise"] is False, key
    results["rows"]["zero_shot"]["acc_src_8way"] = 0.5  # a CLIP that misses the precondition
    head = [c for c in evaluate(atha.claims, results) if c["kind"] == "headline"][0]
    assert head["holds"] is None and head["premise"] is False


def test_tail_sweep_on_smoke_pairs_every_row_over_seeds_and_episodes(monkeypatch, tmp_path):
    """experiment=tail_sweep: zero-shot, CoOp + LoRA and the tail push alone at each fixed
    rho-, on the same episodes and LoRA initialisations; the samples are the (seed, episode)
    units, which the sweep's paired claims read (on small and paper only)."""
    monkeypatch.setenv("NSHOT_IN_PROCESS", "1")  # the jobs in this process, off Ray
    from nshot.claims import evaluate
    from nshot.methods.atha.claims import SWEEP_ALPHA

    atha = get("atha")
    cfg = atha.config("smoke", experiment="tail_sweep", domains=["sketch", "digits"],
                      sweep_episodes=2, episodes_per_job=1, seeds=2,
                      sweep_rho_minus=[0.4, 0.8])  # fmt: skip
    table = atha.experiments(cfg, tmp_path)
    assert table.experiment == "tail_sweep" and table.seeds == 2
    assert list(table.rows) == ["zero_shot", "coop_lora", "tail_rho0p4", "tail_rho0p8"]
    for row, per in table.samples.items():
        units = per["acc_1shot_avg"]
        assert len(units) == 2 * 2, row  # seeds x episodes
        assert table.rows[row]["acc_1shot_avg"] == pytest.approx(np.mean(units))
        gain = 100 * np.mean(np.subtract(units, table.samples["coop_lora"]["acc_1shot_avg"]))
        assert table.rows[row]["paired_gain_vs_coop_lora"] == pytest.approx(gain)
    rates = table.extra["rates_per_block"]  # held at the declared rho-, at rho_block only
    assert rates["tail_rho0p8"]["tail"][cfg.rho_block] == pytest.approx(0.8)
    assert sum(rates["tail_rho0p8"]["head"]) == 0.0 and sum(rates["coop_lora"]["tail"]) == 0.0
    assert set(table.extra["targets"]["zero_shot"]) == {"sketch", "digits"}
    results = table.to_json()
    assert results["experiment"] == "tail_sweep"
    claims = {c["id"]: c for c in evaluate(atha.claims, results)}
    sweep = [c for c in atha.claims if c.experiment == "tail_sweep"]
    assert [c.kind for c in sweep] == ["ablation"] * 3
    assert all(c.alpha == SWEEP_ALPHA and c.test == "paired_t" for c in sweep)
    assert all(claims[c.id]["other"] == "preset" for c in sweep)  # smoke: not evaluated
    assert claims["atha_beats_coop_lora_paired"]["other"] == "experiment"
    # the same results as small's: the claim on rho- = 0.4 reads its row; 0.2 has none
    small = {c["id"]: c for c in evaluate(sweep, {**results, "preset": "small"})}
    assert small["tail_push_rho0p4_beats_coop_lora"]["effect"]["n"] == 4
    assert small["tail_push_rho0p2_beats_coop_lora"]["lhs"] is None


def test_example_on_two_ray_train_workers(ray_session, tmp_path, run_example, capsys):
    """The suite's one run on two Ray Train workers: the example's pre-training of the smoke
    tiny CLIP (all-gathered image features, averaged gradients) writes an nshot checkpoint with
    the final metrics; the example then evaluates it and serves one episode. (The fault and the
    resume are the conformance test's, in-process.)"""
    from nshot.methods.atha.model import load_model
    from nshot.train import load_checkpoint

    argv = ["--output", str(tmp_path), "--workers", "2"]
    for lean in ("steps=20", "checkpoint_every=20", 'domains=["digits"]'):
        argv += ["--set", lean]
    run_example("atha", argv)
    out = capsys.readouterr().out
    assert "episodes (1-shot): acc_1shot_digits=" in out and "query 0 ->" in out
    ckpt = load_checkpoint(tmp_path / "example-atha-smoke", method="atha")
    assert ckpt.step == 20 and 0.0 <= ckpt.metrics["acc_1shot_avg"] <= 1.0
    assert "acc_src_8way" in ckpt.metrics and ckpt.extra["clip_preset"] == "smoke"
    backbone, _ = load_model(ckpt)
    assert backbone.model.cfg.vision_depth == 2 and backbone.vision_depth == 2


def test_anchor_diagnostic_example(smoke_clip, tmp_path, run_example, capsys):
    """examples/atha_anchors.py on the smoke tiny CLIP (the fixture's, cached): the
    projection's conditioning, the anchors' spread and the tokens' best classes per block."""
    import json

    out = tmp_path / "anchors.json"
    run_example("atha_anchors", ["--preset", "smoke", "--domains", "digits", "--out", str(out)])
    report = json.loads(out.read_text())
    sing = torch.linalg.svdvals(smoke_clip.visual_proj.detach().double())
    assert report["clip_preset"] == "smoke"
    assert report["proj_condition"] == pytest.approx(float(sing.max() / sing.min()))
    digits = report["domains"]["digits"]
    assert 0.0 <= digits["weak3_share"] <= 1.0
    assert -1.0 <= digits["anchor_cos_min"] <= digits["anchor_cos_max"] <= 1.0
    assert len(digits["modal_best_class_share"]) == smoke_clip.cfg.vision_depth
    assert '"weak3_share"' in capsys.readouterr().out
