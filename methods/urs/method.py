"""URS as an nshot Method: data, Ray Train loop, evaluation, predictor, experiments."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pyarrow as pa

from nshot.method import Method, ResultsTable, register
from nshot.train.checkpoint import LoadedCheckpoint
from nshot.train.limits import ModelBudget, meta_counts, transformer_activation_bytes

from .claims import CLAIMS
from .config import URSConfig
from .data import instances_table, load_test_set
from .model import build_model, load_model
from .train import train_loop


@register
class URSMethod(Method):
    name = "urs"
    paper = "URS: a unified neural routing solver for cross-problem zero-shot generalization"
    area = "zero-shot neural combinatorial optimisation (vehicle routing)"
    version = "1"
    Config = URSConfig
    claims = CLAIMS
    packages = ("pyvrp", "ortools")  # the reference solvers the gaps are measured against

    def data(self, cfg: URSConfig) -> dict[str, pa.Table]:
        """Test splits: ``seen`` (training variants), ``unseen`` (zero-shot) and, when the config
        names clustered variants, ``clustered`` (customers in Gaussian clusters), all sizes.
        Training instances are generated per step and never stored."""
        from .experiments import test_splits

        out = {}
        for split, variants in test_splits(cfg).items():
            parts = [
                instances_table(load_test_set(cfg, v, n), n)
                for v in variants
                for n in cfg.eval_sizes
            ]
            out[split] = pa.concat_tables(parts) if parts else pa.table({})
        return out

    def train_loop(self, cfg: URSConfig) -> None:
        train_loop(cfg)

    def evaluate(self, checkpoint: LoadedCheckpoint, cfg: URSConfig) -> dict[str, float]:
        """Mean cost, gap to the reference solver (%), feasible share (%) and time per
        instance on the seen and unseen test variants, plus nearest neighbour's cost."""
        from .experiments import evaluate_system, reference_results, summarise, test_sets

        net, _ = load_model(checkpoint)
        variants = test_sets(cfg)
        res = {
            "urs": evaluate_system(net, cfg, variants),
            "nearest_neighbour": evaluate_system("nearest_neighbour", cfg, variants),
        }
        refs = {(v, n): reference_results(cfg, v, n) for v in variants for n in cfg.eval_sizes}
        out: dict[str, float] = {}
        for system, r in res.items():
            summ = summarise(r, refs, cfg)
            prefix = "" if system == "urs" else "nn_"
            out.update({f"{prefix}{k}": v for k, v in summ.items() if v is not None})
        return out

    def predictor(self, checkpoint: LoadedCheckpoint):
        from .serve import URSPredictor

        return URSPredictor.from_checkpoint(checkpoint)

    def model_budget(self, cfg: URSConfig, extra: dict[str, Any] | None = None) -> ModelBudget:
        """The network of the config, counted on the meta device; activations: the encoder on the
        largest request (``MAX_NODES`` customers and 100 depots, 8 augmentations, its ``V x V``
        bias and AAFM factors), and the decoder's ``eval_starts`` rollouts over every node."""
        from . import serve

        params, state = meta_counts(lambda: build_model(cfg))
        v = serve.MAX_NODES + 100
        aug = 8
        enc = transformer_activation_bytes(v, cfg.d, 1, cfg.ff, batch=aug)
        enc += 4 * aug * v * v * 2
        dec = 4 * aug * cfg.eval_starts * (4 * v + 8 * cfg.d)
        return ModelBudget(params=params, activation_bytes=enc + dec, weights_numel=state)

    def experiments(self, cfg: URSConfig, workdir: Path) -> ResultsTable:
        from .experiments import run_experiments

        return run_experiments(cfg, workdir)
