"""examples/gpu_paper_check.py: the GPU check of the paper presets (atha, dirclip) and of the
CUDA paths of cfr and timemode runs at toy sizes on the CPU, every part without an error; and
the timemode denoiser's loss makes no tensor on a fixed device (the bug the GPU run found)."""

from __future__ import annotations

import json
import os

import torch


def test_the_gpu_paper_check_runs_every_part_at_toy_sizes(run_example, nshot_cache, tmp_path):
    before = os.environ.get("NSHOT_IN_PROCESS")
    run_example("gpu_paper_check", ["--tiny", "--out", str(tmp_path)])
    assert os.environ.get("NSHOT_IN_PROCESS") == before  # the cfr part restores it
    rec = json.loads((tmp_path / "gpu_paper_check.json").read_text())
    for part in ("atha", "dirclip", "cfr", "timemode", "train", "bsr_paper"):
        assert "error" not in rec[part], rec[part].get("traceback")
    atha = rec["atha"]
    assert set(atha["episode_seconds"]["1shot"]) == {
        "atha", "coop_lora", "coop", "clip_lora", "zero_shot", "atha_head_only",
        "atha_tail_only", "random_tokens",
    }  # fmt: skip
    assert atha["unit"]["rho0_max_abs_logit_diff"] == 0.0 and atha["paper_hours_estimate"] > 0
    assert rec["dirclip"]["step_s"] > 0 and rec["dirclip"]["paper_hours_estimate"] > 0
    # on the CPU both cfr runs are the same computation, and both timemode dispatches agree
    assert rec["cfr"]["max_abs_diff"] == 0.0
    tm = rec["timemode"]
    assert tm["max_abs_value"] > 1.0 and tm["cpu_sparse_max_abs_diff"] < 1e-5
    assert tm["cpu_loss"] == tm["device_loss"] and tm["grad_rel_diff"] == 0.0
    tr = rec["train"]  # nshot train's steps of bsr and timemode, three each
    assert len(tr["bsr_losses"]["cpu"]) == 3 and len(tr["timemode_losses"]["device"]) == 3
    assert tr["bsr_max_abs_diff"] == 0.0 and tr["timemode_max_rel_diff"] == 0.0
    # tgdt's embedding gradients are summed by several CPU threads in no fixed order
    assert len(tr["tgdt_losses"]["cpu"]) == 3 and tr["tgdt_max_rel_diff"] < 1e-5
    bp = rec["bsr_paper"]  # the smoke shape here: the step runs and its loss is finite
    assert bp["step_s"] > 0 and all(0.5 < v < 2.0 for v in bp["losses"])


def test_the_timemode_loss_follows_its_inputs_device():
    """On the meta device (no data), every tensor the noising, the denoiser and its router
    regularisers create must follow the inputs: a table or constant made on the CPU fails."""
    from nshot.method import get
    from nshot.methods.timemode.model import Diffusion, build_state
    from nshot.methods.timemode.train import loss_terms

    cfg = get("timemode").config("smoke", stage="pretrain", dispatch="dense")
    net = build_state(cfg, 3).net.to("meta")
    x = torch.empty(4, cfg.window, 1, device="meta")
    t = torch.zeros(4, dtype=torch.long, device="meta")
    terms = loss_terms(cfg, net, Diffusion(cfg.diffusion_steps), (x, x, t, x, t))
    assert {v.device.type for v in terms.values()} == {"meta"}
