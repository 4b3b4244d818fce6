"""The BO loop over a discrete candidate set and the baselines.

:func:`run_bo` evaluates ``n_init`` seeded random candidates, then asks a proposer for one
unevaluated candidate at a time; "evaluating" is a lookup of ``task.f`` (and, for the TNP, of
``task.h``) at the chosen index. A proposer is any object with ``propose(task, evaluated_idx,
rng) -> int``; an optional ``reset(task, rng)`` is called once at the start of every run, so one
proposer object can be reused across tasks and seeds.

Proposers: :class:`RandomProposer`, :class:`TNPProposer` (PI on the meta-trained TNP, also the
h-shuffle control), :class:`GPEIProposer` (per-task ``SingleTaskGP`` + log-EI),
:class:`MultiTaskGPProposer` (``MultiTaskGP`` over a few history tasks, refitted every
``refit_every`` evaluations) and :class:`OptunaTPEProposer` (TPE on the continuous box, snapped to
the nearest unevaluated candidate).
"""

from __future__ import annotations

import math
import time
import warnings
from collections.abc import Sequence
from typing import Any, Protocol

import numpy as np
import torch
from botorch.acquisition.analytic import LogExpectedImprovement
from botorch.fit import fit_gpytorch_mll
from botorch.models import MultiTaskGP
from gpytorch.mlls import ExactMarginalLogLikelihood

from .model import TNP
from .surrogate import (
    FIT_ERRORS,
    TNPModel,
    argmax_tiebreak,
    gp_propose_discrete,
    propose_discrete,
    single_thread,
)

__all__ = [
    "GPEIProposer",
    "MultiTaskGPProposer",
    "OptunaTPEProposer",
    "Proposer",
    "RandomProposer",
    "TNPProposer",
    "run_bo",
    "simple_regret",
]


class Proposer(Protocol):
    def propose(self, task: Any, evaluated_idx: list[int], rng: np.random.Generator) -> int: ...


def _free_mask(task: Any, evaluated_idx: Sequence[int]) -> np.ndarray:
    mask = np.zeros(len(task.f), dtype=bool)
    mask[list(evaluated_idx)] = True
    return mask


# ----------------------------------------------------------------------------------------------
# the loop and the metric


def run_bo(
    task: Any,
    proposer: Proposer,
    budget: int,
    n_init: int,
    seed: int,
    trace: list[int] | None = None,
) -> np.ndarray:
    """Best-so-far f after each of ``budget`` evaluations (``np.ndarray [budget]``, float64).

    The first ``min(n_init, budget)`` designs are uniformly random without replacement
    (``np.random.default_rng(seed)``); the rest come from ``proposer``. A proposal that is out of
    range or already evaluated raises ``RuntimeError`` (no candidate is ever evaluated twice).
    ``trace``, when given, receives the evaluated indices in order. Torch's global RNG is
    seeded with ``seed`` for the run (and restored after it), so GP fits that restart from
    random draws are reproducible."""
    n = len(task.f)
    if not 1 <= budget <= n:
        raise ValueError(f"budget must be in [1, {n}] for a task of {n} candidates, got {budget}")
    if n_init < 0:
        raise ValueError(f"n_init must be >= 0, got {n_init}")
    rng = np.random.default_rng(seed)
    with torch.random.fork_rng(devices=[]):  # GP fits may draw from torch's global RNG
        torch.manual_seed(int(seed) % 2**63)
        evaluated = _bo_loop(task, proposer, budget, n_init, rng)
    if trace is not None:
        trace.extend(evaluated)
    return np.maximum.accumulate(np.asarray(task.f, dtype=np.float64)[evaluated])


def _bo_loop(
    task: Any, proposer: Proposer, budget: int, n_init: int, rng: np.random.Generator
) -> list[int]:
    n = len(task.f)
    reset = getattr(proposer, "reset", None)
    if reset is not None:
        reset(task, rng)
    evaluated = [int(i) for i in rng.choice(n, size=min(n_init, budget), replace=False)]
    seen = set(evaluated)
    while len(evaluated) < budget:
        idx = proposer.propose(task, list(evaluated), rng)
        if isinstance(idx, (bool, np.bool_)) or not isinstance(idx, (int, np.integer)):
            raise RuntimeError(f"{type(proposer).__name__} proposed a non-integer {idx!r}")
        idx = int(idx)
        if not 0 <= idx < n:
            raise RuntimeError(f"{type(proposer).__name__} proposed index {idx} outside [0, {n})")
        if idx in seen:
            raise RuntimeError(f"{type(proposer).__name__} proposed evaluated candidate {idx}")
        evaluated.append(idx)
        seen.add(idx)
    return evaluated


