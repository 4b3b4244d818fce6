"""urs: the MTPOMO baseline (POMO with attribute composition), its budget and decoding, the
per-instance paired headline against it, the seen-variant savings control, and the reference
gap beside the scaling curve."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from nshot.method import get
from nshot.methods.urs.checker import check
from nshot.methods.urs.config import SEEN_SMALL, UNSEEN_ALL, URSConfig
from nshot.methods.urs.model import URSNet, build_model, solve
from nshot.methods.urs.mtpomo import MTPOMONet, mtpomo_features
from nshot.methods.urs.representation import Instances, generate


def _mtpomo_cfg(preset: str = "smoke", **kw) -> URSConfig:
    from nshot.methods.urs.experiments import SYSTEM_OVERRIDES

    base = get("urs").config(preset).model_dump()
    return URSConfig.validated({**base, **SYSTEM_OVERRIDES["mtpomo"], **kw})


def test_mtpomo_features_compose_attributes_with_neutral_values():
    """Signed demand (backhauls negative, MTPOMO's convention), windows [0, 1] and zero
    service without time windows; the depot reads its coordinates only."""
    inst = generate("VRPB", 10, 2, 0)
    dep, cust = mtpomo_features(inst)
    assert dep.shape == (2, 1, 2) and cust.shape == (2, 10, 6)
    q = (inst.linehaul[:, 1:] - inst.backhaul[:, 1:]) / inst.capacity[:, None]
    assert np.allclose(cust[..., 2], q) and (cust[..., 2] < 0).any()
    assert np.all(cust[..., 3] == 0) and np.all(cust[..., 4] == 1) and np.all(cust[..., 5] == 0)
    tw = generate("VRPTW", 10, 1, 0)
    _, c = mtpomo_features(tw)
    assert (c[..., 3] > 0).all() and (c[..., 4] < 1).all() and (c[..., 5] > 0).all()
    assert np.allclose(c[..., :2], tw.locs[:, 1:])


def test_mtpomo_is_pomo_without_urs_modules_and_decodes_every_variant_feasibly():
    cfg = _mtpomo_cfg()
    net = build_model(cfg)
    assert isinstance(net, MTPOMONet) and not isinstance(net, URSNet)
    assert net.clip == 10.0 and net.heads == cfg.heads
    names = {n for n, _ in net.named_parameters()}
    assert not any("generator" in n or "w_base" in n or "alpha" in n for n in names)
    torch.manual_seed(0)
    for p in net.parameters():  # a random policy explores more of the masks
        p.data.add_(0.3 * torch.randn_like(p))
    for variants in ([*SEEN_SMALL, *UNSEEN_ALL[:14]], ["MDVRP", "MDVRPTW", "MDOVRPTW"]):
        inst = Instances.concat([generate(v, 10, 1, k) for k, v in enumerate(variants)])
        for i, s in enumerate(solve(net, inst, starts=6, aug=8)):
            rep = check(inst, s["routes"], s["depots"], i)
            assert rep.feasible, f"mtpomo {inst.variants[i]}: {rep.violations[:3]}"
            assert rep.cost == pytest.approx(s["cost"], rel=1e-9, abs=1e-9)
    # the same solutions whatever the batch composition (no cross-instance leakage)
    inst = generate("VRPBLTW", 10, 3, 1)
    alone = solve(net, inst[1:2], starts=6, aug=8)[0]
    assert solve(net, inst, starts=6, aug=8)[1]["routes"] == alone["routes"]


def test_mtpomo_trains_with_the_urs_recipe():
    """The same trainer (POMO REINFORCE, the step's batch from the same generator): a finite
    loss and weights that move."""
    from nshot.methods.urs.train import train_in_process

    cfg = _mtpomo_cfg(steps=3, log_every=100, checkpoint_every=100)
    before = {k: v.clone() for k, v in build_model(cfg).state_dict().items()}
    net, steps = train_in_process(cfg)
    assert isinstance(net, MTPOMONet) and len(steps) == 3
    assert all(np.isfinite(s["loss"]) and s["train_cost"] > 0 for s in steps)
    after = net.state_dict()
    assert any(not torch.equal(before[k], after[k]) for k in before)


def test_small_trains_mtpomo_with_urs_budget_and_evaluates_at_the_training_size():
    """MTPOMO differs from URS only in its network (and POMO's logit clipping); the training
    budget, generator, seen variants and decoding are URS's. N = 20, the training size, is an
    evaluation size (the seen-gap check and the savings control read it)."""
    from nshot.methods.urs.experiments import SYSTEM_OVERRIDES

    small = get("urs").config("small")
    assert "mtpomo" in small.systems and small.experiment_seeds >= 3
    assert small.eval_sizes == [20, 50] and small.train_sizes[0] in small.eval_sizes
    assert set(SYSTEM_OVERRIDES["mtpomo"]) == {"arch", "mbm", "generator", "clip"}
    urs = small.model_dump()
    mt = _mtpomo_cfg("small").model_dump()
    changed = {k for k in urs if urs[k] != mt[k]}
    assert changed == {"arch", "mbm", "generator", "clip"}
    # the old same-backbone flags model is still a row of its own
    assert SYSTEM_OVERRIDES["urs_flags"] == {"mbm": False, "generator": False, "encoding": "flags"}


def test_instance_gaps_pair_by_instance_and_average_the_seeds():
    from nshot.methods.urs.experiments import instance_gaps

    refs = {("A", 20): [{"cost": 10.0, "feasible": True}, {"cost": 5.0, "feasible": False}],
            ("B", 20): [{"cost": 4.0, "feasible": True}]}  # fmt: skip

    def res(a0, a1, b0):
        return {("A", 20): [{"cost": a0}, {"cost": a1}], ("B", 20): [{"cost": b0}]}

    got = instance_gaps([res(11.0, 9.0, 5.0), res(12.0, 1.0, 4.0)], refs, ["A", "B"], [20])
    assert got == pytest.approx([15.0, 12.5])  # the infeasible reference's instance is left out
    assert instance_gaps([{("A", 20): [None, None], ("B", 20): [{"cost": 4.0}]}], refs,
                         ["A", "B"], [20]) is None  # fmt: skip
    missing = {("A", 20): res(1, 1, 1)[("A", 20)]}  # no solutions of B at all
    assert instance_gaps([res(1, 1, 1), missing], refs, ["A", "B"], [20]) is None


def test_mtpomo_headline_is_paired_over_instances_and_needs_both_feasible():
    from nshot.claims import evaluate_claim

    claim = next(c for c in get("urs").claims if c.id == "urs_beats_mtpomo_unseen")
    assert claim.kind == "headline" and claim.test == "paired_t"
    assert claim.references() == [("urs", "gap_pct_unseen_inst"),
                                  ("mtpomo", "gap_pct_unseen_inst")]  # fmt: skip
    rng = np.random.default_rng(0)
    mt = rng.uniform(5, 20, 200)
    urs = mt - 2 + rng.normal(0, 1, 200)
    rows = {s: {"gap_pct_unseen_inst": float(np.mean(v)), "feasible_pct_unseen": 100.0}
            for s, v in (("urs", urs), ("mtpomo", mt))}  # fmt: skip
    samples = {"urs": {"gap_pct_unseen_inst": list(urs)},
               "mtpomo": {"gap_pct_unseen_inst": list(mt)}}  # fmt: skip
    res = {"preset": "small", "rows": rows, "samples": samples}
    out = evaluate_claim(claim, res)
    assert out["holds"] is True and out["effect"]["n"] == 200 and out["p"] < 0.05
    flip = {"urs": samples["mtpomo"], "mtpomo": samples["urs"]}
    rows_flip = {"urs": rows["mtpomo"], "mtpomo": rows["urs"]}
    assert evaluate_claim(claim, {**res, "rows": rows_flip, "samples": flip})["holds"] is False
    bad = {**rows, "mtpomo": {**rows["mtpomo"], "feasible_pct_unseen": 99.0}}
    assert evaluate_claim(claim, {**res, "rows": bad})["holds"] is None
    assert evaluate_claim(claim, {**res, "samples": {}})["holds"] is None
    assert evaluate_claim(claim, {**res, "preset": "smoke"})["holds"] is None


def _cell(variant, n, split, **costs):
    return {"variant": variant, "n": n, "split": split, "reference": "pyvrp",
            **{s: None if c is None else {"cost": c, "gap_pct": 100 * (c - 10) / 10,
                                           "feasible_pct": 100.0}
               for s, c in costs.items()}}  # fmt: skip


def test_savings_control_reads_the_seen_cells_at_the_training_size():
    from nshot.claims import evaluate_claim
    from nshot.methods.urs.experiments import seen_cells_lost

    cfg = get("urs").config("small")
    pv = [
        _cell("CVRP", 20, "seen", urs=10.0, savings=10.5),
        _cell("CVRP", 50, "seen", urs=12.0, savings=11.0),  # lost, but not at N = 20
        _cell("OVRP", 20, "seen", urs=9.0, savings=9.5),
        _cell("OVRPTW", 20, "unseen", urs=12.0, savings=11.0),  # unseen: not counted
    ]
    extra = seen_cells_lost(pv, cfg, ["savings"])
    assert extra == {"cells_lost_by_urs_seen": {"savings": 1},
                     "cells_lost_by_urs_seen_at_train_size": {"savings": 0}}  # fmt: skip
    claim = next(c for c in get("urs").claims if c.id == "urs_beats_savings_every_seen_variant")
    assert claim.kind == "control"
    res = {"preset": "small", "rows": {}, "extra": extra}
    assert evaluate_claim(claim, res)["holds"] is True
    pv[2]["urs"]["cost"] = 9.5  # a tie is not a win
    res["extra"] = seen_cells_lost(pv, cfg, ["savings"])
    assert evaluate_claim(claim, res)["holds"] is False
    # a config that does not evaluate at its training size has no count: not evaluable
    no20 = cfg.replace(eval_sizes=[50])
    assert "cells_lost_by_urs_seen_at_train_size" not in seen_cells_lost(pv, no20, ["savings"])


def test_scaling_entries_get_the_reference_gap_at_its_budget():
    from nshot.methods.urs.bench import reference_gaps, scaling_benchmark

    net = build_model(get("urs").config("smoke")).eval()
    curve = scaling_benchmark(net, [8], starts=4, aug=1)
    seconds = []
    out = reference_gaps(curve, lambda n: seconds.append(n) or 0.1)
    assert seconds == [8]
    (s,) = out
    assert s["ref_feasible"] and s["ref_solver"].startswith("pyvrp") and s["ref_budget_s"] == 0.1
    assert s["gap_pct"] == pytest.approx(100 * (s["cost"] - s["ref_cost"]) / s["ref_cost"])
    assert s["time_s"] == curve[0]["time_s"]  # the URS measurement is unchanged
