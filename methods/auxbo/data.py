"""auxbo's task families as the method loads them: by name and preset (:func:`family`), from a
config (:func:`load_family`: synthetic, mini-LCBench, or the history of earlier sweeps)."""

from __future__ import annotations

from typing import Any

import numpy as np

from nshot.errors import NshotError

from .config import AuxBOConfig
from .lcbench import lcbench_family, lcbench_tune_space
from .synthetic import synthetic_family
from .taskstore import Task

_PRESETS: dict[str, dict[str, dict[str, Any]]] = {
    "synthetic": {
        "paper": {"n_train": 500, "n_test": 100, "n_candidates": 300},
        "small": {"n_train": 500, "n_test": 100, "n_candidates": 300},
        "smoke": {"n_train": 16, "n_test": 4, "n_candidates": 64},
    },
    "lcbench": {
        "paper": {"n_configs": 200, "variant": "perturbed"},
        "small": {"n_configs": 64, "variant": "perturbed"},
        "smoke": {"n_configs": 8, "epochs": 3},
    },
}


def family(name: str, preset: str = "small", **overrides: Any) -> tuple[list[Task], list[Task]]:
    """``(train, test)`` of the family ``name`` ("synthetic" | "lcbench" | "mini-lcbench") at the
    sizes of ``preset`` ("paper" | "small" | "smoke"); keyword ``overrides`` win."""
    key = {"mini-lcbench": "lcbench"}.get(name, name)
    if key not in _PRESETS:
        raise ValueError(f"unknown task family {name!r}: use 'synthetic' or 'lcbench'")
    if preset not in _PRESETS[key]:
        raise ValueError(f"unknown preset {preset!r}: use one of {sorted(_PRESETS[key])}")
    kwargs = {**_PRESETS[key][preset], **overrides}
    return synthetic_family(**kwargs) if key == "synthetic" else lcbench_family(**kwargs)


def history_family(cfg: AuxBOConfig) -> tuple[list[Task], list[Task], dict[str, Any]]:
    """Tasks from the sweep history of ``cfg.history_method`` (the most recent search space)."""
    from nshot.tune.history import load_tasks

    tasks = load_tasks(cfg.history_dir, method=cfg.history_method)
    if not tasks:
        raise NshotError(
            f"family=history: no sweeps of {cfg.history_method!r} in the history; run "
            f"`nshot tune {cfg.history_method} ...` first"
        )
    space_hash = tasks[-1].space_hash
    same = [t for t in tasks if t.space_hash == space_hash]
    widths = set()
    out = []
    for t in same:
        h, mask = t.h_padded()
        h = np.where(mask[..., None], h, np.nan).astype(np.float32)  # NaN frames = padding
        widths.add(h.shape[-1])
        out.append(
            Task(
                name=f"history/{t.task_id}",
                family="history",
                X=t.X.astype(np.float32),
                f=t.y.astype(np.float32),
                h=h,
                h_names=tuple(f"h{i}" for i in range(h.shape[-1])),
                configs=t.configs,
            )
        )
    if len(widths) > 1:
        raise NshotError(f"family=history: sweeps of one space report h of widths {widths}")
    T = max(t.h.shape[1] for t in out)
    for t in out:  # one h length for the family
        if t.h.shape[1] < T:
            pad = np.full((t.h.shape[0], T - t.h.shape[1], t.h.shape[2]), np.nan, np.float32)
            t.h = np.concatenate([t.h, pad], axis=1)
    n_test = len(out) // 5
    train, test = out[: len(out) - n_test], out[len(out) - n_test :] or out[-1:]
    info = {"space": same[-1].space, "space_hash": space_hash, "method": cfg.history_method}
    return train, test, info


def load_family(
    cfg: AuxBOConfig, family: str | None = None
) -> tuple[list[Task], list[Task], dict[str, Any]]:
    """``(history tasks, held-out tasks, info)`` of ``family`` (default ``cfg.family``)."""
    family = family or cfg.family
    if family == "synthetic":
        train, test = synthetic_family(
            n_train=cfg.n_train_tasks,
            n_test=cfg.n_test_tasks,
            n_candidates=cfg.n_candidates,
            seed=cfg.seed,
            version=cfg.synthetic_version,
        )
        return train, test, {"space": None, "space_hash": None}
    if family == "lcbench":
        train, test = lcbench_family(
            n_configs=cfg.lcbench_configs,
            seed=cfg.seed,
            variant=cfg.lcbench_variant,
            n_tasks=cfg.lcbench_tasks if cfg.lcbench_variant == "perturbed" else None,
            extra_test=cfg.lcbench_extra_test if cfg.lcbench_variant == "perturbed" else 0,
        )
        if cfg.lcbench_objective == "neg_log_loss":
            k = list(train[0].h_names).index("val_loss")
            for t in (*train, *test):
                t.f = (-t.h[:, -1, k]).astype(np.float32)
        space = lcbench_tune_space(cfg.lcbench_variant)
        return train, test, {"space": space, "space_hash": None}
    if family == "history":
        return history_family(cfg)
    raise NshotError(f"unknown task family {family!r}")
