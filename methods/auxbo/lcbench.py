"""mini-LCBench: real learning curves of ``MLPClassifier(solver="sgd")`` on scikit-learn's
bundled datasets (no downloads).

110 tasks with shared configurations, h = per-epoch validation (accuracy, log-loss) over 20
epochs, f = final validation accuracy. Computed once with one Ray task per dataset and cached
as a Parquet file in the history format (:mod:`.taskstore`). ``variant="perturbed"`` (opt in,
config ``lcbench_variant``): 160 harder, varied tasks from the same datasets (class subsets,
training-set sizes, training-label noise, feature scales; :func:`lcbench_p_spec`) over a wider
space, f = minus the final validation log-loss.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import re
import shutil
import sys
import time
import warnings
import zlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from .taskstore import Task, read_tasks, write_tasks
from .taskstore import stream_rng as _rng

# --------------------------------------------------------------------------------------------
# mini-LCBench: search space, encoding
# --------------------------------------------------------------------------------------------

LCBENCH_VERSION = "v1"
LCBENCH_VARIANTS = ("clean", "perturbed")
LCBENCH_EPOCHS = 20
LOSS_CAP = 10.0  # validation log-loss is capped here; diverged runs record it
LCBENCH_H_NAMES = ("val_acc", "val_loss")
_N40 = 40  # the small training-set size of the digit-pair tasks

_SPACE: dict[str, Any] = {
    "name": "mini-lcbench/mlp-sgd",
    "params": [
        {"name": "learning_rate_init", "type": "float", "low": 1e-4, "high": 1e-1, "log": True},
        {"name": "alpha", "type": "float", "low": 1e-6, "high": 1e-1, "log": True},
        {"name": "width", "type": "int", "low": 8, "high": 128, "log": True},
        {"name": "batch_size", "type": "int", "low": 8, "high": 128, "log": True},
        {"name": "momentum", "type": "float", "low": 0.5, "high": 0.99, "log": False},
    ],
}


_SPACE_P: dict[str, Any] = {
    "name": "mini-lcbench-perturbed/mlp-sgd",
    "params": [
        {"name": "learning_rate_init", "type": "float", "low": 1e-4, "high": 1.0, "log": True},
        {"name": "alpha", "type": "float", "low": 1e-6, "high": 1.0, "log": True},
        {"name": "width", "type": "int", "low": 8, "high": 128, "log": True},
        {"name": "batch_size", "type": "int", "low": 8, "high": 128, "log": True},
        {"name": "momentum", "type": "float", "low": 0.5, "high": 0.99, "log": False},
    ],
}


def lcbench_space(variant: str = "clean") -> dict:
    """The mini-LCBench hyperparameter space (JSON-able; ``params`` in the column order of X).

    Each parameter: ``name``, ``type`` ("float" | "int"), ``low``, ``high`` (both inclusive) and
    ``log`` (encoded on a log scale). ``width`` is the single hidden layer's size. The
    ``"perturbed"`` variant widens the learning rate to [1e-4, 1] and alpha to [1e-6, 1].
    """
    if variant not in LCBENCH_VARIANTS:
        raise ValueError(f"unknown mini-LCBench variant {variant!r}: use one of {LCBENCH_VARIANTS}")
    return json.loads(json.dumps(_SPACE_P if variant == "perturbed" else _SPACE))


def lcbench_tune_space(variant: str = "clean") -> dict:
    """The same space as Ray Tune domains (``lograndint``'s upper bound is exclusive)."""
    from ray import tune

    out: dict[str, Any] = {}
    for p in lcbench_space(variant)["params"]:
        lo, hi = p["low"], p["high"]
        if p["type"] == "int":
            out[p["name"]] = tune.lograndint(lo, hi + 1) if p["log"] else tune.randint(lo, hi + 1)
        else:
            out[p["name"]] = tune.loguniform(lo, hi) if p["log"] else tune.uniform(lo, hi)
    return out


def encode_config(config: Mapping[str, Any], space: Mapping[str, Any] | None = None) -> np.ndarray:
    """A config dict → its point in [0, 1]^D (log scale for log parameters), float64."""
    space = space or _SPACE
    out = np.empty(len(space["params"]), dtype=np.float64)
    for k, p in enumerate(space["params"]):
        if p["name"] not in config:
            raise KeyError(f"config lacks {p['name']!r}")
        v, lo, hi = float(config[p["name"]]), float(p["low"]), float(p["high"])
        if p["log"]:
            if v <= 0:
                raise ValueError(f"{p['name']}={v} must be > 0 (log-scale parameter)")
            u = (math.log(v) - math.log(lo)) / (math.log(hi) - math.log(lo))
        else:
            u = (v - lo) / (hi - lo)
        out[k] = min(max(u, 0.0), 1.0)
    return out


def decode_x(x: Sequence[float] | np.ndarray, space: Mapping[str, Any] | None = None) -> dict:
    """A point of [0, 1]^D → its config dict (integers rounded, values clipped to the bounds)."""
    space = space or _SPACE
    x = np.asarray(x, dtype=np.float64).reshape(-1)
    if x.shape[0] != len(space["params"]):
        raise ValueError(f"x has {x.shape[0]} values, the space has {len(space['params'])}")
    out: dict[str, Any] = {}
    for u, p in zip(np.clip(x, 0.0, 1.0), space["params"]):
        lo, hi = float(p["low"]), float(p["high"])
        if p["log"]:
            v = math.exp(math.log(lo) + float(u) * (math.log(hi) - math.log(lo)))
        else:
            v = lo + float(u) * (hi - lo)
        v = min(max(v, lo), hi)
        out[p["name"]] = int(round(v)) if p["type"] == "int" else float(v)
    return out


def lcbench_configs(
    n_configs: int = 100, seed: int = 0, space: Mapping[str, Any] | None = None
) -> tuple[np.ndarray, list[dict]]:
    """The shared designs: scrambled Sobol points (seeded) decoded to configs, re-encoded.

    Returns ``(X [n_configs, 5] float32, configs)``; X is the exact encoding of each (rounded)
    config. ``space``: default the mini-LCBench space (the perturbed variant passes its own).
    """
    from scipy.stats import qmc

    space = space or _SPACE
    if n_configs < 1:
        raise ValueError("n_configs must be >= 1")
    d = len(space["params"])
    m = max(0, math.ceil(math.log2(n_configs)))
    u = qmc.Sobol(d=d, scramble=True, seed=seed).random_base2(m)[:n_configs]
    configs = [decode_x(row, space) for row in u]
    X = np.stack([encode_config(c, space) for c in configs]).astype(np.float32)
    return X, configs


# --------------------------------------------------------------------------------------------
# mini-LCBench: tasks (datasets), split
# --------------------------------------------------------------------------------------------

_PAIR = re.compile(r"lcbench/(digits|wine|iris)_(\d)v(\d)(?:/(full|n40))?")
_OVR = re.compile(r"lcbench/digits_(\d)vrest")
_FULL = ("wine", "iris", "breast_cancer", "digits")


def lcbench_task_names() -> list[str]:
    """All 110 mini-LCBench task names, in a fixed order.

    ``lcbench/digits_{a}v{b}/full`` and ``.../n40`` (45 digit pairs, full training split and a
    40-sample stratified subsample), ``lcbench/digits_{k}vrest`` (10, balanced), ``lcbench/wine_
    {a}v{b}`` and ``lcbench/iris_{a}v{b}`` (3 each), ``lcbench/{wine,iris,breast_cancer,digits}``.
    """
    names = []
    for a in range(10):
        for b in range(a + 1, 10):
            names += [f"lcbench/digits_{a}v{b}/full", f"lcbench/digits_{a}v{b}/n40"]
    names += [f"lcbench/digits_{k}vrest" for k in range(10)]
    for ds in ("wine", "iris"):
        names += [f"lcbench/{ds}_{a}v{b}" for a, b in ((0, 1), (0, 2), (1, 2))]
    names += [f"lcbench/{ds}" for ds in _FULL]
    return names


def _group(name: str) -> str:
    """Tasks of one group always land on the same side of the split (the two sizes of a pair)."""
    m = _PAIR.fullmatch(name)
    return f"lcbench/digits_{m.group(2)}v{m.group(3)}" if m and m.group(1) == "digits" else name


def _always_test(name: str) -> bool:
    return not name.startswith("lcbench/digits")


_TEST_DIGIT_PAIRS = 22  # 44 tasks
_TEST_DIGIT_OVR = 3


def lcbench_split(seed: int = 0, names: Sequence[str] | None = None) -> dict[str, str]:
    """``{task name: "train" | "test"}``, fixed by ``seed``.

    Test: every wine, iris and breast-cancer task (9), 22 of the 45 digit pairs (both sizes, 44)
    and 3 of the 10 digit one-vs-rest tasks: 56 test tasks, 54 train. ``names`` restricts the
    result to those tasks (the assignment of each task does not change).
    """
    rng = _rng(seed, (3,))
    pairs = [f"lcbench/digits_{a}v{b}" for a in range(10) for b in range(a + 1, 10)]
    ovr = [f"lcbench/digits_{k}vrest" for k in range(10)]
    test_groups = set(np.asarray(pairs)[rng.permutation(len(pairs))[:_TEST_DIGIT_PAIRS]].tolist())
    test_groups |= set(np.asarray(ovr)[rng.permutation(len(ovr))[:_TEST_DIGIT_OVR]].tolist())
    all_names = lcbench_task_names()
    out = {n: "test" if _always_test(n) or _group(n) in test_groups else "train" for n in all_names}
    return _restrict(out, names, "mini-LCBench")


def _restrict(split: dict[str, str], names: Sequence[str] | None, family: str) -> dict[str, str]:
    """``split`` limited to ``names`` (all when None); an unknown name is a KeyError."""
    if names is None:
        return split
    unknown = [n for n in names if n not in split]
    if unknown:
        raise KeyError(f"unknown {family} task(s): {unknown}")
    return {n: split[n] for n in names}


def lcbench_p_split(
    seed: int = 0, names: Sequence[str] | None = None, extra_test: int = 0
) -> dict[str, str]:
    """``{task name: "train" | "test"}`` of the perturbed variant: 56 of the 160 tasks held out
    by a seeded permutation. ``names`` restricts the result (assignments do not change).

    Tasks beyond the first 160 (in ``names``) are history tasks, except ``extra_test`` of them
    (a seeded permutation of those present), which are held out too."""
    all_names = lcbench_p_task_names()
    perm = _rng(seed, (4,)).permutation(len(all_names))
    test = {all_names[int(i)] for i in perm[:_LCBENCH_P_TEST]}
    out = {n: "test" if n in test else "train" for n in all_names}
    # tasks beyond the first LCBENCH_P_TASKS (``lcbench_tasks`` > 160) are extra history tasks:
    # the held-out 56 never change
    extra = sorted(n for n in set(names or ()) if n not in out and _P_NAME.fullmatch(n))
    if extra_test > len(extra):
        raise ValueError(
            f"extra_test={extra_test} but only {len(extra)} tasks beyond the first "
            f"{len(all_names)}: draw more with n_tasks"
        )
    held = {extra[int(i)] for i in _rng(seed, (5,)).permutation(len(extra))[:extra_test]}
    out.update({n: "test" if n in held else "train" for n in extra})
    return _restrict(out, names, "perturbed mini-LCBench")


def _stable_seed(*parts: Any) -> np.random.SeedSequence:
    return np.random.SeedSequence([zlib.crc32(str(p).encode()) for p in parts])


@dataclass
class _Data:
    X_train: np.ndarray
    y_train: np.ndarray
    X_val: np.ndarray
    y_val: np.ndarray
    n_classes: int
    info: dict


def lcbench_data(name: str, seed: int = 0) -> _Data:
    """Standardised train/validation arrays of one mini-LCBench task (deterministic per seed).

    Fixed 80/20 stratified split per task (its random state from ``seed`` and the dataset); the
    ``n40`` variant of a digit pair subsamples 40 stratified training points of the same split and
    keeps its validation set. One-vs-rest digit tasks subsample the rest class to the positive
    class's size. The StandardScaler is fit on the (final) training split. Labels are 0..K-1.
    """
    if name.startswith("lcbench-p/"):
        return _lcbench_p_data(name, seed)
    from sklearn import datasets
    from sklearn.model_selection import train_test_split
    from sklearn.preprocessing import StandardScaler

    def rs(*parts: Any) -> int:
        return int(_stable_seed(seed, *parts).generate_state(1)[0] % (2**31 - 1))

    m_pair, m_ovr = _PAIR.fullmatch(name), _OVR.fullmatch(name)
    size = "full"
    if m_pair:
        ds, a, b = m_pair.group(1), int(m_pair.group(2)), int(m_pair.group(3))
        if (ds == "digits") != (m_pair.group(4) is not None) or a >= b:
            raise KeyError(f"unknown mini-LCBench task {name!r}")
        size = m_pair.group(4) or "full"
        X, y = getattr(datasets, f"load_{ds}")(return_X_y=True)
        if b >= len(np.unique(y)):
            raise KeyError(f"unknown mini-LCBench task {name!r}")
        keep = (y == a) | (y == b)
        X, y = X[keep], (y[keep] == b).astype(np.int64)
        source, classes = ds, [a, b]
        split_key = f"{ds}_{a}v{b}"
    elif m_ovr:
        k = int(m_ovr.group(1))
        X, y = datasets.load_digits(return_X_y=True)
        pos, rest = np.flatnonzero(y == k), np.flatnonzero(y != k)
        rest = np.sort(np.random.default_rng(rs("ovr", k)).choice(rest, pos.size, replace=False))
        idx = np.sort(np.concatenate([pos, rest]))
        X, y = X[idx], (y[idx] == k).astype(np.int64)
        source, classes = "digits", [f"not {k}", k]
        split_key = f"digits_{k}vrest"
    elif name.startswith("lcbench/") and name[len("lcbench/") :] in _FULL:
        source = name[len("lcbench/") :]
        X, y = getattr(datasets, f"load_{source}")(return_X_y=True)
        y = y.astype(np.int64)
        classes = sorted(int(c) for c in np.unique(y))
        split_key = source
    else:
        raise KeyError(f"unknown mini-LCBench task {name!r}")

    X = X.astype(np.float64)
    X_tr, X_va, y_tr, y_va = train_test_split(
        X, y, test_size=0.2, stratify=y, random_state=rs("split", split_key)
    )
    if size == "n40":
        X_tr, _, y_tr, _ = train_test_split(
            X_tr, y_tr, train_size=_N40, stratify=y_tr, random_state=rs("n40", split_key)
        )
    scaler = StandardScaler().fit(X_tr)
    n_classes = int(len(np.unique(y)))
    info = {
        "dataset": source,
        "classes": classes,
        "n_classes": n_classes,
        "n_train": int(len(y_tr)),
        "n_val": int(len(y_va)),
        "n_features": int(X.shape[1]),
        "size": size,
    }
    return _Data(
        X_train=scaler.transform(X_tr),
        y_train=y_tr,
        X_val=scaler.transform(X_va),
        y_val=y_va,
        n_classes=n_classes,
        info=info,
    )


# --------------------------------------------------------------------------------------------
# perturbed mini-LCBench: harder, varied tasks from the same bundled datasets
# --------------------------------------------------------------------------------------------

LCBENCH_P_VERSION = "p1"
LCBENCH_P_TASKS = 160  # tasks of the perturbed variant
_LCBENCH_P_TEST = 56  # held out (by a seeded permutation)
LCBENCH_P_MAX_TASKS = 1000  # names have three digits
_P_NAME = re.compile(r"lcbench-p/(\d{3})")
_P_BASES = ("digits", "digits", "digits", "digits", "digits", "wine", "breast_cancer", "iris")
_P_N_MIN, _P_N_MAX = 24, 256  # log-uniform training-set size (capped by the dataset)
_P_NOISE_MAX = 0.4  # training labels flipped at a rate ~ U[0, 0.4]
_P_LOG10_SCALE = (-1.0, 1.0)  # standardised features multiplied by 10^U[-1, 1]


def lcbench_p_task_names(n_tasks: int = LCBENCH_P_TASKS) -> list[str]:
    """``lcbench-p/000`` ... : the perturbed variant's tasks (each one's data: :func:`lcbench_p_spec`)."""
    if not 1 <= n_tasks <= LCBENCH_P_MAX_TASKS:
        raise ValueError(
            f"perturbed mini-LCBench has 1..{LCBENCH_P_MAX_TASKS} tasks, not {n_tasks}"
        )
    return [f"lcbench-p/{i:03d}" for i in range(n_tasks)]


def lcbench_p_spec(name: str, seed: int = 0) -> dict:
    """The perturbation of one perturbed-variant task, drawn from ``(seed, index)``.

    ``base``: a bundled dataset (digits for 5 of every 8 indices, then wine, breast cancer,
    iris); for digits ``classes``: k ~ U{2..10} random digits. ``n_train``: log-uniform in
    [24, min(256, 75 % of the data)]; ``noise``: the fraction of training labels replaced by a
    uniformly drawn other class, U[0, 0.4]; ``scale``: the standardised features are multiplied
    by 10^U[-1, 1] (unstandardised inputs of unknown scale, which move the best learning rate).
    The validation set (25 %, stratified) keeps its true labels.
    """
    m = _P_NAME.fullmatch(name)
    if not m:
        raise KeyError(f"unknown perturbed mini-LCBench task {name!r}")
    i = int(m.group(1))
    rng = np.random.default_rng(_stable_seed(seed, "perturbed", i))
    base = _P_BASES[i % len(_P_BASES)]
    n_all = {"digits": 1797, "wine": 178, "breast_cancer": 569, "iris": 150}[base]
    classes = None
    if base == "digits":
        k = int(rng.integers(2, 11))
        classes = sorted(int(c) for c in rng.choice(10, size=k, replace=False))
        n_all = int(round(n_all * k / 10))
    n_hi = min(_P_N_MAX, int(0.75 * n_all))
    n_train = int(round(math.exp(rng.uniform(math.log(_P_N_MIN), math.log(n_hi)))))
    return {
        "base": base,
        "classes": classes,
        "n_train": n_train,
        "noise": round(float(rng.uniform(0.0, _P_NOISE_MAX)), 4),
        "scale": round(float(10 ** rng.uniform(*_P_LOG10_SCALE)), 4),
    }


def _lcbench_p_data(name: str, seed: int) -> _Data:
    from sklearn import datasets
    from sklearn.model_selection import train_test_split
    from sklearn.preprocessing import StandardScaler

    spec = lcbench_p_spec(name, seed)
    rng = np.random.default_rng(_stable_seed(seed, "perturbed-data", name))
    X, y = getattr(datasets, f"load_{spec['base']}")(return_X_y=True)
    if spec["classes"] is not None:
        keep = np.isin(y, spec["classes"])
        X, y = X[keep], np.searchsorted(spec["classes"], y[keep])
    X, y = X.astype(np.float64), y.astype(np.int64)
    K = int(len(np.unique(y)))
    X_tr, X_va, y_tr, y_va = train_test_split(
        X, y, test_size=0.25, stratify=y, random_state=int(rng.integers(2**31 - 1))
    )
    n = min(spec["n_train"], len(y_tr) - K)
    X_tr, _, y_tr, _ = train_test_split(
        X_tr, y_tr, train_size=n, stratify=y_tr, random_state=int(rng.integers(2**31 - 1))
    )
    flip = rng.random(len(y_tr)) < spec["noise"]
    other = (y_tr + rng.integers(1, K, size=len(y_tr))) % K  # a uniformly drawn other class
    y_noisy = np.where(flip, other, y_tr)
    scaler = StandardScaler().fit(X_tr)
    info = {
        "dataset": spec["base"],
        "classes": spec["classes"] or list(range(K)),
        "n_classes": K,
        "n_train": int(len(y_tr)),
        "n_val": int(len(y_va)),
        "n_features": int(X.shape[1]),
        "size": "perturbed",
        "noise": spec["noise"],
        "flipped": float(flip.mean()),
        "scale": spec["scale"],
    }
    return _Data(
        X_train=scaler.transform(X_tr) * spec["scale"],
        y_train=y_noisy,
        X_val=scaler.transform(X_va) * spec["scale"],
        y_val=y_va,
        n_classes=K,
        info=info,
    )


# --------------------------------------------------------------------------------------------
# mini-LCBench: training runs
# --------------------------------------------------------------------------------------------


def _config_seed(seed: int, index: int) -> int:
    """The MLP's random state for design ``index`` (same for every task)."""
    return int(_stable_seed(seed, "mlp", index).generate_state(1)[0] % (2**31 - 1))


_MLP_CLASS: type | None = None


def _mlp_class() -> type:
    """``MLPClassifier``, with the validation of repeated ``partial_fit`` inputs cached.

    sklearn re-validates X and re-binarises y on every ``partial_fit`` call; for the small
    arrays here that costs about as much as the training itself. The subclass validates an
    (X, y) pair once and reuses the result while the same two array objects are passed again,
    and ``predict_proba`` skips the input check; training and prediction are otherwise
    sklearn's own (tests check the curves equal those of a plain MLPClassifier).
    """
    global _MLP_CLASS
    if _MLP_CLASS is not None:
        return _MLP_CLASS
    from sklearn.neural_network import MLPClassifier

    if not callable(getattr(MLPClassifier, "_validate_input", None)):
        _MLP_CLASS = MLPClassifier
        return _MLP_CLASS

    class _CachedInputMLP(MLPClassifier):
        def _validate_input(self, X, y, incremental, reset):
            cache = self.__dict__.get("_auxbo_input")
            if incremental and not reset and cache is not None and cache[0] is X and cache[1] is y:
                return cache[2]
            out = super()._validate_input(X, y, incremental, reset)
            self.__dict__["_auxbo_input"] = (X, y, out)
            return out

        def predict_proba(self, X):
            # predict_proba without re-validating X (validated standardised float arrays here)
            try:
                p = self._forward_pass_fast(X, check_input=False)
            except TypeError:  # another sklearn signature: the public path
                return super().predict_proba(X)
            if self.n_outputs_ == 1:
                p = p.ravel()
            return np.vstack([1 - p, p]).T if p.ndim == 1 else p

    _MLP_CLASS = _CachedInputMLP
    return _MLP_CLASS


def train_curve(
    data: _Data | str,
    config: Mapping[str, Any],
    epochs: int = LCBENCH_EPOCHS,
    random_state: int = 0,
    seed: int = 0,
) -> np.ndarray:
    """Train one config for ``epochs`` epochs of ``partial_fit``; ``[epochs, 2]`` float32 of
    (validation accuracy, validation log-loss) after every epoch.

    ``data`` is a task name (loaded with ``seed``) or :func:`lcbench_data`'s result. The log-loss
    is clipped at ``LOSS_CAP``. A run that diverges (non-finite weights or probabilities, which
    happens at high learning rates) records chance accuracy 1/K and ``LOSS_CAP`` from that epoch
    on. Call it inside :func:`_quiet` (or accept sklearn's warnings).
    """
    if isinstance(data, str):
        data = lcbench_data(data, seed)
    K = data.n_classes
    classes = np.arange(K)
    clf = _mlp_class()(
        hidden_layer_sizes=(int(config["width"]),),
        solver="sgd",
        learning_rate_init=float(config["learning_rate_init"]),
        alpha=float(config["alpha"]),
        batch_size=int(config["batch_size"]),
        momentum=float(config["momentum"]),
        random_state=int(random_state),
        shuffle=True,
    )
    out = np.empty((epochs, 2), dtype=np.float32)
    rows = np.arange(len(data.y_val))
    for e in range(epochs):
        try:
            if e == 0:
                clf.partial_fit(data.X_train, data.y_train, classes=classes)
            else:
                clf.partial_fit(data.X_train, data.y_train)
            proba = clf.predict_proba(data.X_val)
        except (ValueError, FloatingPointError, OverflowError):
            proba = None
        if proba is None or not np.all(np.isfinite(proba)):
            out[e:, 0] = 1.0 / K
            out[e:, 1] = LOSS_CAP
            break
        acc = float(np.mean(np.argmax(proba, axis=1) == data.y_val))
        p_true = np.clip(proba[rows, data.y_val], np.finfo(np.float64).eps, 1.0)
        loss = float(-np.mean(np.log(p_true)))
        out[e, 0] = acc
        out[e, 1] = min(loss, LOSS_CAP) if math.isfinite(loss) else LOSS_CAP
    return out


class _quiet:
    """One thread for BLAS/OpenMP and no sklearn convergence/batch-size or overflow warnings.

    Also, while active, sklearn's MLP indexes its minibatches of a NumPy array with plain
    ``X[idx]`` (what ``_safe_indexing`` ends up doing for an ndarray) instead of going through
    ``_safe_indexing``'s dataframe detection, which costs more than the training step itself at
    these sizes. Anything but an ndarray indexed by an integer array takes the original path.
    """

    def __enter__(self) -> _quiet:
        from sklearn.exceptions import ConvergenceWarning
        from threadpoolctl import threadpool_limits

        self._limits = threadpool_limits(limits=1)
        self._warn = warnings.catch_warnings()
        self._warn.__enter__()
        warnings.simplefilter("ignore", ConvergenceWarning)
        warnings.filterwarnings("ignore", message=".*batch_size.*", category=UserWarning)
        warnings.filterwarnings("ignore", category=RuntimeWarning)
        self._np = np.seterr(all="ignore")
        import sklearn

        # inputs are finite standardised arrays and the parameters come from the checked space
        self._skl = sklearn.config_context(assume_finite=True, skip_parameter_validation=True)
        self._skl.__enter__()
        from sklearn.neural_network import _multilayer_perceptron as mlp_module

        self._mlp_module = mlp_module
        self._orig_indexing = orig = getattr(mlp_module, "_safe_indexing", None)
        if orig is not None:

            def fast_indexing(X, indices, *args, **kwargs):
                if (
                    not args
                    and kwargs.get("axis", 0) == 0
                    and type(X) is np.ndarray
                    and type(indices) is np.ndarray
                    and indices.dtype.kind in "iu"
                ):
                    return X[indices, ...]
                return orig(X, indices, *args, **kwargs)

            mlp_module._safe_indexing = fast_indexing
        return self

    def __exit__(self, *exc: Any) -> None:
        if self._orig_indexing is not None:
            self._mlp_module._safe_indexing = self._orig_indexing
        self._skl.__exit__(*exc)
        np.seterr(**self._np)
        self._warn.__exit__(*exc)
        self._limits.unregister()


def compute_lcbench_task(
    name: str,
    configs: Sequence[Mapping[str, Any]],
    epochs: int = LCBENCH_EPOCHS,
    seed: int = 0,
) -> dict[str, Any]:
    """The per-dataset worker (plain Python; :func:`lcbench_family` runs it as a Ray task).

    Returns ``{"name", "h": [n, epochs, 2] float32, "f": [n] float32, "info": dict}`` with
    f = the final validation accuracy.
    """
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    t0 = time.perf_counter()
    with _quiet():
        data = lcbench_data(name, seed)
        h = np.stack(
            [
                train_curve(data, cfg, epochs=epochs, random_state=_config_seed(seed, i))
                for i, cfg in enumerate(configs)
            ]
        ).reshape(len(configs), epochs, 2)
    info = dict(data.info, seconds=round(time.perf_counter() - t0, 3))
    return {"name": name, "h": h, "f": h[:, -1, 0].copy(), "info": info}


def _make_lcbench_task(result: Mapping[str, Any], X: np.ndarray, configs: list[dict]) -> Task:
    return Task(
        name=result["name"],
        family="lcbench",
        X=X.copy(),
        f=np.asarray(result["f"], dtype=np.float32),
        h=np.asarray(result["h"], dtype=np.float32),
        h_names=LCBENCH_H_NAMES,
        configs=[dict(c) for c in configs],
        info=dict(result["info"]),
    )


def lcbench_task(
    name: str, n_configs: int = 100, seed: int = 0, epochs: int = LCBENCH_EPOCHS
) -> Task:
    """Compute one mini-LCBench task in this process (no Ray, no cache)."""
    X, configs = lcbench_configs(n_configs, seed)
    return _make_lcbench_task(compute_lcbench_task(name, configs, epochs, seed), X, configs)


def _cost(name: str) -> int:
    """Rough relative cost (training-set size) for scheduling the largest tasks first."""
    if name.startswith("lcbench-p/"):
        return lcbench_p_spec(name)["n_train"]
    if name == "lcbench/digits":
        return 1440
    if name == "lcbench/breast_cancer":
        return 455
    if name.endswith("/n40"):
        return 40
    return 290 if name.startswith("lcbench/digits") else 110


class _Progress:
    def __init__(self, enabled: bool, total: int, what: str) -> None:
        self.enabled, self.total, self.what = enabled, total, what
        self.done, self.t0 = 0, time.perf_counter()

    def update(self, label: str) -> None:
        self.done += 1
        if self.enabled:
            dt = time.perf_counter() - self.t0
            print(
                f"\r[auxbo] {self.what}: {self.done}/{self.total} tasks, {dt:.0f} s ({label})"
                + " " * 10,
                end="" if self.done < self.total else "\n",
                file=sys.stderr,
                flush=True,
            )


def _part_path(parts: Path, name: str) -> Path:
    return parts / (name.replace("/", "__") + ".parquet")


def _load_parts(parts: Path, names: Sequence[str], n_configs: int, epochs: int) -> dict[str, Task]:
    """Finished tasks of an interrupted computation (unreadable or mismatched parts are skipped)."""
    done: dict[str, Task] = {}
    if not parts.is_dir():
        return done
    for n in names:
        p = _part_path(parts, n)
        if not p.exists():
            continue
        try:
            tr, te = read_tasks(p)
        except Exception:  # a damaged part is computed again
            continue
        for t in tr + te:
            if t.name == n and t.h.shape == (n_configs, epochs, len(LCBENCH_H_NAMES)):
                done[n] = t
    return done


def _compute_all(
    names: Sequence[str],
    X: np.ndarray,
    configs: list[dict],
    epochs: int,
    seed: int,
    parallel: bool,
    progress: bool,
    parts: Path | None = None,
) -> dict[str, Task]:
    """Compute the tasks ``names`` (largest first); each finished task is also written to
    ``parts`` so an interrupted computation resumes where it stopped."""
    order = sorted(names, key=lambda n: -_cost(n))
    bar = _Progress(progress, len(order), f"mini-LCBench ({len(configs)} configs)")
    results: dict[str, Task] = {}

    def finish(res: Mapping[str, Any]) -> None:
        task = _make_lcbench_task(res, X, configs)
        if parts is not None:
            write_tasks(_part_path(parts, task.name), [task], [])
        results[task.name] = task
        bar.update(task.name)

    if not order:
        return results
    if not parallel:
        for n in order:
            finish(compute_lcbench_task(n, configs, epochs, seed))
        return results

    import ray

    from nshot.train.runner import ensure_ray

    started = False
    if not ray.is_initialized():  # RAY_ADDRESS, else an embedded Ray on loopback, stopped below
        ensure_ray()
        started = True
    try:
        worker = ray.remote(num_cpus=1)(compute_lcbench_task)
        cfg_ref = ray.put([dict(c) for c in configs])
        pending = [worker.remote(n, cfg_ref, epochs, seed) for n in order]
        try:
            while pending:
                ready, pending = ray.wait(pending, num_returns=1)
                finish(ray.get(ready[0]))
        finally:
            for ref in pending:
                ray.cancel(ref, force=True)
    finally:
        if started:
            ray.shutdown()
    return results


# --------------------------------------------------------------------------------------------
# mini-LCBench family
# --------------------------------------------------------------------------------------------


def _default_cache_dir() -> Path:
    from nshot.data import cache_dir

    return cache_dir() / "auxbo"


def lcbench_family(
    n_configs: int = 100,
    seed: int = 0,
    cache_dir: Path | None = None,
    progress: bool = True,
    *,
    epochs: int = LCBENCH_EPOCHS,
    names: Sequence[str] | None = None,
    parallel: bool = True,
    variant: str = "clean",
    n_tasks: int | None = None,
    extra_test: int = 0,
) -> tuple[list[Task], list[Task]]:
    """``(train_tasks, test_tasks)`` of mini-LCBench (an offline substitute for LCBench, enlarged).

    ``variant="perturbed"``: the 160 tasks of :func:`lcbench_p_task_names` (harder, varied
    tasks drawn by :func:`lcbench_p_spec`: class subsets, training-set sizes, label noise, feature
    scales) over the wider space :func:`lcbench_space` ``("perturbed")``, split 104 / 56 by
    :func:`lcbench_p_split`; cached as ``mini-lcbench-perturbed-n…-{LCBENCH_P_VERSION}…``.
    ``n_tasks`` (perturbed only, ≥ 160) draws more tasks the same way: the extra ones are all
    history tasks (the 56 held-out tasks stay the same) except ``extra_test`` of them, which are
    held out too (:func:`lcbench_p_split`); cached with a ``-t{n_tasks}`` suffix (the cache
    holds the runs; the split is applied when reading).
    ``variant="clean"`` (the default here) is the original family described below.

    110 tasks (see :func:`lcbench_task_names`; ``names`` restricts to a subset), split by
    :func:`lcbench_split` into 54 train and 56 test tasks. All tasks share the ``n_configs``
    designs of :func:`lcbench_configs`. The first call computes every task (one Ray task per
    dataset, ``num_cpus=1``; ``parallel=False`` runs them in this process) and writes
    ``<cache_dir>/mini-lcbench-n{n_configs}-e{epochs}-s{seed}-{version}[-{names hash}].parquet``;
    later calls read that file. Finished tasks are kept in ``<file stem>.parts/`` until the file
    is written, so an interrupted computation resumes. An unreadable cache file is warned about and
    rebuilt.
    """
    if variant not in LCBENCH_VARIANTS:
        raise ValueError(f"unknown mini-LCBench variant {variant!r}: use one of {LCBENCH_VARIANTS}")
    perturbed = variant == "perturbed"
    if extra_test and not perturbed:
        raise ValueError("extra_test is for the perturbed variant")
    if perturbed:
        splitter = lambda seed, names: lcbench_p_split(seed, names, extra_test)  # noqa: E731
    else:
        splitter = lcbench_split
    space = lcbench_space(variant)
    if n_tasks is not None and (not perturbed or names is not None):
        raise ValueError("n_tasks is for the perturbed variant without names")
    if n_tasks is not None and not LCBENCH_P_TASKS <= n_tasks <= LCBENCH_P_MAX_TASKS:
        raise ValueError(
            f"n_tasks must be in [{LCBENCH_P_TASKS}, {LCBENCH_P_MAX_TASKS}] (got {n_tasks})"
        )
    if names is None:
        n_p = n_tasks or LCBENCH_P_TASKS
        names = lcbench_p_task_names(n_p) if perturbed else lcbench_task_names()
        suffix = f"-t{n_p}" if perturbed and n_p != LCBENCH_P_TASKS else ""
    else:
        names = list(dict.fromkeys(names))
        splitter(seed, names)  # validates
        suffix = "-" + hashlib.sha256("\n".join(sorted(names)).encode()).hexdigest()[:10]
    cache_dir = Path(cache_dir) if cache_dir is not None else _default_cache_dir()
    stem = "mini-lcbench-perturbed" if perturbed else "mini-lcbench"
    version = LCBENCH_P_VERSION if perturbed else LCBENCH_VERSION
    path = cache_dir / (
        f"{stem}-n{int(n_configs)}-e{int(epochs)}-s{int(seed)}-{version}{suffix}.parquet"
    )
    if path.exists():
        try:
            train, test = read_tasks(path)
            if sorted(t.name for t in train + test) == sorted(names):
                split = splitter(seed, names)
                by_name = {t.name: t for t in train + test}
                return (
                    [by_name[n] for n in names if split[n] == "train"],
                    [by_name[n] for n in names if split[n] == "test"],
                )
            warnings.warn(f"{path}: cached tasks do not match; recomputing", stacklevel=2)
        except Exception as err:  # corrupted or foreign file: rebuild
            warnings.warn(f"{path}: unreadable cache ({err}); recomputing", stacklevel=2)

    X, configs = lcbench_configs(n_configs, seed, space)
    parts = path.with_name(path.stem + ".parts")
    parts.mkdir(parents=True, exist_ok=True)
    results = _load_parts(parts, names, n_configs, epochs)
    if results and progress:
        print(f"[auxbo] resuming: {len(results)} tasks already computed", file=sys.stderr)
    todo = [n for n in names if n not in results]
    results.update(_compute_all(todo, X, configs, epochs, seed, parallel, progress, parts))
    split = splitter(seed, names)
    train = [results[n] for n in names if split[n] == "train"]
    test = [results[n] for n in names if split[n] == "test"]
    params = {
        "family": "lcbench",
        "variant": variant,
        "n_configs": int(n_configs),
        "epochs": int(epochs),
        "seed": int(seed),
        "version": version,
        "space": space,
    }
    write_tasks(path, train, test, metadata=params)
    shutil.rmtree(parts, ignore_errors=True)
    return train, test
