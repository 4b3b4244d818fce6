"""`nshot reproduce skeleton`: the trained embedding against raw-feature prototypes.

Every training seed is one job of the platform's experiment runner (:mod:`nshot.experiment`: a
Ray task, or in this process with ``--in-process``): it trains the model (``train.fit``) and
evaluates every system on the same held-out episodes. Rows are means over seeds, ± the standard
deviation over seeds, and ``samples`` keeps the per-seed values (paired by seed across systems)
for the claims' paired tests (``claims.py``).

* ``protonet``: the trained embedding (the method);
* ``raw_prototypes``: the nearest class mean on the raw features (the baseline);
* ``untrained``: the embedding at its initial weights (ablation: what training adds);
* ``permuted_labels``: ``protonet`` scored against permuted query labels (negative control:
  at chance, or the evaluation leaks labels).
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from nshot.experiment import Job, aggregate, run_jobs
from nshot.method import ResultsTable

from .config import SkeletonConfig
from .data import examples
from .model import build_model, episode_accuracies
from .train import fit

SYSTEMS = ("protonet", "raw_prototypes", "untrained", "permuted_labels")
EVAL_SEED = 12345  # the test episodes' stream, the same for every system and training seed


def run_seed(config: dict[str, Any], seed: int) -> dict[str, float]:
    """One job: train with ``seed``, then each system's accuracy on the same episodes."""
    cfg = SkeletonConfig.validated({**config, "seed": seed})
    test = examples(cfg, "test")
    trained, untrained = fit(cfg), build_model(cfg).eval()
    episodes = EVAL_SEED + seed
    runs = {
        "protonet": episode_accuracies(trained, cfg, *test, episodes),
        "raw_prototypes": episode_accuracies(None, cfg, *test, episodes),
        "untrained": episode_accuracies(untrained, cfg, *test, episodes),
        "permuted_labels": episode_accuracies(trained, cfg, *test, episodes, permute=True),
    }
    return {system: sum(accs) / len(accs) for system, accs in runs.items()}


def run_experiments(cfg: SkeletonConfig, workdir: Path) -> ResultsTable:
    t0 = time.time()
    seeds = [cfg.seed + i for i in range(cfg.experiment_seeds)]
    jobs = [Job((s,), run_seed, (cfg.model_dump(), s), trains=True) for s in seeds]
    description = f"skeleton {cfg.preset}: {len(jobs)} training seeds"
    done = run_jobs(jobs, description=description)
    per_job = {(system, s): {"acc": done[(s,)][system]} for system in SYSTEMS for s in seeds}
    rows, stds, samples = aggregate(per_job)
    return ResultsTable(
        method="skeleton",
        preset=cfg.preset,
        seeds=len(seeds),
        metrics={"acc": True},
        rows=rows,
        stds=stds,
        samples=samples,
        runtime_s=time.time() - t0,
        notes=[
            f"{cfg.ways}-way {cfg.shots}-shot accuracy on {cfg.eval_episodes} episodes of "
            f"held-out classes, mean ± std over {len(seeds)} training seeds"
        ],
        extra={"chance": 1.0 / cfg.ways},
    )
