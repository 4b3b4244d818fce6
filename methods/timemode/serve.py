"""TimeMoDE predictor: a few-shot set of clean windows (or a domain whose exemplar bank is in
the checkpoint) and a count → generated windows (paper §3, sampling).

The exemplars are in original units; they are min-max scaled by their own set (as the few-shot
windows are when fine-tuning), each generated window is conditioned on one of them drawn at
random (its Domain Prompt), and the samples come back in the exemplars' units (or scaled, with
``return_scaled``). With ``domain`` the checkpoint's bank and scaler of that domain are used.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import torch
from pydantic import BaseModel, Field, model_validator

from nshot.method import Predictor
from nshot.serve.schema import StrictRequest
from nshot.train.checkpoint import LoadedCheckpoint

from .model import Diffusion, generate_many, load_model

MAX_SAMPLES = 1024
MAX_EXEMPLARS = 256
BATCH_ROWS = 2048  # stacked windows per reverse chain of a batch


class TimeModeRequest(StrictRequest):
    n_samples: int = Field(..., ge=1, le=MAX_SAMPLES, description="windows to generate")
    exemplars: list[list[list[float]]] | None = Field(
        None, min_length=1, max_length=MAX_EXEMPLARS,
        description="1–256 clean windows of the target, each L × C, original units",
    )  # fmt: skip
    domain: str | None = Field(
        None, max_length=128, description="a domain whose exemplar bank is in the checkpoint"
    )
    seed: int | None = Field(None, ge=0, le=2**31 - 1, description="sampling seed (default 0)")
    return_scaled: bool = Field(False, description="samples in the scaled [0, 1] units")

    @model_validator(mode="after")
    def _check(self) -> TimeModeRequest:
        if (self.exemplars is None) == (self.domain is None):
            raise ValueError("exemplars: give exactly one of 'exemplars' and 'domain'")
        for i, w in enumerate(self.exemplars or []):
            for j, step in enumerate(w):
                if not all(math.isfinite(v) for v in step):
                    raise ValueError(f"exemplars[{i}][{j}]: NaN or inf")
        return self


class TimeModeResponse(BaseModel):
    samples: list[list[list[float]]] = Field(..., description="n × L × C")
    domain: str | None
    seed: int
    steps: int = Field(..., description="reverse diffusion steps (T)")


class TimeModePredictor(Predictor[TimeModeRequest, TimeModeResponse]):
    Request = TimeModeRequest
    Response = TimeModeResponse

    def __init__(self, checkpoint: LoadedCheckpoint) -> None:
        self.state, self.cfg, self.run = load_model(checkpoint)
        self.domains = list(self.run["domains"])
        self.diffusion = Diffusion(self.cfg.diffusion_steps, prediction=self.cfg.prediction)
        self.length, self.channels = self.state.bank.shape[2], self.state.bank.shape[3]

    @classmethod
    def from_checkpoint(cls, checkpoint: LoadedCheckpoint) -> TimeModePredictor:
        return cls(checkpoint)

    def metadata(self) -> dict[str, Any]:
        return {"system": self.cfg.system, "stage": self.run.get("stage"),
                "domains": self.domains, "window": self.length, "channels": self.channels,
                "steps": self.cfg.diffusion_steps, "max_samples": MAX_SAMPLES,
                "max_exemplars": MAX_EXEMPLARS,
                "bank_sizes": dict(zip(self.domains, self.state.bank_count.tolist(),
                                       strict=True))}  # fmt: skip

    def _bank(self, i: int) -> np.ndarray:
        n = int(self.state.bank_count[i])
        return self.state.bank[i, :n].numpy()

    def example_request(self) -> dict[str, Any]:
        """Three clean windows of the checkpoint's first domain, in its original units."""
        lo, hi = self.state.lo[0].numpy(), self.state.hi[0].numpy()
        ex = self._bank(0)[:3] * (hi - lo) + lo
        return {"n_samples": 4, "exemplars": np.round(ex, 6).tolist(), "seed": 0}

    def _exemplars(self, request: TimeModeRequest) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(scaled exemplars, lo, hi)."""
        if request.domain is not None:
            if request.domain not in self.domains:
                raise ValueError(
                    f"domain: unknown domain {request.domain!r}; known: {self.domains}"
                )
            i = self.domains.index(request.domain)
            if int(self.state.bank_count[i]) == 0:
                raise ValueError(f"domain: {request.domain!r} has no exemplar in the checkpoint")
            return self._bank(i), self.state.lo[i].numpy(), self.state.hi[i].numpy()
        assert request.exemplars is not None
        for i, w in enumerate(request.exemplars):
            if len(w) != self.length:
                raise ValueError(f"exemplars[{i}]: {len(w)} time steps, this model takes L = "
                                 f"{self.length}")  # fmt: skip
            for j, step in enumerate(w):
                if len(step) != self.channels:
                    raise ValueError(f"exemplars[{i}][{j}]: {len(step)} channels, this model "
                                     f"takes C = {self.channels}")  # fmt: skip
        x = np.asarray(request.exemplars, dtype=np.float64)
        lo, hi = x.min(axis=(0, 1)), x.max(axis=(0, 1))
        if np.any(hi - lo <= 1e-12):
            raise ValueError("exemplars: constant over the set; its min-max scaling is undefined")
        scaled = (x - lo) / (hi - lo)
        for i, w in enumerate(scaled):
            if np.all(np.ptp(w, axis=0) <= 1e-6):
                raise ValueError(f"exemplars[{i}]: a constant window (its prompt is degenerate)")
        return scaled.astype(np.float32), lo, hi

    def __call__(self, request: TimeModeRequest) -> TimeModeResponse:
        return self.batch([request])[0]

    def batch(self, requests: list[TimeModeRequest]) -> list[TimeModeResponse]:
        """The requests' samples in one reverse-diffusion chain (up to ``BATCH_ROWS`` stacked
        windows per chain; a request is never split): each request keeps its own generator, so
        its answer is the one it gets alone, up to the rounding of the batched forward pass.
        Every request is checked before any sampling (a bad one raises its 422 message)."""
        prepared = [self._exemplars(r) for r in requests]
        seeds = [0 if r.seed is None else r.seed for r in requests]
        chains: list[list[int]] = []
        rows = 0
        for i, r in enumerate(requests):
            if not chains or rows + r.n_samples > BATCH_ROWS:
                chains.append([])
                rows = 0
            chains[-1].append(i)
            rows += r.n_samples
        out: list[np.ndarray] = [np.empty(0)] * len(requests)
        for chain in chains:
            sets = [(torch.from_numpy(prepared[i][0]), requests[i].n_samples, seeds[i])
                    for i in chain]  # fmt: skip
            for i, x in zip(chain, generate_many(self.state.ema, self.diffusion, sets),
                            strict=True):  # fmt: skip
                out[i] = x.numpy().astype(np.float64)
        answers = []
        for r, (_, lo, hi), x, seed in zip(requests, prepared, out, seeds, strict=True):
            if not r.return_scaled:
                x = x * (hi - lo) + lo
            answers.append(TimeModeResponse(samples=np.round(x, 6).tolist(), domain=r.domain,
                                            seed=seed, steps=self.cfg.diffusion_steps))  # fmt: skip
        return answers
