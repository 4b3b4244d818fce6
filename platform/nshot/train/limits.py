"""Limits on the size of a model built from a checkpoint's config, and how methods estimate it.

A checkpoint's ``state.json`` names the config its model is built from; a config within every
field's bounds can still describe a model that exhausts memory before its weights are even read.
Before a method's model is built, :func:`nshot.train.checkpoint.load_checkpoint` asks the method
for a :class:`ModelBudget` (``Method.model_budget(cfg)``) and refuses a checkpoint whose estimate
exceeds these limits:

* parameters: ``DEFAULT_MAX_PARAMS`` (2e9), or ``$NSHOT_MAX_MODEL_PARAMS``, or the
  ``max_params=`` keyword of ``load_checkpoint``;
* activations of one predictor call at the method's request caps: ``DEFAULT_MAX_ACTIVATION_BYTES``
  (16 GiB), or ``$NSHOT_MAX_ACTIVATION_BYTES``, or the ``max_activation_bytes=`` keyword.

The keyword wins over the environment variable, which wins over the default. Numbers may be
written as integers or in floating-point notation (``3e9``).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from nshot.errors import CheckpointError

if TYPE_CHECKING:
    from torch import nn

DEFAULT_MAX_PARAMS = 2_000_000_000
DEFAULT_MAX_ACTIVATION_BYTES = 16 * 2**30
ENV_MAX_PARAMS = "NSHOT_MAX_MODEL_PARAMS"
ENV_MAX_ACTIVATION_BYTES = "NSHOT_MAX_ACTIVATION_BYTES"

__all__ = [
    "DEFAULT_MAX_ACTIVATION_BYTES",
    "DEFAULT_MAX_PARAMS",
    "ENV_MAX_ACTIVATION_BYTES",
    "ENV_MAX_PARAMS",
    "ModelBudget",
    "bounded_ints",
    "meta_counts",
    "resolve_limits",
    "transformer_activation_bytes",
]


@dataclass(frozen=True)
class ModelBudget:
    """What a config's model costs, estimated without building it.

    ``params``: parameters of the model the config builds. ``activation_bytes``: peak memory of
    the intermediate tensors of one predictor call at the method's request caps (float32).
    ``weights_numel``: the number of tensor elements that the checkpoint's ``model.safetensors``
    holds for this config, when the method saves a fixed state dict (``None``: not checked).
    """

    params: int
    activation_bytes: int
    weights_numel: int | None = None


def _limit(value: int | float | None, env: str, default: int) -> int:
    source = "keyword argument"
    if value is None:
        raw = os.environ.get(env)
        if raw is None or not raw.strip():
            return default
        source = f"${env}"
        try:
            value = float(raw.strip().replace("_", ""))
        except ValueError:
            raise CheckpointError(
                f"${env}={raw!r} is not a number (a limit such as {default:.0e})"
            ) from None
    if not value > 0 or value == float("inf"):
        raise CheckpointError(f"{source} {env}: the limit must be a positive number, got {value}")
    return int(value)


def resolve_limits(
    max_params: int | float | None = None, max_activation_bytes: int | float | None = None
) -> tuple[int, int]:
    """The limits in force: keyword, else environment variable, else default."""
    return (
        _limit(max_params, ENV_MAX_PARAMS, DEFAULT_MAX_PARAMS),
        _limit(max_activation_bytes, ENV_MAX_ACTIVATION_BYTES, DEFAULT_MAX_ACTIVATION_BYTES),
    )


def meta_counts(build: Callable[[], nn.Module]) -> tuple[int, int]:
    """``(parameters, state-dict elements)`` of the module ``build()`` returns, built on the
    ``meta`` device: shapes only, nothing allocated."""
    import torch

    with torch.device("meta"):
        module = build()
    params = sum(p.numel() for p in module.parameters())
    state = sum(t.numel() for t in module.state_dict().values())
    return params, state


def transformer_activation_bytes(
    seq_len: int,
    width: int,
    heads: int,
    mlp_dim: int,
    *,
    batch: int = 1,
    bytes_per_value: int = 4,
) -> int:
    """Peak activation memory of one pre-LN transformer block in inference (no gradients).

    Counts the residual stream and its LayerNorm, q/k/v, the attention output, the
    ``heads x L x L`` score matrix and its softmax (materialised by the reference attention
    path), and the MLP's hidden layer before and after its activation. Blocks run one after
    another, so the block's peak is the model's.
    """
    per_token = 8 * width + 2 * mlp_dim
    scores = 2 * heads * seq_len * seq_len
    return bytes_per_value * batch * (seq_len * per_token + scores)


def bounded_ints(
    values: Any, bounds: dict[str, tuple[int, int]], where: str, *, required: bool = True
) -> dict[str, int]:
    """``values[name]`` for each bounded name, each an integer within its bounds, else a
    ``ValueError`` naming it: for model shapes recorded in a checkpoint's ``extra`` state,
    checked before any model is built from them. ``required=False``: a missing name (left to
    the shape's own default) is skipped."""
    if not isinstance(values, dict):
        raise ValueError(f"{where} must be an object, got {type(values).__name__}")
    out: dict[str, int] = {}
    for name, (lo, hi) in bounds.items():
        if name not in values and not required:
            continue
        v = values.get(name)
        if isinstance(v, bool) or not isinstance(v, int) or not lo <= v <= hi:
            raise ValueError(f"{where}.{name} must be an integer in [{lo}, {hi}], got {v!r}")
        out[name] = v
    return out
