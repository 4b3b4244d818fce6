"""A Tune trainable on one task of the synthetic family: a self-contained demo of the searcher.

``f`` is the distance-to-optimum reward and ``h`` the 10 × 3 "direction to the optimum" frames
of the synthetic family, for a task with latent optimum ``tau`` and the family's fixed maps
``A``. Used by ``examples/auxbo_tune.py`` and the tests (Tune workers import it from the installed package).
"""

from __future__ import annotations

from typing import Any

import numpy as np


def synthetic_objective(x: np.ndarray, tau: np.ndarray, A: np.ndarray) -> tuple[float, list]:
    """``x`` in the unit cube (4 coordinates) → ``(f, h [10][3])``, noise-free."""
    z = 2.0 * np.asarray(x, dtype=np.float64) - 1.0 - np.asarray(tau, dtype=np.float64)
    f = float(np.exp(-np.sum(z**2) / 0.5))
    h = np.tanh(np.asarray(A, dtype=np.float64) @ z).tolist()
    return f, h


def synthetic_trainable(config: dict[str, Any], tau: list[float], A: list) -> None:
    """Tune function trainable over params ``x0..x3``: reports ``f`` and ``h``."""
    from ray import tune

    x = np.array([config[f"x{j}"] for j in range(4)])
    f, h = synthetic_objective(x, np.asarray(tau), np.asarray(A))
    tune.report({"f": f, "h": h})
