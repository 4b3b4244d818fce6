"""iclft configuration and presets (``smoke``, ``small``, ``paper``: the paper's synthetic setup)."""

from __future__ import annotations

import re
from typing import ClassVar, Literal

from pydantic import Field, field_validator, model_validator

from nshot.method import MethodConfig

#: trainable subsets of the attention matrices (the paper's fine-tuning variants)
SUBSETS: dict[str, tuple[str, ...]] = {
    "all": ("Q", "K", "V"),
    "v": ("V",),
    "q": ("Q",),
    "k": ("K",),
    "qk": ("Q", "K"),
}
OBJECTIVES = ("zs", "zs+fs")
_VARIANT = re.compile(r"^(zs|zs\+fs)/(all|v|q|k|qk)$")


def parse_variant(name: str) -> tuple[str, str]:
    """``"zs+fs/v"`` -> ``("zs+fs", "v")``: the objective and the trainable subset."""
    m = _VARIANT.match(name)
    if m is None:
        raise ValueError(
            f"unknown variant {name!r}: expected <objective>/<subset> with objective in "
            f"{list(OBJECTIVES)} and subset in {list(SUBSETS)} (e.g. 'zs/v', 'zs+fs/all')"
        )
    return m.group(1), m.group(2)


def row_name(variant: str) -> str:
    """The results-table row (and checkpoint key) of a variant: ``zs+fs/v`` -> ``zsfs_v``."""
    if variant == "pretrained":
        return "pretrained"
    obj, subset = parse_variant(variant)
    return f"{obj.replace('+', '')}_{subset}"


class ICLFTConfig(MethodConfig):
    # the in-context regression setting
    d: int = Field(5, ge=1, le=256, description="input dimension (tokens have d + 2 entries)")
    n_pt: int = Field(20, ge=1, le=1000, description="demonstrations per pretraining prompt")
    n_fs: int = Field(20, ge=1, le=1000, description="demonstrations in the auxiliary FS prompt")
    sigma2: float = Field(0.1, ge=0.0, le=100.0, description="label-noise VARIANCE σ²")
    task_dist: Literal["sphere", "gaussian"] = Field(
        "sphere",
        description="task θ: 'sphere' θ = g/‖g‖ (default), 'gaussian' θ ~ N(0, I/d) "
        "(same second moments; the closed forms use the drawn ‖θ0‖)",
    )
    init_std: float = Field(0.05, gt=0.0, le=10.0, description="std of the N(0, s²) init")
    # what train_loop does
    stage: Literal["pretrain", "finetune"] = Field(
        "finetune",
        description="'pretrain': pretraining only; 'finetune': pretraining (or init_checkpoint) "
        "then one fine-tuning run per entry of `variants`, each from the pretrained weights",
    )
    variants: list[str] = Field(
        default_factory=lambda: ["zs/all", "zs/v", "zs/qk", "zs+fs/all", "zs+fs/v"],
        description="fine-tuning variants '<zs|zs+fs>/<all|v|q|k|qk>': the objective "
        "(zs+fs adds the annealed auxiliary few-shot loss) and the trainable matrices",
    )
    init_checkpoint: str | None = Field(
        None, description="finetune: take the pretrained model from this iclft checkpoint"
    )
    # optimisation (both stages: SGD with momentum, joint gradient-norm clip)
    batch: int = Field(2000, ge=1, le=1_000_000, description="prompts per step (all workers)")
    finetune_steps: int | None = Field(
        None, ge=1, description="fine-tuning iterations T per variant (default: steps)"
    )
    lr: float = Field(0.01, gt=0.0, le=10.0)
    momentum: float = Field(0.9, ge=0.0, lt=1.0)
    clip: float = Field(1.0, gt=0.0, description="joint gradient-norm clip over trainables")
    fs_weight: float = Field(
        1.0, ge=0.0, le=1000.0, description="weight of the auxiliary FS loss at t = 0"
    )
    fs_anneal: bool = Field(True, description="anneal the FS weight linearly to 0 at t = T-1")
    pool_size: int = Field(100_000, ge=1, le=100_000_000, description="fine-tuning pool rows")
    # evaluation / experiments
    eval_batch: int = Field(20_000, ge=1, le=10_000_000, description="prompts per (n, task)")
    eval_n: list[int] = Field(default_factory=lambda: [0, 1, 2, 5, 10, 20], min_length=1)
    eval_random_tasks: int = Field(10, ge=0, le=1000, description="held-out random θ (reported)")
    val_batch: int = Field(2000, ge=1, le=1_000_000, description="validation prompts at reports")
    seeds: int = Field(3, ge=1, le=100, description="seeds in experiments()")

    # `nshot eval --set` may change these (the evaluation prompts); every other field is fixed by
    # the checkpoint, since it shapes the model
    EVAL_FIELDS: ClassVar[frozenset[str]] = MethodConfig.EVAL_FIELDS | {
        "eval_batch",
        "eval_n",
        "eval_random_tasks",
    }
    PRESETS: ClassVar[dict[str, dict]] = {
        "smoke": dict(
            steps=200, batch=256, pool_size=10_000, eval_batch=2000, eval_n=[0, 1, 5, 20],
            variants=["zs/all", "zs/v", "zs+fs/v"], seeds=1, log_every=50,
            checkpoint_every=200, val_batch=500, eval_random_tasks=3,
        ),
        "small": dict(
            steps=2000, batch=2000, pool_size=100_000, eval_batch=20_000,
            eval_n=[0, 1, 2, 5, 10, 20],
            variants=["zs/all", "zs/v", "zs/qk", "zs+fs/all", "zs+fs/v"], seeds=3,
            log_every=200, checkpoint_every=1000,
        ),
        "paper": dict(
            steps=5000, batch=5000, pool_size=100_000, eval_batch=50_000,
            eval_n=list(range(21)),
            variants=["zs/all", "zs/v", "zs/q", "zs/k", "zs/qk", "zs+fs/all", "zs+fs/v"],
            seeds=5, log_every=250, checkpoint_every=1000,
        ),
    }  # fmt: skip

    @field_validator("variants")
    @classmethod
    def _variants(cls, v: list[str]) -> list[str]:
        for name in v:
            parse_variant(name)
        if len(set(v)) != len(v):
            raise ValueError("a variant is listed twice")
        return v

    @field_validator("eval_n")
    @classmethod
    def _eval_n(cls, v: list[int]) -> list[int]:
        if any(n < 0 or n > 100_000 for n in v):
            raise ValueError("every n must be in [0, 100000]")
        return sorted(set(v))

    @model_validator(mode="after")
    def _check(self) -> ICLFTConfig:
        if self.stage == "finetune" and not self.variants:
            raise ValueError("field 'variants': stage=finetune needs at least one variant")
        if self.init_checkpoint is not None and self.stage != "finetune":
            raise ValueError("field 'init_checkpoint': only used with stage=finetune")
        return self

    @property
    def ft_steps(self) -> int:
        return self.finetune_steps or self.steps

    def stages(self) -> list[str]:
        """``["pretrain", *variants]`` (or just pretraining)."""
        return ["pretrain"] + (list(self.variants) if self.stage == "finetune" else [])

    def stage_bounds(self) -> list[tuple[str, int, int]]:
        """``(stage, first global step - 1, last global step)`` of each stage."""
        out, start = [], 0
        for s in self.stages():
            n = self.steps if s == "pretrain" else self.ft_steps
            out.append((s, start, start + n))
            start += n
        return out
