"""Training the tiny Llama models of :mod:`nshot.nn.tinylm`, and resolving a method's ``model``
setting to the folder :func:`nshot.nn.lm.load_causal_lm` loads.

The model (its word-level tokenizer and sizes) is defined in :mod:`nshot.nn.tinylm`; this module
trains it on that corpus through the DeepSpeed helper, in-process or on Ray Train workers, and
caches it::

    path = ensure_tiny_lm("smoke")                  # cached under NSHOT_CACHE/models/
    result = pretrain("smoke", workers=2, zero_stage=3, steps=5, out=tmp)   # on Ray Train
    model, tok = load_causal_lm(resolve_lm_source("tiny-smoke"))

The folder is a normal Hugging Face model (config.json, model.safetensors, tokenizer.json) with
``nshot.json`` holding every file's sha256, the training losses and the teacher-forced accuracy
on its facts.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from nshot.data.cache import cache_dir, file_lock
from nshot.nn.lm import tiny_llama_config, verify_manifest, write_manifest
from nshot.nn.tinylm import SIZES, VERSION, build_tokenizer, fact_accuracy, token_blocks

__all__ = ["TINY_PREFIX", "PretrainResult", "ensure_tiny_lm", "pretrain", "resolve_lm_source"]

#: A method's ``model`` setting that names a tiny LM: ``"tiny-smoke"``, ``"tiny-small"``.
TINY_PREFIX = "tiny-"


def resolve_lm_source(source: str | os.PathLike[str]) -> str | os.PathLike[str]:
    """What :func:`nshot.nn.lm.load_causal_lm` loads for a method's ``model`` setting: the
    cached folder of a tiny LM (``"tiny-smoke"``, ``"tiny-small"``; trained on first use, about
    a minute for ``tiny-smoke``); any other source (``"smollm2"``, a folder, a hub name)
    unchanged."""
    name = str(source)
    if name.startswith(TINY_PREFIX) and not Path(name).expanduser().exists():
        return ensure_tiny_lm(name.removeprefix(TINY_PREFIX))
    return source


# --------------------------------------------------------------------------------------------
# training loop (one function for Ray Train workers and in-process runs)


def _train(config: dict[str, Any]) -> None:
    import torch.distributed as dist

    from nshot.train.deepspeed import (
        DeepSpeedOptions,
        build_engine,
        init_distributed,
        save_hf_model,
    )

    torch.set_num_threads(int(config.get("threads", 1)))
    size = SIZES[config["size"]]
    steps = int(config.get("steps") or size.steps)
    out = Path(config["out"])
    tok = build_tokenizer(_corpus(config["seed"]))
    blocks = token_blocks(tok, _corpus(config["seed"]), size.seq_len)
    torch.manual_seed(config["seed"])
    from transformers import LlamaForCausalLM

    lm_cfg = tiny_llama_config(
        len(tok),
        layers=size.layers,
        hidden=size.hidden,
        intermediate=size.intermediate,
        heads=size.heads,
        max_positions=size.seq_len * 2,
        bos_token_id=tok.bos_token_id,
        eos_token_id=tok.eos_token_id,
        pad_token_id=tok.pad_token_id,
    )
    model = LlamaForCausalLM(lm_cfg)
    opts = DeepSpeedOptions(
        zero_stage=config.get("zero_stage", 0),
        lr=size.lr,
        weight_decay=0.01,
        grad_clip=1.0,
        precision=config.get("precision", "fp32"),
    )
    in_ray = _in_ray_train()
    init_distributed()
    world = dist.get_world_size()
    rank = dist.get_rank()
    if size.batch % world:
        raise ValueError(f"batch {size.batch} is not divisible by {world} workers")
    per_rank = size.batch // world
    engine = build_engine(model, opts.model_copy(update={"micro_batch": per_rank}))

    def lr_at(s: int) -> float:  # linear warm-up over 50 steps, then linear decay to 5%
        return size.lr * min(1.0, (s + 1) / 50) * max(0.05, 1 - s / max(steps, 1))

    rng = np.random.default_rng(config["seed"])
    order = rng.permutation(len(blocks))
    pos = 0
    losses: list[float] = []
    t0 = time.time()
    log_every = int(config.get("log_every", 50))
    for step in range(steps):
        if pos + size.batch > len(order):
            order, pos = rng.permutation(len(blocks)), 0
        idx = order[pos + rank * per_rank : pos + (rank + 1) * per_rank]
        pos += size.batch
        x = torch.from_numpy(blocks[idx])
        loss = engine(input_ids=x, labels=x).loss
        engine.backward(loss)
        for group in engine.optimizer.param_groups:
            group["lr"] = lr_at(step)
        engine.step()
        # the global mean loss: identical on every rank and across ZeRO stages
        g = loss.detach().clone()
        dist.all_reduce(g)
        losses.append(g.item() / world)
        if (step + 1) % log_every == 0 or step + 1 == steps:
            metrics = {"loss": losses[-1], "step": step + 1}
            if in_ray:
                import ray.train

                ray.train.report(metrics)
            if rank == 0:
                print(
                    f"[nshot tiny-{config['size']}] step {step + 1}/{steps} loss {losses[-1]:.4f} "
                    f"({time.time() - t0:.0f}s)",
                    file=sys.stderr,
                    flush=True,
                )
    # probe logits through the engine (collective under ZeRO-3) for checkpoint checks
    probe = torch.from_numpy(blocks[:2])
    engine.eval()
    with torch.no_grad():
        probe_logits = engine(input_ids=probe).logits.float().cpu()
    path = save_hf_model(
        engine,
        out,
        tokenizer=tok,
        extra={
            "size": config["size"],
            "seed": config["seed"],
            "steps": steps,
            "zero_stage": opts.zero_stage,
            "world_size": world,
            "losses": losses,
            "version": VERSION,
        },
    )
    if path is not None:
        from safetensors.torch import save_file

        save_file({"input_ids": probe, "logits": probe_logits}, str(out / "probe.safetensors"))


def _in_ray_train() -> bool:
    try:
        import ray.train

        ray.train.get_context().get_world_size()
        return True
    except Exception:
        return False


_CORPUS: dict[int, list[str]] = {}


def _corpus(seed: int) -> list[str]:
    if seed not in _CORPUS:
        from nshot.data.lmtext import tiny_corpus

        _CORPUS[seed] = tiny_corpus(seed)
    return _CORPUS[seed]


@dataclass
class PretrainResult:
    path: Path
    losses: list[float]
    wall_s: float


def pretrain(
    size: str = "smoke",
    *,
    out: str | os.PathLike[str],
    workers: int = 0,
    zero_stage: int = 0,
    steps: int | None = None,
    seed: int = 0,
    threads: int | None = None,
    precision: str = "fp32",
) -> PretrainResult:
    """Train a tiny LM into the Hugging Face folder ``out``.

    ``workers=0`` trains in this process (a one-process DeepSpeed group); ``workers >= 1`` runs
    the same loop on that many Ray Train workers (``TorchTrainer``; the embedded local Ray, or
    the cluster at ``RAY_ADDRESS``), each with ``threads`` torch threads.
    """
    if size not in SIZES:
        raise ValueError(f"unknown tiny LM size {size!r}; choose from {sorted(SIZES)}")
    out = Path(out).resolve()
    config = {
        "size": size,
        "out": str(out),
        "zero_stage": zero_stage,
        "steps": steps,
        "seed": seed,
        "precision": precision,
        "threads": threads or (max(1, torch.get_num_threads()) if workers == 0 else 1),
    }
    t0 = time.time()
    if workers == 0:
        _train(config)
    else:
        import ray.train
        from ray.train.torch import TorchTrainer

        from nshot.train.runner import ensure_ray, fit_trainer

        ensure_ray()
        storage = out.parent / f".{out.name}-ray"
        trainer = TorchTrainer(
            _train,
            train_loop_config=config,
            scaling_config=ray.train.ScalingConfig(
                num_workers=workers, resources_per_worker={"CPU": 1}
            ),
            run_config=ray.train.RunConfig(name=f"tiny-{size}", storage_path=str(storage)),
        )
        fit_trainer(trainer)
        shutil.rmtree(storage, ignore_errors=True)
    meta = json.loads((out / "nshot.json").read_text())
    return PretrainResult(out, list(meta["losses"]), time.time() - t0)


def ensure_tiny_lm(size: str = "smoke", seed: int = 0) -> Path:
    """The cached tiny LM folder for ``size``/``seed``, trained in-process on first use."""
    if size not in SIZES:
        raise ValueError(f"unknown tiny LM size {size!r}; choose from {sorted(SIZES)}")
    root = cache_dir() / "models"
    target = root / f"tiny-{size}-s{seed}-v{VERSION}"
    if target.is_dir() and verify_manifest(target):
        return target
    with file_lock(root / f".tiny-{size}-s{seed}.lock"):
        if target.is_dir() and verify_manifest(target):
            return target
        tmp = root / f".tmp-tiny-{size}-{os.getpid()}"
        shutil.rmtree(tmp, ignore_errors=True)
        print(f"[nshot] training the tiny-{size} LM (cached in {target})", file=sys.stderr)
        pretrain(size, out=tmp, seed=seed)
        _record_accuracy(tmp)
        shutil.rmtree(target, ignore_errors=True)
        os.replace(tmp, target)
    return target


def _record_accuracy(folder: Path) -> None:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from nshot.data.lmtext import tiny_capabilities

    tok = AutoTokenizer.from_pretrained(folder)
    model = AutoModelForCausalLM.from_pretrained(folder, use_safetensors=True)
    acc = {k: fact_accuracy(model, tok, v) for k, v in tiny_capabilities("eval").items()}
    meta = json.loads((folder / "nshot.json").read_text())
    meta.pop("sha256")
    print(f"[nshot] tiny LM accuracy: {acc}", file=sys.stderr)
    write_manifest(folder, **meta, capability_accuracy=acc)
