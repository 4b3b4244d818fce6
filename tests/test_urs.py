"""urs: unified representation, independent checker, feasible decoding, training and serving."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from pydantic import ValidationError

from nshot.method import ConfigError, get
from nshot.methods.urs.checker import check
from nshot.methods.urs.config import SEEN_SMALL, UNSEEN_ALL, URSConfig
from nshot.methods.urs.heuristics import nearest_neighbour, savings
from nshot.methods.urs.model import URSNet, solve
from nshot.methods.urs.representation import (
    Instances,
    generate,
    parse_variant,
    udr_features,
    variant_name,
)

ALL_VARIANTS = [*SEEN_SMALL, *UNSEEN_ALL]


def make(
    locs,
    lin=None,
    back=None,
    Q=math.inf,
    tw=None,
    svc=None,
    open_route=False,
    L=math.inf,
    bclass=1,
    M=1,
) -> Instances:
    V = len(locs)
    t = np.zeros((1, V, 2))
    t[..., 1] = np.inf
    if tw is not None:
        t[0] = np.asarray(tw, float)
    return Instances(
        locs=np.asarray(locs, float)[None],
        linehaul=np.asarray(lin or [0] * V, float)[None],
        backhaul=np.asarray(back or [0] * V, float)[None],
        capacity=np.asarray([Q], float),
        tw=t,
        service=np.asarray(svc or [0] * V, float)[None],
        open_route=np.asarray([open_route]),
        distance_limit=np.asarray([L], float),
        backhaul_class=np.asarray([bclass]),
        num_depots=M,
    )


SQUARE = [[0, 0], [1, 0], [1, 1], [0, 1], [0.5, 0.5]]  # depot + 4 customers


# --------------------------------------------------------------------------- representation


def test_variant_names_round_trip_and_neutral_values():
    for v in ALL_VARIANTS:  # 50 customers: at least one backhaul in B variants (p = 1 - 0.8^50)
        inst = generate(v, 50, 2, 0)
        assert variant_name(inst, 0) == v == variant_name(inst, 1)
    with pytest.raises(ValueError, match="unknown variant 'VRPX'"):
        parse_variant("VRPX")
    node, glob = udr_features(generate("CVRP", 10, 3, 0))
    # [x, y, q_lin/Q, q_back/Q, e/T, l/T, s/T, is_depot]; absent: backhaul 0, [e, l] = [0, 1], s 0
    assert np.all(node[..., 3] == 0) and np.all(node[..., 4] == 0)
    assert np.all(node[..., 5] == 1) and np.all(node[..., 6] == 0)
    assert np.all(node[:, 0, 7] == 1) and np.all(node[:, 1:, 7] == 0)
    # [10/Q, closed, 1/L, precedence, 1/T]: no limit, no windows, no backhauls -> 0
    assert np.allclose(glob[:, 0], 10 / 30) and np.all(glob[:, 1] == 1)
    assert np.all(glob[:, 2:] == 0)
    node, glob = udr_features(generate("TSP", 10, 2, 0))
    assert np.all(node[..., 2] == 0) and np.all(glob[:, 0] == 0)  # Q = inf -> q/Q = 0
    node, glob = udr_features(generate("OVRPBLTW", 10, 2, 0))
    assert np.all(glob[:, 1] == 0) and np.all(glob[:, 2] > 0) and np.all(glob[:, 3] == 1)
    assert np.allclose(glob[:, 4], 1 / 4.6) and (node[:, 1:, 4] > 0).all()
    _, glob = udr_features(generate("VRPMB", 10, 2, 0))
    assert np.all(glob[:, 3] == 0)  # mixed backhaul: backhaul nodes, no precedence
    node, _ = udr_features(generate("MDVRP", 10, 2, 0))
    assert np.all(node[:, :3, 7] == 1) and np.all(node[:, 3:, 7] == 0)


def test_config_rejects_unknown_variant_and_field():
    with pytest.raises(ConfigError, match="unseen_variants.*unknown variant"):
        URSConfig.from_preset("smoke", unseen_variants=["VRPQ"])
    with pytest.raises(ConfigError, match="unknown field"):
        URSConfig.from_preset("smoke", bogus=1)
    with pytest.raises(ConfigError, match="multi-depot variants are test-only"):
        URSConfig.from_preset("smoke", seen_variants=["MDVRP"])


def test_clustered_layout_test_sets_and_training_mix():
    """``"<variant>@clustered"``: customers in Gaussian clusters around 3–8 seeds (the X
    benchmark's clustered layout), seeded like the uniform sets; the uniform stream is
    unchanged by the layouts (a one-layout mix draws nothing more)."""
    from nshot.methods.urs.representation import generate_mixed, split_layout, test_set

    assert split_layout("VRPTW@clustered") == ("VRPTW", "clustered")
    assert split_layout("CVRP") == ("CVRP", "uniform")
    with pytest.raises(ValueError, match="unknown layout 'grid'"):
        split_layout("CVRP@grid")
    with pytest.raises(ValueError, match="unknown variant"):
        split_layout("VRPX@clustered")
    clu = test_set("VRPTW@clustered", 100, 4, 10_000)
    uni = test_set("VRPTW", 100, 4, 10_000)
    assert np.array_equal(clu.locs, test_set("VRPTW@clustered", 100, 4, 10_000).locs)
    assert clu.variants == ["VRPTW"] * 4 and np.isfinite(clu.tw[:, 1:, 1]).all()
    assert (clu.locs >= 0).all() and (clu.locs <= 1).all()

    def mean_nn(inst):  # mean distance from a customer to its nearest other customer
        c = inst.locs[:, 1:]
        d = np.linalg.norm(c[:, :, None] - c[:, None], axis=-1) + np.eye(c.shape[1]) * 9
        return float(d.min(-1).mean())

    assert mean_nn(clu) < 0.6 * mean_nn(uni)  # clustered: customers much closer together
    a = generate_mixed(["CVRP", "VRPTW"], 20, 16, np.random.default_rng(5))
    b = generate_mixed(["CVRP", "VRPTW"], 20, 16, np.random.default_rng(5), ["uniform"])
    assert np.array_equal(a.locs, b.locs)
    mixed = generate_mixed(["CVRP"], 30, 64, np.random.default_rng(5), ["uniform", "clustered"])
    spread = [float(np.linalg.norm(x[1:] - x[1:].mean(0), axis=-1).mean()) for x in mixed.locs]
    assert min(spread) < 0.25 < max(spread)  # both layouts in one batch
    cfg = URSConfig.from_preset("smoke", clustered_variants=["CVRP"])
    from nshot.methods.urs.experiments import split_of, test_sets

    assert test_sets(cfg)[-1] == "CVRP@clustered" and split_of(cfg, "CVRP@clustered") == "clustered"
    with pytest.raises(ConfigError, match="clustered_variants.*unknown variant"):
        URSConfig.from_preset("smoke", clustered_variants=["VRPQ"])


# --------------------------------------------------------------------------- checker


def test_checker_accepts_feasible_and_computes_open_cost():
    inst = make(SQUARE, lin=[0, 1, 1, 1, 1], Q=4)
    rep = check(inst, [[1, 2, 3, 4]])
    assert rep.feasible, rep.violations
    closed = 1 + 1 + 1 + math.hypot(0.5, 0.5) + math.hypot(0.5, 0.5)
    assert rep.cost == pytest.approx(closed)
    open_ = make(SQUARE, lin=[0, 1, 1, 1, 1], Q=4, open_route=True)
    assert check(open_, [[1, 2, 3, 4]]).cost == pytest.approx(closed - math.hypot(0.5, 0.5))


@pytest.mark.parametrize(
    "kind, inst, routes, depots",
    [
        ("coverage", make(SQUARE, lin=[0, 1, 1, 1, 1], Q=4), [[1, 2, 3]], None),
        ("coverage", make(SQUARE, lin=[0, 1, 1, 1, 1], Q=4), [[1, 2, 3, 4], [2]], None),
        ("coverage", make(SQUARE, lin=[0, 1, 1, 1, 1], Q=4), [[1, 2, 0, 3, 4]], None),
        ("capacity", make(SQUARE, lin=[0, 2, 2, 2, 2], Q=6), [[1, 2, 3, 4]], None),
        # mixed backhaul: picking up 8 before delivering 5 overloads Q = 10 (5 + 8 > 10)
        ("capacity", make(SQUARE, lin=[0, 5, 0, 0, 0], back=[0, 0, 8, 0, 0], Q=10, bclass=2),
         [[2, 1], [3, 4]], None),
        ("precedence", make(SQUARE, lin=[0, 1, 0, 1, 1], back=[0, 0, 1, 0, 0], Q=10),
         [[2, 1, 3, 4]], None),
        ("time_window", make(SQUARE, tw=[[0, 10], [0, 1], [0, 10], [0, 1.5], [0, 10]]),
         [[3, 2, 1, 4]], None),
        ("depot_time", make(SQUARE, tw=[[0, 3], [0, 10], [0, 10], [0, 10], [0, 10]],
                            svc=[0, 0.5, 0.5, 0.5, 0.5]), [[1, 2, 3, 4]], None),
        ("distance_limit", make(SQUARE, lin=[0, 1, 1, 1, 1], Q=4, L=3.0), [[1, 2, 3, 4]], None),
        ("single_route", make(SQUARE), [[1, 2], [3, 4]], None),
        ("depot", make(SQUARE, lin=[0, 1, 1, 1, 1], Q=4), [[1, 2, 3, 4]], [3]),
    ],
)  # fmt: skip
def test_checker_catches_planted_violations(kind, inst, routes, depots):
    rep = check(inst, routes, depots)
    assert not rep.feasible
    assert kind in rep.kinds(), rep.violations


def test_checker_respects_open_routes_and_mixed_order():
    # the same route is fine when open (no return arc to the depot's closing time / limit)
    tw = [[0, 3], [0, 10], [0, 10], [0, 10], [0, 10]]
    inst = make(SQUARE, tw=tw, svc=[0, 0.5, 0.5, 0.5, 0.5], open_route=True)
    assert check(inst, [[1, 2, 3, 4]]).feasible
    inst = make(SQUARE, lin=[0, 1, 1, 1, 1], Q=4, L=3.8, open_route=True)
    assert check(inst, [[1, 2, 3, 4]]).feasible  # length 3.71 open, 4.41 closed
    assert "distance_limit" in check(make(SQUARE, lin=[0, 1, 1, 1, 1], Q=4, L=3.8),
                                     [[1, 2, 3, 4]]).kinds()  # fmt: skip
    # mixed backhaul: delivering first then picking up fits Q = 10
    inst = make(SQUARE, lin=[0, 5, 0, 0, 0], back=[0, 0, 8, 0, 0], Q=10, bclass=2)
    assert check(inst, [[1, 2], [3, 4]]).feasible


# --------------------------------------------------------------------------- decoding


def _assert_all_feasible(inst: Instances, sols: list[dict], what: str) -> None:
    for i, s in enumerate(sols):
        rep = check(inst, s["routes"], s["depots"], i)
        assert rep.feasible, f"{what} {inst.variants[i]}: {rep.violations[:3]}"
        assert rep.cost == pytest.approx(s["cost"], rel=1e-9, abs=1e-9)


def variant_batches(n: int, per: int, seed: int) -> list[Instances]:
    """Every variant, ``per`` instances each, batched together (single- and multi-depot)."""
    one = [generate(v, n, per, seed + k) for k, v in enumerate(ALL_VARIANTS)]
    return [
        Instances.concat([b for b in one if b.num_depots == 1]),
        Instances.concat([b for b in one if b.num_depots > 1]),
    ]


def test_every_decoded_solution_is_feasible_on_every_variant():
    torch.manual_seed(0)
    net = URSNet(d=16, layers=1, ff=32, gen_rank=2, gen_hidden=16)
    for p in net.parameters():  # a random (not zero-delta) policy explores more of the masks
        p.data.add_(0.3 * torch.randn_like(p))
    for inst in variant_batches(10, 2, 0):
        assert {*inst.variants} <= {*ALL_VARIANTS}
        _assert_all_feasible(inst, solve(net, inst, starts=6, aug=8), "urs")
        _assert_all_feasible(inst, solve(None, inst, 1, 1, mode="random", seed=1), "random")
        _assert_all_feasible(inst, nearest_neighbour(inst), "nearest_neighbour")
    inst = variant_batches(10, 1, 5)[0]
    for i in range(len(inst)):
        sv = savings(inst, i)
        assert check(inst, sv["routes"], sv["depots"], i).feasible, inst.variants[i]


def test_masks_skip_absent_constraints_without_changing_them():
    """A batch of one variant skips the constraints it lacks; the masks equal the full
    evaluation at every step of random rollouts, on every variant."""
    from nshot.methods.urs.env import Env

    gen = torch.Generator().manual_seed(0)
    for variant in ALL_VARIANTS:
        inst = generate(variant, 12, 2, 7)
        fast, full = Env(inst, 6), Env(inst, 6)
        full._any_cap = full._any_back = full._any_tw = full._any_limit = True
        flags = (fast._any_cap, fast._any_back, fast._any_tw, fast._any_limit)
        expect = {"TSP": (False,) * 4, "CVRP": (True, False, False, False),
                  "VRPTW": (True, False, True, False), "VRPBLTW": (True,) * 4}  # fmt: skip
        assert flags == expect.get(variant, flags), variant
        for _ in range(2 * fast.V + 2):
            m = fast.mask()
            assert torch.equal(m, full.mask()), variant
            if bool(fast.done.all()):
                break
            act = torch.multinomial(m.reshape(-1, fast.V).float(), 1, generator=gen)
            act = act.reshape(fast.B, fast.R)
            fast.step(act)
            full.step(act)
        assert bool(fast.done.all()) and torch.equal(fast.cost, full.cost), variant


def test_reference_solvers_express_the_variants():
    """PyVRP 0.14 keywords (pickup, max_distance, multi-depot) and OR-Tools classic backhauls
    (a dependency: without it the reference fails rather than fall back to a weaker one)."""
    from nshot.methods.urs.baselines import reference, supports_pyvrp

    for v, solver in (("OVRPMBL", "pyvrp"), ("MDVRPTW", "pyvrp"), ("VRPBLTW", "ortools")):
        inst = generate(v, 8, 1, 3)
        assert supports_pyvrp(inst) == (solver == "pyvrp")
        sol = reference(inst, 0, 0.2)
        assert sol["solver"].split()[0] == solver
        rep = check(inst, sol["routes"], sol["depots"])
        assert rep.feasible, (v, rep.violations)
        nn = nearest_neighbour(inst)[0]["cost"]
        assert rep.cost <= nn + 1e-9


# --------------------------------------------------------------------------- claims


def _cell(variant, n, split, **costs):
    return {"variant": variant, "n": n, "split": split, "reference": "pyvrp",
            **{s: None if c is None else {"cost": c, "gap_pct": 100 * (c - 10) / 10,
                                           "feasible_pct": 100.0}
               for s, c in costs.items()}}  # fmt: skip


def test_claim_numbers_from_the_per_variant_table():
    from nshot.methods.urs.experiments import cells_lost, gap_by_size

    pv = [
        _cell("CVRP", 20, "seen", urs=11.0, nearest_neighbour=12.0, savings=10.5),
        _cell("CVRP", 50, "seen", urs=12.0, nearest_neighbour=12.0, savings=None),
        _cell("OVRPTW", 20, "unseen", urs=11.5, nearest_neighbour=13.0, savings=12.0),
    ]
    by = gap_by_size(pv, "urs", [20, 50, 100])
    assert by == {"seen": {"20": pytest.approx(10.0), "50": pytest.approx(20.0)},
                  "unseen": {"20": pytest.approx(15.0)}}  # fmt: skip
    assert cells_lost(pv, "urs", ["nearest_neighbour", "savings"]) == {
        "nearest_neighbour": 1,  # a tie is not a win
        "savings": 1,  # the multi-depot-style cell without savings is not counted
    }


def test_claims_on_the_committed_small_results():
    """The claims read the committed results. The earlier one-seed run (``small-v1.json``)
    lacks the numbers several claims need (the seen gap at the training size N = 20, the MTPOMO
    row, per-seed samples): those are n/a there, never true. The three-seed ``small.json``
    records every number every claim reads, and its checks hold."""
    import json
    from pathlib import Path

    from nshot.reproduce import with_claims

    results = Path(__file__).parents[1] / "methods" / "urs" / "results"
    current = with_claims(json.loads((results / "small.json").read_text()))["claims"]
    assert [c["id"] for c in current] == [c.id for c in get("urs").claims]
    assert all(c["holds"] is not None for c in current)
    assert all(c["holds"] for c in current if c["kind"] == "check")
    data = json.loads((results / "small-v1.json").read_text())
    holds = {c["id"]: c["holds"] for c in with_claims(data)["claims"]}
    assert list(holds) == [c.id for c in get("urs").claims]
    assert holds["feasible_everywhere"] and holds["zero_shot_gap"]
    assert holds["seen_gap_le_8pct_at_train_size"] is None
    assert holds["beats_nearest_neighbour_everywhere"] is True
    assert holds["headline_zero_shot_beats_savings"] is None  # one seed, no samples
    # declared before the run that adds them: no mtpomo row, no seen-cell count yet
    assert holds["urs_beats_mtpomo_unseen"] is None
    assert holds["urs_beats_savings_every_seen_variant"] is None
    assert data["rows"]["urs"]["gap_pct_clustered"] is not None  # the clustered test sets
    data["rows"]["urs_no_mbm"]["gap_pct_unseen"] = data["rows"]["urs"]["gap_pct_unseen"] + 0.4
    data["extra"]["cells_lost_by_urs"] = {"nearest_neighbour": 2}
    data["extra"]["gap_pct_by_size"] = {"seen": {"20": 7.5}}
    again = {c["id"]: c["holds"] for c in with_claims(data)["claims"]}
    assert again["ablation_mbm"] is False
    assert again["beats_nearest_neighbour_everywhere"] is False
    assert again["seen_gap_le_8pct_at_train_size"] is True
    smoke = {c["id"]: c["holds"] for c in with_claims({**data, "preset": "smoke"})["claims"]}
    assert smoke["feasible_everywhere"] is True and smoke["zero_shot_gap"] is None


def test_per_variant_table_averages_the_training_seeds():
    from nshot.methods.urs.experiments import _mean_cells, training_seeds

    assert training_seeds(get("urs").config("small")) == [0, 1, 2]
    assert training_seeds(get("urs").config("smoke")) == [0]
    one = [
        _cell("CVRP", 50, "seen", urs=11.0, savings=10.5),
        _cell("MDVRP", 50, "unseen", urs=12.0, savings=None),
    ]
    two = [
        _cell("CVRP", 50, "seen", urs=13.0, savings=10.5),
        _cell("MDVRP", 50, "unseen", urs=14.0, savings=None),
    ]
    assert _mean_cells([one], ["urs", "savings"]) is one
    mean = _mean_cells([one, two], ["urs", "savings"])
    assert mean[0]["urs"] == {"cost": 12.0, "gap_pct": pytest.approx(20.0), "feasible_pct": 100.0}
    assert mean[0]["savings"]["cost"] == 10.5 and mean[1]["savings"] is None
    assert {k: mean[1][k] for k in ("variant", "n", "split")} == {
        "variant": "MDVRP", "n": 50, "split": "unseen"
    }  # fmt: skip


def test_headline_is_paired_over_training_seeds_and_needs_feasibility():
    """The headline (URS's unseen gap below savings's) is a paired test over the per-seed
    samples: not evaluable without them, nor when URS is infeasible somewhere; it holds or
    fails with the seeds' values."""
    from nshot.claims import evaluate_claim

    claim = next(c for c in get("urs").claims if c.kind == "headline")
    assert claim.test == "paired_t" and claim.references() == [
        ("urs", "gap_pct_unseen"),
        ("savings", "gap_pct_unseen"),
    ]
    urs, savings = [9.0, 10.0, 11.5], [14.4] * 3  # savings is deterministic: one value per seed
    rows = {
        "urs": {"gap_pct_unseen": sum(urs) / 3, "feasible_pct_unseen": 100.0},
        "savings": {"gap_pct_unseen": 14.4},
    }
    samples = {"urs": {"gap_pct_unseen": urs}, "savings": {"gap_pct_unseen": savings}}
    res = {"preset": "small", "rows": rows, "samples": samples}
    out = evaluate_claim(claim, res)
    assert out["holds"] is True and out["p"] < 0.05 and out["effect"]["n"] == 3
    assert evaluate_claim(claim, {**res, "samples": {}})["holds"] is None
    infeasible = {**rows, "urs": {**rows["urs"], "feasible_pct_unseen": 99.0}}
    assert evaluate_claim(claim, {**res, "rows": infeasible})["holds"] is None
    worse = {"urs": {"gap_pct_unseen": [15.0, 16.0, 14.9]}, "savings": samples["savings"]}
    rows_worse = {**rows, "urs": {**rows["urs"], "gap_pct_unseen": 15.3}}
    assert evaluate_claim(claim, {**res, "rows": rows_worse, "samples": worse})["holds"] is False


# --------------------------------------------------------------------------- Ray Train + serving


@pytest.fixture(scope="module")
def smoke_run(tmp_path_factory, ray_session):
    from nshot.train import Scaling, fit

    cfg = get("urs").config("smoke")
    storage = tmp_path_factory.mktemp("urs-runs")
    res = fit("urs", cfg, scaling=Scaling(workers=0), storage=storage, name="smoke")
    assert res.checkpoint is not None
    return cfg, storage, res


def test_predictor_answers_its_example_request(smoke_run):
    from nshot.train import load_checkpoint

    cfg, _, res = smoke_run
    pred = get("urs").predictor(load_checkpoint(res.checkpoint, method="urs"))
    example = pred.example_request()
    req = pred.Request.model_validate(example)
    answer = pred(req)
    assert answer.variant == cfg.seen_variants[0] and answer.feasible, answer
    assert sorted(c for r in answer.routes for c in r) == list(range(1, 11))
    assert pred.Response.model_validate_json(answer.model_dump_json()) == answer
    assert pred.batch([req, req])[0] == answer


def test_train_checkpoint_resume_and_predictor(smoke_run):
    from nshot.methods.urs.serve import to_unit_square
    from nshot.train import Scaling, fit, load_checkpoint

    cfg, storage, res = smoke_run
    ckpt = load_checkpoint(res.checkpoint, method="urs")
    assert ckpt.step == cfg.steps and math.isfinite(ckpt.metrics["val_cost"])
    # resume: continue the same run to more steps from its last checkpoint
    more = fit("urs", cfg.replace(steps=cfg.steps + 10), scaling=Scaling(workers=0),
               storage=storage, name="smoke", resume=True)  # fmt: skip
    resumed = load_checkpoint(more.checkpoint, method="urs")
    assert resumed.step == cfg.steps + 10
    assert resumed.extra["resumed_from"] == [cfg.steps]
    # the trained smoke model decodes every variant feasibly
    method = get("urs")
    pred = method.predictor(ckpt)
    net = pred.net
    for inst in variant_batches(10, 2, 100):
        _assert_all_feasible(inst, solve(net, inst, starts=10, aug=8), "trained urs")
    # predictor == in-process solve on a VRPTW instance given in request units (×100)
    inst = generate("VRPBLTW", 10, 1, 7)
    row = inst.to_rows()[0]
    s = 100.0
    req = pred.Request(
        locations=(np.asarray(row["locs"]) * s).tolist(),
        linehaul=row["linehaul"],
        backhaul=row["backhaul"],
        capacity=row["capacity"],
        time_windows=(np.asarray(row["tw"]) * s).tolist(),
        service_times=(np.asarray(row["service"]) * s).tolist(),
        distance_limit=row["distance_limit"] * s,
        augment=True,
    )
    out = pred(req)
    assert out.feasible and not out.violations and out.variant == "VRPBLTW"
    direct = solve(net, to_unit_square(inst), cfg.eval_starts, 8)[0]  # what the server decodes
    assert out.routes == direct["routes"]
    assert out.objective == pytest.approx(check(inst, direct["routes"]).cost * s, rel=1e-9)
    assert pred.batch([req, req])[1].objective == pytest.approx(out.objective)
    metrics = method.evaluate(ckpt, cfg)
    assert metrics["feasible_pct_seen"] == 100.0 and metrics["feasible_pct_unseen"] == 100.0
    assert {"gap_pct_unseen", "nn_cost_unseen", "time_s"} <= set(metrics)


BASE = {
    "locations": [[0, 0], [1, 0], [1, 1], [0, 1]],
    "linehaul": [0, 3, 4, 5],
    "capacity": 10,
}


@pytest.mark.parametrize(
    "change, field, msg",
    [
        ({"linehaul": [0, 3, 40, 5]}, "linehaul[2]", "exceeds the capacity 10"),
        ({"time_windows": [[0, 9], [0, 5], [4, 2], [0, 5]]}, "time_windows[2]", "start 4 is after end 2"),
        ({"locations": [[0, 0], [1, float("nan")], [1, 1], [0, 1]]}, "locations[1]", "NaN"),
        ({"linehaul": [0, 3, 4]}, "linehaul", "3 values for 4 locations"),
        ({"locations": [[0, 0], [1, 0]], "linehaul": [0, 1]}, "locations", "at least 2 customers"),
        ({"time_windows": [[0, 9], [0, 0.5], [0, 5], [0, 5]]}, "time_windows[1]", "cannot be reached"),
        ({"distance_limit": 2.5}, "distance_limit", "customer 2 is 1.414"),
        ({"capacity": None}, "capacity", "required when customers have demands"),
        ({"backhaul": [0, 1, 0, 0]}, "backhaul[1]", "linehaul and backhaul demand"),
    ],
)  # fmt: skip
def test_malformed_requests_are_rejected_naming_the_field(change, field, msg):
    from nshot.methods.urs.serve import URSRequest
    from nshot.serve.app import _errors

    with pytest.raises(ValidationError) as err:
        URSRequest.model_validate({**BASE, **change})
    detail = _errors(err.value)[0]  # what the Serve app answers with its 422
    assert detail["field"] == field and msg in detail["msg"], detail
    URSRequest.model_validate(BASE)  # the base request is valid
