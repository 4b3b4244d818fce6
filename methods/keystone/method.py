"""Keystone neurons as an nshot Method: the face of the package.

The work lives in the modules it imports: the neuron space and hooks (:mod:`.neurons`), the
probe (:mod:`.probe`), the capability evaluation (:mod:`.evaluation`), keystone-only SFT
(:mod:`.sft`), the model loader (:mod:`.model`), the train loop (:mod:`.train`), the paper's
comparison (:mod:`.experiments`), its claims (:mod:`.claims`) and the predictor (:mod:`.serve`).
Nothing in the package imports this module.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow as pa

from nshot.method import Method, ResultsTable, register
from nshot.train.checkpoint import LoadedCheckpoint

from .claims import CLAIMS
from .config import KeystoneConfig
from .evaluation import Evaluator, build_evaluator
from .experiments import METRICS, run_experiments, sft_comparison
from .serve import KeystonePredictor
from .train import train_loop

# ``sft_comparison`` stays importable from here for scripts that ran it before the split
__all__ = ["METRICS", "KeystoneMethod", "sft_comparison"]


@register
class KeystoneMethod(Method):
    name = "keystone"
    paper = "Keystone neurons: probing and keystone-only fine-tuning"
    area = "LLM interpretability / sparse fine-tuning"
    version = "1"
    Config = KeystoneConfig
    claims = CLAIMS

    def data(self, cfg: KeystoneConfig) -> dict[str, pa.Table]:
        """Probe prompts, capability candidates, perplexity texts and the SFT task as tables."""
        from nshot.data.lmtext import tiny_sft_task

        from . import evaluation as E
        from .probe import prompt_groups

        kind = cfg.prompt_kind()
        groups = prompt_groups(kind, cfg.stability_groups)
        cands = (
            E.natural_candidates(cfg.eval_candidates)
            if cfg.suite() == "natural"
            else E.tiny_items()
        )
        rows = [(c, p, a) for c, items in cands.items() for p, a in items]
        return {
            "probe_prompts": pa.table(
                {
                    "group": [g for g, grp in enumerate(groups) for _ in grp],
                    "capability": [
                        c
                        for grp in groups
                        for c in ("general", "math", "code", "multilingual")[: len(grp)]
                    ],
                    "prompt": [p for grp in groups for p in grp],
                }
            ),
            "capabilities": pa.table(
                {
                    "capability": [r[0] for r in rows],
                    "prompt": [r[1] for r in rows],
                    "answer": [r[2] for r in rows],
                }
            ),
            "perplexity": pa.table({"text": E.ppl_texts(cfg.ppl_texts)}),
            "sft_train": pa.table(
                {k: list(v) for k, v in zip(("prompt", "answer"), zip(*tiny_sft_task("train")))}
            ),
            "sft_eval": pa.table(
                {k: list(v) for k, v in zip(("prompt", "answer"), zip(*tiny_sft_task("eval")))}
            ),
        }

    def train_loop(self, cfg: KeystoneConfig) -> None:
        train_loop(cfg)

    def predictor(self, checkpoint: LoadedCheckpoint) -> KeystonePredictor:
        return KeystonePredictor.from_checkpoint(checkpoint)

    def evaluate(self, checkpoint: LoadedCheckpoint, cfg: KeystoneConfig) -> dict[str, float]:
        """Unablated vs keystones zeroed vs a module-matched random set zeroed (and, for an SFT
        checkpoint, the new task's accuracy with the Δ rows)."""
        from .probe import make_evaluate, module_matched_set, zero

        pred = KeystonePredictor.from_checkpoint(checkpoint, device=cfg.device)
        source = pred.source
        ev, _ = build_evaluator(pred.model, pred.tok, source, cfg)
        evaluate = make_evaluate(pred.model, pred.space, ev)
        full = evaluate(None)
        off = evaluate(zero(pred.gids))
        rnd = evaluate(
            zero(module_matched_set(pred.space, pred.gids, np.random.default_rng([cfg.seed, 1])))
        )
        out = {f"{k}": v for k, v in full.items()}
        out.update({f"{k}_keystone_off": v for k, v in off.items()})
        out.update({f"{k}_random_off": v for k, v in rnd.items()})
        out["collapse_ratio"] = off["acc"] / full["acc"] if full["acc"] else float("nan")
        out["n_keystones"] = float(len(pred.gids))
        if pred.delta is not None:
            from nshot.data.lmtext import tiny_sft_task

            from .neurons import NeuronHooks

            target = Evaluator(
                pred.tok, {"target": tiny_sft_task("eval")}, batch_size=cfg.eval_batch
            )
            out["acc_target_base"] = target(pred.model, ppl=False)["acc"]
            with NeuronHooks(pred.space, delta=pred.delta):
                out["acc_target"] = target(pred.model, ppl=False)["acc"]
        return out

    def experiments(self, cfg: KeystoneConfig, workdir: Path) -> ResultsTable:
        """The probe on ``cfg.model`` (masking, controls, calibration, stability) and the
        keystone-only SFT comparison on ``cfg.sft_model`` (full FT, keystone rows, random rows)."""
        return run_experiments(cfg, workdir, method=self.name, version=self.version)
