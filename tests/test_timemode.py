"""timemode units: the .ts reader, the corpora and targets, the config, the model's checks
(adaLN-Zero, gates, dense/sparse dispatch, K = 1 equals a SwiGLU DiT, the reverse step) and
the metrics."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from nshot.errors import ConfigError
from nshot.methods.timemode.config import TimeModeConfig


def _ts_text(cases: list[list[np.ndarray]], labels: list[str]) -> str:
    lines = ["# a comment", "@problemName Fixture", "@univariate false",
             f"@dimensions {len(cases[0])}", "@equalLength false", "@classLabel true a b",
             "@data"]  # fmt: skip
    for case, label in zip(cases, labels, strict=True):
        dims = [",".join("?" if np.isnan(v) else repr(float(v)) for v in d) for d in case]
        lines.append(":".join(dims) + f":{label}")
    return "\n".join(lines) + "\n"


def test_ts_reader_parses_cases_dimensions_missing_values_and_labels():
    from nshot.data.cache import DataError
    from nshot.data.tsfile import parse_ts
    from nshot.methods.timemode.data import synth_domain, windows_of

    rng = np.random.default_rng(0)
    a = synth_domain("chirp", 2, 50, rng).astype(np.float64)
    b = synth_domain("sine", 2, 50, rng).astype(np.float64)
    short = b[1, :30].copy()
    short[3] = np.nan
    ts = parse_ts(_ts_text([[a[0], b[0]], [a[1], short]], ["a", "b"]), name="fx.ts")
    assert ts.labels == ["a", "b"] and ts.header["dimensions"] == "2"
    np.testing.assert_array_equal(ts.series[0][1], b[0])
    assert np.isnan(ts.series[1][1][3]) and len(ts.series[1][1]) == 30
    uni = ts.univariate()
    assert [len(s) for s in uni] == [50, 50, 50, 29]  # the missing value is dropped
    w = windows_of(uni, 24)
    assert w.shape == (2 + 2 + 2 + 1, 24)
    np.testing.assert_array_equal(w[0], a[0, :24].astype(np.float32))
    with pytest.raises(DataError, match="fx.ts:2"):
        parse_ts("@problemName x\n1,2,3\n", name="fx.ts")
    with pytest.raises(DataError, match="dimensions"):
        parse_ts("@dimensions 2\n@classLabel true a\n@data\n1,2:a\n", name="fx.ts")


def test_synthetic_corpus_damped_target_and_scalers():
    from nshot.methods.timemode.data import SYNTH_DOMAINS, load_corpus, load_target

    cfg = TimeModeConfig.from_preset("smoke")
    corpus = load_corpus(cfg)
    assert corpus.names == list(SYNTH_DOMAINS)
    for w in corpus.windows:
        assert w.shape == (cfg.synth_per_domain, cfg.window, 1)
        assert w.min() == pytest.approx(0.0) and w.max() == pytest.approx(1.0)
    t0, t1 = load_target(cfg, seed=0), load_target(cfg, seed=1)
    assert t0.shots.shape == (cfg.n_shot, cfg.window, 1) and len(t0.reference) == cfg.n_reference
    assert not np.array_equal(t0.shots, t1.shots)  # each seed draws its own few-shot set
    # the reference comes from disjoint seeds: no few-shot window is in it
    ref = {w.tobytes() for w in t0.reference}
    assert not any(w.tobytes() in ref for w in t0.shots)
    s = t0.scaler.scale(t0.shots)  # fitted on the few-shot windows only
    assert s.min() == pytest.approx(0.0) and s.max() == pytest.approx(1.0)
    np.testing.assert_allclose(t0.scaler.invert(s), t0.shots, atol=1e-5)
    small = load_target(cfg, n_shot=4, seed=0)
    np.testing.assert_array_equal(small.shots, t0.shots[:4])  # regimes of a seed are nested


def test_real_corpus_from_the_wheels_when_cached():
    from nshot.methods.timemode.data import REAL_DOMAINS, load_corpus, load_target, real_available

    if not real_available():
        pytest.skip("the aeon/sktime wheels are not in the nshot cache (offline test run)")
    cfg = TimeModeConfig.from_preset("small", fetch_data=False)
    corpus = load_corpus(cfg)
    counts = dict(zip(corpus.names, (len(w) for w in corpus.windows), strict=True))
    assert corpus.names == list(REAL_DOMAINS) and "ItalyPowerDemand" not in counts
    assert counts["PLAID"] == 14089 and counts["ACSF1"] == 12000 and counts["co2"] == 95
    italy = load_target(cfg)
    assert italy.shots.shape == (50, 24, 1) and len(italy.reference) == 1096 - 50
    # the UCR archive z-normalises every series
    np.testing.assert_allclose(italy.reference[..., 0].mean(1), 0.0, atol=1e-4)


def test_config_names_the_field():
    with pytest.raises(ConfigError, match="top_k"):
        TimeModeConfig.from_preset("small", top_k=5)
    with pytest.raises(ConfigError, match="init_from"):
        TimeModeConfig.from_preset("smoke", stage="finetune")
    with pytest.raises(ConfigError, match="'bogus'.*unknown field"):
        TimeModeConfig.from_preset("smoke", bogus=1)
    with pytest.raises(ConfigError, match="shot_regimes"):
        TimeModeConfig.from_preset("smoke", shot_regimes=[100])
    with pytest.raises(ConfigError, match="heads"):
        TimeModeConfig.from_preset("smoke", heads=3)
    cfg = TimeModeConfig.from_preset("smoke", stage="scratch")
    assert cfg.steps == cfg.scratch_steps


def test_ema_copies_then_warms_up_to_its_decay():
    from nshot.methods.timemode.train import ema_decay

    cfg = TimeModeConfig.from_preset("small")
    assert cfg.ema == 0.999 and cfg.ema_start == 100
    assert [ema_decay(cfg, s) for s in (1, 100, 101)] == [0.0, 0.0, 0.0]  # a copy
    warm = [ema_decay(cfg, s) for s in range(101, 20_000)]
    assert all(b >= a for a, b in zip(warm, warm[1:], strict=False)) and max(warm) < 0.999
    assert ema_decay(cfg, 10**6) == 0.999  # capped (reached after 1000^1.5 ≈ 31,600 steps)
    # 200 steps after the start the average spans tens of steps, not a thousand
    assert abs(ema_decay(cfg, 301) - (1 - 201 ** (-2 / 3))) < 1e-12  # n = 200
    const = cfg.replace(ema_warmup=None)
    assert ema_decay(const, 100) == 0.0 and ema_decay(const, 101) == 0.999
    assert ema_decay(cfg.replace(ema=0.0), 5_000) == 0.0


def test_model_unit_checks():
    from nshot.methods.timemode.experiments import unit_checks

    u = unit_checks()
    assert u["adaln_zero_max_abs_eps"] == 0.0
    assert u["gate_min"] >= 0 and u["gate_sum_max_err"] < 1e-6 and u["gate_topk_count_err"] == 0
    assert u["dense_sparse_max_err"] < 1e-5
    assert u["posterior_step_max_err"] < 1e-6
    assert abs(u["analytic_sample_mean"]) < 0.05 and abs(u["analytic_sample_var"] - 1) < 0.05


def test_samplers_on_gaussian_data():
    """With the exact ε̂ of N(0, I) data (ε̂ = √(1 − ᾱ_t) x_t): the σ² = β chain ends in N(0, I)
    (its exact case), DDIM close to it (discretisation error at T = 100), the posterior-variance
    chain under-dispersed (β̃ is exact for a point mass, not a Gaussian); DDIM draws no noise
    after the initial one; an unknown sampler is refused."""
    from nshot.methods.timemode.model import SAMPLERS, Diffusion

    var = {}
    for sampler in SAMPLERS:
        d = Diffusion(100, sampler=sampler)

        def eps(x, t, d=d):
            return (1 - d._at(d.abar, t)).sqrt() * x

        x = d.sample(eps, (4000, 8, 1), torch.Generator().manual_seed(0))
        assert abs(x.mean().item()) < 0.05, sampler
        var[sampler] = x.var().item()
    assert abs(var["ddpm"] - 1) < 0.03 and abs(var["ddim"] - 1) < 0.08
    assert var["ddpm_posterior"] < var["ddpm"] - 0.03
    # DDIM draws the initial noise and nothing after it; the ancestral chains draw every step
    used = {}
    for sampler in ("ddim", "ddpm"):
        g, ref = torch.Generator().manual_seed(1), torch.Generator().manual_seed(1)
        Diffusion(50, sampler=sampler).sample(lambda x, t: 0.3 * x, (5, 8, 1), g)
        torch.randn((5, 8, 1), generator=ref)
        used[sampler] = torch.equal(g.get_state(), ref.get_state())
    assert used == {"ddim": True, "ddpm": False}
    with pytest.raises(ValueError, match="sampler"):
        Diffusion(10, sampler="euler")


def test_x0_prediction_runs_the_same_chains():
    """For N(0, I) data the exact x̂0 is √ᾱ_t x_t and the exact ε̂ √(1 − ᾱ_t) x_t: the
    x0-predicting diffusion given the one and the ε-predicting given the other run the same
    chain (every sampler, same noise), and each is trained on its own target."""
    from nshot.methods.timemode.model import SAMPLERS, Diffusion

    for sampler in SAMPLERS:
        by_eps, by_x0 = Diffusion(60, sampler=sampler), Diffusion(60, sampler, prediction="x0")
        a = by_eps.sample(lambda x, t, d=by_eps: (1 - d._at(d.abar, t)).sqrt() * x, (64, 8, 1),
                          torch.Generator().manual_seed(3))  # fmt: skip
        b = by_x0.sample(lambda x, t, d=by_x0: d._at(d.abar, t).sqrt() * x, (64, 8, 1),
                         torch.Generator().manual_seed(3))  # fmt: skip
        torch.testing.assert_close(a, b, atol=1e-4, rtol=1e-4)
    x0, eps = torch.randn(2, 8, 1), torch.randn(2, 8, 1)
    assert torch.equal(by_x0.target(x0, eps), x0) and torch.equal(by_eps.target(x0, eps), eps)
    with pytest.raises(ValueError, match="prediction"):
        Diffusion(10, prediction="v")


def test_one_chain_over_several_sets_equals_each_set_alone():
    from nshot.methods.timemode.experiments import randomise
    from nshot.methods.timemode.model import Denoiser, Diffusion, generate, generate_many

    torch.set_num_threads(1)
    cfg = TimeModeConfig.from_preset("smoke", experts=4, top_k=2, basis=2, d_model=16)
    net = Denoiser(cfg).eval()
    randomise(net, 3)
    for p in net.parameters():  # a denoiser whose ε̂ is not near zero, nor saturated
        p.data.mul_(0.5)
    diffusion = Diffusion(cfg.diffusion_steps)
    gen = torch.Generator().manual_seed(0)
    sets = [(torch.rand(3, cfg.window, 1, generator=gen), 5, 11),
            (torch.rand(1, cfg.window, 1, generator=gen), 2, 11),
            (torch.rand(4, cfg.window, 1, generator=gen), 7, 4)]  # fmt: skip
    alone = [generate(net, diffusion, *s) for s in sets]
    together = generate_many(net, diffusion, sets)
    assert [len(x) for x in together] == [5, 2, 7]
    for a, b in zip(alone, together, strict=True):
        torch.testing.assert_close(b, a, atol=1e-5, rtol=1e-5)
    # the same exemplars and seed in two sets give the same samples; another seed does not
    twice = generate_many(net, diffusion, [sets[0], sets[0], (sets[0][0], 5, 12)])
    torch.testing.assert_close(twice[0], twice[1], atol=1e-5, rtol=1e-5)
    assert (twice[0] - twice[2]).abs().max() > 1e-2


def test_shared_expert_always_contributes_and_the_router_follows_the_prompt():
    from nshot.methods.timemode.experiments import randomise
    from nshot.methods.timemode.model import Denoiser

    cfg = TimeModeConfig.from_preset("smoke", experts=4, top_k=2, basis=2)
    net = Denoiser(cfg).eval()
    randomise(net, 1)
    x, t = torch.randn(4, 24, 1), torch.tensor([1, 2, 3, 4])
    ex1, ex2 = torch.rand(4, 24, 1), torch.rand(4, 24, 1)
    with torch.no_grad():
        a, b = net(x, t, ex1), net(x, t, ex2)
        assert not torch.allclose(a.routings[0].scores, b.routings[0].scores)
        mlp = net.blocks[0].mlp
        z, c = torch.randn(4, 24, cfg.d_model), torch.randn(4, cfg.d_model)
        dp = net.domain_prompt(ex1, 4)
        full, r = mlp(z, c, dp)
        routed = full - mlp.shared(z, c)
        ys = torch.stack([e(z, c) for e in mlp.experts], 2)
        torch.testing.assert_close(routed, (r.gates[..., None] * ys).sum(2))


class _SwiGLUDiTBlock(torch.nn.Module):
    """A DiT block with a SwiGLU MLP that has its own AdaLN, written independently."""

    def __init__(self, d: int, heads: int, n: int) -> None:
        super().__init__()
        self.heads = heads
        self.qkv, self.proj = torch.nn.Linear(d, 3 * d), torch.nn.Linear(d, d)
        self.ada = torch.nn.Linear(d, 6 * d)
        self.mlp_ada = torch.nn.Linear(d, 2 * d)
        self.w_gate, self.w_up = torch.nn.Linear(d, n * d), torch.nn.Linear(d, n * d)
        self.w_down = torch.nn.Linear(n * d, d)

    def forward(self, h: torch.Tensor, c: torch.Tensor) -> torch.Tensor:
        ln = torch.nn.functional.layer_norm
        b, length, d = h.shape
        sh1, sc1, g1, sh2, sc2, g2 = self.ada(torch.nn.functional.silu(c))[:, None].chunk(6, -1)
        u = ln(h, (d,), eps=1e-6) * (1 + sc1) + sh1
        q, k, v = self.qkv(u).reshape(b, length, 3, self.heads, -1).permute(2, 0, 3, 1, 4)
        att = torch.softmax(q @ k.transpose(-1, -2) / (d // self.heads) ** 0.5, -1) @ v
        h = h + g1 * self.proj(att.transpose(1, 2).reshape(b, length, d))
        z = ln(h, (d,), eps=1e-6) * (1 + sc2) + sh2
        msh, msc = self.mlp_ada(torch.nn.functional.silu(c))[:, None].chunk(2, -1)
        w = ln(z, (d,), eps=1e-6) * (1 + msc) + msh
        y = self.w_down(torch.nn.functional.silu(self.w_gate(w)) * self.w_up(w)) + z
        return h + g2 * y


def test_dense_variant_equals_a_dit_with_a_swiglu_mlp():
    from nshot.methods.timemode.experiments import randomise
    from nshot.methods.timemode.model import Block

    cfg = TimeModeConfig.from_preset("smoke", system="dit_dense", d_model=16, heads=2)
    block = Block(cfg).eval()
    randomise(block, 2)
    ref = _SwiGLUDiTBlock(16, 2, cfg.expansion).eval()
    e = block.mlp.shared
    pairs = [(ref.qkv, block.attn.qkv), (ref.proj, block.attn.proj), (ref.ada, block.ada),
             (ref.mlp_ada, e.ada), (ref.w_gate, e.gate), (ref.w_up, e.up),
             (ref.w_down, e.down)]  # fmt: skip
    with torch.no_grad():
        for mine, theirs in pairs:
            mine.weight.copy_(theirs.weight)
            mine.bias.copy_(theirs.bias)
        h, c = torch.randn(3, 24, 16), torch.randn(3, 16)
        out, routing = block(h, c, None, "dense")
        assert routing is None and not hasattr(block.mlp, "experts")
        torch.testing.assert_close(out, ref(h, c), atol=1e-5, rtol=1e-5)


def test_frozen_fine_tune_keeps_attention_prototypes_and_shared_expert():
    """The timemode_frozen row's fine-tune: the parts it freezes keep their pre-trained values
    in the trained weights and in the EMA the samples come from; every other part trains."""
    from nshot.methods.timemode.experiments import FROZEN, _weights
    from nshot.methods.timemode.train import fit, stage_data

    cfg = TimeModeConfig.from_preset("smoke", pretrain_steps=4, finetune_steps=4, ema_start=1,
                                     ema=0.5, experts=2, top_k=1)  # fmt: skip
    pre = _weights(fit(cfg, stage_data(cfg)))
    ft = cfg.replace(stage="finetune", init_from="(in memory)", freeze=FROZEN)
    state = fit(ft, stage_data(ft), init={k: torch.from_numpy(v) for k, v in pre.items()})

    def frozen(name: str) -> bool:
        return ".attn." in name or ".mlp.shared." in name or name.endswith(".mlp.prototypes")

    names = list(state.net.state_dict())
    # qkv and proj (weights, biases), the prototypes, the shared expert's ada, gate, up, down
    assert sum(map(frozen, names)) == 13
    for part in ("net", "ema"):
        for name, value in getattr(state, part).state_dict().items():
            if frozen(name):
                start = pre[f"ema.{name}"]
                np.testing.assert_array_equal(value.numpy(), start, err_msg=f"{part}.{name}")
    trained = state.net.state_dict()
    for name in ("embed.weight", "blocks.0.mlp.router.weight", "blocks.0.mlp.experts.0.up.weight",
                 "blocks.0.ada.weight", "prompt.lin.weight", "out.weight"):  # fmt: skip
        assert not np.array_equal(trained[name].numpy(), pre[f"ema.{name}"]), name


def test_resemblance_measures_each_target_against_every_corpus_domain():
    from nshot.methods.timemode.data import SYNTH_DOMAINS
    from nshot.methods.timemode.experiments import resemblance

    cfg = TimeModeConfig.from_preset("smoke")
    r = resemblance(cfg, n=64)
    assert list(r) == ["damped"]  # smoke's target is the damped one
    d = r["damped"]
    assert set(d["per_domain"]) == set(SYNTH_DOMAINS)
    assert d["nearest"] == min(d["per_domain"].values()) > 0
    assert d["per_domain"][d["nearest_domain"]] == d["nearest"] <= d["mean"]


def test_metrics_separate_real_from_structureless_noise():
    from nshot.methods.timemode.baselines import ar_samples, marginal_noise_samples
    from nshot.methods.timemode.data import damped
    from nshot.methods.timemode.evaluation import disc_score, features, fid_feat, js_divergence

    torch.set_num_threads(1)
    rng = np.random.default_rng(0)
    real = damped(300, 24, rng)[..., None]
    shots = real[:50]
    noise = marginal_noise_samples(shots, 300, seed=0)
    same = damped(300, 24, np.random.default_rng(1))[..., None]
    assert features(real).shape == (300, 24)
    assert fid_feat(real, noise) > 5 * fid_feat(real, same)
    # a level shift is caught by the GRU within a few dozen iterations, on a 20 % split and
    # under cross-validation (every window tested once); real against real stays near chance
    assert disc_score(real, real + 1.0, iters=40, batch=64, seeds=1) > 0.4
    short, short_same = real[:, :8], same[:, :8]
    assert disc_score(short, short + 1.0, iters=40, batch=64, seeds=1, folds=2) > 0.4
    assert disc_score(short, short_same, iters=40, batch=64, seeds=1, folds=2) < 0.1
    ar = ar_samples(shots, 50, seed=0)
    assert ar.shape == (50, 24, 1) and np.isfinite(ar).all()
    # roughness: white noise has Δx std √2 × its std and Δx lag-1 autocorrelation −0.5; the
    # damped oscillations are smooth (small Δx, positively correlated)
    from nshot.methods.timemode.evaluation import roughness

    white = roughness(np.random.default_rng(2).normal(size=(2000, 24, 1)))
    assert white["dx_ratio"] == pytest.approx(np.sqrt(2), abs=0.05)
    assert white["dx_acf1"] == pytest.approx(-0.5, abs=0.05) and white["hf_share"] > 0.4
    smooth = roughness(real)
    assert smooth["dx_ratio"] < 0.8 and smooth["dx_acf1"] > 0 and smooth["hf_share"] < 0.1
    p = np.array([0.5, 0.5, 0, 0])
    assert js_divergence(p, p) == 0.0
    assert js_divergence(p, np.array([0, 0, 0.5, 0.5])) == pytest.approx(1.0)


def test_roughness_example_reports_every_set_on_smoke(run_example, tmp_path, capsys):
    import json

    out = tmp_path / "roughness.json"
    run_example(
        "timemode_roughness", ["--preset", "smoke", "--samplers", "ddim", "--out", str(out)]
    )
    report = json.loads(out.read_text())["report"]
    assert set(report) == {
        "real_reference", "real_shots", "from_scratch", "from_scratch[ddim]", "ar_sim",
        "marginal_noise", "timevae",
    }  # fmt: skip
    assert "disc" not in report["real_reference"] and 0 <= report["from_scratch"]["disc"] <= 0.5
    assert "dx_ratio" in capsys.readouterr().out


def test_spread_example_scores_the_reproductions_rows_and_restandardises(run_example, tmp_path):
    """examples/timemode_spread.py on smoke: its disc and fid_feat of both rows are the
    reproduction's own jobs' (an independent path through experiments), and re-standardised
    windows have the real windows' level and spread exactly."""
    import importlib.util
    import json
    from pathlib import Path

    from nshot.methods.timemode.experiments import _finetune_job, _pretrain_job, _scratch_job

    out = tmp_path / "s.json"
    run_example("timemode_spread", ["--preset", "smoke", "--seeds", "1", "--out", str(out)])
    r = json.loads(out.read_text())["seeds"]["0"]
    cfg = TimeModeConfig.from_preset("smoke")
    base = cfg.model_dump()
    weights = _pretrain_job(base, "timemode", cfg.corpus)["weights"]
    ft, sc = _finetune_job(base, "timemode", 0, weights), _scratch_job(base, 0)
    for name, job in (("timemode", ft), ("from_scratch", sc)):
        assert r[name]["disc"] == pytest.approx(job["disc"], abs=1e-12)
        assert r[name]["fid_feat"] == pytest.approx(job["fid_feat"], abs=1e-12)
    path = Path(__file__).parents[1] / "examples" / "timemode_spread.py"
    spec = importlib.util.spec_from_file_location("example_timemode_spread", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    x = np.random.default_rng(0).normal(size=(20, 24, 1)) * np.linspace(0.5, 2, 20)[:, None, None]
    y = mod.restandardise(x, np.array([0.4]), np.array([0.2]))
    np.testing.assert_allclose(y.mean(axis=1), 0.4)
    np.testing.assert_allclose(y.std(axis=1), 0.2)
    assert mod.spread(x)["scale_rel_sd"] > 0.1 and mod.spread(y)["scale_rel_sd"] < 1e-9
