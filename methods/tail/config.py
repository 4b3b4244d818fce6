"""TAIL configuration and presets."""

from __future__ import annotations

from typing import ClassVar, Literal

from pydantic import Field, model_validator

from nshot.method import MethodConfig
from nshot.tune.space import Float, Int, TuneSpec

MAX_DRAWS = 32  # (π, ρ) draws averaged per answer, at most

# the earlier `small` recipe (1,500 steps on modality A only; `results/small-v1.*` and
# `results/small-ingredients.*` were made with it), kept as the preset `small-v1`; the
# quickstart's model is the same recipe (`quickstart`: about 1.5 minutes of training on 2 cores)
_SMALL_V1 = dict(
    depth=4, heads=4, mlp_dim=192, d_data=64, d_label=32, dictionary_size=100,
    steps=1500, lr=1e-3, batch_episodes=32, min_ways=2, max_ways=5, min_shots=1,
    max_shots=5, queries_per_class=5, eval_episodes=500, eval_draws=4,
    curriculum_frac=0.25, warmup_steps=50, log_every=50, checkpoint_every=250,
    experiment_seeds=3,  # the headline claims are paired t-tests over the training seeds
)  # fmt: skip

# `small`: the two changes measured on `small-v1` combined (README, "The `small` recipe"):
# sixteen times the steps (24,000; the `tail_steps16x` row of experiment=ingredients) and
# generated mixed-Gaussian tasks beside modality A (`train_tasks="A+mixed"`,
# `results/small-mixed.*`), the model measured together as `results/widths-mixed-steps16x*.json`;
# it answers with 32 (π, ρ) draws by default (the `tabular` preset's default, measured on that
# model); the comparison's TAIL variants average `compare_draws` = 4 draws, the ablation rows
# train on one seed (`ablation_seeds`), and the served model is checked against nearest centroid
# on generated tasks of 16 to 4,096 features (`served_episodes` per width and seed)
_SMALL = {
    **_SMALL_V1, "train_tasks": "A+mixed", "steps": 24_000, "eval_draws": 32,
    "checkpoint_every": 1000, "compare_draws": 4, "ablation_seeds": 1, "served_episodes": 200,
}  # fmt: skip


