"""``nshot serve <method> --conformal caos``: prediction sets around any few-shot classifier.

The wrapped predictor must expose one-shot embeddings of a request::

    def one_shot_embeddings(self, request) -> OneShotEpisode

a frozen feature per support row and per query (a function of that row and of the request's
unlabelled rows only, never of the support labels), the support labels as class indices, and the
class names in the order the predictor reports them. Every labelled support row ``i`` induces the
one-shot predictor ``s_i(x, y) = 1 - cos(e(x), e(X_i))`` if ``y == Y_i`` else 2, and CAOS
(:mod:`nshot.conformal`) aggregates them with ``A_k`` and calibrates leave-one-out on the same
support set: no support row is spent on calibration, and for exchangeable support and query rows
``P(y_query in set) >= 1 - alpha``.

The response is the wrapped predictor's response plus ``sets`` (the class names in each query's
set), ``set_sizes``, ``empty`` (per query: its set is empty), ``q_hat`` (``null`` when the set is trivial: fewer than
``ceil((1 - alpha)(n + 1))`` support rows), ``trivial``, ``alpha``, ``k`` and ``n_calibration``.
A request may override the served ``alpha`` with its own ``conformal_alpha``.
:meth:`ConformalPredictor.sets` gives these fields alone, from the embeddings, without the
wrapped predictor's answer.

An empty set is a valid answer, not an error: CAOS keeps a class when its aggregated score is at
most the calibrated threshold, and when ``alpha`` is large and the one-shot scores are sharp a
query can be far from every support row of every class. Coverage holds over queries, so the
empty sets are part of the ``alpha`` the set is allowed to miss; ``empty`` flags them so that a
client can treat them as "none of these classes" (or ask again with a smaller
``conformal_alpha``) instead of reading an empty list as a failure.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
from pydantic import BaseModel, Field, create_model

from nshot.conformal import OneShotEpisode as OneShotEpisode
from nshot.conformal import classification_sets
from nshot.errors import NshotError
from nshot.method import Predictor

CONFORMAL_METHODS = ("caos",)


class ConformalPredictor(Predictor):
    """Wraps a few-shot classifier's predictor so that it also returns CAOS prediction sets."""

    def __init__(self, inner: Predictor, method: str = "caos", alpha: float = 0.1, k: int = 1):
        if method not in CONFORMAL_METHODS:
            raise NshotError(
                f"--conformal {method!r}: unknown; choose one of {', '.join(CONFORMAL_METHODS)}"
            )
        if not 0.0 < alpha < 1.0:
            raise NshotError(f"--alpha: must lie in (0, 1), got {alpha}")
        if k < 1:
            raise NshotError(f"--conformal-k: must be at least 1, got {k}")
        if not inner.has_one_shot_embeddings():
            raise NshotError(
                f"--conformal {method}: {type(inner).__name__} does not expose one-shot "
                "embeddings (one_shot_embeddings); conformal sets need a few-shot classifier "
                "that does, such as tail"
            )
        self.inner, self.method, self.alpha, self.k = inner, method, float(alpha), int(k)
        base_req, base_resp = inner.Request, inner.Response
        self.Request = create_model(  # type: ignore[misc]
            f"Conformal{base_req.__name__}",
            __base__=base_req,
            conformal_alpha=(
                float | None,
                Field(None, gt=0.0, lt=1.0, description=f"overrides the served alpha ({alpha})"),
            ),
        )
        self.Response = create_model(  # type: ignore[misc]
            f"Conformal{base_resp.__name__}",
            __base__=base_resp,
            sets=(list[list[Any]], Field(..., description="per query: the classes in its set")),
            set_sizes=(list[int], ...),
            empty=(
                list[bool],
                Field(
                    ...,
                    description="per query: true when its set is empty (valid: no class reaches "
                    "the threshold at this alpha; read it as 'none of these classes')",
                ),
            ),
            q_hat=(float | None, Field(..., description="threshold; null when trivial")),
            trivial=(bool, ...),
            alpha=(float, ...),
            k=(int, ...),
            n_calibration=(int, ...),
        )

    def metadata(self) -> dict[str, Any]:
        return {
            **self.inner.metadata(),
            "conformal": {"method": self.method, "alpha": self.alpha, "k": self.k},
        }

    def sets(self, request: BaseModel) -> dict[str, Any]:
        """The conformal fields of one request's answer (``sets``, ``set_sizes``, ``empty``,
        ``q_hat``, ``trivial``, ``alpha``, ``k``, ``n_calibration``) from the wrapped
        predictor's one-shot embeddings alone, without its own answer: what a coverage check
        needs, at the cost of the embeddings only (an adapting predictor is not adapted)."""
        ep: OneShotEpisode = self.inner.one_shot_embeddings(request)
        alpha = getattr(request, "conformal_alpha", None) or self.alpha
        n = len(ep.support_labels)
        if n < self.k + 1:
            raise ValueError(
                f"{ep.support_field}: conformal sets need at least k + 1 = {self.k + 1} support "
                f"rows, got {n}"
            )
        out = classification_sets(
            ep.support_emb, ep.support_labels, ep.query_emb, len(ep.classes), alpha, self.k
        )
        sets = [[ep.classes[c] for c in np.flatnonzero(row)] for row in out["sets"]]
        q = out["q_hat"]
        return {
            "sets": sets,
            "set_sizes": [len(s) for s in sets],
            "empty": [not s for s in sets],
            "q_hat": q if math.isfinite(q) else None,
            "trivial": not math.isfinite(q),
            "alpha": alpha,
            "k": self.k,
            "n_calibration": n,
        }

    def __call__(self, request: BaseModel) -> BaseModel:
        return self.batch([request])[0]

    def batch(self, requests: list[BaseModel]) -> list[BaseModel]:
        base = self.inner.batch(requests)
        return [self.Response(**b.model_dump(), **self.sets(r)) for b, r in zip(base, requests)]


def wrap(predictor: Predictor, method: str | None, alpha: float, k: int) -> Predictor:
    """``predictor`` itself when ``method`` is None, else its conformal wrapper."""
    if method is None:
        return predictor
    return ConformalPredictor(predictor, method, alpha, k)
