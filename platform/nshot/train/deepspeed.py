"""DeepSpeed engines for nshot's LLM methods, inside a Ray Train worker or a plain process.

::

    from nshot.train.deepspeed import DeepSpeedOptions, build_engine, full_state_dict

    opts = DeepSpeedOptions(zero_stage=3, micro_batch=8, lr=3e-4)
    engine = build_engine(model, opts)               # optimises the params with requires_grad
    loss = engine(input_ids=ids, labels=ids).loss
    engine.backward(loss)
    engine.step()
    weights = full_state_dict(engine)                # gathered from ZeRO-3 shards, every rank

The accelerator is picked once per process: CUDA when a GPU is visible (bf16 when it supports it,
NCCL), otherwise ``DS_ACCELERATOR=cpu`` with fp32 and gloo. Inside a Ray Train worker the process
group Ray Train created is reused; in a plain process (Ray Train's local mode, a test, an example)
a one-process group on 127.0.0.1 is created. The optimizer is ``torch.optim.AdamW`` handed to
DeepSpeed as a client optimizer (DeepSpeed's fused Adam needs CUDA kernels and its CPU Adam a
compiler), so the same code runs everywhere.

Checkpoints go through :mod:`nshot.train.checkpoint` (safetensors + JSON, the weights gathered
from ZeRO-3 partitions) or :func:`save_hf_model` (a Hugging Face folder that
``AutoModelForCausalLM.from_pretrained`` reads); DeepSpeed's own pickled checkpoints are never
written or read.
"""

from __future__ import annotations

import contextlib
import os
import socket
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any, Literal

import torch
from pydantic import BaseModel, ConfigDict, Field

__all__ = [
    "DeepSpeedOptions",
    "accelerator",
    "build_engine",
    "ds_config",
    "full_state_dict",
    "init_distributed",
    "memory_report",
    "precision",
    "save_hf_model",
]


class DeepSpeedOptions(BaseModel):
    """The DeepSpeed knobs a method's config carries (as a nested ``deepspeed`` field)."""

    model_config = ConfigDict(extra="forbid")

    zero_stage: Literal[0, 1, 2, 3] = 0
    offload_optimizer: bool = Field(False, description="ZeRO-Offload: optimizer state on CPU")
    offload_params: bool = Field(False, description="ZeRO-3 parameter offload to CPU")
    micro_batch: int = Field(8, ge=1, description="sequences per worker per step")
    grad_accum: int = Field(1, ge=1, description="micro-batches per optimizer step")
    lr: float = Field(1e-4, gt=0)
    weight_decay: float = Field(0.0, ge=0)
    betas: tuple[float, float] = (0.9, 0.999)
    eps: float = Field(1e-8, gt=0)
    grad_clip: float = Field(1.0, ge=0, description="0 disables clipping")
    precision: Literal["auto", "fp32", "bf16"] = "auto"


def accelerator() -> str:
    """``"cuda"`` when a GPU is visible, else ``"cpu"``; sets ``DS_ACCELERATOR`` accordingly.

    Must run before deepspeed is imported (every function here calls it first). An explicit
    ``DS_ACCELERATOR`` in the environment wins.
    """
    kind = os.environ.get("DS_ACCELERATOR")
    if kind is None:
        kind = "cuda" if torch.cuda.is_available() else "cpu"
        os.environ["DS_ACCELERATOR"] = kind
    return kind


def precision(opts: DeepSpeedOptions) -> str:
    """The precision that ``opts`` resolves to here: bf16 on a bf16-capable GPU, else fp32."""
    if opts.precision != "auto":
        return opts.precision
    if accelerator() == "cuda" and torch.cuda.is_bf16_supported():
        return "bf16"
    return "fp32"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


_DS_GROUP_CACHES = (
    "_WORLD_GROUP",
    "_DATA_PARALLEL_GROUP",
    "_MODEL_PARALLEL_GROUP",
    "_TENSOR_MODEL_PARALLEL_GROUP",
    "_ZERO_PARAM_INTRA_PARALLEL_GROUP",
    "_ALL_TO_ALL_GROUP",
    "_EXPERT_PARALLEL_GROUP",
    "_EXPERT_PARALLEL_GROUP_RANKS",
    "_EXPERT_DATA_PARALLEL_GROUP",
    "_EXPERT_DATA_PARALLEL_GROUP_RANKS",
)
_SEEN_WORLD: list[Any] = [None]  # torch's default group when DeepSpeed's caches were filled