def simple_regret(task: Any, best_so_far: np.ndarray) -> np.ndarray:
    """Normalised simple regret ``(f* − best_t) / (f* − f_min)``; zeros when ``f* == f_min``."""
    f = np.asarray(task.f, dtype=np.float64)
    f_star, f_min = float(f.max()), float(f.min())
    best = np.asarray(best_so_far, dtype=np.float64)
    if f_star == f_min:
        return np.zeros_like(best)
    return (f_star - best) / (f_star - f_min)


# ----------------------------------------------------------------------------------------------
# proposers


class RandomProposer:
    """Uniform over the unevaluated candidates."""

    def propose(self, task: Any, evaluated_idx: list[int], rng: np.random.Generator) -> int:
        free = np.flatnonzero(~_free_mask(task, evaluated_idx))
        return int(rng.choice(free))


class TNPProposer:
    """argmax PI of the frozen TNP with the evaluated designs as context (raw units, ``ξ``).

    ``h_shuffle``: the h of each evaluated design is replaced by the h of another random design
    of the same task, drawn once per evaluated design (the h-shuffle control).
    ``h_pool``: instead, the h of a random design of a random task of ``h_pool`` (history tasks
    of the family, same h shape), drawn once per evaluated design: the cross-task control, whose
    h carries neither the design's nor the task's information."""

    def __init__(
        self,
        model: TNP,
        stats: dict[str, Any],
        xi: float = 0.01,
        h_shuffle: bool = False,
        h_pool: list[Any] | None = None,
    ) -> None:
        if h_shuffle and h_pool is not None:
            raise ValueError("h_shuffle and h_pool are two different controls; pick one")
        if h_pool is not None and not h_pool:
            raise ValueError("h_pool needs at least one task")
        self.model = model.eval()
        self.stats = stats
        self.xi = float(xi)
        self.h_shuffle = bool(h_shuffle)
        self.h_pool = h_pool
        self._swap: dict[int, int] = {}
        self._cross: dict[int, np.ndarray] = {}
        self._task_X: tuple[int, torch.Tensor] | None = None

    def reset(self, task: Any, rng: np.random.Generator) -> None:
        self._swap = {}
        self._cross = {}
        self._task_X = None

    def _cross_h(self, i: int, task: Any, rng: np.random.Generator) -> np.ndarray:
        if i not in self._cross:
            name = getattr(task, "name", None)
            pool = [t for t in self.h_pool if getattr(t, "name", object()) != name] or self.h_pool
            donor = pool[int(rng.integers(0, len(pool)))]
            h = np.asarray(donor.h)[int(rng.integers(0, len(donor.f)))]
            if h.shape != np.asarray(task.h).shape[1:]:
                raise ValueError(
                    f"h_pool task {getattr(donor, 'name', '?')!r} has h of shape {h.shape}, "
                    f"the task {np.asarray(task.h).shape[1:]}"
                )
            self._cross[i] = h
        return self._cross[i]

    def _h_index(self, i: int, n: int, rng: np.random.Generator) -> int:
        if not self.h_shuffle:
            return i
        if i not in self._swap:
            j = int(rng.integers(0, n - 1)) if n > 1 else i
            self._swap[i] = j + (j >= i) if n > 1 else i
        return self._swap[i]

    def surrogate(self, task: Any, evaluated_idx: list[int], rng: np.random.Generator) -> TNPModel:
        n = len(task.f)
        idx = np.asarray(evaluated_idx, dtype=int)
        if not self.model.cfg.use_h:
            h = None
        elif self.h_pool is not None:
            h = np.stack([self._cross_h(int(i), task, rng) for i in idx])
        else:
            h_idx = np.asarray([self._h_index(int(i), n, rng) for i in idx], dtype=int)
            h = np.asarray(task.h)[h_idx]
        return TNPModel(self.model, self.stats, task.X[idx], task.f[idx], h)

    def propose(self, task: Any, evaluated_idx: list[int], rng: np.random.Generator) -> int:
        if self._task_X is None or self._task_X[0] != id(task):
            self._task_X = (id(task), torch.from_numpy(np.array(task.X, dtype=np.float32)))
        model = self.surrogate(task, evaluated_idx, rng)
        return propose_discrete(model, self._task_X[1], _free_mask(task, evaluated_idx), self.xi)


