"""TAIL as an nshot Method."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

from nshot.method import Method, ResultsTable, register
from nshot.train.checkpoint import LoadedCheckpoint
from nshot.train.limits import ModelBudget, meta_counts, transformer_activation_bytes

from .claims import CLAIMS
from .config import TailConfig
from .evaluation import default_settings, evaluate_systems, tail_system
from .serve import TailPredictor
from .train import train_loop

ABLATIONS = {
    "no_projection": {"projection": "none"},
    "fixed_label_slots": {"label_mode": "fixed_slots"},
}


@register
class TailMethod(Method):
    name = "tail"
    paper = "TAIL: universal algorithm-implicit meta-learner"
    area = "few-shot classification"
    version = "1"
    Config = TailConfig
    claims = CLAIMS

    def data(self, cfg: TailConfig) -> dict[str, pa.Table]:
        """The real evaluation data as Arrow tables (training episodes are generated per step)."""
        from nshot.data import digits_table, load_features_parquet, mnist_table

        from .evaluation import text_available

        tables = {"digits": digits_table(), "mnist": mnist_table()}
        if text_available():
            from nshot.data import text_table

            tables["text"] = text_table()
        if cfg.features_path:
            tables["features"] = load_features_parquet(cfg.features_path)
        return tables

    def train_loop(self, cfg: TailConfig) -> None:
        train_loop(cfg)

    def predictor(self, checkpoint: LoadedCheckpoint) -> TailPredictor:
        return TailPredictor.from_checkpoint(checkpoint)

    def model_budget(self, cfg: TailConfig, extra: dict[str, Any] | None = None) -> ModelBudget:
        """Υ's size (built on the meta device) and one episode's activations at the request
        caps: ``MAX_SUPPORT`` support rows and ``MAX_QUERIES`` queries in one sequence; the checkpoint holds Υ's whole state dict."""
        from . import serve
        from .model import TailModel

        params, state = meta_counts(lambda: TailModel(cfg))
        seq = serve.MAX_SUPPORT + serve.MAX_QUERIES
        act = transformer_activation_bytes(seq, cfg.width, cfg.heads, cfg.mlp_dim)
        return ModelBudget(params=params, activation_bytes=act, weights_numel=state)

    def evaluate(self, checkpoint: LoadedCheckpoint, cfg: TailConfig) -> dict[str, float]:
        settings = default_settings()
        if cfg.features_path:
            from .evaluation import Setting

            settings.append(Setting("acc_features_5w5s", cfg.features_path, 5, 5))
        res = evaluate_systems(
            {"tail": tail_system(TailPredictor.from_checkpoint(checkpoint))},
            settings,
            episodes=cfg.eval_episodes,
            draws=cfg.eval_draws,
        )["tail"]
        out: dict[str, float] = {}
        for metric, val in res.items():
            if val is not None:
                out[metric] = val[0]
                out[f"{metric}_ci95"] = val[1]
        return out

    def experiments(self, cfg: TailConfig, workdir: Path) -> ResultsTable:
        """TAIL against ProtoHead, LinearProbe and the two ablations on the same episodes."""
        import ray

        from nshot.train import ensure_ray

        t0 = time.time()
        ensure_ray()
        variants = {"tail": {}, **ABLATIONS}
        seeds = [cfg.seed + i for i in range(cfg.experiment_seeds)]
        train = ray.remote(num_cpus=1)(_train_variant)
        refs = {
            (name, s): train.remote(
                cfg.replace(seed=s, **over), str(workdir / "runs"), f"{name}-seed{s}"
            )
            for name, over in variants.items()
            for s in seeds
        }
        ckpts = dict(zip(refs, ray.get(list(refs.values()))))
        settings = default_settings()
        per_seed: dict[str, dict[str, list[float | None]]] = {}
        ci: dict[str, dict[str, list[float]]] = {}
        draws = max(cfg.eval_draws, 4)
        for s in seeds:
            systems: dict[str, Any] = {"protohead": None, "linear_probe": None}
            for name in variants:
                from nshot.train import load_checkpoint

                systems[name] = tail_system(
                    TailPredictor.from_checkpoint(load_checkpoint(ckpts[(name, s)]))
                )
            res = evaluate_systems(
                systems, settings, episodes=cfg.eval_episodes, seed=12345 + s, draws=draws
            )
            for system, metrics in res.items():
                for metric, val in metrics.items():
                    per_seed.setdefault(system, {}).setdefault(metric, []).append(
                        None if val is None else val[0]
                    )
                    if val is not None:
                        ci.setdefault(system, {}).setdefault(metric, []).append(val[1])
        order = ["tail", "protohead", "linear_probe", "no_projection", "fixed_label_slots"]
        rows: dict[str, dict[str, float | None]] = {}
        stds: dict[str, dict[str, float | None]] = {}
        for system in order:
            rows[system], stds[system] = {}, {}
            for metric, vals in per_seed[system].items():
                if any(v is None for v in vals):
                    rows[system][metric] = stds[system][metric] = None
                    continue
                arr = np.asarray(vals, dtype=float)
                rows[system][metric] = float(arr.mean())
                stds[system][metric] = (
                    float(arr.std(ddof=1)) if len(arr) > 1 else float(ci[system][metric][0] / 1.96)
                )
        table = ResultsTable(
            method=self.name,
            preset=cfg.preset,
            seeds=len(seeds),
            metrics={s.metric: True for s in settings},
            rows=rows,
            stds=stds,
            runtime_s=time.time() - t0,
            notes=_notes(rows, settings, cfg, len(seeds), draws),
            extra={
                "settings": {s.metric: s.description for s in settings},
                "checkpoints": {f"{k[0]}-seed{k[1]}": str(v) for k, v in ckpts.items()},
            },
        )
        return table


def _train_variant(cfg: TailConfig, storage: str, name: str) -> str:
    """One training run (Ray Train local mode inside a Ray task); returns the checkpoint path."""
    from nshot.train import Scaling, fit

    res = fit("tail", cfg, scaling=Scaling(workers=0), storage=storage, name=name, overwrite=True)
    return str(res.checkpoint)


def _notes(rows: dict, settings: list, cfg: TailConfig, seeds: int, draws: int) -> list[str]:
    notes = [
        f"{cfg.eval_episodes} episodes per setting and seed, 5 queries per class; TAIL variants "
        f"average {draws} (π, ρ) draws. Every system sees the same episodes.",
        "± is the standard deviation over training seeds"
        if seeds > 1
        else "± is the standard deviation of the mean over episodes (one training seed)",
        "fixed_label_slots has max_ways label slots and cannot classify 20 classes: n/a.",
    ]

    def fmt(system: str, metric: str) -> str:
        v = rows[system].get(metric)
        return "n/a" if v is None else f"{v:.3f}"

    m = "acc_unseen_modality_5w5s"
    if m in rows["tail"]:
        notes.append(
            f"unseen modality 5w5s: tail {fmt('tail', m)} vs no_projection "
            f"{fmt('no_projection', m)}, fixed_label_slots {fmt('fixed_label_slots', m)}, "
            f"protohead {fmt('protohead', m)}"
        )
    t20 = rows["tail"].get("acc_20way")
    if t20 is not None:
        notes.append(f"20-way 5-shot: tail {t20:.3f} = {t20 * 20:.1f}x chance")
    for s in settings:
        if s.description:
            notes.append(f"{s.metric}: {s.description}")
    return notes
