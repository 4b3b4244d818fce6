"""Unpaired IV configuration and presets.

Preset decisions: ``small`` is the calibrated setting (d = 20, s* = 3, env_large
(3 200, 4), env_small (64, 200), 50 replications, curve m ∈ {50, …, 12 800} at r = 4);
``smoke`` a short check (10 replications, (800, 4) / (32, 100), curve m ∈ {200, 800});
``paper`` the paper's Setting 3 (d = 100, instrument rank 60, s* = 10; reconstruction: the
audit gives no table, so env_large/env_small keep the small preset's data budget shape).
"""

from __future__ import annotations

from typing import Any, ClassVar, Literal

from pydantic import Field, model_validator

from nshot.method import MethodConfig


class UnpairedIVConfig(MethodConfig):
    # estimator (SplitUP / crossfold GMM)
    folds: int = Field(2, ge=2, le=64, description="K: folds of the X-sample, within environment")
    repeats: int = Field(10, ge=1, le=10_000, description="H: random fold assignments averaged")
    analytic: bool = Field(False, description="use the analytic H → ∞ form of C_XX")
    weight: Literal["identity", "optimal"] = Field(
        "identity", description="W: unit weights (paper) or estimated 1/variance per environment"
    )
    lam_c: float = Field(20.0, gt=0.0, le=1e6, description="ℓ1 penalty λ = lam_c · 2/√ñ")
    lam_select: bool = Field(
        False, description="train_loop/serving: choose λ on 20 % held-out environments"
    )
    refit_threshold: float = Field(1e-8, gt=0.0, le=1.0, description="support: |β̂_j| > this")
    psd_eps: float = Field(1e-6, gt=0.0, le=1.0, description="eigenvalue floor of C⁺")
    cd_tol: float = Field(1e-10, gt=0.0, le=1e-2, description="coordinate-descent tolerance")
    # data
    data_source: Literal["synthetic", "card", "path"] = Field(
        "synthetic", description="train_loop/data(): the generator, Card (1995), or data_path"
    )
    data_path: str | None = Field(
        None, description="CSV/Parquet with env, sample ∈ {X,Y}, x_0..x_{d-1}, y"
    )
    d: int = Field(20, ge=1, le=10_000, description="number of covariates")
    s_star: int = Field(3, ge=1, le=10_000, description="nonzero coefficients of β*")
    beta_value: float = Field(1.0, description="value of the nonzero coefficients of β*")
    rank: int | None = Field(
        None, ge=1, description="instrument rank of the generator (None: full rank d)"
    )
    confounding: float = Field(2.0, ge=0.0, le=1e3, description="coefficient of H in Y")
    env_large: tuple[int, int] = Field((3200, 4), description="(m, r): many environments")
    env_small: tuple[int, int] = Field((64, 200), description="(m, r): few environments")
    fit_setting: Literal["env_large", "env_small"] = Field(
        "env_large", description="the setting train_loop generates one replication of"
    )
    # experiments
    replications: int = Field(50, ge=1, le=100_000)
    curve_ms: list[int] = Field(
        [50, 200, 800, 3200, 12800], min_length=1, description="consistency curve: m values"
    )
    curve_r: int = Field(4, ge=2, le=10_000, description="consistency curve: r per sample")
    curve_reps: int = Field(50, ge=1, le=100_000, description="replications per curve point")
    low_rank_k: int | None = Field(
        10, ge=1, description="rank k of the reported low-rank variant (None: skip it)"
    )
    card_splits: int = Field(200, ge=0, le=100_000, description="Card half splits (0: skip)")
    chunk_reps: int = Field(10, ge=1, le=10_000, description="replications per Ray task")

    # one training step in every preset: the estimators are closed-form (train.py)
    PRESETS: ClassVar[dict[str, dict[str, Any]]] = {
        "smoke": dict(
            d=20, s_star=3, env_large=(800, 4), env_small=(32, 100), replications=10,
            curve_ms=[200, 800], curve_reps=10, card_splits=20, low_rank_k=10, chunk_reps=5,
            steps=1, checkpoint_every=1, log_every=1,
        ),
        "small": dict(
            d=20, s_star=3, env_large=(3200, 4), env_small=(64, 200), replications=50,
            curve_ms=[50, 200, 800, 3200, 12800], curve_reps=50, card_splits=200,
            low_rank_k=10, chunk_reps=10,
            steps=1, checkpoint_every=1, log_every=1,
        ),
        "paper": dict(
            d=100, s_star=10, rank=60, env_large=(3200, 4), env_small=(400, 32),
            replications=50, curve_ms=[200, 800, 3200, 12800, 51200], curve_reps=50,
            card_splits=200, low_rank_k=None, chunk_reps=5,
            steps=1, checkpoint_every=1, log_every=1,
        ),
    }  # fmt: skip

    @model_validator(mode="before")
    @classmethod
    def _path_implies_source(cls, values: Any) -> Any:
        if isinstance(values, dict) and values.get("data_path") and "data_source" not in values:
            values = {**values, "data_source": "path"}
        return values

    @model_validator(mode="after")
    def _check(self) -> UnpairedIVConfig:
        if self.s_star > self.d:
            raise ValueError(f"field 's_star': {self.s_star} exceeds d = {self.d}")
        if self.rank is not None and self.rank > self.d:
            raise ValueError(f"field 'rank': {self.rank} exceeds d = {self.d}")
        if self.low_rank_k is not None and self.low_rank_k > self.d:
            raise ValueError(f"field 'low_rank_k': {self.low_rank_k} exceeds d = {self.d}")
        if self.beta_value == 0:
            raise ValueError("field 'beta_value': must be nonzero (it defines the support)")
        for name in ("env_large", "env_small"):
            m, r = getattr(self, name)
            if m < 2:
                raise ValueError(f"field '{name}': needs m >= 2 environments, got {m}")
            if r < 2:
                raise ValueError(f"field '{name}': needs r >= 2 units per environment, got {r}")
            if not self.analytic and self.folds > r:
                raise ValueError(
                    f"field 'folds': {self.folds} folds exceed r = {r} units per environment "
                    f"of {name}"
                )
        if any(m < 2 for m in self.curve_ms):
            raise ValueError("field 'curve_ms': every m must be >= 2")
        if not self.analytic and self.folds > self.curve_r:
            raise ValueError(f"field 'folds': {self.folds} folds exceed curve_r = {self.curve_r}")
        if self.data_source == "path" and not self.data_path:
            raise ValueError("field 'data_path': data_source='path' needs a data_path")
        if self.data_path and self.data_source != "path":
            raise ValueError(
                f"field 'data_source': data_path is set but data_source={self.data_source!r}"
            )
        return self

    def lam(self, n_x: int) -> float:
        """λ = lam_c · 2/√ñ (the paper gives only λ ≍ m^(-1/2))."""
        return self.lam_c * 2.0 / n_x**0.5
