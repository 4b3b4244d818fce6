"""The DeepSpeed helper: ZeRO stages agree, ZeRO-3 checkpoints load into plain transformers."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import load_file

from nshot.train.deepspeed import DeepSpeedOptions, build_engine, ds_config, memory_report


def test_zero_stages_agree_on_two_ray_workers(ray_session, tmp_path):
    """ZeRO-3 on two Ray Train workers trains the same global batches to the same losses and
    weights as ZeRO-0 in one process (each rank takes its slice of the one global batch, so the
    world size does not change the data; ZeRO-2 is compared with both in one process, below)."""
    from transformers import AutoModelForCausalLM

    from nshot.train.tinylm import pretrain

    losses = {}
    for stage, workers in ((0, 0), (3, 2)):
        res = pretrain(
            "smoke", out=tmp_path / f"z{stage}", workers=workers, zero_stage=stage, steps=4
        )
        meta = json.loads((res.path / "nshot.json").read_text())
        assert meta["world_size"] == max(workers, 1) and meta["zero_stage"] == stage
        losses[stage] = res.losses
        assert len(res.losses) == 4
    # the loss changes over the steps (training happens) ...
    assert abs(losses[0][-1] - losses[0][0]) > 1e-3
    # ... identically under both stages (same seed, same data, same global batch)
    diff = max(abs(a - b) for a, b in zip(losses[0], losses[3], strict=True))
    assert diff < 1e-3, (losses[0], losses[3])

    # a ZeRO-3 checkpoint (gathered from both workers' shards) loads into plain transformers
    # and gives the logits the engine gave
    z3 = tmp_path / "z3"
    probe = load_file(str(z3 / "probe.safetensors"))
    plain = AutoModelForCausalLM.from_pretrained(z3, use_safetensors=True)
    with torch.no_grad():
        logits = plain(input_ids=probe["input_ids"]).logits
    assert torch.allclose(logits, probe["logits"], atol=1e-4), (
        (logits - probe["logits"]).abs().max()
    )
    # and the weights equal the ZeRO-0 run's up to float reordering
    z0 = load_file(str(tmp_path / "z0" / "model.safetensors"))
    w3 = load_file(str(z3 / "model.safetensors"))
    assert z0.keys() == w3.keys()
    assert max((z0[k] - w3[k]).abs().max().item() for k in z0) < 1e-4


def test_ds_config_rejects_inconsistent_options():
    with pytest.raises(ValueError, match="offload_optimizer"):
        ds_config(DeepSpeedOptions(zero_stage=0, offload_optimizer=True))
    with pytest.raises(ValueError, match="offload_params"):
        ds_config(DeepSpeedOptions(zero_stage=2, offload_params=True))
    with pytest.raises(Exception, match="zero_stage"):
        DeepSpeedOptions(zero_stage=4)
    cfg = ds_config(DeepSpeedOptions(zero_stage=3, grad_accum=2, micro_batch=4))
    assert cfg["zero_optimization"]["stage"] == 3
    assert cfg["gradient_accumulation_steps"] == 2
    assert "bf16" not in cfg  # CPU: fp32


def test_build_engine_in_process_trains_only_given_params():
    from transformers import LlamaForCausalLM

    from nshot.nn.lm import tiny_llama_config

    torch.manual_seed(0)
    model = LlamaForCausalLM(tiny_llama_config(50, layers=1, hidden=32, intermediate=64))
    frozen = {k: v.clone() for k, v in model.state_dict().items()}
    head = [model.lm_head.weight]
    engine = build_engine(model, DeepSpeedOptions(lr=1e-2, micro_batch=2), params=head)
    x = torch.randint(0, 50, (2, 8))
    for _ in range(2):
        loss = engine(input_ids=x, labels=x).loss
        engine.backward(loss)
        engine.step()
    after = model.state_dict()
    assert not torch.equal(after["lm_head.weight"], frozen["lm_head.weight"])
    for k, v in frozen.items():
        if k != "lm_head.weight":
            assert torch.equal(after[k], v), k
    mem = memory_report(engine)
    # Adam: two moments per trainable value, fp32
    assert mem["optimizer"] >= 2 * model.lm_head.weight.numel() * 4
    with pytest.raises(ValueError, match="no trainable"):
        build_engine(model, DeepSpeedOptions(), params=[])


def test_engine_builds_again_after_the_process_group_is_recreated():
    """Ray Train's local mode destroys torch's default group after every in-process run; a later
    DeepSpeed engine in the same process must not reuse DeepSpeed's cached (now unregistered)
    sub-groups ("Group ... is not registered")."""
    import torch.distributed as dist
    from transformers import LlamaForCausalLM

    from nshot.nn.lm import tiny_llama_config

    model = LlamaForCausalLM(tiny_llama_config(50, layers=1, hidden=32, intermediate=64))
    x = torch.randint(0, 50, (2, 8))
    for _ in range(2):
        engine = build_engine(model, DeepSpeedOptions(lr=1e-2, micro_batch=2))
        engine.backward(engine(input_ids=x, labels=x).loss)
        engine.step()
        if dist.is_initialized():  # what LocalTorchController.run does at its end; the next
            dist.destroy_process_group()  # build_engine creates the default group again


def test_fp32_zero3_keeps_one_copy_of_each_weight_and_trains_like_zero0():
    """fp32 ZeRO-3 shares the master weights with the parameter partitions (DeepSpeed clones
    them, see ``share_fp32_master``); the optimizer then steps the partitions in place and the
    losses equal ZeRO-0's."""
    from nshot.train.deepspeed import full_state_dict

    def run(stage):
        torch.manual_seed(0)
        model = torch.nn.Sequential(
            torch.nn.Linear(16, 32), torch.nn.Tanh(), torch.nn.Linear(32, 1)
        )
        engine = build_engine(model, DeepSpeedOptions(zero_stage=stage, lr=1e-2, micro_batch=64))
        g = torch.Generator().manual_seed(1)
        x, y = torch.randn(64, 16, generator=g), torch.randn(64, 1, generator=g)
        losses = []
        for _ in range(4):
            loss = ((engine(x) - y) ** 2).mean()
            engine.backward(loss)
            engine.step()
            losses.append(float(loss))
        return losses, full_state_dict(engine), memory_report(engine)

    l0, w0, _ = run(0)
    l2, w2, _ = run(2)
    l3, w3, mem3 = run(3)
    assert l0[-1] < l0[0] - 1e-3
    for lk, wk in ((l2, w2), (l3, w3)):  # ZeRO-2 and ZeRO-3 train exactly like ZeRO-0
        assert max(abs(a - b) for a, b in zip(l0, lk, strict=True)) < 1e-6, (l0, lk)
        assert max((w0[k] - wk[k]).abs().max().item() for k in w0) < 1e-6
    n = sum(t.numel() for t in w0.values())
    assert mem3["master"] == 0 and mem3["params"] == n * 4
    assert mem3["optimizer"] >= 2 * n * 4


