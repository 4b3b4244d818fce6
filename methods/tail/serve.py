"""TAIL's predictor: few-shot classification of one episode per request."""

from __future__ import annotations

from typing import Any, Literal

import numpy as np
import torch
from pydantic import BaseModel, Field, field_validator, model_validator

from nshot.method import Predictor
from nshot.serve.schema import StrictRequest, check_label_types
from nshot.train.checkpoint import LoadedCheckpoint

from .config import MAX_DRAWS, TailConfig
from .episodes import (
    draw_views,
    normalise_rows,
    preprocess_episode,
    span_embedding,
    standardise,
)
from .model import TailModel, load_model

Label = int | str  # one type per request: all integers or all strings
MAX_SUPPORT = 1000
MAX_QUERIES = 1000
MAX_FEATURES = 4096  # features per row
FLOAT32_MAX = 3.4028234663852886e38
DRAW_BATCH_SCORES = 1 << 20  # attention scores per head in one forward of batched draws
SAFE_MAGNITUDE = 1e30  # larger features are scaled down first (float32 sums would overflow)


def _safe_scale(x: np.ndarray) -> np.ndarray:
    """``x`` divided by its largest magnitude when that exceeds ``SAFE_MAGNITUDE``: TAIL's
    preprocessing (centre, then scale each row to norm sqrt(d)) does not change under a positive
    scale, but its float32 means and norms of features near the float32 limit overflow to NaN.
    Smaller inputs are returned unchanged (bit for bit)."""
    top = float(np.max(np.abs(x))) if x.size else 0.0
    return x / np.float32(top) if top > SAFE_MAGNITUDE else x


_BLAS = None


def _one_blas_thread():
    """numpy's BLAS on one thread (a context): the per-episode linear algebra of the wide-input
    map is small, and a multithreaded BLAS competing with torch for a loaded CPU made one
    ``[25, 4096]`` episode 20x slower (0.5 s instead of 25 ms) on this 2-core machine."""
    global _BLAS
    from threadpoolctl import ThreadpoolController

    if _BLAS is None:
        _BLAS = ThreadpoolController()
    return _BLAS.limit(limits=1, user_api="blas")


def _digit(c: int) -> str:
    return f"digit-{c}"


class TailRequest(StrictRequest):
    support_x: list[list[float]] = Field(
        ...,
        max_length=MAX_SUPPORT,
        description=f"support features, n x d_T (any width d_T from 1 to {MAX_FEATURES})",
    )
    support_y: list[Label] = Field(
        ..., max_length=MAX_SUPPORT, description="one label per support row"
    )
    query_x: list[list[float]] = Field(..., min_length=1, max_length=MAX_QUERIES)
    n_draws: int | None = Field(
        None,
        ge=1,
        le=MAX_DRAWS,
        description="(π, ρ) draws averaged; left out: the checkpoint's `eval_draws` "
        "(`/metadata`: `default_n_draws`); an explicit null is refused",
    )
    seed: int = Field(0, ge=0)
    standardise: bool = Field(
        True,
        description="standardise every feature by the support set's mean and standard "
        "deviation before TAIL's own preprocessing (features constant on the support become 0); "
        "false: the features as sent",
    )

    @field_validator("n_draws", mode="before")
    @classmethod
    def _n_draws_not_null(cls, value: Any) -> Any:
        # the default (field left out) is not validated; only an explicit null reaches here
        if value is None:
            raise ValueError(
                f"an integer from 1 to {MAX_DRAWS}; leave the field out for the checkpoint's "
                "default"
            )
        return value

    @model_validator(mode="after")
    def _check(self) -> TailRequest:
        if not self.support_x:
            raise ValueError("support_x: the support set is empty")
        if len(self.support_x) != len(self.support_y):
            raise ValueError(
                f"support_y: {len(self.support_y)} labels for {len(self.support_x)} support rows"
            )
        d = len(self.support_x[0])
        if d == 0:
            raise ValueError("support_x: rows have no features")
        if d > MAX_FEATURES:
            raise ValueError(
                f"support_x: rows have {d} features; this endpoint takes at most {MAX_FEATURES}"
            )
        for name, rows in (("support_x", self.support_x), ("query_x", self.query_x)):
            for i, row in enumerate(rows):
                if len(row) != d:
                    raise ValueError(
                        f"{name}[{i}]: has {len(row)} features, the support rows have {d}"
                    )
            values = np.asarray(rows, dtype=np.float64)
            bad = ~(np.abs(values) <= FLOAT32_MAX).all(axis=1)  # NaN compares False
            if bad.any():
                i = int(np.argmax(bad))
                raise ValueError(f"{name}[{i}]: contains NaN, inf or a value past float32")
        check_label_types("support_y", self.support_y)
        if len(set(self.support_y)) < 2:
            raise ValueError("support_y: needs at least 2 distinct labels")
        return self


