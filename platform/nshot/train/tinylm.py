"""Training the tiny Llama models of :mod:`nshot.nn.tinylm`, and resolving a method's ``model``
setting to the folder :func:`nshot.nn.lm.load_causal_lm` loads.

The model (its word-level tokenizer and sizes) is defined in :mod:`nshot.nn.tinylm`; this module
trains it on that corpus on a DeepSpeed engine (:mod:`nshot.train.deepspeed`), its steps run by
nshot's trainer (:func:`nshot.train.trainer.train`, ``session=False``), in-process or on Ray
Train workers, and caches it::

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
from nshot.train.trainer import Recipe, train

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
# the training: one recipe of nshot's trainer for Ray Train workers and in-process runs


class _PretrainRecipe(Recipe):
    """The tiny LM's pre-training on a DeepSpeed engine as :func:`nshot.train.trainer.train`
    runs it (outside a Ray run, ``session=False``; a pre-training starts from scratch): the
    trainer's engine step (forward, ``engine.backward``, ``engine.step``; ZeRO and the clip
    to norm 1 are the engine's). Each rank takes its slice of the one global batch, drawn in
    the order of one permutation of the token blocks per epoch."""

    def __init__(self, config: dict[str, Any]) -> None:
        super().__init__(SIZES[config["size"]])
        self.config = config
        self.steps = int(config.get("steps") or self.cfg.steps)
        self.log_every = int(config.get("log_every", 50))
        self.losses: list[float] = []

    def schedule(self) -> tuple[int, int, int]:
        return self.steps, self.log_every, self.steps  # nothing checkpointed: the last step

    def build(self) -> None:
        import torch.distributed as dist
        from transformers import LlamaForCausalLM

        from nshot.train.deepspeed import DeepSpeedOptions, build_engine, init_distributed

        size, config = self.cfg, self.config
        self.tok = build_tokenizer(_corpus(config["seed"]))
        self.blocks = token_blocks(self.tok, _corpus(config["seed"]), size.seq_len)
        torch.manual_seed(config["seed"])
        lm_cfg = tiny_llama_config(
            len(self.tok),
            layers=size.layers,
            hidden=size.hidden,
            intermediate=size.intermediate,
            heads=size.heads,
            max_positions=size.seq_len * 2,
            bos_token_id=self.tok.bos_token_id,
            eos_token_id=self.tok.eos_token_id,
            pad_token_id=self.tok.pad_token_id,
        )
        model = LlamaForCausalLM(lm_cfg)
        self.opts = DeepSpeedOptions(
            zero_stage=config.get("zero_stage", 0),
            lr=size.lr,
            weight_decay=0.01,
            grad_clip=1.0,
            precision=config.get("precision", "fp32"),
        )
        self.in_ray = _in_ray_train()
        init_distributed()
        self.world_size, self.rank = dist.get_world_size(), dist.get_rank()
        if size.batch % self.world_size:
            raise ValueError(f"batch {size.batch} is not divisible by {self.world_size} workers")
        self.per_rank = size.batch // self.world_size
        self.samples_per_step = self.per_rank
        self.engine = build_engine(
            model, self.opts.model_copy(update={"micro_batch": self.per_rank})
        )
        self.model = model
        self.rng = np.random.default_rng(config["seed"])
        self.order = self.rng.permutation(len(self.blocks))
        self.pos = 0
        self.t0 = time.time()

    def lr_at(self, s: int) -> float:
        """Linear warm-up over 50 steps, then linear decay to 5 % (``s`` counts from 0)."""
        size = self.cfg
        return size.lr * min(1.0, (s + 1) / 50) * max(0.05, 1 - s / max(self.steps, 1))

    def loss(self, step: int, micro: int = 0) -> tuple[torch.Tensor, dict[str, float]]:
        import torch.distributed as dist

        batch = self.cfg.batch
        if self.pos + batch > len(self.order):
            self.order, self.pos = self.rng.permutation(len(self.blocks)), 0
        first = self.pos + self.rank * self.per_rank
        idx = self.order[first : first + self.per_rank]
        self.pos += batch
        x = torch.from_numpy(self.blocks[idx]).to(self.engine.device)
        loss = self.engine(input_ids=x, labels=x).loss
        for group in self.engine.optimizer.param_groups:  # used by the engine's step
            group["lr"] = self.lr_at(step - 1)
        # the global mean loss: identical on every rank and across ZeRO stages
        g = loss.detach().clone()
        dist.all_reduce(g)
        self.losses.append(g.item() / self.world_size)
        return loss, {"loss": self.losses[-1]}

    def on_report(self, step: int, metrics: dict[str, float]) -> dict[str, float]:
        """``ray.train.report`` inside Ray Train and rank 0's progress line (the step's loss)."""
        if self.in_ray:
            import ray.train

            ray.train.report({"loss": self.losses[-1], "step": step})
        if self.rank == 0:
            print(
                f"[nshot tiny-{self.config['size']}] step {step}/{self.steps} "
                f"loss {self.losses[-1]:.4f} ({time.time() - self.t0:.0f}s)",
                file=sys.stderr,
                flush=True,
            )
        return metrics


def _train(config: dict[str, Any]) -> None:
    from nshot.train.deepspeed import save_hf_model

    torch.set_num_threads(int(config.get("threads", 1)))
    out = Path(config["out"])
    recipe = train(_PretrainRecipe(config), session=False, start=0)
    engine, blocks = recipe.engine, recipe.blocks
    # probe logits through the engine (collective under ZeRO-3) for checkpoint checks
    probe = torch.from_numpy(blocks[:2])
    engine.eval()
    with torch.no_grad():
        probe_logits = engine(input_ids=probe.to(engine.device)).logits.float().cpu()
    path = save_hf_model(
        engine,
        out,
        tokenizer=recipe.tok,
        extra={
            "size": config["size"],
            "seed": config["seed"],
            "steps": recipe.steps,
            "zero_stage": recipe.opts.zero_stage,
            "world_size": recipe.world_size,
            "losses": recipe.losses,
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