def _forget_stale_deepspeed_groups() -> None:
    """DeepSpeed caches sub-groups of the default process group (``deepspeed.utils.groups``)
    for the life of the process. When that group is destroyed and created again in the same
    process (Ray Train's local mode destroys it after every run), the cached groups are
    unregistered and DeepSpeed fails with "Group ... is not registered"; forget them then."""
    import torch.distributed as dist
    from deepspeed.utils import groups

    world = dist.group.WORLD if dist.is_initialized() else None
    if world is not None and world is _SEEN_WORLD[0]:
        return
    for name in _DS_GROUP_CACHES:
        if hasattr(groups, name):
            setattr(groups, name, {} if isinstance(getattr(groups, name), dict) else None)
    _SEEN_WORLD[0] = world


SHM_OP_ENV = "NSHOT_DEEPSPEED_SHM_OP"


@contextlib.contextmanager
def _without_cpu_shm_op() -> Iterator[None]:
    """Keep DeepSpeed's CPU backend from JIT-compiling its shared-memory all-reduce op.

    On CPU, DeepSpeed's ``TorchBackend`` builds ``deepspeed_shm_comm`` (a C++ extension compiled
    with ninja into ``~/.cache/torch_extensions``) every time a process group is joined. The op
    serves only DeepSpeed-Inference's tensor-parallel ``inference_all_reduce``, which nshot never
    calls (training all-reduces go through torch.distributed/gloo). Building it needs a C++
    toolchain, and a compile that is killed midway (a stopped job, a timed-out test) leaves
    torch's ``lock`` file behind, on which every later run waits forever. Set
    ``NSHOT_DEEPSPEED_SHM_OP=1`` to let DeepSpeed build and use it anyway.
    """
    if accelerator() == "cuda" or os.environ.get(SHM_OP_ENV, "0") == "1":
        yield
        return
    import importlib

    # not ``import deepspeed.comm.torch as m``: ``deepspeed.comm`` re-exports the torch package
    # under that name
    ds_torch = importlib.import_module("deepspeed.comm.torch")
    build = getattr(ds_torch, "build_shm_op", None)
    if build is None:  # a DeepSpeed without the op
        yield
        return
    ds_torch.build_shm_op = lambda: None
    try:
        yield
    finally:
        ds_torch.build_shm_op = build


def init_distributed() -> None:
    """Join the existing process group (Ray Train's) or create a one-process one on 127.0.0.1.

    On CPU, DeepSpeed's shared-memory inference op is not compiled (see
    :func:`_without_cpu_shm_op`).
    """
    accelerator()
    import deepspeed
    import torch.distributed as dist

    try:
        with _without_cpu_shm_op():
            if dist.is_available() and dist.is_initialized():
                deepspeed.init_distributed(dist_backend=dist.get_backend())
                return
            if "RANK" not in os.environ or "WORLD_SIZE" not in os.environ:
                os.environ.update(RANK="0", LOCAL_RANK="0", WORLD_SIZE="1", LOCAL_SIZE="1")
                os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
                os.environ["MASTER_PORT"] = str(_free_port())
            backend = "nccl" if accelerator() == "cuda" else "gloo"
            deepspeed.init_distributed(dist_backend=backend)
    finally:
        if dist.is_available():
            _forget_stale_deepspeed_groups()


