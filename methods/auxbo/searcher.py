"""``AuxBOSearcher``: the paper's surrogate as a Ray Tune searcher.

The searcher keeps the sweep's context ``{(x_i, f_i, h_i)}`` (x in the unit cube of the
:class:`~nshot.tune.space.SearchSpace`, f oriented so higher is better, h the trial's auxiliary
curve) and proposes the next config by maximising probability of improvement under the
meta-trained TNP, exposed to BoTorch as a ``Model`` (``optimize_acqf`` over the continuous cube,
or ``optimize_acqf_discrete`` over a given candidate set).

* The first ``n_init`` suggestions are warm starts: the best configs of earlier sweeps of the
  same space in the history (most recent first), then uniform random configs.
* Without a surrogate meta-trained for the space it uses a BoTorch ``SingleTaskGP`` + log-EI on
  the same context (the default ``fallback="auto"``, as ``nshot tune --search auxbo``). A
  surrogate named by ``checkpoint`` that does not fit the space (another encoded width, h frames
  of another width) is refused with a message naming the mismatch unless ``fallback="gp"``;
  ``fallback=None`` refuses to run without a fitting surrogate.
* ``save``/``restore`` write JSON (context, pending trials, RNG state): a restored sweep
  continues without repeating a trial and nothing is unpickled.
"""

from __future__ import annotations

import json
import math
import os
import sys
from pathlib import Path
from typing import Any

import numpy as np
from ray.tune.search import Searcher

from nshot.method import ConfigError, NshotError
from nshot.tune.space import SearchSpace

from .backends import SurrogateMismatchError

STATE_VERSION = 1


def h_array(h: Any) -> np.ndarray:
    """A trial's ``h`` (list of floats, or list of equal-length lists) as ``[T, d]``."""
    if h is None:
        return np.zeros((0, 1), dtype=np.float32)
    arr = np.asarray(h, dtype=np.float32)
    if arr.ndim == 1:
        arr = arr.reshape(-1, 1)
    elif arr.ndim > 2:
        arr = arr.reshape(arr.shape[0], -1)
    return arr


def surrogate_dir_for_hash(space_hash: str) -> Path:
    from nshot.data import cache_dir

    return cache_dir() / "auxbo" / "surrogates" / space_hash


def default_surrogate_dir(space: SearchSpace) -> Path:
    """Where ``nshot train auxbo --set family=history --set history_method=...`` puts the
    surrogate of a search space (the searcher's default checkpoint)."""
    return surrogate_dir_for_hash(space.schema_hash())


