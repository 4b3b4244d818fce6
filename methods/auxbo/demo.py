"""A Tune trainable on one task of the synthetic family: a self-contained demo of the searcher.

``f`` is the distance-to-optimum reward and ``h`` the 10 × 3 frames of the synthetic family
(:mod:`.synthetic`), for a task with latent optimum ``tau`` and the family's fixed maps ``A``:
by default version 1's "direction to the optimum" frames; ``version=2`` with the task's ``gains``
gives the default family's (how far each coordinate is from the optimum's, on the torus). Used by
``examples/auxbo_tune.py`` and the tests (Tune workers import it from the installed package).
"""

from __future__ import annotations

from typing import Any

import numpy as np


def synthetic_objective(
    x: np.ndarray,
    tau: np.ndarray,
    A: np.ndarray,
    version: int = 1,
    gains: np.ndarray | None = None,
) -> tuple[float, list]:
    """``x`` in the unit cube (4 coordinates) → ``(f, h [10][3])``, noise-free."""
    from .synthetic import synthetic_values

    cand = 2.0 * np.asarray(x, dtype=np.float64)[None, :] - 1.0
    f, h = synthetic_values(cand, tau, np.asarray(A, dtype=np.float64), version, gains)
    return float(f[0]), h[0].tolist()


def synthetic_trainable(
    config: dict[str, Any],
    tau: list[float],
    A: list,
    version: int = 1,
    gains: list[float] | None = None,
) -> None:
    """Tune function trainable over params ``x0..x3``: reports ``f`` and ``h``."""
    from ray import tune

    x = np.array([config[f"x{j}"] for j in range(4)])
    f, h = synthetic_objective(
        x, np.asarray(tau), np.asarray(A), version, None if gains is None else np.asarray(gains)
    )
    tune.report({"f": f, "h": h})
