"""ZeroUnlearn: closed form, orthogonality, the edit on a tiny model, serving."""

from __future__ import annotations

import json

import pytest
import torch

from nshot.methods.zerounlearn import edit as E
from nshot.methods.zerounlearn.evaluation import score
from nshot.nn.lm import encode, encode_pair, pad_token_id

WORDS = (
    "the capital of is a city in and you i because therefore people speak language . "
    "alpha beta gamma delta epsilon zeta eta theta iota kappa lambda mu nu xi omicron pi rho "
    "sigma tau upsilon phi chi psi omega red green blue north south east west"
).split()


def _tiny_lm(seed: int = 0):
    from tokenizers import Tokenizer
    from tokenizers.models import WordLevel
    from tokenizers.pre_tokenizers import Whitespace
    from transformers import LlamaForCausalLM, PreTrainedTokenizerFast

    from nshot.nn.lm import tiny_llama_config

    vocab = {"<pad>": 0, "<bos>": 1, "<eos>": 2, "<unk>": 3}
    for w in WORDS:
        vocab.setdefault(w, len(vocab))
    core = Tokenizer(WordLevel(vocab, unk_token="<unk>"))
    core.pre_tokenizer = Whitespace()
    tok = PreTrainedTokenizerFast(
        tokenizer_object=core, bos_token="<bos>", eos_token="<eos>", unk_token="<unk>",
        pad_token="<pad>",
    )  # fmt: skip
    torch.manual_seed(seed)
    model = LlamaForCausalLM(tiny_llama_config(len(vocab), layers=2, hidden=64, intermediate=256))
    model.eval()
    for p in model.parameters():
        p.requires_grad_(False)
    return model, tok


SUBJECTS = ["alpha", "beta", "gamma", "delta", "epsilon", "zeta", "eta", "theta", "iota", "kappa"]
ANSWERS = ["red", "green", "blue", "north", "south", "east", "west", "omega", "sigma", "tau"]


def _trained_tiny_lm():
    """The tiny model trained for a few hundred steps to know SUBJECTS -> ANSWERS (and to
    continue a few filler sentences), so that forgetting and retaining can be observed."""
    model, tok = _tiny_lm()
    texts = [f"the capital of {s} is {a}" for s, a in zip(SUBJECTS, ANSWERS)]
    texts += [f"people in {s} speak {a}" for s, a in zip(SUBJECTS, ANSWERS)]
    texts += [" ".join(WORDS[i : i + 8]) for i in range(0, len(WORDS) - 8, 2)]
    eos = tok.eos_token_id  # the neutral target must be a token the model has seen
    ids, mask = E._batch([[*encode(tok, t), eos] for t in texts], pad_token_id(tok))
    labels = ids.masked_fill(mask == 0, -100)
    for p in model.parameters():
        p.requires_grad_(True)
    opt = torch.optim.Adam(model.parameters(), lr=3e-3)
    torch.manual_seed(0)
    model.train()
    for _ in range(300):
        loss = model(input_ids=ids, attention_mask=mask, labels=labels).loss
        opt.zero_grad()
        loss.backward()
        opt.step()
    model.eval()
    for p in model.parameters():
        p.requires_grad_(False)
    reqs = [
        E.EditRequest("the capital of {} is", s, a, ("people in {} speak",), "capital")
        for s, a in zip(SUBJECTS, ANSWERS)
    ]
    known, _ = score(model, tok, [(r.prompt(), r.answer) for r in reqs])
    assert all(known), "the tiny test model did not learn its facts"
    return model, tok, reqs, texts


def test_closed_form_zeroes_gradient():
    """Closed form: D = A B⁻¹ zeroes ∂J/∂D (float64, random small matrices)."""
    g = torch.Generator().manual_seed(0)
    d, m, n_w, n_f = 6, 10, 40, 3
    W = torch.randn(d, m, generator=g, dtype=torch.float64)
    Kw = torch.randn(m, n_w, generator=g, dtype=torch.float64)
    Vw = torch.randn(d, n_w, generator=g, dtype=torch.float64)
    Kf = torch.randn(m, n_f, generator=g, dtype=torch.float64)
    Vf = torch.randn(d, n_f, generator=g, dtype=torch.float64)
    q = E.sensitive_basis(torch.randn(2, d, generator=g, dtype=torch.float64))
    P = E.soft_projector(q, 0.01)
    lam_w, lam_f, lam_r = 3.0, 50.0, 1.0
    kkt = lam_w * Kw @ Kw.T + lam_f * Kf @ Kf.T
    vkt = lam_w * Vw @ Kw.T + lam_f * Vf @ Kf.T
    D = E.closed_form_d(W, kkt, vkt, P, lam_r)
    grad = E.objective_gradient(D, W, P, Vw, Kw, Vf, Kf, lam_w, lam_f, lam_r)
    scale = E.objective_gradient(torch.zeros_like(D), W, P, Vw, Kw, Vf, Kf, lam_w, lam_f, lam_r)
    assert grad.norm() / scale.norm() < 1e-6
    # a perturbed D is not stationary: the test can fail
    bad = E.objective_gradient(D + 1e-3, W, P, Vw, Kw, Vf, Kf, lam_w, lam_f, lam_r)
    assert bad.norm() / scale.norm() > 1e-6


