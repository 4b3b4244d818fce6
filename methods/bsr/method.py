"""BSR as an nshot Method: masked VideoMAE pretraining on rendered EEG under Ray Train,
few-shot evaluation on held-out subjects through two montages, serving any montage, and the
reproduction."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

from nshot.method import Method, ResultsTable, register
from nshot.train.checkpoint import LoadedCheckpoint
from nshot.train.limits import ModelBudget, meta_counts

from .claims import CLAIMS
from .config import VERSION, BsrConfig
from .model import build_pretrainer, load_model
from .serve import BsrPredictor
from .train import train_loop


@register
class BsrMethod(Method):
    name = "bsr"
    paper = "BSR: brain signal rendering of EEG into spectrum videos for VideoMAE"
    area = "EEG / video foundation models"
    version = VERSION
    Config = BsrConfig
    claims = CLAIMS

    def data(self, cfg: BsrConfig) -> dict[str, pa.Table]:
        """The generated trials (raw EEG on montage A's 32 channels, labels, subjects)."""
        from .data import eeg_table

        return {"eeg": eeg_table(cfg)}

    def train_loop(self, cfg: BsrConfig) -> None:
        """Stage 1: masked pretraining on the source subjects' spectrum videos (montage A)."""
        train_loop(cfg)

    def evaluate(self, checkpoint: LoadedCheckpoint, cfg: BsrConfig) -> dict[str, float]:
        """Held-out masked MSE, and BSR's balanced accuracy and κ after few-shot fine-tuning
        on the first ``eval_subjects`` target subjects, per k and montage (mean over
        ``seeds`` support draws)."""
        import torch

        from .data import load_dataset
        from .evaluation import run_videomae
        from .train import held_out_mse, source_clips, split_clips

        model, ckpt_cfg, _ = load_model(checkpoint)
        run_cfg = ckpt_cfg.replace(**{k: getattr(cfg, k) for k in BsrConfig.EVAL_FIELDS})
        torch.set_num_threads(run_cfg.torch_threads)
        ds = load_dataset(run_cfg)
        clips, *_ = source_clips(run_cfg, ds)
        out = {"mae_mse": held_out_mse(run_cfg, model, clips,
                                       split_clips(run_cfg, len(clips.powers))[1])}  # fmt: skip
        state = model.videomae.state_dict()
        for k in run_cfg.shots:
            for montage in ("A", "B"):
                runs = [
                    run_videomae(
                        run_cfg, "bsr", state, *ds.subject(name), k, montage, run_cfg.seed + s
                    )  # fmt: skip
                    for name in ds.names("target")[: run_cfg.eval_subjects]
                    for s in range(run_cfg.seeds)
                ]
                out[f"bacc_k{k}_{montage}"] = float(np.mean([r["bacc"] for r in runs]))
                out[f"kappa_k{k}_{montage}"] = float(np.mean([r["kappa"] for r in runs]))
        return out

    def predictor(self, checkpoint: LoadedCheckpoint) -> BsrPredictor:
        return BsrPredictor.from_checkpoint(checkpoint)

    def model_budget(self, cfg: BsrConfig, extra: dict[str, Any] | None = None) -> ModelBudget:
        """VideoMAE of the config, counted on the meta device, and one request's activations
        (all support and query videos at the request caps, encoded ``ENCODE_BATCH`` at a time)."""
        from . import serve

        params, state = meta_counts(lambda: build_pretrainer(cfg))
        tokens = (cfg.frames // cfg.tubelet) * cfg.spatial_patches
        per_clip = tokens * cfg.width * 12 + cfg.heads * tokens * tokens
        videos = (serve.MAX_SUPPORT + 1) * cfg.frames * 3 * cfg.grid * cfg.grid
        elems = serve.ENCODE_BATCH * per_clip + videos
        return ModelBudget(params=params, activation_bytes=4 * elems, weights_numel=state)

    def experiments(self, cfg: BsrConfig, workdir: Path) -> ResultsTable:
        from .experiments import run_experiments

        return run_experiments(cfg, workdir)
