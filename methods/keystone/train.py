"""``nshot train keystone``: probe a model for K* and, optionally, fine-tune its keystone rows."""

from __future__ import annotations

import time
from typing import Any

import torch

from nshot.train.trainer import Recipe, train

from .config import KeystoneConfig
from .evaluation import Evaluator
from .model import checkpoint_state, log
from .probe import probe_model


class KeystoneRecipe(Recipe):
    """One step: probe ``cfg.model`` (Stages 1–2) for K*; with ``train_sft`` also fine-tune the
    keystone rows on the new task (:class:`.sft.SFTRecipe`, a DeepSpeed engine run by the
    trainer in this worker). The checkpoint holds K* and the Δ rows (safetensors) and the probe's
    record (JSON); a resume redoes the step (no weights are restored)."""

    def build(self) -> None:
        self.ckpt_state: dict[str, torch.Tensor] = {}
        self.probe_extra: dict[str, Any] | None = None

    def schedule(self) -> tuple[int, int, int]:
        return 1, 1, 1  # one step, checkpointed

    def step(self, step: int) -> dict[str, float]:
        t0 = time.time()
        cfg = self.cfg
        if cfg.device == "auto":  # the model runs on the worker's device
            cfg = cfg.replace(device=str(self.device))
        model, tok, space, ev, res = probe_model(
            cfg.model, cfg, controls=False, calibration=False, stability=False
        )
        gids = [space.gid(k["layer"], k["module"], k["index"]) for k in res.keystones]
        metrics = {
            "n_keystones": float(len(gids)),
            "collapsed": float(res.collapsed),
            "acc_base": res.base["acc"],
            "ppl_base": res.base["ppl"],
            "acc_keystone_off": res.curve[-1]["acc"] if res.curve else res.base["acc"],
            "ppl_keystone_off": res.curve[-1]["ppl"] if res.curve else res.base["ppl"],
        }
        delta = None
        extra: dict[str, Any] = {
            "model_source": cfg.model,
            "space": space.describe(),
            "keystones": res.keystones,
            "collapsed": res.collapsed,
            "curve": res.curve,
            "base": res.base,
        }
        if cfg.train_sft and gids:
            from nshot.data.lmtext import tiny_sft_task

            from . import sft

            dm = sft.DeltaModel(model, space, gids)
            hist = sft.train(
                dm,
                list(dm.delta.parameters()),
                tok,
                tiny_sft_task("train"),
                steps=cfg.sft_steps,
                batch=cfg.sft_batch,
                lr=cfg.sft_lr_keystone,
                seed=cfg.seed,
                deepspeed_opts=cfg.deepspeed,
                log=log,
            )
            target = Evaluator(tok, {"target": tiny_sft_task("eval")}, batch_size=cfg.eval_batch)
            metrics["acc_target"] = target(model, ppl=False)["acc"]
            metrics["trainable_params"] = float(dm.delta.n_params)
            extra["sft"] = hist["history"]
            delta = dm.delta
            dm.remove_hooks()
        metrics["wall_s"] = time.time() - t0
        self.ckpt_state = checkpoint_state(space, gids, delta)
        self.probe_extra = extra
        return metrics

    def state(self) -> dict[str, torch.Tensor]:
        return self.ckpt_state

    def extra(self) -> dict[str, Any] | None:
        return self.probe_extra


def train_loop(cfg: KeystoneConfig) -> None:
    """Probe ``cfg.model`` (Stages 1–2) and checkpoint K*; with ``train_sft`` also fine-tune the
    keystone rows on the new task and checkpoint the Δ rows (safetensors) with K* (JSON).

    The loop is one step, reported as step 1; ``fail_at_step=1`` fails it on a first attempt
    (fault injection), and a resumed run does the step again."""
    train(KeystoneRecipe(cfg))