def test_soft_projector_scales_sensitive_subspace():
    g = torch.Generator().manual_seed(1)
    vs = torch.randn(4, 16, generator=g, dtype=torch.float64)
    q = E.sensitive_basis(vs)
    assert torch.allclose(q.T @ q, torch.eye(4, dtype=torch.float64), atol=1e-10)
    P = E.soft_projector(q, 0.01)
    assert torch.allclose(P @ q, 0.01 * q, atol=1e-10)


def test_prefix_cache_matches_full_forward():
    """The δ optimisation's cached-prefix forward gives the full forward's NLL (δ = 0)."""
    model, tok, reqs, _ = _trained_tiny_lm()
    reqs = reqs[:3]
    templates = ["{}", "because people speak red . {}"]
    tgt = [encode_pair(tok, r.prompt(), r.answer)[1] for r in reqs]
    t = E.optimise_targets(
        model, tok, reqs, templates, tgt, layer=0, site="mlp", loss_layer=1,
        hp=E.DeltaHParams(steps=1),
    )  # fmt: skip
    for i, r in enumerate(reqs):
        ref = 0.0
        for c in templates:
            ids, _ = E.subject_prompt(tok, E.fill(c, r.template), r.subject)
            with torch.no_grad():
                lp = model(torch.tensor([ids])).logits[0, -1].log_softmax(-1)
            ref += float(-lp[tgt[i][0]]) / len(templates)
        assert t.final_nll[i] == pytest.approx(ref, rel=1e-4, abs=1e-5)


@pytest.fixture(scope="module")
def edited_tiny():
    model, tok, reqs, texts = _trained_tiny_lm()
    forget, retain = reqs[:3], reqs[3:]
    stats = E.key_statistics(model, tok, texts, [0], 2000, use_cache=False)
    hp = E.EditHParams(layers=(0,), lam_w=15000.0, gd_steps=20)
    prep = E.prepare(
        model, tok, forget, ["{}"], stats, hp, E.DeltaHParams(steps=25), 1,
        E.DeltaHParams(steps=25, lr=0.5),
    )  # fmt: skip
    w0 = E.mlp(model, 0).down_proj.weight.detach().clone()
    keys = E.collect_at_subject(model, tok, forget, ["{}"], 0, "key").T
    diag = E.apply_edit(model, tok, forget, prep, hp, "zerounlearn")
    return model, tok, forget, retain, prep, w0, keys, diag


def test_orthogonality_after_first_layer(edited_tiny):
    """Orthogonality: ‖Qᵀ W' k_i‖ / ‖Qᵀ W k_i‖ ≤ 0.05 on the forget keys, first layer edited."""
    model, tok, forget, retain, prep, w0, keys, diag = edited_tiny
    q = E.sensitive_basis(prep.vs[0])
    w1 = E.mlp(model, 0).down_proj.weight.detach().double()
    ratio = ((q.T @ (w1 @ keys)).norm(dim=0) / (q.T @ (w0.double() @ keys)).norm(dim=0)).mean()
    assert float(ratio) <= 0.05
    assert diag["layers"][0]["ortho_ratio"] == pytest.approx(float(ratio), rel=1e-6)


def test_train_loop_forgets_on_tiny_lm_and_serves(ray_session, tiny_smoke_lm, tmp_path):
    """The method end to end on the tiny LM nshot trains: Ray Train (local mode) runs the edit,
    the checkpoint holds only the edited down_proj, evaluate and the predictor reload it."""
    from nshot.method import get
    from nshot.train import Scaling, fit, load_checkpoint

    method = get("zerounlearn")
    cfg = method.config("smoke", delta_steps=10)
    local = Scaling(workers=0)
    # the loop's one step fails on a first attempt (fault injection); a resume does it
    with pytest.raises(Exception, match="injected fault at step 1"):  # noqa: PT011
        fit("zerounlearn", cfg.replace(fail_at_step=1), scaling=local, storage=tmp_path, name="zu")
    res = fit("zerounlearn", cfg, scaling=local, storage=tmp_path, name="zu", resume=True)
    m = res.metrics
    assert m["eff_before"] == 100.0  # forget facts are chosen among those the model knows
    assert m["eff"] < m["eff_before"]  # the edit removes some of them ...
    assert m["spe"] >= 80.0  # ... and keeps most retained facts
    ckpt = load_checkpoint(res.checkpoint, method="zerounlearn")
    assert set(ckpt.weights()) == {"layers.0.down_proj"}
    again = method.evaluate(ckpt, cfg)
    assert again["eff"] == pytest.approx(m["eff"]) and again["spe"] == pytest.approx(m["spe"])
    pred = method.predictor(ckpt)
    meta = pred.metadata()
    forgotten = ckpt.extra["forget"]
    assert meta["n_forgotten"] == len(forgotten)
    assert not any(f["subject"] in str(meta) for f in forgotten)  # never the facts themselves
    out = pred(pred.Request(prompt=forgotten[0]["template"].format(forgotten[0]["subject"])))
    assert out.edited_layers == [0] and len(out.next_token_top_k) == 5
    # the predictor's own example (a retained fact): answered, through JSON unchanged, the
    # same batched
    example = pred.example_request()
    json.dumps(example)
    assert not any(f["subject"] in example["prompt"].split() for f in forgotten)
    req = pred.Request.model_validate(example)
    answer = pred(req)
    assert pred.Response.model_validate_json(answer.model_dump_json()) == answer
    # a batch of two runs other matrix kernels than a batch of one: probabilities to 1e-5
    batched = [json.loads(a.model_dump_json()) for a in pred.batch([req, req])]
    single = json.loads(answer.model_dump_json())
    for b in batched:
        assert b["completion"] == single["completion"] and b["neutral"] == single["neutral"]
        assert [t["token"] for t in b["next_token_top_k"]] == [
            t["token"] for t in single["next_token_top_k"]
        ]
        assert [t["prob"] for t in b["next_token_top_k"]] == pytest.approx(
            [t["prob"] for t in single["next_token_top_k"]], rel=1e-5
        )


