"""BSR's predictor: raw EEG of one subject, its electrode layout and sampling rate, plus a
labelled support set of that subject's trials → class probabilities of a query trial.

Any montage is accepted (standard 10-20/10-10 names, or head-frame positions in metres): the
trials are rendered onto the model's scalp grid, which is what makes the pretrained encoder
layout-agnostic. Band powers are z-scored with the support trials' statistics (never the
query's), or with the statistics the checkpoint stores for ``subject_id`` (a pretraining
subject). The classifier is the frozen encoder's mean-pooled embedding with a logistic
regression fitted on the support (the paper's linear-probe protocol; fine-tuning per request
would cost seconds), so prediction sets (``--conformal caos``) work on the same embeddings.
"""

from __future__ import annotations

import math
from typing import Any, Literal

import numpy as np
import torch
from pydantic import BaseModel, Field, model_validator

from nshot.method import Predictor
from nshot.serve.schema import StrictRequest, check_label_types
from nshot.train.checkpoint import LoadedCheckpoint

from .config import BsrConfig
from .data import (
    CLASSES,
    MONTAGE_B,
    NormStats,
    band_powers,
    interpolation_matrix,
    montage_hash,
    positions_for,
    project,
    render,
    standard_positions,
)
from .model import encode, fit_probe, load_model

MAX_CHANNELS = 256
MAX_SAMPLES = 65_536
MAX_SUPPORT = 200
ENCODE_BATCH = 64
MIN_CHANNELS = 8
SFREQ_RANGE = (64.0, 4096.0)


class SupportTrial(StrictRequest):
    eeg: list[list[float]] = Field(..., description="channels × samples")
    label: str | int


class BsrRequest(StrictRequest):
    eeg: list[list[float]] = Field(..., description="the query trial, channels × samples")
    support: list[SupportTrial] = Field(
        ..., max_length=MAX_SUPPORT, description="labelled trials of the same subject"
    )
    ch_names: list[str] | None = Field(None, description="standard 10-20/10-10 names")
    positions: list[list[float]] | None = Field(
        None, description="head-frame electrode positions [x, y, z] in metres (instead of names)"
    )
    sfreq: float = Field(..., description="sampling rate (Hz)")
    unit: Literal["V", "uV"] = "V"
    subject_id: str | None = Field(
        None, min_length=1, max_length=64,
        description="a subject whose normalisation statistics the checkpoint stores (the "
        "pretraining subjects, see metadata()['subjects']); they z-score the band powers "
        "instead of the support's",
    )  # fmt: skip

    @model_validator(mode="after")
    def _check(self) -> BsrRequest:
        lo, hi = SFREQ_RANGE
        if not lo <= self.sfreq <= hi:
            raise ValueError(
                f"sfreq: {self.sfreq} Hz is outside [{lo:g}, {hi:g}] (the β band needs >= 64 Hz)"
            )
        c, n = _shape("eeg", self.eeg)
        if c < MIN_CHANNELS:
            raise ValueError(f"eeg: {c} channels; at least {MIN_CHANNELS} are needed")
        for i, t in enumerate(self.support):
            ci, ni = _shape(f"support[{i}].eeg", t.eeg)
            if ci != c:
                raise ValueError(f"support[{i}].eeg: {ci} channels, the query has {c}")
            if ni != n:
                raise ValueError(f"support[{i}].eeg: {ni} samples, the query has {n}")
        if self.ch_names is None and self.positions is None:
            raise ValueError("ch_names: give the channel names or their positions")
        if self.ch_names is not None:
            if len(self.ch_names) != c:
                raise ValueError(f"ch_names: {len(self.ch_names)} names for {c} channels")
            seen: set[str] = set()
            for i, n in enumerate(self.ch_names):
                if n in seen:
                    raise ValueError(f"ch_names[{i}]: duplicate channel name {n[:40]!r}")
                seen.add(n)
            if self.positions is None:
                known = standard_positions()
                for i, n in enumerate(self.ch_names):
                    if n not in known:
                        raise ValueError(
                            f"ch_names[{i}]: unknown channel name {n[:40]!r} (not a 10-20/10-10 "
                            "name); give positions"
                        )
        if self.positions is not None:
            if len(self.positions) != c:
                raise ValueError(f"positions: {len(self.positions)} positions for {c} channels")
            for i, p in enumerate(self.positions):
                if len(p) != 3 or not all(math.isfinite(v) for v in p):
                    raise ValueError(f"positions[{i}]: must be 3 finite numbers [x, y, z]")
        if not self.support:
            raise ValueError("support: the support set is empty")
        labels = [t.label for t in self.support]
        check_label_types("support", labels)
        if len(set(labels)) < 2:
            raise ValueError("support: needs trials of at least two classes")
        return self


