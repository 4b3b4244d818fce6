"""TAIL's own benchmark (``nshot bench tail``): inline queries against one sequence per query.

TAIL reads an episode's queries inline: one sequence holds the support and every query, and the
attention mask keeps the queries from seeing each other. The CAML-style alternative runs one
sequence ``[support ; query_j]`` per query. Both give the same logits; this benchmark times the
two forward passes of the same randomly initialised weights at ``ways``-way ``shots``-shot with
``queries`` queries, on one torch thread, and reports the speed-up and the largest logit
difference.
"""

from __future__ import annotations

import time
from typing import Any

import numpy as np
import torch

from .config import TailConfig
from .episodes import make_batch, modality_a
from .model import TailModel


def inference(
    *,
    preset: str = "small",
    ways: int = 100,
    shots: int = 5,
    queries: int = 100,
    reps: int = 5,
) -> dict[str, Any]:
    """TAIL forward time at ``ways``-way ``shots``-shot with ``queries`` queries: inline query
    processing (one sequence) against one sequence per query, same weights, one torch thread;
    medians over ``reps`` after a warm-up."""
    torch.set_num_threads(1)
    cfg = TailConfig.from_preset(preset, dictionary_size=max(ways, 100), max_ways=5)
    torch.manual_seed(0)
    model = TailModel(cfg).eval()
    per_class = max(1, queries // ways)
    batch = make_batch(
        modality_a(), cfg, batch=1, K=ways, shots=shots, queries=per_class,
        rng=np.random.default_rng(0),
    )  # fmt: skip
    args = (batch["support_x"], batch["support_slot"], batch["query_x"], batch["active_slots"])

    def timed(fn) -> tuple[float, torch.Tensor]:
        with torch.no_grad():
            out = fn(*args)  # warm-up
            times = []
            for _ in range(reps):
                t = time.perf_counter()
                out = fn(*args)
                times.append(time.perf_counter() - t)
        return float(np.median(times)), out

    t_inline, a = timed(model)
    t_per_query, b = timed(lambda *x: model.forward_per_query(*x, query_chunk=25))
    return {
        "benchmark": "tail_inference",
        "preset": preset,
        "ways": ways,
        "shots": shots,
        "queries": int(batch["query_x"].shape[1]),
        "inline_s": t_inline,
        "per_query_s": t_per_query,
        "speedup_inline": t_per_query / t_inline,
        "max_abs_logit_diff": float((a - b).abs().max()),
        "target_speedup": 10.0,
    }


#: the figures ``nshot bench tail`` compares with the previous run's file
COMPARED = ("inline_s", "per_query_s", "speedup_inline")