class GPEIProposer:
    """Per-task ``SingleTaskGP`` (standardised f, fitted with one thread) + log-EI, discrete
    argmax over the unevaluated candidates (exact ties: largest posterior mean)."""

    def propose(self, task: Any, evaluated_idx: list[int], rng: np.random.Generator) -> int:
        X = torch.as_tensor(np.asarray(task.X, dtype=np.float64))
        idx = torch.as_tensor(evaluated_idx, dtype=torch.long)
        y = torch.as_tensor(np.asarray(task.f, dtype=np.float64))[idx]
        return gp_propose_discrete(X[idx], y, X, torch.from_numpy(_free_mask(task, evaluated_idx)))


def _standardise_np(y: np.ndarray) -> np.ndarray:
    y = np.asarray(y, dtype=np.float64)
    if y.size < 2:
        return y - y.mean()
    std = y.std()
    return (y - y.mean()) / (std if std > 1e-9 else 1.0)


class MultiTaskGPProposer:
    """BoTorch ``MultiTaskGP`` over ``n_history_tasks`` history tasks plus the target task.

    Per run (``reset``), the history tasks and ``points_per_task`` random designs of each are
    drawn with the run's rng; the target task is task index ``n_history_tasks``
    (``output_tasks=[target]``). f is standardised per task. Hyperparameters are fitted with
    ``fit_gpytorch_mll`` (L-BFGS ``maxiter``, one thread) at the first proposal and then every
    ``refit_every`` evaluations; in between, a new model on the grown data reuses the fitted
    state dict. The acquisition is log-EI on the target task, discrete argmax.
    ``fit_seconds`` records the wall time of every hyperparameter fit."""

    def __init__(
        self,
        history_tasks: Sequence[Any],
        n_history_tasks: int = 3,
        points_per_task: int = 20,
        maxiter: int = 200,
        refit_every: int = 5,
    ) -> None:
        if not history_tasks:
            raise ValueError("MultiTaskGPProposer needs at least one history task")
        self.history_tasks = list(history_tasks)
        self.n_history_tasks = min(int(n_history_tasks), len(self.history_tasks))
        self.points_per_task = int(points_per_task)
        self.maxiter = int(maxiter)
        self.refit_every = max(1, int(refit_every))
        self.fit_seconds: list[float] = []
        self._reset_state()

    def _reset_state(self) -> None:
        self._hist_X: torch.Tensor | None = None
        self._hist_y: torch.Tensor | None = None
        self._state: dict[str, torch.Tensor] | None = None
        self._fitted_at = -1
        self._task_id: int | None = None

    def reset(self, task: Any, rng: np.random.Generator) -> None:
        self._reset_state()
        self._task_id = id(task)
        pick = rng.choice(len(self.history_tasks), size=self.n_history_tasks, replace=False)
        xs, ys = [], []
        for t_idx, k in enumerate(pick):
            h = self.history_tasks[int(k)]
            rows = rng.choice(len(h.f), size=min(self.points_per_task, len(h.f)), replace=False)
            x = np.asarray(h.X, dtype=np.float64)[rows]
            xs.append(np.hstack([x, np.full((len(rows), 1), float(t_idx))]))
            ys.append(_standardise_np(np.asarray(h.f, dtype=np.float64)[rows]))
        self._hist_X = torch.from_numpy(np.vstack(xs))
        self._hist_y = torch.from_numpy(np.concatenate(ys))

    def _model(self, task: Any, evaluated_idx: list[int]) -> tuple[MultiTaskGP, float]:
        target = float(self.n_history_tasks)
        X_t = np.asarray(task.X, dtype=np.float64)[evaluated_idx]
        y_t = _standardise_np(np.asarray(task.f, dtype=np.float64)[evaluated_idx])
        X_t = np.hstack([X_t, np.full((len(evaluated_idx), 1), target)])
        assert self._hist_X is not None and self._hist_y is not None
        train_X = torch.cat([self._hist_X, torch.from_numpy(X_t)])
        train_Y = torch.cat([self._hist_y, torch.from_numpy(y_t)]).reshape(-1, 1)
        gp = MultiTaskGP(
            train_X,
            train_Y,
            task_feature=-1,
            output_tasks=[self.n_history_tasks],
            all_tasks=list(range(self.n_history_tasks + 1)),
            outcome_transform=None,
        )
        return gp, float(y_t.max())

    def propose(self, task: Any, evaluated_idx: list[int], rng: np.random.Generator) -> int:
        if self._task_id != id(task) or self._hist_X is None:
            self.reset(task, rng)
        n_eval = len(evaluated_idx)
        gp, best = self._model(task, evaluated_idx)
        refit = self._state is None or n_eval - self._fitted_at >= self.refit_every
        with single_thread(), torch.enable_grad(), warnings.catch_warnings():
            warnings.simplefilter("ignore")
            if refit:
                start = time.perf_counter()
                mll = ExactMarginalLogLikelihood(gp.likelihood, gp)
                try:
                    fit_gpytorch_mll(mll, optimizer_kwargs={"options": {"maxiter": self.maxiter}})
                except FIT_ERRORS:  # degenerate data: keep the prior hyperparameters
                    pass
                self.fit_seconds.append(time.perf_counter() - start)
                self._state = {k: v.detach().clone() for k, v in gp.state_dict().items()}
                self._fitted_at = n_eval
            else:
                assert self._state is not None
                gp.load_state_dict(self._state)
            gp.eval()
            free = np.flatnonzero(~_free_mask(task, evaluated_idx))
            cand = torch.as_tensor(np.asarray(task.X, dtype=np.float64)[free])
            with torch.no_grad():
                acq = LogExpectedImprovement(gp, best_f=best)
                lei = torch.nan_to_num(acq(cand.unsqueeze(-2)), nan=-math.inf)
                mean = gp.posterior(cand).mean.reshape(-1)
        return int(free[argmax_tiebreak(lei, mean)])


