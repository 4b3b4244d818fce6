"""Comparisons the tests share."""

from __future__ import annotations

import pytest


def json_close(a, b) -> bool:
    """Equal JSON values, floats to 1e-5 (a batch of two runs other matrix kernels than a batch
    of one, so a model's probabilities may differ in the seventh digit between the two)."""
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(json_close(a[k], b[k]) for k in a)
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(json_close(x, y) for x, y in zip(a, b))
    if isinstance(a, float) or isinstance(b, float):
        return (
            isinstance(a, int | float)
            and isinstance(b, int | float)
            and a == pytest.approx(b, rel=1e-5, abs=1e-9)
        )
    return a == b
