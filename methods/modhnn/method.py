"""modhnn as an nshot Method: the contract wired to the package's modules (meta-training in
``train.py``, adaptation and metrics in ``adapt.py``, the predictor in ``serve.py``, the
comparison in ``experiments.py``). Nothing in the package imports this module."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pyarrow as pa

from nshot.method import Method, ResultsTable, register
from nshot.train.checkpoint import LoadedCheckpoint
from nshot.train.limits import ModelBudget, bounded_ints, meta_counts

from .adapt import evaluate_state
from .claims import CLAIMS
from .config import ModHNNConfig
from .data import split_table
from .experiments import run_experiments
from .model import Dynamics, DynSpec, load_model
from .serve import MAX_SHOTS, MAX_STATES, ModHNNPredictor
from .train import train_loop

#: what the network spec recorded in a modhnn checkpoint may be (every preset is far inside)
SPEC_BOUNDS = {"width": (1, 4096), "depth": (1, 32), "d_z": (0, 1024), "rank": (0, 1024)}


@register
class ModHNNMethod(Method):
    name = "modhnn"
    paper = "Modulation-based meta-learning of Hamiltonian dynamics (ICML 2026)"
    area = "few-shot system identification / structure-preserving dynamics"
    version = "1"
    Config = ModHNNConfig
    claims = CLAIMS

    def data(self, cfg: ModHNNConfig) -> dict[str, pa.Table]:
        return {s: split_table(cfg, cfg.system, s) for s in ("train", "test")}

    def train_loop(self, cfg: ModHNNConfig) -> None:
        train_loop(cfg)

    def evaluate(self, checkpoint: LoadedCheckpoint, cfg: ModHNNConfig) -> dict[str, float]:
        state, system = load_model(checkpoint)
        return evaluate_state(state, system, cfg)

    def predictor(self, checkpoint: LoadedCheckpoint) -> ModHNNPredictor:
        return ModHNNPredictor(checkpoint)

    def model_budget(self, cfg: ModHNNConfig, extra: dict[str, Any] | None = None) -> ModelBudget:
        """The dynamics of the recorded spec (else the config's sizes), counted on the meta
        device, plus the table of training latents (its row count is read from the weights,
        so the weights' size is not checked); activations: a request's shots and states
        through ``depth`` layers of ``width``, with the gradient the Hamiltonian needs."""
        spec = (extra or {}).get("spec")
        if spec is None:
            spec = {"width": cfg.width, "depth": cfg.depth, "d_z": cfg.d_z, "rank": cfg.rank}
        sizes = bounded_ints(spec, SPEC_BOUNDS, "extra.spec")
        dspec = DynSpec.from_dict(spec) if (extra or {}).get("spec") else DynSpec(
            kind="hnn", modulation=cfg.modulation, **sizes
        )  # fmt: skip
        params, _ = meta_counts(lambda: Dynamics(dspec))
        instances = (extra or {}).get("instances", {})
        n = instances.get("train", 0) if isinstance(instances, dict) else 0
        n = n if isinstance(n, int) and not isinstance(n, bool) and n > 0 else 0
        params += n * max(sizes["d_z"], 1)
        rows = MAX_SHOTS + MAX_STATES
        act = 4 * 16 * rows * (sizes["width"] + sizes["rank"]) * (sizes["depth"] + 2)
        return ModelBudget(params=params, activation_bytes=act)

    def experiments(self, cfg: ModHNNConfig, workdir: Path) -> ResultsTable:
        return run_experiments(cfg, workdir)