class TailConfig(MethodConfig):
    # transformer Υ
    depth: int = Field(4, ge=1, le=32)
    heads: int = Field(4, ge=1, le=32)
    mlp_dim: int = Field(192, ge=4, le=8192)
    d_data: int = Field(64, ge=2, le=2048, description="fixed data width after projection")
    d_label: int = Field(32, ge=2, le=1024, description="label-embedding width")
    dictionary_size: int = Field(100, ge=2, le=4096, description="label dictionary M")
    dropout: float = Field(0.0, ge=0.0, lt=1.0)
    # ablations
    projection: Literal["random_injection", "none"] = Field(
        "random_injection", description="'none': fixed zero-padding identity map (ablation)"
    )
    label_mode: Literal["random_injection", "fixed_slots"] = Field(
        "random_injection", description="'fixed_slots': labels take slots 0..K-1 (ablation)"
    )
    attention: Literal["inline", "causal"] = Field("inline")
    # optimisation
    lr: float = Field(3e-4, gt=0.0, le=1.0)
    weight_decay: float = Field(0.0, ge=0.0, le=1.0)
    batch_episodes: int = Field(32, ge=1, le=4096, description="episodes per step per worker")
    warmup_steps: int = Field(100, ge=0)
    lr_decay_steps: int = Field(
        0,
        ge=0,
        description="the learning rate falls linearly to lr/lr_decay_steps over the last "
        "lr_decay_steps steps; 0: constant after the warmup (`small`'s schedule)",
    )
    curriculum_frac: float = Field(0.25, ge=0.0, le=1.0, description="0 disables it")
    # training episodes (modality A)
    min_ways: int = Field(2, ge=2, le=4096)
    max_ways: int = Field(5, ge=2, le=4096)
    min_shots: int = Field(1, ge=1, le=1000)
    max_shots: int = Field(5, ge=1, le=1000)
    queries_per_class: int = Field(5, ge=1, le=1000)
    train_tasks: Literal["A", "A+mixed"] = Field(
        "A",
        description="training episodes: modality A only (the paper's training), or 'A+mixed': every other "
        "step (drawn per step) a batch of generated mixed-Gaussian tasks (episodes."
        "MixedGaussianModality) of random width 8..d_data, separation 0.7..1.5 and feature "
        "noise 0.5..2, standardised by their support like the predictor's requests",
    )
    # evaluation
    eval_episodes: int = Field(500, ge=1, le=1_000_000)
    eval_draws: int = Field(
        1,
        ge=1,
        le=MAX_DRAWS,
        description="(π, ρ) draws averaged at test time; also the served predictor's default",
    )
    experiment_seeds: int = Field(
        1, ge=1, le=20, description="training seeds per system in experiments()"
    )
    ablation_seeds: int | None = Field(
        None,
        ge=1,
        le=20,
        description="training seeds of the ablation rows (no_projection, fixed_label_slots) in "
        "experiments(): the first ablation_seeds of the experiment's seeds; None: "
        "experiment_seeds",
    )
    compare_draws: int | None = Field(
        None,
        ge=1,
        le=MAX_DRAWS,
        description="(π, ρ) draws the TAIL variants of experiments() average; None: "
        "max(eval_draws, 4)",
    )
    served_episodes: int = Field(
        0,
        ge=0,
        le=100_000,
        description="experiments() (comparison): episodes per width and seed on which each "
        "seed's TAIL checkpoint, served at its default settings, answers generated tasks of "
        "16 to 4,096 features next to nearest centroid (widths.py); 0: not run",
    )
    # experiments(): the paper's comparison, or the paper's scale ingredients one at a time
    experiment: Literal["comparison", "ingredients"] = Field(
        "comparison",
        description="experiments(): 'comparison' (TAIL against ProtoHead, LinearProbe and two "
        "ablations) or 'ingredients' (TAIL as configured, with twice the depth, and with four "
        "and sixteen times the training steps, against ProtoHead and LinearProbe on the same "
        "episodes)",
    )
    features_path: str | None = Field(
        None,
        description="Parquet of precomputed features (features, label, dataset) to evaluate on",
    )

    # Sweeps: TAIL draws fresh episodes every step, so the windowed episode accuracy it reports
    # is measured on episodes the model has not trained on (progressive validation); it is the
    # objective f, and its curve with the loss is the auxiliary vector h.
    TUNE: ClassVar[TuneSpec] = TuneSpec(
        space={
            "lr": Float(1e-4, 3e-3, log=True),
            "weight_decay": Float(1e-6, 1e-1, log=True),
            "depth": Int(1, 4),
            "warmup_steps": Int(0, 20),
        },
        metric="episode_acc",
        mode="max",
        curve=("episode_acc", "loss"),
    )

    # `nshot eval --set` may change these (episodes, (π, ρ) draws and an extra feature set to
    # evaluate on); every other field is fixed by the checkpoint, since it shapes the model
    EVAL_FIELDS: ClassVar[frozenset[str]] = MethodConfig.EVAL_FIELDS | {
        "eval_episodes",
        "eval_draws",
        "features_path",
    }
    PRESETS: ClassVar[dict[str, dict]] = {
        "smoke": dict(
            depth=1, heads=2, mlp_dim=48, d_data=16, d_label=8, dictionary_size=20,
            steps=50, batch_episodes=4, min_ways=2, max_ways=3, min_shots=1, max_shots=2,
            queries_per_class=2, eval_episodes=20, curriculum_frac=0.0, warmup_steps=5,
            log_every=10, checkpoint_every=25,
        ),
        "small": _SMALL,
        "small-v1": _SMALL_V1,
        # `nshot quickstart`'s model: the `small-v1` recipe, a 3-minute model (its printout
        # says so and where the long-trained `small` stands)
        "quickstart": _SMALL_V1,
        # the `small` model for serving arbitrary tabular inputs (README: "TAIL on any input"):
        # mixed-Gaussian tasks beside modality A, 28,000 steps (the last 4,000 decaying) and
        # 32 (π, ρ) draws per answer by default; ~23 min of training on 2 cores
        "tabular": {
            **_SMALL_V1, "train_tasks": "A+mixed", "steps": 28_000, "lr_decay_steps": 4_000,
            "eval_draws": 32, "checkpoint_every": 1000,
        },
        "paper": dict(
            depth=16, heads=16, mlp_dim=3072, d_data=1280, d_label=256, dictionary_size=100,
            steps=100_000, batch_episodes=32, lr=3e-5, min_ways=2, max_ways=5, min_shots=1,
            max_shots=5, queries_per_class=5, eval_episodes=500, curriculum_frac=0.25,
            warmup_steps=2000, log_every=100, checkpoint_every=5000,
        ),
    }  # fmt: skip

    @property
    def width(self) -> int:
        return self.d_data + self.d_label

    @model_validator(mode="after")
    def _check(self) -> TailConfig:
        if self.lr_decay_steps > self.steps:
            raise ValueError(
                f"field 'lr_decay_steps': {self.lr_decay_steps} exceeds steps={self.steps}"
            )
        if self.width % self.heads:
            raise ValueError(
                f"field 'heads': d_data + d_label = {self.width} is not divisible by heads={self.heads}"
            )
        if self.ablation_seeds is not None and self.ablation_seeds > self.experiment_seeds:
            raise ValueError(
                f"field 'ablation_seeds': {self.ablation_seeds} exceeds "
                f"experiment_seeds={self.experiment_seeds}"
            )
        if self.max_ways < self.min_ways:
            raise ValueError("field 'max_ways': must be >= min_ways")
        if self.max_shots < self.min_shots:
            raise ValueError("field 'max_shots': must be >= min_shots")
        if self.max_ways > self.dictionary_size:
            raise ValueError(
                f"field 'max_ways': {self.max_ways} exceeds the label dictionary size "
                f"M = dictionary_size = {self.dictionary_size}"
            )
        return self