def ds_config(opts: DeepSpeedOptions) -> dict[str, Any]:
    """The DeepSpeed JSON config for ``opts``."""
    zero: dict[str, Any] = {"stage": opts.zero_stage}
    if opts.offload_optimizer:
        if opts.zero_stage == 0:
            raise ValueError("offload_optimizer needs ZeRO stage 1, 2 or 3 (zero_stage)")
        zero["offload_optimizer"] = {"device": "cpu"}
    if opts.offload_params:
        if opts.zero_stage != 3:
            raise ValueError("offload_params needs ZeRO stage 3 (zero_stage)")
        zero["offload_param"] = {"device": "cpu"}
    if opts.zero_stage == 3:
        zero["stage3_gather_16bit_weights_on_model_save"] = False
    cfg: dict[str, Any] = {
        "train_micro_batch_size_per_gpu": opts.micro_batch,
        "gradient_accumulation_steps": opts.grad_accum,
        "zero_optimization": zero,
        "zero_allow_untested_optimizer": True,
        "zero_force_ds_cpu_optimizer": False,
        "steps_per_print": 10**9,
        "wall_clock_breakdown": False,
    }
    if opts.grad_clip > 0:
        cfg["gradient_clipping"] = opts.grad_clip
    if precision(opts) == "bf16":
        cfg["bf16"] = {"enabled": True}
    return cfg


def build_engine(
    model: torch.nn.Module,
    opts: DeepSpeedOptions,
    params: Iterable[torch.nn.Parameter] | None = None,
) -> Any:
    """A ``deepspeed.DeepSpeedEngine`` over ``model`` optimising ``params`` with AdamW.

    ``params`` defaults to the model's parameters with ``requires_grad``; parameters outside it
    are frozen (only they are left out of ZeRO's partitioned optimizer state). Collective: every
    rank calls it with the same model.
    """
    init_distributed()
    import deepspeed

    if params is None:
        params = [p for p in model.parameters() if p.requires_grad]
    params = list(params)
    if not params:
        raise ValueError("build_engine: no trainable parameters (all have requires_grad=False)")
    wanted = {id(p) for p in params}
    for p in model.parameters():
        if id(p) not in wanted:
            p.requires_grad_(False)
    decay = [p for p in params if p.ndim >= 2]
    no_decay = [p for p in params if p.ndim < 2]
    groups = [{"params": decay, "weight_decay": opts.weight_decay}]
    if no_decay:
        groups.append({"params": no_decay, "weight_decay": 0.0})
    optimizer = torch.optim.AdamW(groups, lr=opts.lr, betas=opts.betas, eps=opts.eps)
    engine, _, _, _ = deepspeed.initialize(
        model=model, optimizer=optimizer, config=ds_config(opts), model_parameters=None
    )
    share_fp32_master(engine)
    return engine


def share_fp32_master(engine: Any) -> int:
    """Drop ZeRO-3's redundant fp32 master copy when the parameters are fp32 already.

    DeepSpeed 0.19 means to reuse the partitioned parameters as the master weights when their
    dtype and device match (``stage3.py``, "we don't need another copy of the weights"), but it
    compares a ``torch.device`` with the device *string*, which is never equal, so it clones
    every partition: fp32 ZeRO-3 then holds each parameter twice. Here the master tensor is made
    a view of the partition it was cloned from (same values), so the optimizer steps the
    partition in place and DeepSpeed's fp32 → partition copy after each step copies a tensor
    onto itself. Optimizer state stays keyed by the same tensor objects. Returns the number of
    sub-groups shared (0 for other stages, bf16/fp16, or offloaded optimizers).
    """
    opt = getattr(engine, "optimizer", None)
    lp = getattr(opt, "fp16_partitioned_groups_flat", None)
    hp = getattr(opt, "fp32_partitioned_groups_flat", None)
    if not _zero3(engine) or not lp or not hp or getattr(opt, "offload_optimizer", False):
        return 0
    shared = 0
    for low, master in zip(lp, hp):
        if low is None or master is None or master.numel() != low.numel():
            continue
        if low.dtype != master.dtype or low.device != master.device:
            continue
        if master.untyped_storage().data_ptr() == low.untyped_storage().data_ptr():
            continue  # already shared (a DeepSpeed that compares devices correctly)
        if not torch.equal(master, low):
            continue
        master.data = low.data
        shared += 1
    return shared


def _zero3(engine: Any) -> bool:
    return getattr(engine, "zero_optimization_stage", lambda: 0)() == 3


