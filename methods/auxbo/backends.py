"""What :class:`~nshot.methods.auxbo.searcher.AuxBOSearcher` proposes with.

* :class:`TNPBackend`: the meta-trained TNP (a ``save_tnp`` folder or an ``nshot train auxbo``
  checkpoint), checked against the sweep's search space, wrapped as a BoTorch ``Model`` with the
  sweep's context, maximising probability of improvement.
* :class:`GPBackend`: the fallback, BoTorch ``SingleTaskGP`` + log-EI on the same context.

Both take the context as ``X [n, D]`` (unit cube), ``y [n]`` (higher is better) and a list of
per-trial curves ``h_i [T_i, d]`` (any length: padded or truncated to the model's ``T_h``).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import torch

from nshot.method import NshotError


class SurrogateMismatchError(NshotError):
    """The surrogate checkpoint was meta-trained for another space or h shape."""


def pad_curves(hs: list[np.ndarray], h_len: int, h_dim: int) -> np.ndarray:
    """``[n, h_len, h_dim]`` with NaN frames as padding (the TNP masks non-finite frames); a
    curve longer than ``h_len`` keeps its last ``h_len`` frames. Raises on a width mismatch."""
    out = np.full((len(hs), h_len, h_dim), np.nan, dtype=np.float32)
    for i, h in enumerate(hs):
        h = np.asarray(h, dtype=np.float32)
        if h.size == 0:
            continue
        h = h.reshape(h.shape[0], -1)
        if h.shape[1] != h_dim:
            raise SurrogateMismatchError(
                f"the trials report h frames of width {h.shape[1]}, the surrogate was "
                f"meta-trained on width {h_dim}"
            )
        h = h[-h_len:]
        out[i, : h.shape[0]] = h
    return out


def load_surrogate(folder: str | Path) -> tuple[Any, dict[str, Any], dict[str, Any]]:
    """``(TNP, stats, extra)`` from a ``save_tnp`` folder or an auxbo nshot checkpoint."""
    from .model import META_FILE, load_tnp

    folder = Path(folder)
    if (folder / META_FILE).is_file():
        return load_tnp(folder)
    from nshot.train.checkpoint import load_checkpoint

    from .model import load_model

    ckpt = load_checkpoint(folder, method="auxbo")
    model, stats = load_model(ckpt)
    return model, stats, dict(ckpt.extra)


class TNPBackend:
    """The meta-trained TNP inside BoTorch's PI acquisition."""

    def __init__(self, model: Any, stats: dict[str, Any], extra: dict[str, Any]) -> None:
        self.model = model.eval()
        self.stats = stats
        self.extra = extra

    @classmethod
    def load(cls, folder: str | Path, space: Any) -> TNPBackend:
        from .model import TNPCheckpointError

        try:
            model, stats, extra = load_surrogate(folder)
        except (TNPCheckpointError, NshotError) as err:
            raise SurrogateMismatchError(f"unusable surrogate at {folder}: {err}") from None
        want = extra.get("space_hash")
        if want and want != space.schema_hash():
            raise SurrogateMismatchError(
                f"the surrogate at {folder} was meta-trained on search space {want}, this sweep's "
                f"space is {space.schema_hash()} ({sorted(space.params)})"
            )
        if model.cfg.x_dim != space.dim:
            raise SurrogateMismatchError(
                f"the surrogate at {folder} takes {model.cfg.x_dim}-dimensional designs, this "
                f"sweep's space encodes to {space.dim} ({sorted(space.params)})"
            )
        return cls(model, stats, extra)

    def botorch_model(self, X: np.ndarray, y: np.ndarray, hs: list[np.ndarray]) -> Any:
        from .surrogate import TNPModel

        cfg = self.model.cfg
        h = pad_curves(hs, cfg.h_len, cfg.h_dim) if cfg.use_h else None
        return TNPModel(self.model, self.stats, X, y, h)

    def propose_continuous(self, X, y, hs, dim, excluded, xi, seed, n_raw, restarts) -> np.ndarray:
        from .surrogate import propose_continuous

        model = self.botorch_model(X, y, hs)
        x = propose_continuous(
            model, dim, best_f=float(np.max(y)), xi=xi, seed=seed, n_raw=n_raw, restarts=restarts
        )
        return np.asarray(x, dtype=np.float64).reshape(-1)

    def propose_discrete(self, X, y, hs, candidates, excluded, xi) -> int | None:
        from .surrogate import propose_discrete

        evaluated = _evaluated(candidates, excluded)
        if evaluated.all():
            return None
        model = self.botorch_model(X, y, hs)
        cand = torch.as_tensor(candidates, dtype=torch.float64)
        return int(
            propose_discrete(
                model, cand, torch.as_tensor(evaluated), xi=xi, best_f=float(np.max(y))
            )
        )


class GPBackend:
    """BoTorch ``SingleTaskGP`` + log-EI (the searcher's fallback); ignores h."""

    def propose_continuous(self, X, y, hs, dim, excluded, xi, seed, n_raw, restarts) -> np.ndarray:
        from .surrogate import gp_propose_continuous

        x = gp_propose_continuous(
            torch.as_tensor(X, dtype=torch.float64),
            torch.as_tensor(y, dtype=torch.float64),
            dim,
            seed,
        )
        return np.asarray(x, dtype=np.float64).reshape(-1)

    def propose_discrete(self, X, y, hs, candidates, excluded, xi) -> int | None:
        from .surrogate import gp_propose_discrete

        evaluated = _evaluated(candidates, excluded)
        if evaluated.all():
            return None
        return gp_propose_discrete(
            torch.as_tensor(X, dtype=torch.float64),
            torch.as_tensor(y, dtype=torch.float64),
            torch.as_tensor(candidates, dtype=torch.float64),
            torch.as_tensor(evaluated),
        )


def _evaluated(candidates: np.ndarray, excluded: np.ndarray) -> np.ndarray:
    if not len(excluded):
        return np.zeros(len(candidates), bool)
    return np.array([np.any(np.all(np.isclose(c[None], excluded), axis=1)) for c in candidates])