class AuxBOSearcher(Searcher):
    """Few-shot BO with auxiliary information as a Ray Tune ``Searcher``.

    Args:
        space: the search space (a :class:`SearchSpace` or its JSON); when ``None`` it is taken
            from Tune's ``param_space`` through ``set_search_properties``.
        metric, mode: the reported objective (nshot sweeps report ``f``).
        checkpoint: a surrogate folder (``nshot train auxbo`` checkpoint); ``None`` looks in
            :func:`default_surrogate_dir`.
        fallback: ``"auto"`` (default): a GP when no surrogate for the space exists, unless
            ``checkpoint`` names one (then a mismatch is an error); ``"gp"``: a GP whenever no
            compatible surrogate exists; ``None``: refuse without one.
        surrogate: ``False``: the GP alone, even where a surrogate exists (what aux-BO is with
            no history; the baseline of ``experiment=history_curve``).
        n_init: warm-start/random suggestions before the model is used.
        xi: PI margin (in the surrogate's z-scored units).
        candidates: optional discrete candidate configs (``optimize_acqf_discrete``).
        n_raw: raw Sobol samples of ``optimize_acqf`` over the continuous cube.
        warm_start: history tasks (:class:`nshot.tune.history.HistoryTask`) whose best configs
            seed the first suggestions.
    """

    def __init__(
        self,
        space: SearchSpace | dict | None = None,
        metric: str | None = "f",
        mode: str | None = "max",
        *,
        checkpoint: str | os.PathLike | None = None,
        fallback: str | None = "auto",
        n_init: int = 1,
        xi: float = 0.01,
        candidates: list[dict[str, Any]] | None = None,
        n_raw: int = 512,
        restarts: int = 4,
        warm_start: list[Any] | None = None,
        seed: int = 0,
        h_key: str = "h",
        surrogate: bool = True,
    ) -> None:
        super().__init__(metric=metric, mode=mode)
        if fallback == "auto":  # a GP unless a surrogate was named explicitly
            fallback = None if checkpoint else "gp"
        if fallback not in (None, "gp"):
            raise ConfigError(f"auxbo: fallback must be 'auto', 'gp' or None, got {fallback!r}")
        if n_init < 1:
            raise ConfigError("auxbo: n_init must be >= 1")
        if not (0.0 <= xi < 10.0):
            raise ConfigError("auxbo: xi must be in [0, 10)")
        if not surrogate and checkpoint:
            raise ConfigError("auxbo: surrogate=False takes no checkpoint")
        self._use_surrogate = bool(surrogate)
        self._checkpoint = str(checkpoint) if checkpoint else None
        self._fallback = fallback
        self._n_init = int(n_init)
        self._xi = float(xi)
        self._n_raw = int(n_raw)
        self._restarts = int(restarts)
        self._seed = int(seed)
        self._h_key = h_key
        self._raw_candidates = candidates
        self._warm_configs: list[dict[str, Any]] = []
        self._warm_tasks = warm_start or []
        self._rng = np.random.default_rng(seed)
        # context: rows of {"x": [...], "y": float, "h": [[...]], "trial_id": str}
        self._context: list[dict[str, Any]] = []
        self._pending: dict[str, list[float]] = {}
        self._seen: list[list[float]] = []  # every suggested x (repeats are avoided)
        self._backend: Any = None
        self._backend_name = "none"
        self._space: SearchSpace | None = None
        self._candidates: np.ndarray | None = None
        if space is not None:
            self._set_space(
                space if isinstance(space, SearchSpace) else SearchSpace.from_json(space)
            )

    # ------------------------------------------------------------------ setup
    def _set_space(self, space: SearchSpace) -> None:
        self._space = space
        if self._raw_candidates is not None:
            if not self._raw_candidates:
                raise ConfigError("auxbo: candidates is empty")
            self._candidates = np.stack([space.encode(c) for c in self._raw_candidates])
        self._warm_configs = _warm_configs(self._warm_tasks, space)
        self._backend = self._make_backend(space)

    def _make_backend(self, space: SearchSpace) -> Any:
        from .backends import GPBackend, TNPBackend

        if not self._use_surrogate:
            self._backend_name = "gp"
            return GPBackend()
        folder = Path(self._checkpoint) if self._checkpoint else default_surrogate_dir(space)
        explicit = self._checkpoint is not None
        if folder.exists():
            try:
                backend = TNPBackend.load(folder, space)
                self._backend_name = f"tnp:{folder}"
                return backend
            except SurrogateMismatchError as err:
                if self._fallback != "gp":
                    raise SurrogateMismatchError(
                        f"auxbo: {err}; meta-train a surrogate on this space's history "
                        "(nshot train auxbo --set history_method=<method>) or pass fallback=gp"
                    ) from None
                print(f"[auxbo] {err}; using the GP fallback", file=sys.stderr)
        elif explicit:
            raise SurrogateMismatchError(f"auxbo: no surrogate checkpoint at {folder}")
        if self._fallback != "gp":
            raise SurrogateMismatchError(
                f"auxbo: no surrogate meta-trained for this search space (looked in {folder}); "
                "train one with `nshot train auxbo --set history_method=<method>` once the "
                "history holds sweeps of it, or pass fallback=gp"
            )
        self._backend_name = "gp"
        return GPBackend()

    def set_search_properties(
        self, metric: str | None, mode: str | None, config: dict, **spec
    ) -> bool:
        if metric:
            self._metric = metric
        if mode:
            self._mode = mode
        if config:
            space = SearchSpace.from_tune(config)
            if self._space is None:
                self._set_space(space)
            elif space != self._space:
                return False
        return True

    # ------------------------------------------------------------------ Tune API
    def suggest(self, trial_id: str) -> dict[str, Any] | None:
        if self._space is None:
            raise NshotError("auxbo: no search space (pass one or give Tune a param_space)")
        x = self._propose()
        self._pending[trial_id] = x.tolist()
        self._seen.append(x.tolist())
        return self._space.decode(x)

    def on_trial_complete(
        self, trial_id: str, result: dict | None = None, error: bool = False
    ) -> None:
        x = self._pending.pop(trial_id, None)
        if x is None or error or not result or self.metric not in result:
            return
        f = result[self.metric]
        if f is None or not math.isfinite(float(f)):
            return
        y = float(f) if self.mode == "max" else -float(f)
        h = h_array(result.get(self._h_key))
        self._context.append({"x": x, "y": y, "h": h.tolist(), "trial_id": trial_id})

    # ------------------------------------------------------------------ proposals
    def _propose(self) -> np.ndarray:
        assert self._space is not None
        n_done = len(self._context) + len(self._pending)
        if n_done < self._n_init or not self._context:
            for cfg in self._warm_configs:
                x = self._space.encode(cfg)
                if not self._is_seen(x):
                    return self._snap(x)
            return self._random()
        X = np.asarray([c["x"] for c in self._context], dtype=np.float64)
        y = np.asarray([c["y"] for c in self._context], dtype=np.float64)
        hs = [np.asarray(c["h"], dtype=np.float32).reshape(len(c["h"]), -1) for c in self._context]
        # pending trials: their x is excluded (no repeated proposal while they run)
        excluded = np.asarray(self._seen, dtype=np.float64).reshape(-1, self._space.dim)
        seed = int(self._rng.integers(2**31 - 1))
        if self._candidates is not None:
            idx = self._backend.propose_discrete(X, y, hs, self._candidates, excluded, self._xi)
            if idx is None:
                return self._random()
            return self._candidates[idx]
        x = self._backend.propose_continuous(
            X, y, hs, self._space.dim, excluded, self._xi, seed, self._n_raw, self._restarts
        )
        x = self._snap(np.asarray(x, dtype=np.float64))
        return x if not self._is_seen(x) else self._random()

    def _snap(self, x: np.ndarray) -> np.ndarray:
        """Canonical point of the config ``x`` decodes to (integers rounded, one-hot exact)."""
        assert self._space is not None
        if self._candidates is not None:
            d = ((self._candidates - x[None]) ** 2).sum(1)
            for i in np.argsort(d):
                if not self._is_seen(self._candidates[i]):
                    return self._candidates[i]
            raise NshotError("auxbo: every candidate has been evaluated")
        return self._space.encode(self._space.decode(x))

    def _is_seen(self, x: np.ndarray) -> bool:
        return any(np.allclose(x, s, atol=1e-9) for s in self._seen)

    def _random(self) -> np.ndarray:
        assert self._space is not None
        if self._candidates is not None:
            free = [
                i for i in range(len(self._candidates)) if not self._is_seen(self._candidates[i])
            ]
            if not free:
                raise NshotError("auxbo: every candidate has been evaluated")
            return self._candidates[int(self._rng.choice(free))]
        for _ in range(100):
            x = self._snap(self._rng.random(self._space.dim))
            if not self._is_seen(x):
                return x
        return x

    # ------------------------------------------------------------------ state
    def get_state(self) -> dict[str, Any]:
        return {
            "version": STATE_VERSION,
            "space": self._space.to_json() if self._space else None,
            "metric": self.metric,
            "mode": self.mode,
            "context": self._context,
            "pending": self._pending,
            "seen": self._seen,
            "rng": self._rng.bit_generator.state,
            "backend": self._backend_name,
        }

    def set_state(self, state: dict[str, Any]) -> None:
        if state.get("version") != STATE_VERSION:
            raise NshotError(
                f"auxbo: searcher state version {state.get('version')} is not {STATE_VERSION}"
            )
        space = SearchSpace.from_json(state["space"]) if state.get("space") else None
        if space is not None and (self._space is None or space != self._space):
            self._set_space(space)
        self._metric, self._mode = state["metric"], state["mode"]
        self._context = list(state["context"])
        # trials that were running when the sweep stopped are re-run by Tune under new ids
        self._pending = {}
        self._seen = [list(map(float, s)) for s in state["seen"]]
        rng = np.random.default_rng()
        rng.bit_generator.state = state["rng"]
        self._rng = rng

    def save(self, checkpoint_path: str) -> None:
        from nshot.fileio import atomic_write

        atomic_write(checkpoint_path, json.dumps(self.get_state()))

    def restore(self, checkpoint_path: str) -> None:
        try:
            with open(checkpoint_path) as fh:
                state = json.load(fh)
        except (OSError, json.JSONDecodeError) as err:
            raise NshotError(
                f"auxbo: cannot read searcher state {checkpoint_path}: {err}"
            ) from None
        self.set_state(state)

    def summary(self) -> dict[str, Any]:
        return {
            "backend": self._backend_name,
            "context": len(self._context),
            "warm_starts": len(self._warm_configs),
        }


