"""iclft: closed forms, the learned linear attention against them, freezing, the Ray Train
loop with checkpoints and resume, and the predictor."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from nshot.method import ConfigError, get
from nshot.methods.iclft import closed_form as cf
from nshot.methods.iclft import data as D
from nshot.methods.iclft.config import ICLFTConfig
from nshot.methods.iclft.evaluation import summary, task_errors
from nshot.methods.iclft.model import LinearAttention, load_model, new_model, set_trainable, tokens
from nshot.methods.iclft.train import train_in_process

D5, S2 = 5, 0.1


def _prompts(rng, theta, n, B, sigma2=S2):
    x = rng.normal(size=(B, n + 1, len(theta)))
    y = x @ theta + rng.normal(size=(B, n + 1)) * np.sqrt(sigma2)
    Z = np.concatenate([np.ones((B, n + 1, 1)), x, y[..., None]], -1)
    yq = y[:, -1].copy()
    Z[:, -1, -1] = 0.0
    return Z, yq


def _unit(rng, d=D5):
    g = rng.normal(size=d)
    return g / np.linalg.norm(g)


# --------------------------------------------------------------------------- closed forms


def test_closed_form_errors_match_monte_carlo():
    rng = np.random.default_rng(0)
    th0 = _unit(rng)
    c = cf.pretrained_coef(D5, 20, S2)
    assert c == pytest.approx(21 / 26.5) and cf.spec_a(D5, 20) == pytest.approx(20 / 26)
    assert cf.vonly_zs_floor(D5, S2) == pytest.approx(2 / 9 + 0.1)  # 0.322
    models = {
        "pretrained": (cf.pretrained_params(D5, c), lambda n, th: cf.err_pretrained(n, D5, c, S2)),
        "vonly": (cf.vonly_zs_params(th0, 0.7, c / 0.7),
                  lambda n, th: cf.err_vfamily(n, th, th0 / 9, c, S2)),
        "zs_all": (cf.zs_all_params(th0, 0.5), lambda n, th: cf.err_zs_all(n, th, th0, 0.5, S2)),
    }  # fmt: skip
    for name, (params, exact) in models.items():
        for theta in (th0, -th0):
            for n in (0, 1, 20):
                Z, yq = _prompts(rng, theta, n, 10_000)
                mc = float(np.mean((cf.predict(*params, Z) - yq) ** 2))
                assert mc == pytest.approx(exact(n, theta), rel=0.05), (name, n)
    # V-only ZS optimum reaches the floor at n = 0 on the target task
    assert cf.err_vfamily(0, th0, th0 / 9, c, S2) == pytest.approx(cf.vonly_zs_floor(D5, S2))
    # the FS auxiliary loss pulls the ICL weight w from c* ≈ 0.79 down to ≈ 0.65 (quoted as ≈ 0.66)
    assert 0.6 < cf.vonly_fs_optimum(D5, 20, S2, 1.0)[1] < 0.7


def test_closed_form_parameters_give_the_spec_predictions():
    rng = np.random.default_rng(1)
    th0 = _unit(rng)
    a = cf.spec_a(D5, 20)
    for n in (0, 1, 7, 20):
        Z, _ = _prompts(rng, _unit(rng), n, 64)
        xs, ys, xq = Z[:, :-1, 1:-1], Z[:, :-1, -1], Z[:, -1, 1:-1]
        want = a / (n + 1) * np.einsum("bi,bid,bd->b", ys, xs, xq)
        np.testing.assert_allclose(cf.predict(*cf.pretrained_params(D5, a), Z), want, atol=1e-6)
    # the all-parameter ZS family: zero ZS error without noise, for any c
    Z, yq = _prompts(rng, th0, 0, 256, sigma2=0.0)
    for c in (0.3, 1.0, 4.0):
        np.testing.assert_allclose(cf.predict(*cf.zs_all_params(th0, c), Z), yq, atol=1e-9)
        assert cf.err_zs_all(0, th0, th0, c, 0.0) == pytest.approx(0.0, abs=1e-12)


def test_model_forward_matches_full_attention_and_reference():
    torch.manual_seed(0)
    net = LinearAttention(D5, init_std=0.5).double()
    rng = np.random.default_rng(2)
    for n in (0, 3, 20):
        Z, _ = _prompts(rng, _unit(rng), n, 32)
        Zt = torch.from_numpy(Z)
        fast = net(Zt)
        full = net.full(Zt)[:, -1, -1]
        ref = cf.predict(*(p.detach().numpy() for p in (net.Q, net.K, net.V)), Z)
        np.testing.assert_allclose(fast.detach().numpy(), full.detach().numpy(), rtol=1e-10)
        np.testing.assert_allclose(fast.detach().numpy(), ref, rtol=1e-10, atol=1e-12)
    # tokens: [1, x, y], and the query's y entry is 0
    Z = tokens(torch.ones(2, 3, D5), torch.full((2, 3), 7.0))
    assert Z.shape == (2, 3, D5 + 2) and (Z[:, :, 0] == 1).all()
    assert (Z[:, :-1, -1] == 7).all() and (Z[:, -1, -1] == 0).all()


def test_config_validation_names_the_field():
    with pytest.raises(ConfigError, match="field 'variants'.*unknown variant 'zs/w'"):
        ICLFTConfig.from_preset("smoke", variants=["zs/w"])
    with pytest.raises(ConfigError, match="field 'sigma2'"):
        ICLFTConfig.from_preset("smoke", sigma2=-1)
    with pytest.raises(ConfigError, match="field 'init_checkpoint'"):
        ICLFTConfig.from_preset("smoke", stage="pretrain", init_checkpoint="/x")
    with pytest.raises(ConfigError, match="field 'dd': unknown field"):
        ICLFTConfig.from_preset("smoke", dd=3)
    small = get("iclft").config("small")
    assert small.variants == ["zs/all", "zs/v", "zs/qk", "zs+fs/all", "zs+fs/v"]
    assert (small.steps, small.batch, small.eval_batch, small.seeds) == (2000, 2000, 20_000, 3)


# --------------------------------------------------------------------------- learned model


@pytest.fixture(scope="module")
def pretrained():
    """A short pretraining (smoke sizes, 400 steps of 512 prompts: smoke's own 200 × 256 does
    not leave the saddle at the 0.05 init)."""
    torch.set_num_threads(1)
    cfg = ICLFTConfig.from_preset("smoke", steps=400, batch=512, log_every=100)
    net = new_model(cfg, 0)
    train_in_process(net, cfg, 0, "pretrain")
    return cfg, net


def test_pretraining_learns_the_closed_form_optimum(pretrained):
    cfg, net = pretrained
    theta0 = D.target_task(cfg, 0)
    c = cf.pretrained_coef(cfg.d, cfg.n_pt, cfg.sigma2)
    s = summary(net, theta0)
    assert s["w"] == pytest.approx(c, abs=0.05)  # v_y·QᵀK_xx ≈ c*·I
    assert s["offdiag_share"] < 0.12 and abs(s["M00"]) < 0.05
    # predictions: close to the closed-form optimum's on fresh prompts
    Zt, yq = D.eval_batch(theta0, 20, 4000, cfg.sigma2, D.generator(7))
    learned = task_errors(net, theta0, [0, 1, 20], 8000, cfg.sigma2, 0, 0)
    ref = cf.predict(*cf.pretrained_params(cfg.d, c), Zt.numpy())
    with torch.no_grad():
        got = net.double()(Zt).numpy()
    net.float()
    assert np.sqrt(np.mean((got - ref) ** 2)) < 0.15 * np.sqrt(np.mean(ref**2))
    for n in (0, 1, 20):
        assert learned[n] == pytest.approx(cf.err_pretrained(n, cfg.d, c, cfg.sigma2), rel=0.08)
    assert learned[1] > learned[0]  # the 1/(n+1) normalisation: 1-shot worse than 0-shot


def test_value_only_finetuning_freezes_qk_and_reaches_the_zs_floor(pretrained):
    cfg, pre = pretrained
    cfg = cfg.replace(steps=150)
    theta0 = D.target_task(cfg, 0)
    before = {k: v.clone() for k, v in pre.state_dict().items()}
    for variant, frozen in (("zs/v", ("Q", "K")), ("zs/qk", ("V",))):
        net = LinearAttention(cfg.d)
        net.load_state_dict(before)
        train_in_process(net, cfg, 0, variant)
        after = net.state_dict()
        for name in ("Q", "K", "V"):
            same = torch.equal(after[name], before[name])
            assert same == (name in frozen), (variant, name)
        if variant == "zs/v":
            errs = task_errors(net, theta0, [0, 20], 8000, cfg.sigma2, 0, 0)
            pre_errs = task_errors(pre, theta0, [0, 20], 8000, cfg.sigma2, 0, 0)
            assert 0.25 <= errs[0] <= 0.40  # closed form 0.322
            assert errs[20] == pytest.approx(pre_errs[20], rel=0.25)  # ICL preserved
            assert summary(net, theta0)["w"] == pytest.approx(summary(pre, theta0)["w"])
    assert set_trainable(LinearAttention(3), "qk")[0].shape == (5, 5)


# --------------------------------------------------------------------------- Ray Train loop


def _tiny(**kw):
    base = dict(steps=60, batch=128, pool_size=2000, variants=["zs/v"], log_every=20,
                checkpoint_every=40, eval_batch=400, eval_n=[0, 1, 20], eval_random_tasks=2,
                val_batch=200)  # fmt: skip
    return get("iclft").config("smoke", **{**base, **kw})


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory, ray_session):
    from nshot.train import Scaling, fit

    cfg = _tiny()
    storage = tmp_path_factory.mktemp("iclft-runs")
    res = fit("iclft", cfg, scaling=Scaling(workers=0), storage=storage, name="straight")
    return cfg, storage, res


def test_fit_checkpoint_evaluate_and_predictor_round_trip(tiny_run):
    from nshot.train import load_checkpoint

    cfg, _, res = tiny_run
    ck = load_checkpoint(res.checkpoint, method="iclft")
    assert ck.step == 120 and ck.extra["trained"] == ["pretrained", "zs_v"]
    assert ck.extra["resumed_from"] == []
    assert {"loss", "val_err_n0", "val_err_n20"} <= set(ck.metrics)
    method = get("iclft")
    metrics = method.evaluate(ck, cfg)
    assert {"pretrained/err_target_n0", "zs_v/err_unseen_n20", "zs_v/err_random_n1"} <= set(metrics)
    assert all(np.isfinite(v) for v in metrics.values())
    pred = method.predictor(ck)
    meta = pred.metadata()
    assert meta["variants"] == ["pretrained", "zs/v"] and meta["default_variant"] == "zs/v"
    # the predictor equals the trained model's forward on the same prompt
    bundle, _ = load_model(ck)
    rng = np.random.default_rng(3)
    theta0 = np.array(ck.extra["theta0"])
    for n in (0, 4):
        Z, _ = _prompts(rng, theta0, n, 1)
        queries = rng.normal(size=(3, D5))
        req = pred.Request(context_x=Z[0, :-1, 1:-1].tolist(), context_y=Z[0, :-1, -1].tolist(),
                           query_x=queries.tolist(), variant="pretrained")  # fmt: skip
        out = pred(req)
        assert out.n_context == n and out.variant == "pretrained" and out.d == D5
        Zq = np.repeat(Z, 3, axis=0)
        Zq[:, -1, 1:-1] = queries
        with torch.no_grad():
            want = bundle.models["pretrained"].double()(torch.from_numpy(Zq)).numpy()
        np.testing.assert_allclose(out.y_hat, want, rtol=1e-9, atol=1e-12)
        # the default model (zs/v) gives other predictions than the pretrained one
        other = pred(pred.Request(**{**req.model_dump(), "variant": None}))
        assert other.variant == "zs/v" and not np.allclose(other.y_hat, out.y_hat)
        assert pred(pred.Request(**{**req.model_dump(), "variant": "zs_v"})).y_hat == other.y_hat


def test_predictor_answers_its_example_request(tiny_run):
    """The predictor's own example body (shapes from the checkpoint: d features) is answered,
    the answer survives a JSON round trip and equals the batched answer."""
    import json

    from nshot.train import load_checkpoint

    _, _, res = tiny_run
    pred = get("iclft").predictor(load_checkpoint(res.checkpoint, method="iclft"))
    body = pred.example_request()
    assert json.loads(json.dumps(body)) == body
    assert all(len(row) == D5 for row in body["context_x"] + body["query_x"])
    req = pred.Request.model_validate(body)
    answer = pred(req)
    assert len(answer.y_hat) == len(body["query_x"]) and answer.n_context == 4
    assert pred.Response.model_validate_json(answer.model_dump_json()) == answer
    assert pred.batch([req, req])[0] == answer


def test_predictor_rejects_bad_requests(tiny_run):
    from pydantic import ValidationError

    from nshot.train import load_checkpoint

    _, _, res = tiny_run
    pred = get("iclft").predictor(load_checkpoint(res.checkpoint, method="iclft"))
    R = pred.Request
    ok = dict(context_x=[[0.0] * D5] * 2, context_y=[1.0, 2.0], query_x=[[1.0] * D5])
    cases = {
        "context_y": dict(ok, context_y=[1.0]),
        "query_x: at least one": dict(ok, query_x=[]),
        r"context_x\[1\]: has 4 features": dict(ok, context_x=[[0.0] * D5, [0.0] * 4]),
        r"query_x\[0\]: contains NaN": dict(ok, query_x=[[float("nan")] * D5]),
        r"context_y\[0\]: NaN": dict(ok, context_y=[float("inf"), 1.0]),
        "context_x: 1001 demonstrations": dict(
            ok, context_x=[[0.0] * D5] * 1001, context_y=[0.0] * 1001
        ),  # fmt: skip
    }
    for msg, body in cases.items():
        with pytest.raises(ValidationError, match=msg):
            R(**body)
    with pytest.raises(ValueError, match=r"query_x\[0\]: has 3 features, the model expects d = 5"):
        pred(R(context_x=[], context_y=[], query_x=[[1.0, 2.0, 3.0]]))
    with pytest.raises(ValueError, match="variant: unknown model 'zs/qk'"):
        pred(R(**ok, variant="zs/qk"))
    zero_shot = pred(R(query_x=[[1.0] * D5]))  # an empty context is valid
    assert zero_shot.n_context == 0 and len(zero_shot.y_hat) == 1


def test_every_stage_ends_with_a_report_and_a_checkpoint():
    """The run reports every ``log_every`` steps and checkpoints every ``checkpoint_every``, and
    both at the end of every stage (a stage's loss window closes with it); a fresh run from
    ``init_checkpoint`` neither reports nor checkpoints over the pretraining it skips."""
    from nshot.methods.iclft.train import ICLFTRecipe

    cfg = _tiny(steps=50, log_every=20, checkpoint_every=30, variants=["zs/v", "zs/all"])
    for init, first in ((None, 1), ("/x", 51)):
        recipe = ICLFTRecipe(cfg.replace(init_checkpoint=init))
        recipe.bounds = recipe.cfg.stage_bounds()
        last = recipe.schedule()[0]
        assert last == 150
        steps = range(1, last + 1)  # as the trainer asks the recipe at each step
        ckpts = [s for s in steps if recipe.is_checkpoint(s)]
        reports = [s for s in steps if recipe.is_checkpoint(s) or recipe.is_report(s)]
        assert ckpts == [s for s in (30, 50, 60, 90, 100, 120, 150) if s >= first]
        want = (20, 30, 40, 50, 60, 80, 90, 100, 120, 140, 150)
        assert reports == [s for s in want if s >= first]


def test_resume_continues_from_its_checkpoint(tiny_run):
    """A run killed mid fine-tuning resumes from its step-80 checkpoint (weights and momentum)
    and ends with exactly the weights of the uninterrupted run."""
    from nshot.train import Scaling, fit, load_checkpoint

    cfg, storage, straight = tiny_run
    with pytest.raises(Exception, match="injected fault"):
        fit("iclft", cfg.replace(fail_at_step=100), scaling=Scaling(workers=0), storage=storage,
            name="killed")  # fmt: skip
    killed = load_checkpoint(storage / "killed", method="iclft")
    assert killed.step == 80 and killed.extra["stage"] == "zs/v"
    resumed = fit("iclft", cfg, scaling=Scaling(workers=0), storage=storage, name="killed",
                  resume=True)  # fmt: skip
    assert load_checkpoint(resumed.checkpoint).extra["resumed_from"] == [80]
    a = load_checkpoint(resumed.checkpoint).weights()
    b = load_checkpoint(straight.checkpoint).weights()
    assert a.keys() == b.keys()
    for k in a:
        assert torch.equal(a[k], b[k]), k


# --------------------------------------------------------------------------- claims


def test_committed_small_results_carry_their_claims():
    """The claims recorded in the committed small results are what the claims give on them and
    all hold; the experiments no longer grade themselves; and a claim can fail: a V-only
    fine-tuning whose 20-shot error doubles breaks 'V-only preserves ICL'."""
    import copy
    import json
    from pathlib import Path

    from nshot.reproduce import with_claims

    path = Path(__file__).parents[1] / "methods" / "iclft" / "results" / "small.json"
    data = json.loads(path.read_text())
    assert "checks" not in data["extra"]
    fresh = with_claims(data)["claims"]
    assert fresh == data["claims"]
    # the paired headlines need the per-seed samples, which results made before they were
    # recorded lack: not evaluable there, never true; every other claim holds
    tested = set() if data.get("samples") else {c["id"] for c in fresh if c.get("test")}
    assert all(c["holds"] is True for c in fresh if c["id"] not in tested), fresh
    assert all(c["holds"] is None for c in fresh if c["id"] in tested)
    # the same per-seed values (kept in extra as well) make the headlines evaluable
    paired = with_claims({**data, "samples": data["extra"]["per_seed"]})["claims"]
    heads = [c for c in paired if c["kind"] == "headline"]
    assert len(heads) == 2 and all(c["effect"]["n"] == 3 for c in heads)
    assert all(c["holds"] in (True, False) for c in heads)
    worse = copy.deepcopy(data)
    worse["rows"]["zs_v"]["err_target_n20"] *= 2
    worse["rows"]["zsfs_v"]["err_unseen_n20"] = worse["rows"]["zs_v"]["err_unseen_n20"]
    bad = {c["id"]: c["holds"] for c in with_claims(worse)["claims"]}
    assert bad["zs_v_preserves_icl_target"] is False and bad["fs_loss_v_hurts_unseen"] is False
    smoke = {c["id"]: c["holds"] for c in with_claims({**data, "preset": "smoke"})["claims"]}
    assert set(smoke.values()) == {None}  # stated for small/paper only