def test_gd_variant_and_ablations_run():
    model, tok = _tiny_lm(1)
    reqs = [E.EditRequest("the capital of {} is", s, "red", (), "capital") for s in SUBJECTS[:2]]
    texts = [" ".join(WORDS) for _ in range(20)]
    stats = E.key_statistics(model, tok, texts, [0], 500, use_cache=False)
    hp = E.EditHParams(layers=(0,), gd_steps=5, null_threshold=1e9)  # whole space is "null"
    prep = E.prepare(model, tok, reqs, ["{}"], stats, hp, E.DeltaHParams(steps=2), 1)
    w0 = E.mlp(model, 0).down_proj.weight.detach().clone()
    for variant in ("gd", "wo_op", "wo_ut", "memit", "alphaedit"):
        E.load_edited_weights(model, {"layers.0.down_proj": w0})
        E.apply_edit(model, tok, reqs, prep, hp, variant)
        assert not torch.equal(E.mlp(model, 0).down_proj.weight, w0), variant
    with pytest.raises(ValueError, match="variant"):
        E.apply_edit(model, tok, reqs, prep, hp, "nope")


def test_memit_update_solves_its_normal_equations():
    """MEMIT: ΔW minimises ‖ΔW K_f − R‖² + λ_w tr(ΔW KKT_w ΔWᵀ), so ΔW (K_f K_fᵀ + λ_w KKT_w)
    = R K_fᵀ; a larger λ_w (more weight on the preserved keys) moves them less."""
    g = torch.Generator().manual_seed(3)
    d, m, n_w, n_f = 5, 12, 30, 3
    Kw = torch.randn(m, n_w, generator=g, dtype=torch.float64)
    Kf = torch.randn(m, n_f, generator=g, dtype=torch.float64)
    R = torch.randn(d, n_f, generator=g, dtype=torch.float64)
    kkt = Kw @ Kw.T / n_w
    delta = E.memit_update(R, Kf, kkt, 2.0)
    lhs = delta @ (Kf @ Kf.T + 2.0 * kkt)
    assert torch.allclose(lhs, R @ Kf.T, atol=1e-10)
    moved = [float((E.memit_update(R, Kf, kkt, lam) @ Kw).norm()) for lam in (0.1, 10.0)]
    assert moved[1] < moved[0]


def test_alphaedit_update_stays_in_the_null_space_of_the_preserved_keys():
    """AlphaEdit: ΔW's rows lie in the null space of KKT_w (so ΔW leaves every preserved key's
    output unchanged), it solves ΔW (K_f K_fᵀ Pn + L2 I) = R K_fᵀ Pn, and it fits the forget
    targets when they are reachable from the null space."""
    g = torch.Generator().manual_seed(4)
    d, m, r, n_f = 5, 12, 7, 3
    basis, _ = torch.linalg.qr(torch.randn(m, m, generator=g, dtype=torch.float64))
    Kw = basis[:, :r] @ torch.randn(r, 40, generator=g, dtype=torch.float64)  # rank r
    kkt = Kw @ Kw.T / 40
    u0 = E.null_space_projector(kkt, 1e-8)
    assert u0.shape[1] == m - r
    Kf = torch.randn(m, n_f, generator=g, dtype=torch.float64)
    R = torch.randn(d, n_f, generator=g, dtype=torch.float64)
    l2 = 1e-6
    delta = E.alphaedit_update(R, Kf, u0, l2)
    pn = u0 @ u0.T
    assert (delta @ Kw).norm() < 1e-8 * delta.norm() * Kw.norm()
    lhs = delta @ (Kf @ Kf.T @ pn + l2 * torch.eye(m, dtype=torch.float64))
    assert torch.allclose(lhs, R @ Kf.T @ pn, atol=1e-8)
    assert (delta @ Kf - R).norm() < 1e-4 * R.norm()
    # MEMIT's update (with a full-rank preserved term) trades the preserved keys off instead
    memit = E.memit_update(R, Kf, kkt + 1e-2 * torch.eye(m, dtype=torch.float64), 1.0)
    assert (memit @ Kw).norm() > 1e-3 * memit.norm() * Kw.norm()