def _warm_configs(tasks: list[Any], space: SearchSpace) -> list[dict[str, Any]]:
    """Best config of each history task of this space, most recent task first."""
    out = []
    for t in reversed(tasks):
        if getattr(t, "space_hash", None) != space.schema_hash() or len(t.configs) == 0:
            continue
        best = int(np.argmax(t.y))
        cfg = {**space.fixed, **t.configs[best]}
        try:
            space.encode(cfg)
        except ConfigError:
            continue
        out.append(cfg)
    return out


def searcher_factory(ctx: Any) -> AuxBOSearcher:
    """``nshot tune --search auxbo``: options checkpoint, fallback, surrogate, n_init, xi, n_raw,
    restarts, warm."""
    from nshot.tune.history import load_tasks

    opts = dict(ctx.options)
    known = {"checkpoint", "fallback", "surrogate", "n_init", "xi", "n_raw", "restarts", "warm"}
    unknown = set(opts) - known
    if unknown:
        raise ConfigError(
            f"--search auxbo: unknown options {sorted(unknown)}; known: {sorted(known)}"
        )
    checkpoint = opts.get("checkpoint")
    fallback = opts.get("fallback", "auto")
    # "auto", as in Python: a surrogate meta-trained for this space when there is one, else a GP
    if fallback in ("none", "", None):
        fallback = None
    warm = []
    surrogate = _flag(opts.get("surrogate", True), "surrogate")
    if _flag(opts.get("warm", True), "warm"):
        warm = load_tasks(ctx.history_dir, method=ctx.method, space_hash=ctx.space.schema_hash())
    s = AuxBOSearcher(
        metric=ctx.metric,
        mode=ctx.mode,
        checkpoint=checkpoint,
        fallback=fallback,
        n_init=int(opts.get("n_init", 1)),
        xi=float(opts.get("xi", 0.01)),
        n_raw=int(opts.get("n_raw", 512)),
        restarts=int(opts.get("restarts", 4)),
        warm_start=warm,
        seed=ctx.seed,
        surrogate=surrogate,
    )
    # the space comes from the method (Tune passes the same one through param_space)
    s._set_space(ctx.space)
    return s


def _flag(value: Any, name: str) -> bool:
    """A boolean search option: a bool, or (from the command line) true/false/1/0."""
    if isinstance(value, bool):
        return value
    if isinstance(value, str) and value.lower() in ("true", "1", "yes", "false", "0", "no"):
        return value.lower() in ("true", "1", "yes")
    raise ConfigError(f"--search auxbo: option {name} must be true or false, got {value!r}")
