"""auxbo as an nshot Method: meta-training under Ray Train, evaluation, serving, experiments."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

from nshot.method import Method, ResultsTable, register
from nshot.train.checkpoint import LoadedCheckpoint
from nshot.train.limits import (
    ModelBudget,
    bounded_ints,
    meta_counts,
    transformer_activation_bytes,
)

from .claims import CLAIMS
from .config import AuxBOConfig
from .data import load_family
from .model import TNP, TNPConfig, evaluate_prediction, load_model
from .train import train_loop

# --------------------------------------------------------------------------- the Method


#: what the TNP sizes recorded in an auxbo checkpoint may be (every preset is far inside)
TNP_BOUNDS = {
    "x_dim": (1, 4096), "h_len": (1, 100_000), "h_dim": (1, 4096), "d": (4, 4096),
    "heads": (1, 64), "layers_h": (0, 32), "layers": (1, 64), "mlp_ratio": (1, 16),
}  # fmt: skip


@register
class AuxBOMethod(Method):
    name = "auxbo"
    paper = "Few-shot Bayesian optimisation with auxiliary information (ICML 2026)"
    area = "few-shot Bayesian optimisation / hyperparameter tuning"
    version = "1"
    Config = AuxBOConfig
    claims = CLAIMS

    def data(self, cfg: AuxBOConfig) -> dict[str, pa.Table]:
        from .taskstore import tasks_to_table

        train, test, _ = load_family(cfg)
        return {"train": tasks_to_table({"train": train}), "test": tasks_to_table({"test": test})}

    def train_loop(self, cfg: AuxBOConfig) -> None:
        train_loop(cfg)

    def evaluate(self, checkpoint: LoadedCheckpoint, cfg: AuxBOConfig) -> dict[str, float]:
        from .bo import RandomProposer, TNPProposer, run_bo, simple_regret

        model, stats = load_model(checkpoint)
        family = checkpoint.extra.get("family", cfg.family)
        _, test, _ = load_family(cfg, family)
        test = test[: cfg.eval_tasks]
        smallest = min(len(t.f) for t in test)
        sizes = tuple(n for n in (1, 2, 5, 10, 20) if n < smallest - 1)
        m = min(cfg.m_targets, smallest - max(sizes))
        out: dict[str, float] = {}
        pred = evaluate_prediction(
            model, test, n_ctx_list=sizes, m_targets=m, stats=stats, seed=cfg.seed
        )
        for n, r in pred.items():
            out[f"nll_ctx{n}"] = r["nll"]
            out[f"mse_ctx{n}"] = r["mse"]
        budget = min(cfg.budget, smallest)
        for name, prop in (
            ("auxbo", TNPProposer(model, stats, xi=cfg.xi)),
            ("random", RandomProposer()),
        ):
            regrets = np.stack(
                [
                    simple_regret(t, run_bo(t, prop, budget, cfg.n_init, seed=cfg.seed + i))
                    for i, t in enumerate(test)
                ]
            )
            for k in sorted({min(5, budget), min(10, budget), budget}):
                out[f"{name}_regret_at_{k}"] = float(regrets[:, k - 1].mean())
        return out

    def predictor(self, checkpoint: LoadedCheckpoint):
        from .serve import AuxBOPredictor

        return AuxBOPredictor(checkpoint)

    def model_budget(
        self, cfg: AuxBOConfig, extra: dict[str, Any] | None = None
    ) -> ModelBudget | None:
        """The TNP of the recorded ``extra["tnp"]`` sizes, counted on the meta device (its
        input widths come from the data, so a config alone gives ``None``); activations: one
        forward pass of the predictor at the Request caps (the whole context and one chunk of
        candidates in one sequence), and every context point's h sequence through the
        h-encoder."""
        from . import serve

        tnp = (extra or {}).get("tnp")
        if tnp is None:
            return None
        bounded_ints(tnp, TNP_BOUNDS, "extra.tnp", required=False)
        tcfg = TNPConfig.from_dict(tnp)
        params, state = meta_counts(lambda: TNP(tcfg))
        n, m = serve.MAX_CONTEXT, serve.CANDIDATE_CHUNK  # one forward pass at the caps
        mlp = tcfg.mlp_ratio * tcfg.d
        act = transformer_activation_bytes(n + m, tcfg.d, tcfg.heads, mlp)
        if tcfg.use_h:
            act += transformer_activation_bytes(tcfg.h_len, tcfg.d, tcfg.heads, mlp, batch=n)
        return ModelBudget(params=params, activation_bytes=act, weights_numel=state)

    def experiments(self, cfg: AuxBOConfig, workdir: Path) -> ResultsTable:
        """The paper's comparison, or (``experiment=history_curve``) the history curve on the
        sweeps of ``history_method`` (:mod:`.history_curve`)."""
        if cfg.experiment == "history_curve":
            from .history_curve import run_history_curve

            return run_history_curve(cfg, workdir)
        from .experiments import run_experiments

        return run_experiments(cfg, workdir)