def full_state_dict(engine_or_model: Any) -> dict[str, torch.Tensor]:
    """The model's full weights as fp32 CPU tensors, on every rank (collective under ZeRO-3).

    Accepts an engine or a plain module. Tied weights appear under each of their names.
    """
    module = getattr(engine_or_model, "module", engine_or_model)
    if _zero3(engine_or_model):
        import deepspeed

        params = list(module.parameters())
        with deepspeed.zero.GatheredParameters(params, modifier_rank=None):
            return {k: v.detach().float().cpu().clone() for k, v in module.state_dict().items()}
    return {k: v.detach().float().cpu().clone() for k, v in module.state_dict().items()}


def save_hf_model(
    engine_or_model: Any,
    path: str | os.PathLike[str],
    *,
    tokenizer: Any = None,
    extra: dict[str, Any] | None = None,
) -> Path | None:
    """Write a Hugging Face model folder (config.json, model.safetensors, tokenizer files and
    ``nshot.json`` with every file's sha256 and ``extra``) gathered from any ZeRO stage.

    Collective: call it on every rank; rank 0 writes and gets the path, other ranks get None.
    """
    import torch.distributed as dist

    module = getattr(engine_or_model, "module", engine_or_model)
    state = full_state_dict(engine_or_model)
    if dist.is_available() and dist.is_initialized() and dist.get_rank() != 0:
        return None
    from transformers import AutoModelForCausalLM

    from nshot.nn.lm import write_manifest

    out = Path(path)
    out.mkdir(parents=True, exist_ok=True)
    plain = AutoModelForCausalLM.from_config(module.config, dtype=torch.float32)
    missing, unexpected = plain.load_state_dict(state, strict=False)
    tied = set(getattr(plain, "_tied_weights_keys", None) or ())
    if unexpected or [k for k in missing if k not in tied and "lm_head" not in k]:
        raise RuntimeError(f"weights do not match the config: {missing=} {unexpected=}")
    plain.save_pretrained(out, safe_serialization=True)
    if tokenizer is not None:
        tokenizer.save_pretrained(out)
    write_manifest(out, **(extra or {}))
    return out


def _nbytes(t: torch.Tensor) -> int:
    return t.numel() * t.element_size()


def memory_report(engine: Any) -> dict[str, float]:
    """Bytes this rank holds for the model's parameters and the optimizer, by kind.

    ``params``: model parameters resident on this rank (ZeRO-3: its partition only);
    ``master``: fp32 master copies DeepSpeed keeps for the optimizer (ZeRO 1-3 with bf16; a
    master tensor that shares storage with the parameters, see :func:`share_fp32_master`, is not
    counted twice);
    ``optimizer``: optimizer state tensors (Adam moments) of this rank;
    ``grads``: gradient buffers of this rank; ``total`` = params + master + optimizer.
    """
    module = engine.module
    params = 0
    storages: set[int] = set()
    for p in module.parameters():
        ds = getattr(p, "ds_tensor", None)
        t = ds if ds is not None else p
        params += _nbytes(t)
        if t.numel():
            storages.add(t.untyped_storage().data_ptr())
    opt = engine.optimizer
    inner = getattr(opt, "optimizer", opt)  # DeepSpeed's ZeRO wrapper holds a torch optimizer
    state = 0
    for entry in inner.state.values():
        state += sum(_nbytes(v) for v in entry.values() if isinstance(v, torch.Tensor))
    # the ZeRO wrappers' flat fp32 partitions are what the torch optimizer steps
    flat = list(getattr(opt, "fp32_partitioned_groups_flat", None) or [])  # ZeRO-3
    flat += list(getattr(opt, "single_partition_of_fp32_groups", None) or [])  # ZeRO-1/2
    if not flat:  # ZeRO-0 with bf16/fp16: DeepSpeed's unfused optimizer keeps fp32 copies
        flat = [t for group in getattr(opt, "fp32_groups", None) or [] for t in group]
    master = sum(
        _nbytes(t)
        for t in flat
        if isinstance(t, torch.Tensor)
        and not (t.numel() and t.untyped_storage().data_ptr() in storages)
    )
    grads = sum(_nbytes(t.grad) for t in flat if isinstance(t, torch.Tensor) and t.grad is not None)
    if inner is opt:
        grads = sum(_nbytes(p.grad) for p in module.parameters() if p.grad is not None)
    return {
        "params": float(params),
        "master": float(master),
        "optimizer": float(state),
        "grads": float(grads),
        "total": float(params + master + state),
    }
