"""TimeMoDE configuration and presets.

One training run is one stage (paper §3): ``pretrain`` on the multi-domain corpus, ``finetune``
from a pre-trained checkpoint on the scarce target's few-shot windows, or ``scratch`` (the same
architecture on the target windows only). ``system`` names the architecture variant: the full
TimeMoDE, ``dit_dense`` (one SwiGLU MLP, no router, no domain prompt), ``no_domain_prompt`` (a
learned constant replaces the exemplar's prompt) or ``no_stage_adaln`` (experts without their
own timestep AdaLN). ``steps`` is set from the stage's step count.
"""

from __future__ import annotations

from typing import ClassVar, Literal

from pydantic import Field, model_validator

from nshot.method import MethodConfig
from nshot.tune.space import Choice, Float, TuneSpec

VERSION = "1"  # of the checkpoint format

System = Literal["timemode", "dit_dense", "no_domain_prompt", "no_stage_adaln"]
Stage = Literal["pretrain", "finetune", "scratch"]


class TimeModeConfig(MethodConfig):
    system: System = Field(
        "timemode",
        description="timemode (MoDE with domain prompts and stage-aware experts), dit_dense "
        "(a DiT with one SwiGLU MLP: no router, no prompt), no_domain_prompt (a learned "
        "constant replaces the prompt) or no_stage_adaln (experts without their AdaLN on t)",
    )
    stage: Stage = Field("pretrain", description="pretrain, finetune or scratch")
    init_from: str | None = Field(
        None, description="finetune: the pre-trained checkpoint folder to start from"
    )
    # data
    corpus: Literal["real", "synthetic"] = Field(
        "real",
        description="pre-training corpus: real (UCR/UEA sets read out of the aeon and sktime "
        "wheels, plus statsmodels co2) or synthetic (six generated families)",
    )
    target: Literal["italy", "damped"] = Field(
        "italy",
        description="few-shot target: italy (ItalyPowerDemand, never pre-trained on; "
        "z-normalised per series) or damped (generated damped oscillations)",
    )
    fetch_data: bool = Field(
        False, description="fetch the pinned aeon/sktime wheels from the package index if absent"
    )
    window: int = Field(24, ge=8, le=512, description="window length L")
    synth_per_domain: int = Field(2000, ge=16, le=100_000, description="synthetic windows/domain")
    data_seed: int = Field(0, ge=0, description="seed of the generated windows")
    n_shot: int = Field(50, ge=2, le=1000, description="few-shot target windows (main regime)")
    shot_regimes: list[int] = Field([10, 25], description="the smaller regimes reported")
    n_reference: int = Field(2000, ge=32, le=100_000, description="generated target reference")
    bank_size: int = Field(256, ge=1, le=256, description="clean exemplars kept per domain")
    # model (paper §3, Table 8)
    d_model: int = Field(64, ge=8, le=1024, description="width d")
    depth: int = Field(2, ge=1, le=24, description="transformer blocks")
    heads: int = Field(2, ge=1, le=16, description="attention heads")
    experts: int = Field(4, ge=1, le=64, description="K routed experts (plus one shared)")
    top_k: int = Field(2, ge=1, le=8, description="experts per token")
    expansion: int = Field(2, ge=1, le=8, description="expert hidden width n·d")
    basis: int = Field(2, ge=1, le=16, description="h_b prototype vectors per expert")
    tau: float = Field(1.0, ge=0.0, le=10.0, description="constant added to the router logits")
    routing: Literal["softmax", "sum"] = Field(
        "softmax", description="router scores: softmax, or divided by their sum"
    )
    dispatch: Literal["auto", "dense", "sparse"] = Field(
        "auto",
        description="MoE compute: dense (every expert, masked) or sparse; auto: dense on CPU",
    )
    # diffusion
    diffusion_steps: int = Field(100, ge=2, le=2000, description="T")
    prediction: Literal["eps", "x0"] = Field(
        "eps",
        description="the denoiser's target: eps (the noise, DDPM's parametrisation) or x0 "
        "(the clean window, as Diffusion-TS; the reverse chain reads x̂0 directly)",
    )
    w_p: float = Field(0.01, ge=0.0, le=10.0, description="prototype orthogonality weight")
    w_a: float = Field(0.01, ge=0.0, le=10.0, description="load-balancing weight")
    # optimisation
    pretrain_steps: int = Field(1500, ge=1, le=1_000_000, description="pre-training steps")
    finetune_steps: int = Field(500, ge=1, le=1_000_000, description="fine-tuning steps")
    scratch_steps: int = Field(1500, ge=1, le=1_000_000, description="from-scratch steps")
    batch: int = Field(128, ge=2, le=8192, description="pre-training batch")
    target_batch: int = Field(50, ge=2, le=8192, description="fine-tune / scratch batch")
    lr: float = Field(3e-4, gt=0.0, le=1.0, description="AdamW rate (pretrain, scratch)")
    finetune_lr: float = Field(1e-4, gt=0.0, le=1.0, description="AdamW rate (finetune)")
    weight_decay: float = Field(1e-5, ge=0.0, le=1.0, description="AdamW weight decay")
    ema: float = Field(0.999, ge=0.0, lt=1.0, description="EMA decay (0: off)")
    ema_start: int = Field(100, ge=0, description="steps before the EMA starts (a copy until)")
    ema_warmup: float | None = Field(
        2 / 3,
        gt=0.0,
        le=10.0,
        description="EMA warm-up power: n steps after ema_start the decay is "
        "min(ema, 1 − (1 + n)^−power) (ema_pytorch's schedule, whose update_after_step is the "
        "paper's 'EMA 0 for the first 100 steps'); null: the constant decay ema from ema_start on",
    )
    grad_clip: float = Field(1.0, gt=0.0, description="gradient norm clip")
    freeze: list[Literal["attention", "prototypes", "shared_expert"]] = Field(
        [], description="parts frozen during fine-tuning"
    )
    # evaluation
    n_generate: int = Field(300, ge=4, le=100_000, description="generated windows scored")
    disc_iters: int = Field(400, ge=1, le=100_000, description="GRU discriminator iterations")
    disc_batch: int = Field(
        64, ge=2, le=4096, description="GRU discriminator batch (≥ its training set: full batch)"
    )
    disc_lr: float = Field(1e-3, gt=0.0, le=1.0, description="GRU discriminator Adam rate")
    disc_seeds: int = Field(3, ge=1, le=10, description="discriminator seeds averaged")
    disc_folds: int = Field(
        1, ge=1, le=10,
        description="1: the discriminator tests on a 20 % split; k ≥ 2: k-fold cross-validation "
        "(every window tested once)",
    )  # fmt: skip
    regime_seeds: int = Field(
        20,
        ge=0,
        le=20,
        description="the smaller regimes and the damped target run for the first this many "
        "fine-tuning seeds",
    )
    ablation_seeds: int = Field(
        20, ge=1, le=20,
        description="the reported-only rows (dit_dense, no_stage_adaln, timemode_synthpre) are "
        "fine-tuned for the first this many fine-tuning seeds",
    )  # fmt: skip
    damped_seeds: int = Field(
        20,
        ge=0,
        le=20,
        description="disc_damped (the generated damped-oscillation target, the one the real "
        "corpus resembles least) runs for the first this many fine-tuning seeds",
    )
    long_pretrain_factor: int = Field(
        4,
        ge=0,
        le=100,
        description="the timemode_longpre row: TimeMoDE pre-trained for this many times "
        "pretrain_steps, then fine-tuned as the timemode row (0: no such row)",
    )
    regime_disc_seeds: int = Field(
        1, ge=1, le=10, description="discriminator seeds of the reported regimes (disc_10, …)"
    )
    pred_iters: int = Field(400, ge=1, le=100_000, description="TSTR predictor iterations")
    routing_windows: int = Field(64, ge=4, le=4096, description="windows per domain (routing_js)")
    seeds: int = Field(3, ge=1, le=20, description="fine-tuning seeds of the reproduction")

    TUNE: ClassVar[TuneSpec] = TuneSpec(
        space={
            "lr": Float(1e-4, 1e-3, log=True),
            "finetune_lr": Float(3e-5, 1e-3, log=True),
            "w_a": Float(1e-3, 1e-1, log=True),
            "d_model": Choice([32, 64, 96, 128]),  # widths every preset's heads divide
        },
        metric="loss",
        mode="min",
        curve=("loss",),
    )
    EVAL_FIELDS: ClassVar[frozenset[str]] = MethodConfig.EVAL_FIELDS | {
        "n_generate",
        "disc_iters",
        "disc_batch",
        "disc_lr",
        "disc_seeds",
        "disc_folds",
        "regime_disc_seeds",
        "pred_iters",
        "routing_windows",
        "n_shot",
        "target",
    }

    PRESETS: ClassVar[dict[str, dict]] = {
        "smoke": {
            "corpus": "synthetic", "target": "damped", "synth_per_domain": 64, "n_reference": 64,
            "n_shot": 16, "shot_regimes": [4, 8], "bank_size": 8, "d_model": 16, "depth": 1,
            "heads": 2, "experts": 2, "top_k": 1, "expansion": 2, "basis": 1,
            "diffusion_steps": 10, "pretrain_steps": 20, "finetune_steps": 10,
            "scratch_steps": 10, "batch": 16, "target_batch": 8, "ema": 0.0, "ema_start": 0,
            "n_generate": 32, "disc_iters": 20, "disc_batch": 16, "disc_seeds": 1,
            "regime_disc_seeds": 1,
            "pred_iters": 20, "routing_windows": 8, "seeds": 1, "log_every": 5,
            "checkpoint_every": 10,
        },
        "small": {
            "fetch_data": True, "pretrain_steps": 1000, "batch": 64, "finetune_steps": 300,
            "scratch_steps": 600, "n_generate": 200, "disc_seeds": 3, "disc_folds": 2,
            "disc_iters": 150, "disc_batch": 256, "disc_lr": 1e-2, "regime_seeds": 1,
            "damped_seeds": 3, "regime_disc_seeds": 3, "ablation_seeds": 1,
            "pred_iters": 200, "log_every": 50, "checkpoint_every": 500,
        },
        "paper": {
            "fetch_data": True, "d_model": 256, "depth": 6, "heads": 4, "experts": 8,
            "expansion": 4, "basis": 4, "diffusion_steps": 250, "pretrain_steps": 20_000,
            "finetune_steps": 2000, "scratch_steps": 20_000, "ema": 0.9999, "n_generate": 3000,
            "disc_iters": 2000, "disc_batch": 128, "disc_folds": 2, "pred_iters": 2000, "log_every": 100,
            "checkpoint_every": 1000,
        },
    }  # fmt: skip

    @model_validator(mode="after")
    def _check(self) -> TimeModeConfig:
        if self.d_model % self.heads:
            raise ValueError("field 'heads': must divide d_model")
        if self.system == "dit_dense":
            pass  # one SwiGLU MLP: experts, top_k and the router are unused
        elif self.top_k > self.experts:
            raise ValueError(f"field 'top_k': {self.top_k} > experts = {self.experts}")
        if self.experts * self.basis > self.d_model:
            raise ValueError(
                "field 'basis': experts × basis must not exceed d_model (orthogonal prototypes)"
            )
        if any(k < 2 or k > self.n_shot for k in self.shot_regimes):
            raise ValueError(f"field 'shot_regimes': each must lie in [2, n_shot={self.n_shot}]")
        if self.stage == "finetune" and not self.init_from:
            raise ValueError("field 'init_from': the finetune stage needs a pre-trained checkpoint")
        steps = {"pretrain": self.pretrain_steps, "finetune": self.finetune_steps,
                 "scratch": self.scratch_steps}[self.stage]  # fmt: skip
        self.__dict__["steps"] = steps
        return self

    @property
    def routed(self) -> bool:
        """Whether the MLPs are a routed mixture (every system but dit_dense)."""
        return self.system != "dit_dense"