def test_editing_baselines_write_the_remapping_targets_on_the_tiny_lm():
    """MEMIT and AlphaEdit through ``apply_edit`` on the trained tiny LM: each writes the
    remapping targets (the edited layer's output at the forget prompts moves to ``z_new``),
    AlphaEdit only within the null space of the general-text keys, and the per-fact metrics
    average to the metrics."""
    import random

    from nshot.methods.zerounlearn.evaluation import EvalSet, evaluate_instances

    model, tok, reqs, texts = _trained_tiny_lm()
    forget, retain = reqs[:3], reqs[3:]
    rng = random.Random(0)
    general = [" ".join(rng.choice(WORDS) for _ in range(12)) for _ in range(300)]
    stats = E.key_statistics(model, tok, texts + general, [0], 4000, use_cache=False)
    hp = E.EditHParams(layers=(0,), lam_w=1.0, alphaedit_threshold=1e-2, alphaedit_l2=1e-4)
    prep = E.prepare(
        model, tok, forget, ["{}"], stats, hp, E.DeltaHParams(steps=2), 1,
        E.DeltaHParams(steps=10, lr=0.5),
    )  # fmt: skip
    es = EvalSet(tuple(forget), tuple(retain), ())
    w0 = E.mlp(model, 0).down_proj.weight.detach().clone()
    h0 = E.collect_at_subject(model, tok, forget, ["{}"], 0, "layer")
    assert (h0 - prep.z_new).norm() > 0.1 * prep.z_new.norm()  # the targets are not where h is
    u0 = E.null_space_projector(stats[0].kkt, hp.alphaedit_threshold)
    for variant in ("memit", "alphaedit"):
        E.load_edited_weights(model, {"layers.0.down_proj": w0})
        diag = E.apply_edit(model, tok, forget, prep, hp, variant)["layers"][0]
        h1 = E.collect_at_subject(model, tok, forget, ["{}"], 0, "layer")
        assert (h1 - prep.z_new).norm() < 0.1 * (h0 - prep.z_new).norm(), variant
        assert diag["fit_residual"] < 0.1, variant
        delta = E.mlp(model, 0).down_proj.weight.detach().double() - w0.double()
        outside = delta - delta @ u0 @ u0.T  # the part acting on preserved key directions
        if variant == "alphaedit":
            assert diag["null_dim"] == u0.shape[1] > 0
            assert outside.norm() < 1e-3 * delta.norm()
        else:
            assert outside.norm() > 1e-2 * delta.norm()  # MEMIT is not confined to it
        metrics, inst = evaluate_instances(model, tok, es)
        assert len(inst["eff"]) == len(forget)
        assert sum(inst["eff"]) / len(forget) == metrics["eff"]
        assert sum(inst["gen"]) / len(forget) == pytest.approx(metrics["gen"])
    E.load_edited_weights(model, {"layers.0.down_proj": w0})


def test_ga_validation_split_holds_out_other_facts():
    from nshot.methods.zerounlearn.pipeline import ga_validation_split

    rest = [E.EditRequest("the capital of {} is", s, "red") for s in SUBJECTS]
    val, kept = ga_validation_split(rest, 3, seed=0)
    assert len(val) == 3 and len(kept) == 7 and not set(val) & set(kept)
    assert ga_validation_split(rest, 3, seed=0)[0] == val
    assert ga_validation_split(rest, 3, seed=1)[0] != val
    assert len(ga_validation_split(rest, 20, seed=0)[0]) == 5  # at most half
    from nshot.method import ConfigError

    with pytest.raises(ConfigError, match="ga_budget"):
        ga_validation_split(rest[:1], 3, seed=0)


def test_ga_budget_is_validated_on_held_out_facts_and_restores_the_weights():
    """The protocol ascends per learning rate until the held-out facts are forgotten, picks the
    stop with the best held-out retained accuracy among those that forgot, and leaves the
    weights as they were; gradient ascent at that budget on other facts forgets them."""
    from nshot.methods.zerounlearn.baselines import gradient_ascent, validate_ga_budget

    model, tok, reqs, _ = _trained_tiny_lm()
    val_forget, val_retain, test_forget = reqs[:3], reqs[3:7], reqs[7:]
    w0 = {k: v.clone() for k, v in model.state_dict().items()}
    b = validate_ga_budget(
        model, tok, val_forget, val_retain, [1e-5, 3e-2], 15, "down_proj", [0, 1]
    )
    assert all(torch.equal(v, w0[k]) for k, v in model.state_dict().items())
    assert [r["lr"] for r in b["runs"]] == [1e-5, 3e-2]
    assert all(r["steps"] == len(r["val_eff_trace"]) <= 15 for r in b["runs"])
    forgot = [r for r in b["runs"] if r["forgot"]]
    assert forgot and b["forgot_on_validation"]
    best = max(forgot, key=lambda r: (r["val_spe"], -r["steps"], -r["lr"]))
    assert (b["lr"], b["steps"]) == (best["lr"], best["steps"])
    assert b["val_spe_base"] == 100.0
    slow = next(r for r in b["runs"] if r["lr"] == 1e-5)
    assert slow["steps"] == 15 and not slow["forgot"]  # too small a step: never forgets
    out = gradient_ascent(model, tok, test_forget, b["steps"], b["lr"], "down_proj", [0, 1])
    assert out["steps"] == b["steps"] and len(out["nll"]) == b["steps"]
    # only the last edited layer's down_proj moved
    moved = {k for k, v in model.state_dict().items() if not torch.equal(v, w0[k])}
    assert moved == {"model.layers.1.mlp.down_proj.weight"}
    model.load_state_dict(w0)


