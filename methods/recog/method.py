"""ReCoG as an nshot Method: episodic training under Ray Train, evaluation on held-out targets,
serving a property defined by its support set, and the reproduction."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pyarrow as pa

from nshot.method import Method, ResultsTable, register
from nshot.train.checkpoint import LoadedCheckpoint
from nshot.train.limits import ModelBudget, meta_counts

from .claims import CLAIMS
from .config import VERSION, RecogConfig
from .model import build_model, load_model
from .serve import RecogPredictor
from .train import train_loop


@register
class RecogMethod(Method):
    name = "recog"
    paper = "ReCoG: relational and compact context graph for few-shot molecular property prediction"
    area = "graphs / chemistry"
    version = VERSION
    Config = RecogConfig
    claims = CLAIMS

    def data(self, cfg: RecogConfig) -> dict[str, pa.Table]:
        """The track's label matrix (long form) and its properties with their split."""
        from .data import data_tables

        return data_tables(cfg)

    def train_loop(self, cfg: RecogConfig) -> None:
        """Episodic meta-training of ``cfg.system`` on the track's training targets."""
        train_loop(cfg)

    def evaluate(self, checkpoint: LoadedCheckpoint, cfg: RecogConfig) -> dict[str, float]:
        """1-shot (and 10-shot) ROC-AUC, ΔAUPRC, cliff AUC, gate AUC and the distractor drop of
        the checkpoint on the held-out targets of its track."""
        import math

        from .data import track_for
        from .evaluation import evaluate_system, model_system

        model, ckpt_cfg, _ = load_model(checkpoint)
        run_cfg = ckpt_cfg.replace(
            **{k: getattr(cfg, k) for k in ("eval_draws", "eval_queries", "seed", "fetch_data")}
        )
        track = track_for(run_cfg)
        res = evaluate_system(model_system(model), track, run_cfg, run_cfg.seed,
                              uses_context=ckpt_cfg.system != "protonet")  # fmt: skip
        res.pop("detail")
        return {k: float(v) for k, v in res.items() if v is not None and not math.isnan(v)}

    def predictor(self, checkpoint: LoadedCheckpoint) -> RecogPredictor:
        return RecogPredictor.from_checkpoint(checkpoint)

    def model_budget(self, cfg: RecogConfig, extra: dict[str, Any] | None = None) -> ModelBudget:
        """The model of the config over the checkpoint's property list (the config's track
        when there is no checkpoint: at most 200 properties), and one request's activations:
        the molecule–support similarity tensor and the triplet tensor at the request caps."""
        from . import serve

        props = (extra or {}).get("props") or {}
        names = props.get("names") if isinstance(props, dict) else None
        n_props = len(names) if isinstance(names, list) else 200
        if not 1 <= n_props <= 10_000:
            raise ValueError(f"extra.props.names: {n_props} properties is out of range")
        params, state = meta_counts(lambda: build_model(cfg, n_props))
        m, s = serve.MAX_SUPPORT + serve.MAX_QUERIES, serve.MAX_SUPPORT
        p = cfg.n_aux + 1
        elems = m * s * cfg.d + 4 * m * p * p + 4 * p * p * cfg.d + 3 * m * cfg.d + m * cfg.fp_bits
        return ModelBudget(params=params, activation_bytes=4 * elems, weights_numel=state)

    def experiments(self, cfg: RecogConfig, workdir: Path) -> ResultsTable:
        from .experiments import run_experiments

        return run_experiments(cfg, workdir)
