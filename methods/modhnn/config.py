"""modhnn configuration and presets (``smoke``, ``small``, ``paper``)."""

from __future__ import annotations

from typing import ClassVar, Literal

from pydantic import Field, model_validator

from nshot.method import MethodConfig

SystemName = Literal["mass_spring", "pendulum", "duffing", "dno"]
Variant = Literal["none", "shift", "full_weight", "mr", "svd", "film", "concat"]
ROWS = (
    "svd",
    "mr",
    "full_weight",
    "shift",
    "film",
    "hnn_per_instance",
    "hnn_pooled",
    "mlp_modulated",
    "fomaml",
    "reptile",
    "anil",
)
Row = Literal[
    "svd", "mr", "full_weight", "shift", "film", "concat", "hnn_per_instance", "hnn_pooled",
    "mlp_modulated", "fomaml", "reptile", "anil",
]  # fmt: skip
Ablation = Literal["zero_init", "reset_latents"]


class ModHNNConfig(MethodConfig):
    # data (the paper's benchmark systems)
    system: SystemName = Field("pendulum", description="the system train_loop meta-trains on")
    n_train_instances: int = Field(70, ge=1, le=100_000, description="training parameter values")
    n_test_instances: int = Field(10, ge=1, le=10_000, description="unseen test parameter values")
    n_traj: int = Field(10, ge=2, le=1000, description="trajectories per instance")
    n_steps: int = Field(30, ge=3, le=10_000, description="states per trajectory")
    dt: float = Field(0.1, gt=0.0, le=1.0, description="time step of the data")
    # model (the paper's method)
    modulation: Variant = Field("svd", description="modulation train_loop meta-trains")
    model_kind: Literal["hnn", "mlp"] = Field(
        "hnn", description="hnn: modulated energy; mlp: the non-structured vector-field control"
    )
    width: int = Field(64, ge=2, le=4096)
    depth: int = Field(2, ge=1, le=16)
    d_z: int = Field(4, ge=1, le=1024, description="latent dimension")
    rank: int = Field(3, ge=1, le=256, description="rank r of MR(r) and SVD(r)")
    # meta-training
    lr: float = Field(1e-3, gt=0.0, le=1.0, description="Adam lr of the base")
    batch_instances: int = Field(8, ge=1, le=100_000, description="instances per outer step")
    points_per_instance: int = Field(
        0, ge=0, le=1_000_000, description="samples per instance and step (0: all)"
    )
    n_inner: int = Field(3, ge=0, le=1000, description="latent SGD steps N_in per outer step")
    lr_inner: float = Field(1e-2, gt=0.0, le=100.0, description="latent SGD step η_in")
    latent_clip: float = Field(
        10.0, ge=0.0, description="clip each latent's gradient norm in its SGD step (0: off)"
    )
    lambda_phi: float = Field(1e-3, ge=0.0, le=10.0, description="λ_φ on ‖φ‖₂")
    lambda_z: float = Field(1e-2, ge=0.0, le=10.0, description="λ_z on ‖z‖₂")
    lambda_orth: float = Field(1e-2, ge=0.0, le=10.0, description="SVD basis orthogonality weight")
    grad_clip: float = Field(10.0, ge=0.0, description="clip the base's gradient norm (0: off)")
    reset_latents: bool = Field(False, description="ablation: reset the latents every epoch")
    # test-time adaptation
    shots: int = Field(10, ge=1, le=100_000, description="(q, p, q̇, ṗ) samples of one trajectory")
    adapt_steps: int = Field(200, ge=0, le=100_000, description="Adam steps on z at test time")
    adapt_lr: float = Field(1e-2, gt=0.0, le=10.0)
    latent_init: Literal["avg", "zero"] = Field("avg", description="z_avg or zero at test time")
    scratch_steps: int = Field(1000, ge=1, le=1_000_000, description="per-instance HNN steps")
    scratch_lr: float = Field(3e-3, gt=0.0, le=1.0, description="per-instance HNN Adam lr")
    # optimisation-based meta-learning baselines (rows fomaml, reptile, anil)
    inner_steps: int = Field(
        5, ge=0, le=1000,
        description="SGD steps on an instance's shots per outer step (fomaml, reptile, anil)",
    )  # fmt: skip
    inner_lr: float = Field(
        1e-2, gt=0.0, le=100.0, description="SGD step of the weights in the inner loop"
    )
    inner_clip: float = Field(
        10.0, ge=0.0, description="clip each instance's inner-loop gradient norm (0: off)"
    )
    test_inner_steps: int = Field(
        10, ge=0, le=100_000,
        description="SGD steps on the test instance's shots (fomaml, reptile, anil)",
    )  # fmt: skip
    # evaluation (the paper's metrics)
    grid: int = Field(50, ge=2, le=1000, description="ε_field grid points per axis")
    rollout_steps: int = Field(1000, ge=20, le=1_000_000, description="long rollout for drift")
    drift_window: int = Field(100, ge=1, le=100_000, description="steps averaged at both ends")
    midpoint_iters: int = Field(5, ge=1, le=1000, description="fixed-point iterations per step")
    midpoint_tol: float = Field(
        0.0, ge=0.0, le=1.0, description="iterate further until the update is below tol (0: off)"
    )
    # experiments()
    seeds: int = Field(3, ge=1, le=100)
    rows: list[Row] = Field(default_factory=lambda: list(ROWS), min_length=1)
    ablations: list[Ablation] = Field(
        default_factory=lambda: ["zero_init", "reset_latents"],
        description="ablations of the paper's ablation study, run on the SVD row",
    )
    ablation_seeds: int = Field(1, ge=1, le=100, description="seeds of the reset-latents run")
    extra_systems: list[SystemName] = Field(
        default_factory=list, description="further systems run with svd and hnn_pooled (extra)"
    )

    # `nshot eval --set` may change these (test-time adaptation of z and the dynamics metrics);
    # every other field is fixed by the checkpoint, since it shapes the model
    EVAL_FIELDS: ClassVar[frozenset[str]] = MethodConfig.EVAL_FIELDS | {
        "shots",
        "adapt_steps",
        "adapt_lr",
        "latent_init",
        "grid",
        "rollout_steps",
        "drift_window",
        "midpoint_iters",
        "midpoint_tol",
    }
    PRESETS: ClassVar[dict[str, dict]] = {
        "smoke": dict(
            n_train_instances=5, n_test_instances=2, n_traj=2, n_steps=10, width=16, d_z=2,
            rank=2, steps=50, batch_instances=2, n_inner=1, adapt_steps=20, scratch_steps=50,
            grid=10, rollout_steps=100, drift_window=10, seeds=1, log_every=10,
            checkpoint_every=25, ablations=[],
        ),
        "small": dict(
            n_train_instances=70, n_test_instances=10, n_traj=10, n_steps=30, width=64, d_z=4,
            rank=3, steps=1000, batch_instances=8, points_per_instance=100, n_inner=3,
            adapt_steps=1000, seeds=3, log_every=100, checkpoint_every=500,
            extra_systems=["mass_spring"],
        ),
        "paper": dict(
            system="pendulum", n_train_instances=70, n_test_instances=10, width=200, d_z=8,
            rank=5, steps=5000, batch_instances=8, n_inner=3, adapt_steps=200, seeds=3,
            log_every=100, checkpoint_every=1000,
            extra_systems=["mass_spring", "duffing", "dno"],
        ),
    }  # fmt: skip

    @model_validator(mode="after")
    def _check(self) -> ModHNNConfig:
        if self.shots > self.n_steps:
            raise ValueError(
                f"field 'shots': {self.shots} shots from one trajectory of {self.n_steps} states"
            )
        if self.drift_window * 2 > self.rollout_steps + 1:
            raise ValueError("field 'drift_window': two windows do not fit in rollout_steps")
        if self.model_kind == "mlp" and self.modulation == "none":
            pass  # an unmodulated MLP is allowed (a plain vector-field regressor)
        if len(set(self.rows)) != len(self.rows):
            raise ValueError("field 'rows': repeated row")
        return self