def test_cpu_process_group_never_waits_on_a_stale_extension_lock(tmp_path):
    """A DeepSpeed op compile that was killed midway leaves torch's ``lock`` file behind; joining
    a CPU process group must not build (and so wait on) DeepSpeed's shm inference op."""
    import os
    import subprocess
    import sys

    stale = tmp_path / "ext" / "py311_cpu" / "deepspeed_shm_comm"
    stale.mkdir(parents=True)
    (stale / "lock").touch()
    (tmp_path / "ext" / "deepspeed_shm_comm").mkdir()
    (tmp_path / "ext" / "deepspeed_shm_comm" / "lock").touch()
    code = (
        "from nshot.train.deepspeed import init_distributed\n"
        "init_distributed()\n"
        "import importlib\n"
        "cdb = importlib.import_module('deepspeed.comm.comm').cdb\n"
        "print('backend:', type(cdb).__name__, 'shm op:', cdb.shm_comm_op)\n"
    )
    env = {**os.environ, "TORCH_EXTENSIONS_DIR": str(tmp_path / "ext")}
    for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_PORT", "NSHOT_DEEPSPEED_SHM_OP"):
        env.pop(k, None)
    out = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=180
    )
    assert out.returncode == 0, out.stderr[-2000:]
    assert "backend: TorchBackend shm op: None" in out.stdout
