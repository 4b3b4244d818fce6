"""modhnn's predictor: adapt-and-predict per request.

A request carries observations of a new system, either ``shots`` (``{q, p, dq, dp}`` samples) or
observed trajectories (``trajectory``, or several in ``trajectories``: states on a uniform ``dt``
or at given ``times``; derivatives by central differences, second order at the ends), plus an
``initial_state``, a ``horizon`` (steps) and a step ``dt``. The predictor fits only the latent z
(from z_avg, the base frozen) to the observations and integrates the adapted learned dynamics
(RK4 or the implicit midpoint rule, float64) from the initial state. The response holds the
rollout, the learned energy H̃ along it, the fitted z and the fit loss.
"""

from __future__ import annotations

import math
from typing import Any, Literal

import numpy as np
import torch
from pydantic import BaseModel, Field, model_validator

from nshot.method import Predictor
from nshot.serve.schema import StrictRequest, check_finite
from nshot.train.checkpoint import LoadedCheckpoint

from .config import ModHNNConfig
from .model import load_model

MAX_SHOTS = 1000
MAX_STATES = 10_000
DOF = 1  # one (q, p) pair


class Shot(StrictRequest):
    q: float
    p: float
    dq: float
    dp: float


class Trajectory(StrictRequest):
    states: list[list[float]] = Field(..., description="observed [q, p] states, in time order")
    dt: float | None = Field(None, description="uniform time step (or give times)")
    times: list[float] | None = Field(None, description="observation times (or give dt)")


def _check_trajectory(t: Trajectory, where: str) -> None:
    if len(t.states) < 3:
        raise ValueError(f"{where}.states: needs at least 3 states, got {len(t.states)}")
    if len(t.states) > MAX_STATES:
        raise ValueError(f"{where}.states: at most {MAX_STATES} states")
    for i, s in enumerate(t.states):
        if len(s) != 2 * DOF:
            raise ValueError(
                f"{where}.states[{i}]: has {len(s)} values, the model has {DOF} degree of "
                f"freedom ([q, p])"
            )
        check_finite(f"{where}.states[{i}]", s)
    if (t.dt is None) == (t.times is None):
        raise ValueError(f"{where}: give exactly one of dt and times")
    if t.dt is not None and not (math.isfinite(t.dt) and 0 < t.dt <= 1):
        raise ValueError(f"{where}.dt: must be in (0, 1], got {t.dt}")
    if t.times is not None:
        if len(t.times) != len(t.states):
            raise ValueError(f"{where}.times: {len(t.times)} times for {len(t.states)} states")
        check_finite(f"{where}.times", t.times)
        if any(b <= a for a, b in zip(t.times, t.times[1:])):
            raise ValueError(f"{where}.times: must be finite and strictly increasing")


class ModHNNRequest(StrictRequest):
    shots: list[Shot] | None = Field(None, description="(q, p, q̇, ṗ) samples (1–1000)")
    trajectory: Trajectory | None = Field(None, description="one observed trajectory")
    trajectories: list[Trajectory] | None = Field(None, description="several observed trajectories")
    initial_state: list[float] = Field(..., description="[q, p] to roll out from")
    horizon: int = Field(..., description="steps to predict (1–10,000)")
    dt: float = Field(..., description="prediction step, in (0, 1]")
    integrator: Literal["rk4", "midpoint"] = "rk4"

    @model_validator(mode="after")
    def _check(self) -> ModHNNRequest:
        given = [n for n in ("shots", "trajectory", "trajectories") if getattr(self, n) is not None]
        if len(given) != 1:
            raise ValueError(
                "shots: give exactly one of shots, trajectory and trajectories"
                + (f" (got {', '.join(given)})" if given else " (got none)")
            )
        if self.shots is not None:
            if not 1 <= len(self.shots) <= MAX_SHOTS:
                raise ValueError(f"shots: needs 1 to {MAX_SHOTS} samples, got {len(self.shots)}")
            for i, s in enumerate(self.shots):
                check_finite(f"shots[{i}]", [s.q, s.p, s.dq, s.dp])
        if self.trajectory is not None:
            _check_trajectory(self.trajectory, "trajectory")
        if self.trajectories is not None:
            if not 1 <= len(self.trajectories) <= 100:
                raise ValueError("trajectories: needs 1 to 100 trajectories")
            for i, t in enumerate(self.trajectories):
                _check_trajectory(t, f"trajectories[{i}]")
        if len(self.initial_state) != 2 * DOF:
            raise ValueError(
                f"initial_state: has {len(self.initial_state)} values, the model has {DOF} "
                "degree of freedom ([q, p])"
            )
        check_finite("initial_state", self.initial_state)
        if not 1 <= self.horizon <= 10_000:
            raise ValueError(f"horizon: must be in 1..10000, got {self.horizon}")
        if not (math.isfinite(self.dt) and 0 < self.dt <= 1):
            raise ValueError(f"dt: must be in (0, 1], got {self.dt}")
        return self


