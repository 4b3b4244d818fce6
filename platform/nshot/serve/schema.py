"""The strict base of every request model that the Serve app validates.

A typed API refuses what it did not ask for: with ``StrictRequest`` a numeric field takes a JSON
number only (``"0.5"``, ``" 1 "``, ``"1_000"`` and ``true`` are refused; an integer is still a
valid float), an integer field takes an integer only (``1.0`` and ``true`` are refused), a string
field a string only, a boolean field ``true``/``false`` only, and an unknown field (the typo
``n_drawz``) is an error naming it. Nested models of a request derive from it too.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from typing import Any

from pydantic import BaseModel, ConfigDict


class StrictRequest(BaseModel):
    """Base of request models: strict types, unknown fields forbidden."""

    model_config = ConfigDict(strict=True, extra="forbid")


def check_label_types(name: str, labels: Sequence[Any]) -> None:
    """``labels`` are all integers or all strings: a mix is refused, so that ``1`` and ``"1"``
    can never be two classes that print alike (raises ``ValueError`` naming ``name``)."""
    kinds = {type(v) for v in labels}
    if len(kinds) > 1:
        raise ValueError(
            f'{name}: labels mix integers and strings (e.g. 1 and "1"); use one type for all'
        )


# the default bound on a request's real numbers: far beyond any quantity the methods here model,
# far below what overflows a float32 network into a NaN answer (about 1e19 and up)
MAX_ABS = 1e6


def check_finite(name: str, values: Iterable[float], limit: float = MAX_ABS) -> None:
    """Every value finite and within ``±limit`` (raises ``ValueError`` naming ``name``)."""
    for v in values:
        if not math.isfinite(v):
            raise ValueError(f"{name}: NaN or inf")
        if abs(v) > limit:
            raise ValueError(f"{name}: {v:g} is beyond ±{limit:g}")
