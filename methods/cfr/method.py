"""CFR as an nshot Method: one (class, k) run of stages 1–3 under Ray Train, evaluation on the
class's test images, and a predictor of anomaly maps."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pyarrow as pa

from nshot.method import Method, ResultsTable, register
from nshot.train.checkpoint import LoadedCheckpoint
from nshot.train.limits import ModelBudget, meta_counts

from .claims import CLAIMS
from .config import VERSION, CfrConfig
from .model import BANKS, build_model, bundle_entries, load_models
from .serve import MAX_SIDE, CfrPredictor
from .train import train_loop


@register
class CfrMethod(Method):
    name = "cfr"
    paper = "CFR: crossmodal feature replacer for RGB + 3D few-shot anomaly detection"
    area = "vision / anomaly detection"
    version = VERSION
    Config = CfrConfig
    claims = CLAIMS

    def data(self, cfg: CfrConfig) -> dict[str, pa.Table]:
        """Per class: normal training pool and test images (RGB, xyz, masks), generated."""
        from .data import data_tables

        return data_tables(cfg)

    def train_loop(self, cfg: CfrConfig) -> None:
        """Stages 1–3 of ``cfg.system`` for ``cfg.class_name`` and k = ``cfg.shot``."""
        train_loop(cfg)

    def evaluate(self, checkpoint: LoadedCheckpoint, cfg: CfrConfig) -> dict[str, float]:
        """I-AUROC, P-AUROC, AUPRO@30 %, AUPRO@10 % and the replaced fraction on normal test
        images of the checkpoint's class; for a bundle, every model's, named
        ``<class>.k<k>.<metric>``."""
        from nshot.train.trainer import local_device

        from .evaluation import evaluate_model

        per_model = {}
        for m in load_models(checkpoint):
            if not m.banks_built:
                raise ValueError("checkpoint: saved during stage 1, before its memory banks exist")
            run_cfg = m.cfg.replace(**{k: getattr(cfg, k) for k in CfrConfig.EVAL_FIELDS})
            per_model[f"{m.class_name}.k{m.shot}."] = evaluate_model(
                m.model, run_cfg, m.class_name, local_device()
            )
        if "bundle" not in checkpoint.extra:
            (metrics,) = per_model.values()
            return metrics
        return {p + k: v for p, metrics in per_model.items() for k, v in metrics.items()}

    def predictor(self, checkpoint: LoadedCheckpoint) -> CfrPredictor:
        return CfrPredictor.from_checkpoint(checkpoint)

    def model_budget(self, cfg: CfrConfig, extra: dict[str, Any] | None = None) -> ModelBudget:
        """The mappings and the retriever, the banks of the checkpoint (the config's k shots
        at 10 % when there is none), and one request's per-pixel features at the largest side;
        for a bundle, the sum of its models' weights and the largest one's activations."""
        if extra and "bundle" in extra:
            parts = [self.model_budget(c, {"run": run})
                     for c, run, _ in bundle_entries(extra, "bundle")]  # fmt: skip
            numel = [b.weights_numel for b in parts]
            return ModelBudget(
                params=sum(b.params for b in parts),
                activation_bytes=max(b.activation_bytes for b in parts),
                weights_numel=None if None in numel else sum(numel),
            )
        run = (extra or {}).get("run") or {}
        sizes = run.get("bank_sizes") if isinstance(run, dict) else None
        if not isinstance(sizes, dict):
            n = int(cfg.shot * cfg.grid * cfg.grid * cfg.coreset_frac)
            sizes = dict.fromkeys(BANKS, max(n, 1))
        params, state = meta_counts(lambda: build_model(cfg, sizes))
        pixels = MAX_SIDE * MAX_SIDE
        bank = max(sizes.values())
        elems = pixels * (4 * (cfg.rgb_dim + cfg.xyz_dim) + 2 * cfg.rgb_dim) + 4096 * bank
        return ModelBudget(params=params, activation_bytes=4 * elems, weights_numel=state)

    def experiments(self, cfg: CfrConfig, workdir: Path) -> ResultsTable:
        from .experiments import run_experiments

        return run_experiments(cfg, workdir)