def _shape(field: str, eeg: list[list[float]]) -> tuple[int, int]:
    if not eeg:
        raise ValueError(f"{field}: no channel")
    if len(eeg) > MAX_CHANNELS:
        raise ValueError(f"{field}: {len(eeg)} channels; at most {MAX_CHANNELS}")
    n = len(eeg[0])
    for i, row in enumerate(eeg):
        if len(row) != n:
            raise ValueError(f"{field}[{i}]: {len(row)} samples, channel 0 has {n}")
        if n > MAX_SAMPLES:
            raise ValueError(f"{field}[{i}]: {n} samples; at most {MAX_SAMPLES}")
        for j, v in enumerate(row):
            if not math.isfinite(v):
                raise ValueError(f"{field}[{i}][{j}]: {v} is not a finite number")
    return len(eeg), n


class BsrResponse(BaseModel):
    label: str | int
    probs: dict[str, float] = Field(..., description="class (as a string) → probability")
    frames: int
    channels_used: int
    montage_hash: str


class BsrPredictor(Predictor[BsrRequest, BsrResponse]):
    Request = BsrRequest
    Response = BsrResponse

    def __init__(self, model: torch.nn.Module, cfg: BsrConfig, extra: dict[str, Any]) -> None:
        self.model = model.eval()
        self.cfg = cfg
        self.extra = extra

    @classmethod
    def from_checkpoint(cls, checkpoint: LoadedCheckpoint) -> BsrPredictor:
        model, cfg, extra = load_model(checkpoint)
        return cls(model, cfg, extra)

    def metadata(self) -> dict[str, Any]:
        c = self.cfg
        return {
            "grid": c.grid, "frames": c.frames, "trial_s": c.trial_s, "model_sfreq": c.sfreq,
            "min_channels": MIN_CHANNELS, "sfreq_range": list(SFREQ_RANGE),
            "bands_hz": [[4, 8], [8, 13], [13, 30]], "max_support": MAX_SUPPORT,
            "subjects": sorted(self._subjects()),
        }  # fmt: skip

    def example_request(self) -> dict[str, Any]:
        """Two generated trials per class and a query on the classic 19-channel montage (the
        layout the model was not pretrained on), at the model's sampling rate."""
        from .data import _subject_trials, head_model, montage_channels

        cfg = self.cfg
        rng = np.random.default_rng([99, 1])
        labels = np.array([0, 1, 2, 3, 0, 1, 2, 3, 1])
        timing = np.random.default_rng([99, 1, 2])  # generator version 2's latencies
        eeg = _subject_trials(cfg, head_model(cfg.source_spacing_mm), rng, labels, timing)
        eeg = eeg[:, montage_channels("B")] * 1e6
        to_list = lambda x: np.round(x.astype(np.float64), 3).tolist()  # noqa: E731
        return {
            "eeg": to_list(eeg[-1]),
            "support": [{"eeg": to_list(e), "label": CLASSES[int(y)]}
                        for e, y in zip(eeg[:-1], labels[:-1], strict=True)],
            "ch_names": list(MONTAGE_B),
            "sfreq": cfg.sfreq,
            "unit": "uV",
        }  # fmt: skip

    # -- rendering -----------------------------------------------------------------------------

    def _signals(self, request: BsrRequest) -> np.ndarray:
        """(1 + n_support, C, samples) in volts at the model's rate, cropped to one trial."""
        from scipy.signal import resample_poly

        x = np.stack([np.asarray(request.eeg, np.float64)]
                     + [np.asarray(t.eeg, np.float64) for t in request.support])  # fmt: skip
        if request.unit == "uV":
            x = x * 1e-6
        if abs(request.sfreq - self.cfg.sfreq) > 1e-9:
            frac = self.cfg.sfreq / request.sfreq
            up, down = _ratio(frac)
            x = resample_poly(x, up, down, axis=-1)
        need = self.cfg.samples
        if x.shape[-1] < need:
            raise ValueError(
                f"eeg: {x.shape[-1] / self.cfg.sfreq:.3f} s at the model's rate is shorter than "
                f"the {self.cfg.trial_s:g} s trial the frame layout needs ({self.cfg.frames} "
                f"frames of {self.cfg.window_s:g} s)"
            )
        return x[..., :need]

    def _videos(self, request: BsrRequest, all_rows: bool = False) -> tuple[torch.Tensor, str]:
        pos = (np.asarray(request.positions, np.float64) if request.positions is not None
               else positions_for(list(request.ch_names or [])))  # fmt: skip
        xy = project(pos)
        m, _ = interpolation_matrix(xy, self.cfg.grid)
        p = band_powers(self._signals(request), self.cfg.sfreq, self.cfg.window, self.cfg.frames)
        # the answer normalises by the support's statistics (never the query's); the conformal
        # features by all trials', a symmetric function of support and query (exchangeability)
        stats = self._stored_stats(request.subject_id) or NormStats.fit(p if all_rows else p[1:])
        v = render(stats.apply(p), m, self.cfg.grid)
        return torch.from_numpy(np.ascontiguousarray(v, dtype=np.float32)), montage_hash(
            xy, self.cfg.grid
        )

    def _stored_stats(self, subject_id: str | None) -> NormStats | None:
        if subject_id is None:
            return None
        table = self._subjects()
        if subject_id not in table:
            known = ", ".join(sorted(table)[:5]) or "none"
            raise ValueError(
                f"subject_id: unknown subject {subject_id[:40]!r}; this checkpoint stores "
                f"statistics of {len(table)} subjects ({known}{', ...' if len(table) > 5 else ''})"
            )
        return NormStats.from_json(table[subject_id])

    def _subjects(self) -> dict[str, dict]:
        return dict((self.extra.get("renderer") or {}).get("subject_stats") or {})

    @torch.no_grad()
    def _embed(self, request: BsrRequest, all_rows: bool = False) -> tuple[np.ndarray, str]:
        v, h = self._videos(request, all_rows)
        emb = [encode(self.model, v[s : s + ENCODE_BATCH], self.cfg)
               for s in range(0, len(v), ENCODE_BATCH)]  # fmt: skip
        return torch.cat(emb).numpy().astype(np.float64), h

    def one_shot_embeddings(self, request: BsrRequest, kind: str | None = None):
        """The frozen encoder's embedding (read as ``head_pool`` says: mean-pooled by
        default) of each support trial and of the query,
        rendered with the normalisation statistics of all the request's trials (support and
        query together; a stored subject's when ``subject_id`` names one): a trial's feature is
        the same whether it is a support trial or the query, as CAOS's guarantee needs."""
        from nshot.serve.conformal import OneShotEpisode

        emb, _ = self._embed(request, all_rows=True)
        labels = [t.label for t in request.support]
        classes = sorted(set(labels), key=str)
        return OneShotEpisode(
            support_emb=emb[1:],
            support_labels=np.array([classes.index(y) for y in labels]),
            query_emb=emb[:1],
            classes=classes,
        )

    def __call__(self, request: BsrRequest) -> BsrResponse:
        emb, h = self._embed(request)
        labels = [t.label for t in request.support]
        classes = sorted(set(labels), key=str)
        y = np.array([classes.index(v) for v in labels])
        full = fit_probe(emb[1:], y).predict_proba(emb[:1], len(classes))[0]
        best = int(np.argmax(full))
        return BsrResponse(
            label=classes[best],
            probs={str(c): float(p) for c, p in zip(classes, full, strict=True)},
            frames=self.cfg.frames,
            channels_used=len(request.eeg),
            montage_hash=h,
        )


def _ratio(frac: float) -> tuple[int, int]:
    from fractions import Fraction

    f = Fraction(frac).limit_denominator(1000)
    return f.numerator, f.denominator
