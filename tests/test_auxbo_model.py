"""auxbo surrogate unit tests (the TNP-D surrogate and the BO loop around it): TNP-D masks, the BoTorch
wrapper, checkpoints and the BO loop. Fast, no Ray, tiny models."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from botorch.acquisition.analytic import ProbabilityOfImprovement

from nshot.methods.auxbo.bo import GPEIProposer, RandomProposer, TNPProposer, run_bo, simple_regret
from nshot.methods.auxbo.model import (
    SIGMA_FLOOR,
    TNP,
    TNPCheckpointError,
    TNPConfig,
    count_params,
    evaluate_prediction,
    f_only_plus_params,
    family_stats,
    load_tnp,
    nll_loss,
    sample_batch,
    save_tnp,
)
from nshot.methods.auxbo.surrogate import TNPModel, propose_continuous, propose_discrete
from nshot.methods.auxbo.taskstore import Task

torch.set_num_threads(1)
ATOL = 1e-5


def _tasks(k: int, seed: int = 0, n: int = 60, T: int = 10, dh: int = 3, D: int = 4) -> list[Task]:
    """A miniature of the synthetic family: h reveals the direction f hides."""
    fam = np.random.default_rng(1234)
    grid = fam.uniform(-1, 1, (n, D))
    A = fam.normal(size=(T, dh, D))
    out = []
    for i in range(k):
        r = np.random.default_rng([seed, i])
        tau = r.uniform(-1, 1, D)
        diff = grid - tau
        f = np.exp(-(diff**2).sum(1) / 0.5) + r.normal(0, 0.01, n)
        h = np.tanh(np.einsum("tcd,nd->ntc", A, diff)) + r.normal(0, 0.05, (n, T, dh))
        out.append(
            Task(
                name=f"mini/{seed}/{i}",
                family="synthetic",
                X=((grid + 1) / 2).astype(np.float32),
                f=f.astype(np.float32),
                h=h.astype(np.float32),
                h_names=("a", "b", "c"),
            )
        )
    return out


def _cfg(**over) -> TNPConfig:
    base = dict(x_dim=4, h_len=10, h_dim=3, d=16, heads=2, layers_h=1, layers=2)
    return TNPConfig(**{**base, **over})


def _model(seed: int = 0, **over) -> TNP:
    torch.manual_seed(seed)
    return TNP(_cfg(**over)).eval()


def _inputs(b: int = 2, n: int = 5, m: int = 7, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    return (
        torch.rand(b, n, 4, generator=g),
        torch.randn(b, n, generator=g),
        torch.randn(b, n, 10, 3, generator=g),
        torch.rand(b, m, 4, generator=g),
    )


# ---------------------------------------------------------------------------------------- TNP


@pytest.mark.parametrize("use_h", [True, False])
def test_shapes_and_sigma_floor(use_h):
    model = _model(use_h=use_h)
    xc, fc, hc, xt = _inputs()
    mu, sigma = model(xc, fc, hc if use_h else None, xt)
    assert mu.shape == sigma.shape == (2, 7)
    assert torch.isfinite(mu).all() and (sigma > SIGMA_FLOOR).all()


def test_targets_are_independent():
    model = _model()
    xc, fc, hc, xt = _inputs(m=9)
    mu, sigma = model(xc, fc, hc, xt)
    for j in (0, 4, 8):
        mu1, s1 = model(xc, fc, hc, xt[:, j : j + 1])
        assert torch.allclose(mu1[:, 0], mu[:, j], atol=ATOL)
        assert torch.allclose(s1[:, 0], sigma[:, j], atol=ATOL)
    perm = torch.randperm(9, generator=torch.Generator().manual_seed(1))
    mu_p, s_p = model(xc, fc, hc, xt[:, perm])
    assert torch.allclose(mu_p, mu[:, perm], atol=ATOL)
    assert torch.allclose(s_p, sigma[:, perm], atol=ATOL)


def test_padding_is_ignored():
    model = _model()
    xc, fc, hc, xt = _inputs(n=3)
    mu, sigma = model(xc, fc, hc, xt)
    # two padding context slots full of garbage (NaN included)
    xp = torch.cat([xc, torch.full((2, 2, 4), float("nan"))], dim=1)
    fp = torch.cat([fc, torch.tensor([[1e6, float("nan")]] * 2)], dim=1)
    hp = torch.cat([hc, 50 * torch.randn(2, 2, 10, 3)], dim=1)
    ctx = torch.tensor([[True] * 3 + [False] * 2] * 2)
    mu2, s2 = model(xp, fp, hp, xt, ctx_mask=ctx)
    assert torch.allclose(mu, mu2, atol=ATOL) and torch.allclose(sigma, s2, atol=ATOL)
    # padded frames: 6 real frames + 4 garbage frames masked == the 6 frames alone
    hm = torch.zeros(2, 3, 10, dtype=torch.bool)
    hm[..., :6] = True
    garbage = hc.clone()
    garbage[..., 6:, :] = float("nan")
    mu3, s3 = model(xc, fc, garbage, xt, h_mask=hm)
    mu4, s4 = model(xc, fc, hc[..., :6, :], xt)
    assert torch.allclose(mu3, mu4, atol=ATOL) and torch.allclose(s3, s4, atol=ATOL)
    # and h matters when it is read
    mu5, _ = model(xc, fc, -hc, xt)
    assert not torch.allclose(mu5, mu, atol=1e-3)


def test_f_only_ignores_h_and_plus_params_matches_capacity():
    model = _model(use_h=False)
    xc, fc, hc, xt = _inputs()
    assert torch.equal(model(xc, fc, hc, xt)[0], model(xc, fc, None, xt)[0])
    full = _cfg(d=64, heads=4, layers=3)
    plus = f_only_plus_params(full)
    assert not plus.use_h and plus.d > full.d and plus.d % plus.heads == 0
    assert abs(count_params(plus) / count_params(full) - 1) < 0.1
    assert count_params(plus) > count_params(TNPConfig(**{**full.to_dict(), "use_h": False}))


def test_config_round_trip_and_validation():
    cfg = _cfg(use_h=False, dropout=0.1)
    assert TNPConfig.from_dict(json.loads(json.dumps(cfg.to_dict()))) == cfg
    with pytest.raises(ValueError, match="unknown"):
        TNPConfig.from_dict({**cfg.to_dict(), "width": 3})
    with pytest.raises(ValueError, match="divisible"):
        _cfg(d=15)


# ---------------------------------------------------------------------------- meta-training


def test_batch_loss_and_evaluation():
    tasks = _tasks(6)
    stats = family_stats(tasks)
    assert {"f_mean", "f_std", "h_mean", "h_std"} <= set(stats)
    batch = sample_batch(tasks, 4, 5, 8, np.random.default_rng(0), stats)
    assert batch["xc"].shape == (4, 5, 4) and batch["hc"].shape == (4, 5, 10, 3)
    assert batch["xt"].shape == (4, 8, 4) and batch["ft"].shape == (4, 8)
    n = batch["ctx_mask"].sum(1)
    assert ((n >= 1) & (n <= 5)).all()
    assert (batch["ctx_mask"][:, :1]).all()  # context left-aligned, padding after
    model = _model()
    model.train()
    loss = nll_loss(model, batch)
    loss.backward()
    assert torch.isfinite(loss) and model.ctx_encoder[0].weight.grad is not None
    ev = evaluate_prediction(model, tasks, (1, 2), m_targets=8, stats=stats, seed=3)
    assert ev == evaluate_prediction(model, tasks, (1, 2), m_targets=8, stats=stats, seed=3)
    assert set(ev) == {1, 2} and all(np.isfinite(v["nll"]) and v["mse"] >= 0 for v in ev.values())
    sh = evaluate_prediction(model, tasks, (2,), m_targets=8, stats=stats, seed=3, h_shuffle=True)
    assert sh[2]["nll"] != ev[2]["nll"]
    pool = _tasks(3, seed=11)
    cross = evaluate_prediction(model, tasks, (2,), m_targets=8, stats=stats, seed=3, h_pool=pool)
    assert cross == evaluate_prediction(
        model, tasks, (2,), m_targets=8, stats=stats, seed=3, h_pool=pool
    )
    assert cross[2]["nll"] not in (ev[2]["nll"], sh[2]["nll"])
    with pytest.raises(ValueError, match="pick one"):
        evaluate_prediction(model, tasks, (2,), 8, stats, h_shuffle=True, h_pool=pool)


def test_cross_task_control_takes_every_h_from_another_task():
    from nshot.methods.auxbo.model import _with_cross_h

    tasks = _tasks(4, seed=2)
    rng = np.random.default_rng(0)
    swapped = _with_cross_h(tasks[0], tasks, rng)
    assert swapped.h.shape == tasks[0].h.shape and swapped.X is tasks[0].X
    donors = np.concatenate([t.h for t in tasks[1:]])
    own = tasks[0].h
    for row in swapped.h:
        assert any(np.array_equal(row, d) for d in donors)
        assert not any(np.array_equal(row, o) for o in own)


# ---------------------------------------------------------------------------------- BoTorch


def _surrogate(model: TNP | None = None, n_ctx: int = 4):
    task = _tasks(1, seed=5)[0]
    stats = family_stats(_tasks(4))
    model = model or _model()
    idx = np.arange(n_ctx)
    return task, stats, model, TNPModel(model, stats, task.X[idx], task.f[idx], task.h[idx])


def test_posterior_shapes_and_values():
    task, stats, model, surr = _surrogate()
    assert surr.num_outputs == 1 and surr.batch_shape == torch.Size([])
    X = torch.rand(3, 5, 4, dtype=torch.float64)
    post = surr.posterior(X)
    assert post.mean.shape == (3, 5, 1) and post.variance.shape == (3, 5, 1)
    assert post.mean.dtype == torch.float64
    assert surr.posterior(X[0]).mean.shape == (5, 1)
    idx = np.arange(4)
    with torch.no_grad():
        mu, sigma = model(
            torch.from_numpy(task.X[idx])[None],
            torch.from_numpy((task.f[idx] - stats["f_mean"]) / stats["f_std"]).float()[None],
            surr._hc[None],
            X.reshape(1, -1, 4).float(),
            None,
            surr._h_mask[None],
        )
    mean = stats["f_mean"] + stats["f_std"] * mu.double().reshape(3, 5, 1)
    var = (stats["f_std"] * sigma.double().reshape(3, 5, 1)) ** 2
    assert torch.allclose(post.mean, mean, atol=1e-5) and torch.allclose(post.variance, var)
    # a point's posterior does not depend on the other points of its batch
    assert torch.allclose(surr.posterior(X[:, 2:3]).mean, post.mean[:, 2:3], atol=1e-6)
    # gradients reach X (optimize_acqf needs them)
    Xg = torch.rand(4, 1, 4, dtype=torch.float64, requires_grad=True)
    pi = ProbabilityOfImprovement(surr, best_f=surr.best_f + 0.01)(Xg)
    assert pi.shape == (4,) and ((pi >= 0) & (pi <= 1)).all()
    pi.sum().backward()
    assert Xg.grad is not None and torch.isfinite(Xg.grad).all()
    assert next(model.parameters()).dtype == torch.float32  # the shared TNP is never cast
    bigger = surr.with_context(task.X[[10]], task.f[[10]], task.h[[10]])
    assert bigger.train_X.shape == (5, 4) and surr.train_X.shape == (4, 4)


def test_proposals():
    task, _, _, surr = _surrogate()
    X = torch.from_numpy(task.X)
    evaluated = np.ones(len(task.f), dtype=bool)
    evaluated[[7, 11]] = False
    assert propose_discrete(surr, X, evaluated) in (7, 11)
    evaluated[:] = False
    evaluated[:4] = True
    i = propose_discrete(surr, X, evaluated, xi=0.01)
    assert 4 <= i < len(task.f)
    with pytest.raises(ValueError, match="every candidate"):
        propose_discrete(surr, X, np.ones(len(task.f), dtype=bool))
    x = propose_continuous(surr, 4, seed=0, n_raw=32, restarts=2)
    assert x.shape == (4,) and ((x >= 0) & (x <= 1)).all()


# -------------------------------------------------------------------------------- checkpoints


def test_save_load_round_trip_and_corruption(tmp_path):
    model = _model(seed=3)
    stats = family_stats(_tasks(3))
    save_tnp(model, stats, tmp_path / "ck", {"steps": 7})
    loaded, stats2, extra = load_tnp(tmp_path / "ck")
    assert stats2 == json.loads(json.dumps(stats)) and extra == {"steps": 7}
    xc, fc, hc, xt = _inputs()
    with torch.no_grad():
        a, b = model(xc, fc, hc, xt), loaded(xc, fc, hc, xt)
    assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1])

    weights = tmp_path / "ck" / "tnp.safetensors"
    raw = bytearray(weights.read_bytes())
    raw[-5] ^= 0xFF
    weights.write_bytes(bytes(raw))
    with pytest.raises(TNPCheckpointError, match="corrupt"):
        load_tnp(tmp_path / "ck")

    save_tnp(model, stats, tmp_path / "ck2")
    meta_path = tmp_path / "ck2" / "tnp.json"
    meta = json.loads(meta_path.read_text())
    meta["config"]["d"] = 32
    meta_path.write_text(json.dumps(meta))
    with pytest.raises(TNPCheckpointError, match="shape|match"):
        load_tnp(tmp_path / "ck2")
    meta_path.write_text("{not json")
    with pytest.raises(TNPCheckpointError, match="JSON"):
        load_tnp(tmp_path / "ck2")
    with pytest.raises(TNPCheckpointError, match="missing"):
        load_tnp(tmp_path / "nothing")


# --------------------------------------------------------------------------------- BO loop


@pytest.mark.parametrize("kind", ["random", "tnp", "tnp_shuffle", "tnp_cross"])
def test_run_bo_never_repeats_and_is_monotone(kind):
    task = _tasks(1, seed=9)[0]
    stats = family_stats(_tasks(4))
    proposer = {
        "random": RandomProposer(),
        "tnp": TNPProposer(_model(), stats),
        "tnp_shuffle": TNPProposer(_model(), stats, h_shuffle=True),
        "tnp_cross": TNPProposer(_model(), stats, h_pool=_tasks(3, seed=4)),
    }[kind]
    trace: list[int] = []
    best = run_bo(task, proposer, budget=12, n_init=2, seed=0, trace=trace)
    assert best.shape == (12,) and len(set(trace)) == 12
    assert np.all(np.diff(best) >= 0)
    assert np.allclose(best, np.maximum.accumulate(task.f[trace]))
    reg = simple_regret(task, best)
    assert np.all((reg >= 0) & (reg <= 1)) and np.all(np.diff(reg) <= 0)
    assert np.array_equal(best, run_bo(task, proposer, 12, 2, seed=0))  # deterministic, reusable


def test_gp_finds_the_max_of_an_easy_task_faster_than_random():
    grid = np.linspace(0, 1, 40, dtype=np.float32)[:, None]
    f = (-((grid[:, 0] - 0.63) ** 2)).astype(np.float32)
    task = Task("easy1d", "test", grid, f, np.zeros((40, 1, 1), np.float32), ("z",))
    budget = 12

    def steps_to_max(proposer, seed):
        trace: list[int] = []
        run_bo(task, proposer, budget, 1, seed, trace=trace)
        best = int(np.argmax(f))
        return trace.index(best) + 1 if best in trace else budget + 1

    seeds = range(4)
    gp = np.mean([steps_to_max(GPEIProposer(), s) for s in seeds])
    rnd = np.mean([steps_to_max(RandomProposer(), s) for s in seeds])
    assert gp < rnd and gp <= 8


def test_meta_train_keeps_the_step_with_the_lowest_held_back_nll():
    from nshot.method import NshotError
    from nshot.methods.auxbo.config import AuxBOConfig
    from nshot.methods.auxbo.train import meta_train, selection_nll, selection_split

    tasks = _tasks(12)
    stats = family_stats(tasks)
    cfg = AuxBOConfig.from_preset("smoke", steps=12, select_tasks=3, select_every=4, lr=3e-2)
    fit, held = selection_split(cfg, tasks)
    assert len(fit) == 9 and len(held) == 3 and not {t.name for t in fit} & {t.name for t in held}
    assert selection_split(cfg, tasks) == (fit, held)  # seeded
    sel: dict = {}
    model, _ = meta_train(cfg, tasks, stats, True, selection=sel)
    assert sel["steps"] == [4, 8, 12] and sel["tasks"] == [t.name for t in held]
    assert sel["best_nll"] == min(sel["nll"]) and sel["best_step"] in sel["steps"]
    m = min(cfg.m_targets, 59)
    assert selection_nll(model, held, m, stats, cfg.seed) == pytest.approx(
        sel["best_nll"], abs=1e-6
    )
    with pytest.raises(NshotError, match="leaves no history task"):
        selection_split(AuxBOConfig.from_preset("smoke", select_tasks=12), tasks)


def test_meta_train_h_shuffle_trains_and_selects_on_shuffled_h(monkeypatch):
    """The h_set control: every batch and the step selection take h from other designs."""
    import nshot.methods.auxbo.train as M
    from nshot.methods.auxbo.config import AuxBOConfig

    tasks = _tasks(12)
    stats = family_stats(tasks)
    cfg = AuxBOConfig.from_preset("smoke", steps=8, select_tasks=3, select_every=4, lr=3e-2)
    flags = []
    real = M.sample_batch

    def spy(*args, **kwargs):
        flags.append(kwargs.get("h_shuffle", False))
        return real(*args, **kwargs)

    monkeypatch.setattr(M, "sample_batch", spy)
    sel: dict = {}
    model, _ = M.meta_train(cfg, tasks, stats, True, selection=sel, h_shuffle=True)
    assert flags == [True] * cfg.steps
    _, held = M.selection_split(cfg, tasks)
    m = min(cfg.m_targets, 59)
    kept = M.selection_nll(model, held, m, stats, cfg.seed, h_shuffle=True)
    assert kept == pytest.approx(sel["best_nll"], abs=1e-6)
    assert M.selection_nll(model, held, m, stats, cfg.seed) != pytest.approx(kept, abs=1e-6)
    plain, _ = M.meta_train(cfg, tasks, stats, True)
    assert any(
        not torch.equal(a, b)
        for a, b in zip(model.state_dict().values(), plain.state_dict().values())
    )
    with pytest.raises(ValueError, match="needs a model that reads h"):
        M.meta_train(cfg, tasks, stats, False, h_shuffle=True)


def test_run_bo_seeds_torch_for_the_run_and_restores_it():
    """GP fits may restart from torch's global RNG: a run must not depend on what ran before."""

    class TorchRandom:
        def propose(self, task, evaluated_idx, rng):
            free = [i for i in range(len(task.f)) if i not in evaluated_idx]
            return free[int(torch.randint(len(free), ()))]

    task = _tasks(1, seed=3)[0]
    torch.manual_seed(123)
    before = torch.rand(3)
    torch.manual_seed(123)
    a, b = [], []
    run_bo(task, TorchRandom(), 10, 1, seed=5, trace=a)
    assert torch.equal(torch.rand(3), before)  # the caller's RNG stream is untouched
    torch.rand(50)  # a different global state ...
    run_bo(task, TorchRandom(), 10, 1, seed=5, trace=b)
    assert a == b  # ... the same run


def test_set_information_sees_task_information_only_where_h_carries_it():
    """R² of the optimum from the mean h of random designs: high when h depends on the task
    (the synthetic family), about zero when every task's h comes from one distribution."""
    from dataclasses import replace

    from nshot.methods.auxbo.experiments import set_information, task_optimum

    train, test = _tasks(80, seed=0), _tasks(30, seed=1)
    assert np.allclose(task_optimum(test[0]), test[0].X[np.argmax(test[0].f)])
    informative = set_information(train, test, sizes=(1, 10), draws=8)
    assert set(informative) == {"optimum", "profile"}
    assert informative["optimum"][10] > 0.6
    assert informative["optimum"][10] > informative["optimum"][1]
    assert informative["profile"][10] > 0.2
    rng = np.random.default_rng(5)

    def blind(t: Task) -> Task:
        return replace(t, h=rng.normal(size=t.h.shape).astype(np.float32))

    null = set_information(
        [blind(t) for t in train], [blind(t) for t in test], sizes=(10,), draws=8
    )
    assert null["optimum"][10] < 0.1 and null["profile"][10] < 0.1