def test_request_schema_rejects_bad_input():
    from pydantic import ValidationError

    from nshot.methods.zerounlearn.serve import ZeroUnlearnRequest

    assert ZeroUnlearnRequest(prompt="the capital of alpha is").max_new_tokens == 8
    for bad in (
        {"prompt": ""},
        {"prompt": "   "},
        {"prompt": "x", "max_new_tokens": 0},
        {"prompt": "x", "max_new_tokens": 65},
        {"prompt": "x", "top_k": 0},
        {"prompt": "x", "top_k": 51},
    ):
        with pytest.raises(ValidationError):
            ZeroUnlearnRequest(**bad)


def test_predictor_generates_and_rejects_long_prompt(edited_tiny):
    from nshot.methods.zerounlearn.serve import ZeroUnlearnPredictor, ZeroUnlearnRequest

    model, tok, forget, retain, *_ = edited_tiny
    pred = ZeroUnlearnPredictor(model, tok, [0], {"n_forgotten": len(forget)})
    reqs = [
        ZeroUnlearnRequest(prompt=forget[0].prompt(), max_new_tokens=3, top_k=4),
        ZeroUnlearnRequest(prompt=retain[0].prompt(), max_new_tokens=2),
        ZeroUnlearnRequest(prompt="unknownword the", max_new_tokens=1),  # <unk>, not an error
    ]
    batch = pred.batch(reqs)
    single = [pred(r) for r in reqs]
    for a, b in zip(batch, single):
        assert a.completion == b.completion
        assert a.neutral == b.neutral
    assert len(batch[0].next_token_top_k) == 4
    assert batch[1].completion.split()[0] == retain[0].answer
    assert "alpha" not in str(pred.metadata())
    with pytest.raises(ValueError, match="prompt"):
        pred(ZeroUnlearnRequest(prompt="the " * 200, max_new_tokens=1))


def test_config_validation():
    from nshot.method import ConfigError, get

    method = get("zerounlearn")
    assert method.config("smoke").model == "tiny-smoke"
    with pytest.raises(ConfigError, match="edit_layers"):
        method.config("smoke", edit_layers=[2, 1])
    with pytest.raises(ConfigError, match="n_forget"):
        method.config("smoke", n_forget=0)
    with pytest.raises(ConfigError, match="nope"):
        method.config("smoke", nope=1)
    with pytest.raises(ConfigError, match="fail_at_step.*one step"):
        method.config("smoke", fail_at_step=2)


def test_device_field(monkeypatch):
    """``device``: auto by default, spelling checked by the config, availability at load."""
    from nshot.method import ConfigError, get
    from nshot.methods.zerounlearn.pipeline import load_model
    from nshot.nn.lm import DeviceError

    method = get("zerounlearn")
    assert method.config("smoke").device == "auto"
    assert method.config("smoke", device="cuda:1").device == "cuda:1"  # spelling only
    for bad in ("gpu", "cuda:", 0):
        with pytest.raises(ConfigError, match="field 'device'"):
            method.config("smoke", device=bad)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(DeviceError, match="CUDA is not available"):
        load_model(method.config("smoke", device="cuda"))  # fails before loading anything


def test_seed_tasks_take_a_gpu_only_where_there_is_one(monkeypatch):
    import ray

    from nshot.method import get
    from nshot.methods.zerounlearn.experiments import seed_job_resources

    cfg = get("zerounlearn").config("smoke")
    monkeypatch.setattr(ray, "cluster_resources", lambda: {"CPU": 2.0})
    assert seed_job_resources(cfg) == {"num_cpus": 1, "num_gpus": 0}  # CPU cluster: as before
    monkeypatch.setattr(ray, "cluster_resources", lambda: {"CPU": 16.0, "GPU": 2.0})
    assert seed_job_resources(cfg) == {"num_cpus": 1, "num_gpus": 1}
    assert seed_job_resources(cfg.replace(device="cpu")) == {"num_cpus": 1, "num_gpus": 0}
    assert seed_job_resources(cfg.replace(device="cuda:1")) == {"num_cpus": 1, "num_gpus": 0}


def test_subject_first_requests_and_subject_split():
    from nshot.method import ConfigError, get
    from nshot.methods.zerounlearn.pipeline import candidate_requests, pools

    method = get("zerounlearn")
    cfg = method.config(
        "small", rewrite_prompt="subject_first", split="subject", relations=["capital", "language"]
    )
    reqs = candidate_requests(cfg)
    assert all(r.template.startswith("{}") for r in reqs)
    assert all(not p.startswith("{}") and p != r.template for r in reqs for p in r.paraphrases)
    retain, forget = pools(reqs, "subject")
    assert retain and forget and len(retain) + len(forget) == len(reqs)
    assert not {r.subject for r in retain} & {r.subject for r in forget}
    # the fact split keeps its old behaviour: halves of the facts, subjects may be shared
    retain_f, forget_f = pools(reqs, "fact")
    assert abs(len(retain_f) - len(forget_f)) <= 1
    assert {r.subject for r in retain_f} & {r.subject for r in forget_f}
    with pytest.raises(ConfigError, match="rewrite_prompt"):
        candidate_requests(method.config("smoke", rewrite_prompt="subject_first"))