class ModHNNResponse(BaseModel):
    trajectory: list[list[float]] = Field(..., description="horizon + 1 states [q, p]")
    energy: list[float] | None = Field(..., description="learned H̃ along the rollout (HNNs)")
    z: list[float]
    fit_loss: float = Field(..., description="relative squared error on the observations")


def derivatives(t: Trajectory) -> tuple[np.ndarray, np.ndarray]:
    """``(states [n, 2], (q̇, ṗ) [n, 2])`` by central differences (second order at the ends)."""
    x = np.asarray(t.states, dtype=np.float64)
    coords = t.dt if t.dt is not None else np.asarray(t.times, dtype=np.float64)
    return x, np.gradient(x, coords, axis=0, edge_order=2)


def observations(request: ModHNNRequest) -> tuple[np.ndarray, np.ndarray]:
    if request.shots is not None:
        x = np.array([[s.q, s.p] for s in request.shots], dtype=np.float64)
        f = np.array([[s.dq, s.dp] for s in request.shots], dtype=np.float64)
        return x, f
    trajs = [request.trajectory] if request.trajectory is not None else request.trajectories
    parts = [derivatives(t) for t in trajs or []]
    return np.concatenate([p[0] for p in parts]), np.concatenate([p[1] for p in parts])


class ModHNNPredictor(Predictor[ModHNNRequest, ModHNNResponse]):
    Request = ModHNNRequest
    Response = ModHNNResponse

    def __init__(self, checkpoint: LoadedCheckpoint) -> None:
        self.state, self.system = load_model(checkpoint)
        self.cfg = ModHNNConfig.validated(checkpoint.config)
        self.dyn = self.state.dyn
        self.step = checkpoint.step

    def metadata(self) -> dict[str, Any]:
        spec = self.dyn.spec
        return {
            "system": self.system,
            "kind": spec.kind,
            "modulation": spec.modulation,
            "d_z": spec.d_z,
            "degrees_of_freedom": DOF,
            "adapt_steps": self.cfg.adapt_steps,
            "step": self.step,
        }

    def example_request(self) -> dict[str, Any]:
        """``shots`` exact ``(q, p, q̇, ṗ)`` samples (the checkpoint's number of shots) of the
        checkpoint's system at the middle of its parameter ranges, and a 20-step rollout at the
        training data's ``dt`` from the first of them: the body a user would POST."""
        from .systems import get_system

        sys_ = get_system(self.system)
        mu = np.array([(lo + hi) / 2 for lo, hi in sys_.ranges])
        x = np.round(sys_.initial_states(mu, self.cfg.shots, np.random.default_rng(0)), 4)
        f = np.round(np.stack(sys_.field(x[:, 0], x[:, 1], mu), -1), 4)
        shots = [dict(zip(("q", "p", "dq", "dp"), map(float, (*xi, *fi)))) for xi, fi in zip(x, f)]
        return {"shots": shots, "initial_state": x[0].tolist(), "horizon": 20, "dt": self.cfg.dt}

    def adapt(self, x: np.ndarray, f: np.ndarray) -> tuple[torch.Tensor | None, float]:
        from .adapt import adapt_latent
        from .model import relative_loss

        X = torch.as_tensor(x[None], dtype=torch.float32)
        F = torch.as_tensor(f[None], dtype=torch.float32)
        if not self.dyn.uses_latent:
            return None, float(relative_loss(self.dyn.field(X, None), F)[0])
        z, fit = adapt_latent(
            self.dyn, X, F, self.state.z_avg()[None], steps=self.cfg.adapt_steps,
            lr=self.cfg.adapt_lr, lambda_z=self.cfg.lambda_z,
        )  # fmt: skip
        return z, float(fit[0])

    def __call__(self, request: ModHNNRequest) -> ModHNNResponse:
        import copy

        from .model import implicit_midpoint, rk4

        x, f = observations(request)
        if not np.isfinite(f).all():
            raise ValueError("trajectory: derivatives are not finite")
        z, fit = self.adapt(x, f)
        dyn64 = copy.deepcopy(self.dyn).double().eval()
        z64 = z.double() if z is not None else None
        x0 = torch.tensor([[request.initial_state]], dtype=torch.float64)  # [1, 1, 2]

        def field(s: torch.Tensor) -> torch.Tensor:
            return dyn64.field(s, z64)

        with torch.no_grad():  # the field takes its own input gradient
            if request.integrator == "rk4":
                traj = rk4(field, x0, request.dt, request.horizon)
            else:
                traj = implicit_midpoint(
                    field, x0, request.dt, request.horizon, iters=self.cfg.midpoint_iters,
                    tol=self.cfg.midpoint_tol,
                )  # fmt: skip
        traj = traj[0, 0]  # [horizon + 1, 2]
        energy = None
        if dyn64.spec.kind == "hnn":
            with torch.no_grad():
                energy = dyn64.energy(traj[None], z64)[0].tolist()
        return ModHNNResponse(
            trajectory=traj.tolist(),
            energy=energy,
            z=z[0].tolist() if z is not None else [],
            fit_loss=fit,
        )
