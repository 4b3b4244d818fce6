"""weightspace as an nshot Method: OCE meta-network training under Ray Train, serving, experiments."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pyarrow as pa
import torch

from nshot.method import Method, NshotError, ResultsTable, register
from nshot.train.checkpoint import LoadedCheckpoint
from nshot.train.limits import ModelBudget, bounded_ints, meta_counts

from .backbones import count_params
from .claims import CLAIMS
from .config import WeightspaceConfig
from .model import DeepSetsOCE


def model_from_checkpoint(checkpoint: LoadedCheckpoint) -> DeepSetsOCE:
    arch = checkpoint.extra.get("model")
    if not isinstance(arch, dict):
        raise NshotError(f"{checkpoint.path}: not a weightspace checkpoint (no model shape)")
    model = DeepSetsOCE(int(arch["width"]), int(arch["res_layers"]), int(arch["k"]),
                        str(arch["head_init"]))  # fmt: skip
    try:
        model.load_state_dict(checkpoint.weights())
    except RuntimeError as err:
        raise NshotError(f"{checkpoint.path}: weights do not fit the stored shape: {err}") from None
    return model.eval()


@register
class WeightspaceMethod(Method):
    name = "weightspace"
    paper = (
        "On the Expressive Power of Permutation-Equivariant Weight-Space Networks, with output "
        "capacity expansion (ICML 2026)"
    )
    area = "weight-space learning"
    version = "1"
    Config = WeightspaceConfig
    claims = CLAIMS

    def data(self, cfg: WeightspaceConfig) -> dict[str, pa.Table]:
        from .data import data_tables

        return data_tables(cfg)

    def train_loop(self, cfg: WeightspaceConfig) -> None:
        """Train one (backbone, k) configuration end to end through rendering; every worker
        takes its slice of each batch (DDP averages the gradients); reports the training loss,
        the test rel_mse and the copy separation every ``eval_every`` steps and checkpoints
        every ``checkpoint_every``; resumes from the last checkpoint."""
        from nshot.train import session

        from .data import splits
        from .train import build, train_model

        ctx = session.context()
        torch.set_num_threads(cfg.torch_threads)
        torch.manual_seed(cfg.seed)
        model = build(cfg)
        opt = torch.optim.Adam(model.parameters(), lr=cfg.lr)
        restored = session.restore(model, opt)
        start = restored.step if restored else 0
        ddp = session.prepare_model(model)
        train, test = splits(cfg)
        extra = {"model": model.describe(), "params": count_params(model), "task": cfg.task,
                 "grid": cfg.grid, "radius": cfg.radius}  # fmt: skip

        def on_eval(step: int, row: dict[str, float]) -> None:
            session.report(
                {k: v for k, v in row.items() if k != "step"}, step=step, model=model,
                optimizer=opt, extra=extra,
                checkpoint=step % cfg.checkpoint_every == 0 or step == cfg.steps,
                samples=cfg.eval_every * cfg.batch // ctx.world_size,
            )  # fmt: skip

        train_model(model, train, test, cfg, seed=cfg.seed, forward=ddp, optimizer=opt,
                    start=start, rank=ctx.rank, world=ctx.world_size, on_eval=on_eval)  # fmt: skip

    def evaluate(self, checkpoint: LoadedCheckpoint, cfg: WeightspaceConfig) -> dict[str, float]:
        """rel_mse and copy separation on the test INRs, with the identity baseline."""
        from .data import grid, splits
        from .model import rel_mse, render
        from .train import evaluate_model

        model = model_from_checkpoint(checkpoint)
        data_cfg = cfg.replace(**{k: checkpoint.extra[k] for k in ("grid", "radius")
                                  if k in checkpoint.extra})  # fmt: skip
        _, test = splits(data_cfg)
        x = grid(data_cfg).float()
        out = evaluate_model(model, test, x)
        ident = rel_mse(render(test.W1, test.b1, test.W2, test.b2, x), test.target)
        return {**out, "identity_rel_mse": float(ident.mean()), "k": float(model.k),
                "params": float(count_params(model))}  # fmt: skip

    def predictor(self, checkpoint: LoadedCheckpoint):
        from .serve import WeightspacePredictor

        return WeightspacePredictor(checkpoint)

    def model_budget(
        self, cfg: WeightspaceConfig, extra: dict[str, Any] | None = None
    ) -> ModelBudget:
        """The DeepSets OCE of the recorded shape (else the config's), counted on the meta
        device; activations: every neuron of a batch of 1-3-1 INRs through ``width`` channels,
        and a render of ``MAX_POINTS`` points by ``k`` copies."""
        from . import serve

        arch = (extra or {}).get("model")
        if arch is None:
            arch = {"width": cfg.backbone_width(), "res_layers": cfg.res_layers, "k": cfg.k}
        head_init = arch.get("head_init", cfg.head_init) if isinstance(arch, dict) else None
        sizes = bounded_ints(
            arch, {"width": (1, 4096), "res_layers": (1, 12), "k": (1, 64)}, "extra.model"
        )
        if head_init not in ("random", "zero"):
            raise ValueError(f"extra.model.head_init must be random or zero, got {head_init!r}")
        params, state = meta_counts(
            lambda: DeepSetsOCE(sizes["width"], sizes["res_layers"], sizes["k"], head_init)
        )
        points = serve.MAX_POINTS
        act = 4 * (64 * 8 * sizes["width"] * 4 + points * sizes["k"] * 3 * 4)
        return ModelBudget(params=params, activation_bytes=act, weights_numel=state)

    def experiments(self, cfg: WeightspaceConfig, workdir: Path) -> ResultsTable:
        from .experiments import run_experiments

        return run_experiments(cfg, workdir)