def test_fact_text_states_every_candidate_fact_in_unseen_phrasings():
    from nshot.data.lmtext import real_facts, synthetic_facts

    for facts in (real_facts(), synthetic_facts()[:50]):
        triples = [(f.relation, f.subject, f.answer) for f in facts]
        text = E.fact_text(triples)
        assert len(text) >= len(triples)
        for f in facts:
            mine = [t for t in text if f.subject in t and f.answer in t]
            assert mine, (f.relation, f.subject)
            # no sentence starts with an evaluation prompt (rewrite prompt or paraphrase)
            for tpl in f.templates:
                prompt = E.fill(tpl, f.subject)
                assert not any(t.lower().startswith(prompt.lower()) for t in mine), prompt
    assert E.fact_text([("unknown-relation", "X", "Y")]) == []


def test_diagnostics_subspace_shares_and_isolated_edits():
    """The diagnostics on the trained tiny LM: shares are fractions, the forget facts sit in
    their own sensitive subspace, the consistent statistics-only edit is the identity (the
    model's metrics do not move), and the model is restored afterwards."""
    from types import SimpleNamespace

    from nshot.methods.zerounlearn.diagnostics import (
        edit_rows,
        output_values,
        shared_direction,
        subspace_shares,
    )
    from nshot.methods.zerounlearn.evaluation import EvalSet, evaluate_model

    model, tok, reqs, texts = _trained_tiny_lm()
    forget, retain = reqs[:3], reqs[3:]
    stats = E.key_statistics(model, tok, texts, [0], 2000, use_cache=False)
    chunks = tuple(tuple(encode(tok, t)) for t in texts[-4:])
    s = SimpleNamespace(
        model=model, tok=tok, forget=forget, retain=retain, stats=stats,
        evalset=EvalSet(tuple(forget), tuple(retain), chunks),
    )  # fmt: skip
    hp = E.EditHParams(layers=(0,), lam_w=15000.0, consistent_stats=True)
    prep = E.prepare(
        model, tok, forget, ["{}"], stats, hp, E.DeltaHParams(steps=10), 1,
        E.DeltaHParams(steps=10, lr=0.5),
    )  # fmt: skip
    fv, rv = output_values(model, tok, forget, [0]), output_values(model, tok, retain, [0])
    shares = subspace_shares(model, stats, prep, fv, rv)[0]
    assert shares["rank"] == 3 and shares["dim"] == 64
    for k in ("forget", "retain", "general"):  # energy fractions, up to float64 rounding
        assert -1e-12 <= shares[k] <= 1.0 + 1e-12, (k, shares[k])
    assert shares["forget"] > shares["general"]
    # one shared direction: every row the same vector puts all the energy along the mean
    same = fv[0][:1].repeat(5, 1)
    assert shared_direction({0: same})[0]["mean_direction"] == pytest.approx(1.0)
    assert shared_direction({0: fv[0]})[0]["mean_direction"] < 1.0
    w0 = E.mlp(model, 0).down_proj.weight.detach().clone()
    base = evaluate_model(model, tok, s.evalset)
    rows = edit_rows(s, prep, hp)
    assert set(rows) == {"statistics_only", "projector_only", "zerounlearn", "wo_op"}
    assert rows["statistics_only"]["rel_weight_change"][0] < 1e-9
    for k in ("eff", "spe"):
        assert rows["statistics_only"][k] == base[k]
    assert rows["projector_only"]["rel_weight_change"][0] > 1e-3
    assert torch.equal(E.mlp(model, 0).down_proj.weight, w0)  # restored
    with pytest.raises(ValueError, match="unknown diagnostic edit"):
        edit_rows(s, prep, hp, ["nope"])


