"""CAOS configuration and presets."""

from __future__ import annotations

from typing import ClassVar

from pydantic import Field, field_validator, model_validator

from nshot.method import MethodConfig


class CAOSConfig(MethodConfig):
    k: int = Field(3, ge=1, description="A_k: how many of the smallest one-shot scores are summed")
    n: int = Field(20, ge=2, description="labelled examples per trial (and in the served bank)")
    n_test: int = Field(20, ge=1, description="test images per trial")
    trials: int = Field(1000, ge=1, description="trials, each with a fresh labelled set")
    alphas: list[float] = Field([0.05, 0.1, 0.2], min_length=1, description="miscoverage levels")
    n_sweep: list[int] = Field([], description="extra n values reported at alpha = 0.1 (JSON only)")
    trials_per_task: int = Field(100, ge=1, description="trials per Ray task")
    # digits-landmark substitute for the paper's landmarking data
    canvas: int = Field(
        16, ge=9, le=64, description="side of the canvas the 8x8 digit is pasted in"
    )
    patch: int = Field(7, ge=1, le=15, description="side of the raw patch backbone (odd)")
    pixel_noise: float = Field(0.15, ge=0.0, description="std of the Gaussian pixel noise")
    # classification analogue (reported, not gated)
    cls_trials: int = Field(300, ge=0, description="trials of the digits classification analogue")
    cls_n: int = Field(40, ge=2, description="labelled examples per classification trial")
    cls_k: int = Field(1, ge=1, description="k of the classification analogue")
    # real features instead of the substitute
    features_path: str | None = Field(
        None,
        description="Parquet of precomputed per-candidate features: image_id, features (L x D), "
        "label (candidate index); replaces the digits-landmark substitute",
    )

    # `nshot eval --set` may change these (the trials and levels evaluate() measures the
    # checkpoint's bank with); every other field is fixed by the checkpoint, since it shapes the
    # model
    EVAL_FIELDS: ClassVar[frozenset[str]] = MethodConfig.EVAL_FIELDS | {
        "n_test",
        "trials",
        "alphas",
        "trials_per_task",
    }
    # one training step: the served bank is fitted in closed form (train.py)
    FIT: ClassVar[dict[str, int]] = {"steps": 1, "checkpoint_every": 1, "log_every": 1}
    PRESETS: ClassVar[dict[str, dict]] = {
        "smoke": {**FIT, "trials": 50, "n_test": 5, "trials_per_task": 25, "cls_trials": 40},
        "small": {**FIT, "trials": 1000, "n_test": 20, "n_sweep": [10, 20, 40], "cls_trials": 300},
        "paper": {**FIT, "trials": 5000, "n_test": 20, "n_sweep": [10, 20, 40], "cls_trials": 1000},
    }

    @field_validator("alphas")
    @classmethod
    def _alphas(cls, v: list[float]) -> list[float]:
        for a in v:
            if not 0.0 < a < 1.0:
                raise ValueError(f"every alpha must lie in (0, 1), got {a}")
        return v

    @field_validator("patch")
    @classmethod
    def _odd(cls, v: int) -> int:
        if v % 2 == 0:
            raise ValueError(f"must be odd (a patch centred on its pixel), got {v}")
        return v

    @model_validator(mode="after")
    def _k_le_n(self) -> CAOSConfig:
        if self.k > self.n - 1:
            raise ValueError(f"field 'k': must be at most n - 1 = {self.n - 1}, got {self.k}")
        for m in self.n_sweep:
            if self.k > m - 1:
                raise ValueError(f"field 'n_sweep': n = {m} is below k + 1 = {self.k + 1}")
        if self.cls_k > self.cls_n - 1:
            raise ValueError(f"field 'cls_k': must be at most cls_n - 1 = {self.cls_n - 1}")
        if self.canvas < 8 + 1:
            raise ValueError("field 'canvas': must leave room for an 8x8 digit")
        return self