class TailResponse(BaseModel):
    labels: list[Label]
    probs: list[dict[str, float]] = Field(..., description="per query: label -> probability")
    n_classes: int


WideInputs = Literal["span", "subset", "gaussian"]


class TailPredictor(Predictor[TailRequest, TailResponse]):
    """One episode per request, read through TAIL's input path:

    1. (``standardise``, default on) every feature standardised by the support set's mean and
       standard deviation (:func:`episodes.standardise`), in float64;
    2. TAIL's preprocessing: centred by the support mean, rows scaled to ``sqrt(d_T)·f/‖f‖``;
    3. features wider than the model (``d_T > d_data``) are embedded by ``wide_inputs``:
       ``"span"`` (default) writes them in a basis of the support span plus each row's residual
       norm (:func:`episodes.span_embedding`: exact distances between the support and each
       query, so every coordinate counts); ``"subset"`` keeps a random ``d_data`` of the
       coordinates per draw (the first design, kept as the ablation);
       ``"gaussian"`` is a Gaussian random projection to ``d_data`` per draw;
    4. per (π, ρ) draw, the random injection π into the ``d_data`` model coordinates and ρ of
       the labels into the dictionary; the restricted softmax is averaged over ``n_draws``.
    """

    Request = TailRequest
    Response = TailResponse

    def __init__(
        self,
        model: TailModel,
        cfg: TailConfig,
        conformal_embedding: str = "encoder",
        wide_inputs: WideInputs = "span",
    ) -> None:
        if wide_inputs not in ("span", "subset", "gaussian"):
            raise ValueError(f"wide_inputs: expected span, subset or gaussian, got {wide_inputs!r}")
        self.model = model.eval()
        self.cfg = cfg
        self.conformal_embedding = conformal_embedding
        self.wide_inputs = wide_inputs

    @classmethod
    def from_checkpoint(cls, checkpoint: LoadedCheckpoint) -> TailPredictor:
        model, cfg = load_model(checkpoint)
        return cls(model, cfg)

    def example_request(self) -> dict[str, Any]:
        """A 5-way 5-shot episode of real scikit-learn digits (classes 5-9, which no training
        or tuning choice saw; 64 pixel values per row), labelled "digit-5".."digit-9", with 5
        queries per class in class order: the request ``nshot quickstart`` serves. A fixed-slot
        model trained for fewer ways gets the first classes only."""
        from nshot.data import digits_table, episode_from_table

        ways = 5 if self.cfg.label_mode != "fixed_slots" else min(5, self.cfg.max_ways)
        episode = episode_from_table(
            digits_table(), (5, 6, 7, 8, 9)[:ways], shots=5, queries=5, label=_digit
        )
        episode.pop("query_y")
        return episode

    def metadata(self) -> dict[str, Any]:
        return {
            "dictionary_size": self.cfg.dictionary_size,
            "d_data": self.cfg.d_data,
            "label_mode": self.cfg.label_mode,
            "max_support": MAX_SUPPORT,
            "max_queries": MAX_QUERIES,
            "max_features": MAX_FEATURES,
            "default_n_draws": self.cfg.eval_draws,
            "input_contract": self.input_contract(),
        }

    def input_contract(self) -> dict[str, str]:
        """What a request may hold and what is done to it, in words (``/metadata`` shows it)."""
        d = self.cfg.d_data
        wide = {
            "span": f"written in a basis of the support rows' span plus each row's residual "
            f"norm (at most {d} coordinates; exact distances between the support and each "
            f"query when n <= {d} support rows, the top principal directions of the support "
            "beyond that): every feature counts",
            "subset": f"a random {d} of the features are kept per (π, ρ) draw",
            "gaussian": f"a Gaussian random projection to {d} coordinates per (π, ρ) draw",
        }[self.wide_inputs]
        return {
            "features": f"one episode per request: 1 to {MAX_FEATURES} numeric features per row "
            "(the same width for support and query rows), finite and within float32 range; any "
            "scale, any order",
            "rows": f"1 to {MAX_SUPPORT} support rows with one label each (all integers or all "
            f"strings; 2 to {self.cfg.dictionary_size} distinct labels) and 1 to {MAX_QUERIES} "
            "query rows",
            "standardise": "on by default (request field `standardise`): each feature minus its "
            "support mean, divided by its support standard deviation; a feature constant on "
            "the support becomes 0",
            "preprocessing": "then centred by the support mean and each row scaled to norm "
            "sqrt(d_T)",
            "wide_inputs": f"features wider than d_data = {d} are {wide}; narrower ones are "
            f"placed among the {d} model coordinates by the random injection π",
            "draws": f"n_draws (π, ρ) draws (default {self.cfg.eval_draws}, the checkpoint's "
            "eval_draws) are averaged; the same seed gives the same answer",
        }

    @torch.no_grad()
    def probabilities(
        self,
        support_f: np.ndarray,
        support_y: np.ndarray,
        query_f: np.ndarray,
        draws: int,
        seeds: list[int] | int,
    ) -> np.ndarray:
        """Restricted-softmax probabilities ``[B, q, K]`` averaged over ``draws`` (π, ρ) draws.

        ``support_f``/``query_f`` are preprocessed features ``[B, n|q, d_T]``; labels 0..K-1.
        Episode ``b`` draws its maps from its own generator (``seeds[b]``), so its answer does
        not depend on which other episodes share the batch.
        """
        b = support_f.shape[0]
        seeds = [seeds] * b if isinstance(seeds, int) else list(seeds)
        rngs = [np.random.default_rng([s, 7]) for s in seeds]
        tokens = support_f.shape[1] + query_f.shape[1]
        # draws run together, as many per forward as keep its attention scores within
        # DRAW_BATCH_SCORES (one at least; a 5-way 5-shot request: all 32 draws at once)
        chunk = max(1, min(draws, DRAW_BATCH_SCORES // (b * tokens * tokens)))
        total = None
        with _one_blas_thread():
            for start in range(0, draws, chunk):
                per = [
                    self.model_inputs(support_f[i], support_y[i], query_f[i], rngs[i])
                    for _ in range(start, min(draws, start + chunk))
                    for i in range(b)
                ]  # draw-major: each episode's generator gives its draws in the same order
                # whatever the chunk, so the answer does not depend on it
                views = {k: torch.cat([v[k] for v in per]) for k in per[0]}
                p = torch.softmax(self.model(**views), dim=-1)
                p = p.view(-1, b, *p.shape[1:]).sum(0)
                total = p if total is None else total + p
        return (total / draws).numpy()

    def model_inputs(
        self,
        support_f: np.ndarray,
        support_y: np.ndarray,
        query_f: np.ndarray,
        rng: np.random.Generator,
    ) -> dict[str, torch.Tensor]:
        """One (π, ρ) draw for one episode of preprocessed features ``[n|q, d_T]``: the
        :class:`TailModel` inputs (batch of one). Features wider than ``d_data`` first go
        through the ``wide_inputs`` map (drawn from the same ``rng``)."""
        d_t, d = support_f.shape[-1], self.cfg.d_data
        if d_t > d and self.wide_inputs == "span":
            support_f, query_f = span_embedding(support_f, query_f, d, rng)
        elif d_t > d and self.wide_inputs == "gaussian":
            g = rng.standard_normal((d_t, d))
            support_f, query_f = normalise_rows(support_f @ g), normalise_rows(query_f @ g)
        episode = {
            "support_f": support_f[None],
            "support_y": support_y[None],
            "query_f": query_f[None],
        }
        return draw_views(episode, self.cfg, rng)

    def features(self, request: TailRequest) -> tuple[np.ndarray, np.ndarray]:
        """A request's support and query features after the input path's steps 1 and 2
        (standardisation unless ``standardise`` is false, then TAIL's preprocessing)."""
        if request.standardise:  # float64 from the request's numbers: nothing overflows
            sz, qz = standardise(np.asarray(request.support_x), np.asarray(request.query_x))
            return normalise_rows(sz), normalise_rows(qz)  # the support mean is 0 already
        sx = np.asarray(request.support_x, dtype=np.float32)
        qx = np.asarray(request.query_x, dtype=np.float32)
        top = max(float(np.max(np.abs(sx))), float(np.max(np.abs(qx))))
        if top > SAFE_MAGNITUDE:  # one scale for support and queries
            sx, qx = sx / np.float32(top), qx / np.float32(top)
        return preprocess_episode(sx, qx)

    @torch.no_grad()
    def one_shot_embeddings(self, request: TailRequest, kind: str | None = None):
        """Frozen per-row features for conformal prediction sets (``nshot.serve.conformal``).

        Every step is a symmetric function of **all** rows of the request (support and
        queries together, labels unused), so a row's feature does not depend on whether it is a
        support row or a query, nor on any label: exchangeability, and hence the CAOS guarantee,
        are kept. The steps follow the answer's input path with the support set replaced by all
        rows: (``standardise``, default on) every feature standardised by the mean and standard
        deviation of all rows, then each row scaled to norm ``sqrt(d_T)`` (without
        standardisation: centred by the mean of all rows first); features wider than the
        model's ``d_data`` are written in a basis of the span of all rows plus each row's
        residual norm (:func:`episodes.span_embedding` with a fixed seed: every coordinate
        counts, and distances between rows are exact while the request has at most ``d_data``
        rows); narrower ones are zero-padded. For ``kind="encoder"`` (default) each row then
        passes through TAIL's encoder on its own, as a lone query token.
        """
        from nshot.serve.conformal import OneShotEpisode

        from .episodes import preprocess, project

        kind = kind or self.conformal_embedding
        classes = list(dict.fromkeys(request.support_y))
        index = {c: i for i, c in enumerate(classes)}
        rows = request.support_x + request.query_x
        if request.standardise:
            z, _ = standardise(np.asarray(rows, dtype=np.float64), np.zeros((0, len(rows[0]))))
            f = normalise_rows(z)  # every feature's mean over the rows is 0 already
        else:
            x = _safe_scale(np.asarray(rows, dtype=np.float32))
            f = preprocess(x, x.mean(axis=0, keepdims=True))
        if f.shape[-1] > self.cfg.d_data:
            with _one_blas_thread():
                f, _ = span_embedding(f, f[:0], self.cfg.d_data, np.random.default_rng(0))
            f = f.astype(np.float32)
        f = project(f, self.cfg.d_data, "none", np.random.default_rng(0))
        if kind == "encoder":
            t = torch.cat(
                [torch.from_numpy(f), self.model.unknown.expand(len(f), self.cfg.d_label)], dim=-1
            ).unsqueeze(1)  # [N, 1, W]: every row its own sequence
            mask = torch.ones(1, 1, 1, dtype=torch.bool)
            f = self.model.encoder(t, mask)[:, 0].numpy()
        elif kind != "input":
            raise ValueError(f"kind: expected 'encoder' or 'input', got {kind!r}")
        n = len(request.support_x)
        return OneShotEpisode(
            support_emb=f[:n],
            support_labels=np.array([index[c] for c in request.support_y]),
            query_emb=f[n:],
            classes=classes,
            support_field="support_y",
        )

    def __call__(self, request: TailRequest) -> TailResponse:
        return self.batch([request])[0]

    def batch(self, requests: list[TailRequest]) -> list[TailResponse]:
        """Requests of the same shape run as one batch of episodes; others one by one."""
        groups: dict[tuple, list[int]] = {}
        prepared = []
        for i, r in enumerate(requests):
            classes = list(dict.fromkeys(r.support_y))  # first-appearance order
            if len(classes) > self.cfg.dictionary_size:
                raise ValueError(
                    f"support_y: {len(classes)} distinct labels exceed the label dictionary "
                    f"size M = {self.cfg.dictionary_size}"
                )
            if self.cfg.label_mode == "fixed_slots" and len(classes) > self.cfg.max_ways:
                raise ValueError(
                    f"support_y: this fixed-slot model labels at most {self.cfg.max_ways} classes"
                )
            index = {c: k for k, c in enumerate(classes)}
            sy = np.array([index[c] for c in r.support_y], dtype=np.int64)
            sf, qf = self.features(r)
            prepared.append((classes, sy, sf, qf))
            draws = r.n_draws if r.n_draws is not None else self.cfg.eval_draws
            key = (sf.shape, qf.shape, len(classes), draws)
            groups.setdefault(key, []).append(i)
        out: list[TailResponse | None] = [None] * len(requests)
        for (_, _, _, draws), idx in groups.items():
            probs = self.probabilities(
                np.stack([prepared[i][2] for i in idx]),
                np.stack([prepared[i][1] for i in idx]),
                np.stack([prepared[i][3] for i in idx]),
                draws,
                [requests[i].seed for i in idx],
            )
            for j, i in enumerate(idx):
                classes = prepared[i][0]
                p = probs[j]
                out[i] = TailResponse(
                    labels=[classes[k] for k in p.argmax(-1).tolist()],
                    probs=[{str(c): float(v) for c, v in zip(classes, row)} for row in p.tolist()],
                    n_classes=len(classes),
                )
        return out  # type: ignore[return-value]