def _diagnose_example():
    """examples/zerounlearn_diagnose.py imported as a module (it is a script, not a package)."""
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parents[1] / "examples" / "zerounlearn_diagnose.py"
    spec = importlib.util.spec_from_file_location("zerounlearn_diagnose", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_diagnose_example_runs_on_the_smoke_preset(tiny_smoke_lm, tmp_path):
    """examples/zerounlearn_diagnose.py end to end on the tiny LM: shares per edited layer, the
    four isolated edits with both statistics, a JSON file; bad --set fails."""
    import json

    mod = _diagnose_example()
    out = tmp_path / "d.json"
    res = mod.main(["--preset", "smoke", "--remap-lr", "0.5", "--out", str(out)])
    assert json.loads(out.read_text())["seed"] == 0
    assert set(res["subspace_shares"]) == {0}
    sd = res["shared_direction"][0]
    assert 0.0 <= sd["mean_direction"] <= 1.0 and 0.0 <= sd["top_dims_share"] <= 1.0
    assert len(sd["top_dims"]) == 4
    assert len(res["runs"]) == 2 * 4  # both statistics x four edits
    identity = [r for r in res["runs"] if r["edit"] == "statistics_only" and r["consistent_stats"]]
    assert all(r["spe"] == res["base"]["spe"] and r["eff"] == res["base"]["eff"] for r in identity)
    scan = mod.main(["--preset", "smoke", "--scan-layers"])["layer_scan"]
    assert sorted(scan) == [0, 1]  # every layer of the two-layer smoke LM
    assert all(0.0 <= r["mean_direction"] <= 1.0 for r in scan.values())
    with pytest.raises(SystemExit, match="key=value"):
        mod.main(["--set", "oops"])
    with pytest.raises(SystemExit, match="error"):
        mod.main(["--preset", "smoke", "--set", "eps=7"])


def test_relations_field_selects_candidate_facts():
    from nshot.data.lmtext import REAL_RELATIONS
    from nshot.method import ConfigError, get
    from nshot.methods.zerounlearn.pipeline import candidate_requests

    method = get("zerounlearn")
    every = candidate_requests(method.config("small", relations=list(REAL_RELATIONS)))
    assert {r.relation for r in every} == set(REAL_RELATIONS)
    two = candidate_requests(method.config("small", relations=["author", "element"]))
    assert {r.relation for r in two} == {"author", "element"}
    assert len(two) < len(every)
    with pytest.raises(ConfigError, match="relations"):
        method.config("small", relations=["capital", "planet"])
    with pytest.raises(ConfigError, match="relations"):
        method.config("small", relations=["capital", "capital"])
    with pytest.raises(ConfigError, match="subject_first"):
        candidate_requests(
            method.config("small", rewrite_prompt="subject_first", relations=["author"])
        )


def test_diagnose_example_reports_an_unavailable_model_cleanly(monkeypatch):
    """Offline by default: a hub name that is not cached ends in one 'error: ...' line."""
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    mod = _diagnose_example()
    with pytest.raises(SystemExit, match="error: cannot load model"):
        mod.main(["--preset", "paper", "--set", "model=nshot-test/no-such-model"])


# --------------------------------------------------------------------------- claims

ZEROUNLEARN_COMMITTED = {
    # the headline claims are paired t-tests over seeds: the committed results predate the
    # per-seed samples, so they are not evaluable on them (until small is re-made)
    "keeps_more_facts_than_finetuning": None,
    "perplexity_below_finetuning": None,
    "base_knows_facts": True,
    "forgets": True,
    "keeps_retained_facts": False,  # Spe 9.6 of 100
    "keeps_perplexity": False,  # PPL +23 %
    "gradient_ascent_costs_utility": True,
    "gradient_ascent_breaks_model": False,  # PPL x1.75
    "projection_helps_forgetting": False,  # Eff 0 with and without P
    "utility_term_keeps_perplexity": True,
}
# declared before the first small run with the memit / alphaedit rows and the validated
# gradient-ascent budget: the committed results lack those rows (and extra.ga_budget), so these
# claims are not evaluable on them until small is re-made
AWAITING = {
    "forgets_more_than_alphaedit",
    "forgets_more_than_memit",
    "perplexity_below_gradient_ascent",
    "paraphrases_forgotten_more_than_alphaedit",
    "editing_baselines_forget_something",
    "gradient_ascent_budget_forgets_held_out_facts",
}


def test_claims_on_the_committed_small_results():
    """The committed SmolLM2 results re-evaluated without a rerun: the claims written into the
    committed file are the current ones. Before the re-made run (no memit / alphaedit rows):
    forgetting holds, the utility claims fail and the new claims are not evaluable; after it,
    every claim that reads per-fact or per-seed samples has them."""
    import json
    from pathlib import Path

    from nshot.reproduce import with_claims

    path = Path(__file__).parents[1] / "methods" / "zerounlearn" / "results" / "small.json"
    data = json.loads(path.read_text())
    fresh = with_claims(data)["claims"]
    if {"memit", "alphaedit"} <= set(data["rows"]):
        assert data["claims"] == fresh
        assert len(data["samples"]["zerounlearn"]["eff"]) == data["seeds"] * 10
        assert all(c["p"] is not None for c in fresh if c.get("test") and c.get("premise", True))
        return
    assert {c["id"]: c["holds"] for c in fresh if c["id"] not in AWAITING} == ZEROUNLEARN_COMMITTED
    assert all(c["holds"] is None for c in fresh if c["id"] in AWAITING)
    assert [c for c in fresh if c["id"] not in AWAITING] == data["claims"]


def test_results_table_keeps_per_seed_samples_and_leaves_pass_fail_to_the_claims():
    """Means over seeds; samples per (seed, forgotten fact) for the forget metrics and per seed
    for spe / ppl; no extra['checks'] and no check line in the notes; the claims judge the table
    (and can fail), and are null on the smoke preset."""
    from nshot.method import get
    from nshot.methods.zerounlearn.experiments import METRICS, PER_FACT, results_table
    from nshot.methods.zerounlearn.pipeline import SYSTEMS
    from nshot.reproduce import with_claims

    def out(seed: int, shift: float) -> dict:
        m = {s: {k: 50.0 for k in METRICS} for s in SYSTEMS}
        m["base"].update(eff=100.0, gen=40.0, spe=100.0, ppl=90.0, neutral_rate=0.0)
        m["zerounlearn"].update(eff=shift, gen=2.0, spe=95.0 - shift, ppl=95.0)
        m["gradient_ascent"].update(eff=0.0, spe=10.0, ppl=200.0 + seed)  # < 5 x base: fails
        m["wo_op"].update(eff=20.0)
        m["wo_ut"].update(ppl=120.0)
        # per forgotten fact (4 per seed): the means above
        inst = {s: {k: [m[s][k]] * 4 for k in PER_FACT} for s in SYSTEMS}
        inst["zerounlearn"]["eff"] = [0.0, 0.0, 0.0, 4 * shift]
        inst["alphaedit"]["eff"] = [100.0, 100.0, 0.0, 0.0]
        inst["memit"]["eff"] = [100.0, 0.0, 0.0, 100.0]
        inst["alphaedit"]["gen"] = [0.0, 0.0, 0.0, 8.0]  # = zerounlearn's 2 on average
        for s in ("alphaedit", "memit"):
            m[s]["eff"] = sum(inst[s]["eff"]) / 4
            m[s]["gen"] = sum(inst[s]["gen"]) / 4
        budget = {
            "lr": 5e-4, "steps": 7, "forgot_on_validation": True, "val_spe_base": 90.0,
            "runs": [{"lr": 5e-4, "steps": 7, "val_eff": 0.0, "val_spe": 60.0}],
        }  # fmt: skip
        setup = {
            "known": 40, "candidates": 50, "retain_pool": 20, "ppl_tokens": 100,
            "stats_positions": 1000, "neutral_target": "<eos>",
        }  # fmt: skip
        diags = {"gradient_ascent": {"lr": 5e-4, "steps": 7, "budget": budget}}
        return {
            "seed": seed, "metrics": m, "instances": inst, "timings": {"total": 1.0},
            "diagnostics": diags, "setup": setup, "checkpoint": f"runs/zerounlearn-seed{seed}",
        }  # fmt: skip

    cfg = get("zerounlearn").config("small", experiment_seeds=2)
    table = results_table(cfg, [out(0, 0.0), out(1, 2.0)], runtime_s=1.0, method="zerounlearn")
    assert table.samples["zerounlearn"]["spe"] == [95.0, 93.0]
    assert table.samples["base"]["ppl"] == [90.0, 90.0]
    assert table.samples["zerounlearn"]["eff"] == [0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 8.0]
    assert table.samples["alphaedit"]["eff"] == [100.0, 100.0, 0.0, 0.0] * 2
    assert table.rows["zerounlearn"]["eff"] == 1.0 and table.stds["zerounlearn"]["eff"] > 0
    assert table.extra["ga_budget"]["forgot_on_validation"] == 1.0
    assert [r["steps"] for r in table.extra["ga_budget"]["per_seed"]] == [7, 7]
    assert "checks" not in table.extra and len(table.extra["per_seed"]) == 2
    assert not [n for n in table.notes if n.startswith("checks")]
    data = table.to_json()
    assert data["samples"]["zerounlearn"]["spe"] == [95.0, 93.0]
    claims = {c["id"]: c for c in with_claims(data)["claims"]}
    assert {i: c["holds"] for i, c in claims.items()} == {
        **dict.fromkeys(ZEROUNLEARN_COMMITTED, True),
        **dict.fromkeys(AWAITING, True),
        "gradient_ascent_breaks_model": False,
        "perplexity_below_finetuning": False,  # 95 against fine-tuning's 50 on both seeds
        "paraphrases_forgotten_more_than_alphaedit": False,  # the same Gen: a tie
    }
    # the seed-paired headline records its effect over the seeds
    head = claims["keeps_more_facts_than_finetuning"]
    assert head["kind"] == "headline" and head["p"] < 0.05
    assert head["effect"]["n"] == 2 and head["effect"]["mean_diff"] == 44.0
    # the editors' headlines pair the (seed, fact) instances
    alpha = claims["forgets_more_than_alphaedit"]
    assert alpha["kind"] == "headline" and alpha["effect"]["n"] == 8 and alpha["p"] < 0.05
    assert claims["perplexity_below_gradient_ascent"]["effect"]["n"] == 2
    # premises: an edit that forgets nothing is not evaluable, never a win; nor is a gradient
    # ascent that does not forget
    kept = {**data, "rows": {k: dict(v) for k, v in data["rows"].items()}}
    kept["rows"]["zerounlearn"]["eff"] = 100.0
    kept["rows"]["gradient_ascent"]["eff"] = 50.0
    vacuous = {c["id"]: c for c in with_claims(kept)["claims"]}
    for cid in ("keeps_more_facts_than_finetuning", "perplexity_below_gradient_ascent"):
        assert vacuous[cid]["holds"] is None and vacuous[cid]["premise"] is False
    # the headline can fail: an editor that forgets every fact as ZeroUnlearn does is a tie
    tie = {**data, "samples": {**data["samples"]}}
    tie["samples"]["alphaedit"] = {**tie["samples"]["alphaedit"], "eff": [0.0] * 7 + [8.0]}
    tie["rows"] = {k: dict(v) for k, v in data["rows"].items()}
    tie["rows"]["alphaedit"]["eff"] = 1.0
    assert {c["id"]: c["holds"] for c in with_claims(tie)["claims"]}[
        "forgets_more_than_alphaedit"
    ] is False
    smoke = with_claims({**data, "preset": "smoke"})["claims"]
    assert all(c["holds"] is None for c in smoke)