class OptunaTPEProposer:
    """Optuna ``TPESampler`` over the continuous box ``[0, 1]^D``: ask → snap to the nearest
    unevaluated candidate (Euclidean) → tell that candidate's f at the next call. Evaluations
    the study did not ask for (the random initial designs) are added as completed trials at the
    candidate's x. Optuna's logging is silenced. ``n_startup_trials`` is TPE's own random
    warm-up (Optuna's default 10)."""

    def __init__(self, n_startup_trials: int = 10, seed_offset: int = 0) -> None:
        self.n_startup_trials = int(n_startup_trials)
        self.seed_offset = int(seed_offset)
        self._study: Any = None
        self._pending: dict[int, Any] = {}  # candidate index -> asked trial
        self._known: set[int] = set()
        self._task_id: int | None = None

    def reset(self, task: Any, rng: np.random.Generator) -> None:
        import optuna

        optuna.logging.set_verbosity(optuna.logging.ERROR)
        seed = int(rng.integers(0, 2**31 - 1)) + self.seed_offset
        sampler = optuna.samplers.TPESampler(seed=seed, n_startup_trials=self.n_startup_trials)
        self._study = optuna.create_study(direction="maximize", sampler=sampler)
        d = np.asarray(task.X).shape[1]
        self._dists = {f"x{i}": optuna.distributions.FloatDistribution(0.0, 1.0) for i in range(d)}
        self._pending = {}
        self._known = set()
        self._task_id = id(task)

    def _sync(self, task: Any, evaluated_idx: list[int]) -> None:
        import optuna

        X = np.asarray(task.X, dtype=np.float64)
        for i in evaluated_idx:
            if i in self._known:
                continue
            value = float(task.f[i])
            trial = self._pending.pop(i, None)
            if trial is not None:
                self._study.tell(trial, value)
            else:
                params = {f"x{k}": float(np.clip(X[i, k], 0.0, 1.0)) for k in range(X.shape[1])}
                self._study.add_trial(
                    optuna.trial.create_trial(params=params, distributions=self._dists, value=value)
                )
            self._known.add(i)

    def propose(self, task: Any, evaluated_idx: list[int], rng: np.random.Generator) -> int:
        if self._study is None or self._task_id != id(task):
            self.reset(task, rng)
        self._sync(task, evaluated_idx)
        trial = self._study.ask(self._dists)
        x = np.asarray([trial.params[f"x{k}"] for k in range(len(self._dists))])
        X = np.asarray(task.X, dtype=np.float64)
        dist = ((X - x) ** 2).sum(axis=1)
        dist[_free_mask(task, evaluated_idx)] = np.inf
        idx = int(np.argmin(dist))
        self._pending[idx] = trial
        return idx
