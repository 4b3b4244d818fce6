"""auxbo's predictor: the surrogate itself, for design tools and notebooks.

Given a few-shot context ``[{x, f, h}]`` and candidate designs, it returns the TNP's predictive
mean and standard deviation of f (in the task's own units), the probability of improvement over
the context's best f, and the index of the candidate BO would evaluate next.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
from pydantic import BaseModel, Field, field_validator

from nshot.method import Predictor
from nshot.serve.schema import StrictRequest, check_finite
from nshot.train.checkpoint import LoadedCheckpoint

from .model import load_model

# an objective may be in any units; x (the unit cube) and h (curves) are of order one
MAX_F = 1e12


class ContextPoint(StrictRequest):
    x: list[float] | dict[str, Any] = Field(..., description="design (unit cube) or a config")
    f: float = Field(..., description="observed objective (higher is better)")
    h: list[list[float]] | None = Field(None, description="auxiliary frames [T][d_h]")

    @field_validator("f")
    @classmethod
    def _f(cls, v: float) -> float:
        check_finite("f", [v], MAX_F)
        return v

    @field_validator("h")
    @classmethod
    def _h(cls, v: list[list[float]] | None) -> list[list[float]] | None:
        if v is None:
            return v
        if not v:
            raise ValueError("h is empty; omit it instead")
        if len({len(row) for row in v}) != 1:
            raise ValueError("h frames have different widths")
        for t, row in enumerate(v):
            check_finite(f"h[{t}]", row)
        return v


MAX_CONTEXT = 2_000
MAX_CANDIDATES = 10_000
# candidates scored per forward pass: a target attends to the context and itself only (the
# TNP-D mask), so splitting the candidates changes no answer and bounds the attention memory
CANDIDATE_CHUNK = 1_000


class AuxBORequest(StrictRequest):
    context: list[ContextPoint] = Field(..., min_length=1, max_length=MAX_CONTEXT)
    candidates: list[list[float] | dict[str, Any]] = Field(
        ..., min_length=1, max_length=MAX_CANDIDATES
    )
    xi: float | None = Field(None, ge=0.0, le=10.0, description="PI margin in f's own units")


class AuxBOResponse(BaseModel):
    mean: list[float]
    std: list[float]
    pi: list[float]
    best_index: int


class AuxBOPredictor(Predictor[AuxBORequest, AuxBOResponse]):
    Request = AuxBORequest
    Response = AuxBOResponse

    def __init__(self, checkpoint: LoadedCheckpoint) -> None:
        from nshot.tune.space import SearchSpace

        self.model, self.stats = load_model(checkpoint)
        extra = checkpoint.extra
        self.space = SearchSpace.from_json(extra["space"]) if extra.get("space") else None
        self.xi = float(checkpoint.config.get("xi", 0.01))
        self.meta = {
            "family": extra.get("family"),
            "x_dim": self.model.cfg.x_dim,
            "h_len": self.model.cfg.h_len,
            "h_dim": self.model.cfg.h_dim,
            "uses_h": self.model.cfg.use_h,
            "space": extra.get("space"),
            "history_method": extra.get("history_method"),
            "step": checkpoint.step,
        }

    def metadata(self) -> dict[str, Any]:
        return dict(self.meta)

    def example_request(self) -> dict[str, Any]:
        """Three observed designs (with their h curves when the surrogate reads h) and two
        candidates, in this surrogate's design and curve widths."""
        cfg = self.model.cfg
        frames = min(cfg.h_len, 10)

        def design(k: int) -> list[float]:
            return [round((k + 1 + j) / (cfg.x_dim + 6) % 1.0, 3) for j in range(cfg.x_dim)]

        context = []
        for i, f in enumerate((0.2, 0.5, 0.4)):
            point: dict[str, Any] = {"x": design(i), "f": f}
            if cfg.use_h:
                point["h"] = [
                    [round(f * (t + 1) / frames - 0.1 * c, 3) for c in range(cfg.h_dim)]
                    for t in range(frames)
                ]
            context.append(point)
        return {"context": context, "candidates": [design(3), design(4)]}

    def _x(self, x: list[float] | dict[str, Any], where: str) -> np.ndarray:
        D = self.model.cfg.x_dim
        if isinstance(x, dict):
            if self.space is None:
                raise ValueError(f"{where}: this surrogate has no search space; send x as a list")
            missing = sorted(set(self.space.params) - set(x))
            unknown = sorted(set(x) - set(self.space.params))
            if missing or unknown:
                raise ValueError(f"{where}: missing keys {missing}, unknown keys {unknown}")
            try:
                return self.space.encode(x)
            except Exception as err:  # noqa: BLE001 - SearchSpaceError names the parameter
                raise ValueError(f"{where}: {err}") from None
        if len(x) != D:
            raise ValueError(f"{where}: x has {len(x)} coordinates, the surrogate expects {D}")
        check_finite(where, x)
        return np.asarray(x, dtype=np.float64)

    def __call__(self, request: AuxBORequest) -> AuxBOResponse:
        from .model import normalise_h

        cfg = self.model.cfg
        X = np.stack([self._x(c.x, f"context[{i}]") for i, c in enumerate(request.context)])
        cand = np.stack([self._x(c, f"candidates[{i}]") for i, c in enumerate(request.candidates)])
        f = np.asarray([c.f for c in request.context], dtype=np.float64)
        hc = h_mask = None
        if cfg.use_h:
            h = np.full((len(X), cfg.h_len, cfg.h_dim), np.nan, dtype=np.float32)
            for i, c in enumerate(request.context):
                if c.h is None:
                    raise ValueError(f"context[{i}]: h is required (the surrogate reads h)")
                arr = np.asarray(c.h, dtype=np.float32)
                if arr.shape[1] != cfg.h_dim:
                    raise ValueError(
                        f"context[{i}]: h frames have width {arr.shape[1]}, expected {cfg.h_dim}"
                    )
                if arr.shape[0] > cfg.h_len:
                    raise ValueError(
                        f"context[{i}]: h has {arr.shape[0]} frames, at most {cfg.h_len}"
                    )
                h[i, : arr.shape[0]] = arr
            hn, mask = normalise_h(h, self.stats)
            hc = torch.from_numpy(hn).unsqueeze(0)
            h_mask = torch.from_numpy(mask).unsqueeze(0)
        z = (f - self.stats["f_mean"]) / self.stats["f_std"]
        xc = torch.as_tensor(X, dtype=torch.float32).unsqueeze(0)
        zc = torch.as_tensor(z, dtype=torch.float32).unsqueeze(0)
        xt = torch.as_tensor(cand, dtype=torch.float32).unsqueeze(0)
        mus, sigmas = [], []
        with torch.no_grad():
            for start in range(0, xt.shape[1], CANDIDATE_CHUNK):
                mu_c, sigma_c = self.model(
                    xc, zc, hc, xt[:, start : start + CANDIDATE_CHUNK], None, h_mask
                )
                mus.append(mu_c[0])
                sigmas.append(sigma_c[0])
        mu = torch.cat(mus).double() * self.stats["f_std"] + self.stats["f_mean"]  # raw f units
        sigma = torch.cat(sigmas).double() * self.stats["f_std"]
        xi = self.xi if request.xi is None else request.xi
        pi = torch.special.ndtr((mu - (float(f.max()) + xi)) / sigma)
        # argmax PI, ties (PI saturates at 0 or 1) broken by the mean
        order = np.lexsort((mu.numpy(), pi.numpy()))
        best = int(order[-1])
        return AuxBOResponse(
            mean=mu.tolist(),
            std=sigma.tolist(),
            pi=pi.tolist(),
            best_index=best,
        )
