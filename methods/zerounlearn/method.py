"""ZeroUnlearn as an nshot Method: the face of the package.

The work lives in the modules it imports: the edit (:mod:`.edit`), one seed's run end to end
(:mod:`.pipeline`), the train loop (:mod:`.train`), the baselines (:mod:`.baselines`), the
metrics (:mod:`.evaluation`), the paper's comparison (:mod:`.experiments`), its claims
(:mod:`.claims`) and the predictor (:mod:`.serve`). Nothing in the package imports this module.
"""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa

from nshot.method import Method, ResultsTable, register
from nshot.train.checkpoint import CheckpointError, LoadedCheckpoint

from .claims import CLAIMS
from .config import ZeroUnlearnConfig
from .experiments import METRICS, run_experiments
from .serve import ZeroUnlearnPredictor
from .train import train_loop

__all__ = ["METRICS", "ZeroUnlearnMethod"]


@register
class ZeroUnlearnMethod(Method):
    name = "zerounlearn"
    paper = "ZeroUnlearn: few-shot LLM unlearning as knowledge re-mapping"
    area = "few-shot LLM unlearning (model editing)"
    version = "1"
    Config = ZeroUnlearnConfig
    claims = CLAIMS

    def data(self, cfg: ZeroUnlearnConfig) -> dict[str, pa.Table]:
        """Candidate facts (before the per-model filter) and the general text splits."""
        from nshot.data.lmtext import general_text

        from .pipeline import candidate_requests

        reqs = candidate_requests(cfg)
        facts = pa.table(
            {
                "relation": [r.relation for r in reqs],
                "subject": [r.subject for r in reqs],
                "answer": [r.answer for r in reqs],
                "rewrite_template": [r.template for r in reqs],
                "paraphrases": [list(r.paraphrases) for r in reqs],
            }
        )
        return {
            "facts": facts,
            "general_train": pa.table({"text": general_text("train")}),
            "general_heldout": pa.table({"text": general_text("heldout")}),
        }

    def train_loop(self, cfg: ZeroUnlearnConfig) -> None:
        """The edit on rank 0 with full weights; reports the metrics before and after (one
        step, :mod:`.train`)."""
        train_loop(cfg)

    def predictor(self, checkpoint: LoadedCheckpoint) -> ZeroUnlearnPredictor:
        return ZeroUnlearnPredictor.from_checkpoint(checkpoint)

    def evaluate(self, checkpoint: LoadedCheckpoint, cfg: ZeroUnlearnConfig) -> dict[str, float]:
        """Eff, Gen, Spe, PPL and the neutral rate of the checkpoint's edited model on its own facts."""
        from nshot.data.lmtext import general_text

        from .edit import EditRequest, load_edited_weights, model_fingerprint
        from .evaluation import EvalSet, evaluate_model, ppl_chunks
        from .pipeline import load_model

        extra = checkpoint.extra
        if "forget" not in extra:
            raise CheckpointError(f"checkpoint {checkpoint.path} has no request list")
        model, tok = load_model(cfg)
        if model_fingerprint(model, model.config.num_hidden_layers - 1) != extra.get(
            "model_fingerprint"
        ):
            raise CheckpointError(
                f"checkpoint {checkpoint.path}: base model {cfg.model!r} is not the edited one"
            )
        load_edited_weights(model, checkpoint.weights())
        chunks = ppl_chunks(tok, general_text("heldout"), cfg.ppl_chunks, cfg.ppl_length)
        es = EvalSet(
            tuple(EditRequest.from_json(r) for r in extra["forget"]),
            tuple(EditRequest.from_json(r) for r in extra["retain"]),
            tuple(tuple(c) for c in chunks),
        )
        return evaluate_model(model, tok, es)

    def experiments(self, cfg: ZeroUnlearnConfig, workdir: Path) -> ResultsTable:
        """ZeroUnlearn, -GD, the ablations and the baselines on the same facts, per seed."""
        return run_experiments(cfg, workdir, method=self.name, version=self.version)
