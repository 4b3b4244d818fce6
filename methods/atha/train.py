"""ATHA's two kinds of training.

* :func:`train_loop` (``nshot train atha``): the contrastive pre-training of the tiny CLIP that
  every episode starts from (:class:`PretrainRecipe` on :mod:`nshot.train.trainer`), run by
  :func:`nshot.train.clip.pretrain` in this worker (on a worker group its loop all-gathers the
  image features and averages the gradients over the workers). It runs in chunks of
  ``checkpoint_every`` steps; after each chunk rank 0 reports an nshot checkpoint (the tiny
  CLIP's weights, its config in ``extra``). The pre-training's own
  resume state (weights, optimizer, losses) lives in a work folder beside the run, so a resumed
  run continues from it and ends with the weights of an uninterrupted run.
* :func:`run_episode`: one episode (paper §4.1): a fresh :class:`~.model.EpisodeModel`, trained
  ``epochs`` full-support steps (AdamW on LoRA, SGD with momentum on the context and on the
  rates, cross-entropy at the small logit scale), then its queries classified.
"""

from __future__ import annotations

import hashlib
import json
import shutil
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from nshot.errors import ConfigError
from nshot.train import session
from nshot.train.trainer import Recipe, train

from .config import AthaConfig
from .data import DOMAINS, Episode, domain_pool, sample_episode
from .model import Backbone, EpisodeModel

# --------------------------------------------------------------------------------------------
# pre-training (nshot train atha)


def check_backbone(cfg: AthaConfig) -> None:
    """``backbone='clip'`` (the paper preset): raise a ``ConfigError`` naming what is missing
    (``clip_path``, the tokenizer, ``data_path``); with everything present, say that this loop
    pre-trains the tiny CLIP only (the method runs the real CLIP through ``.paper``)."""
    if cfg.backbone != "clip":
        return
    from .clip_backbone import check_clip_backbone

    check_clip_backbone(cfg)
    raise ConfigError(
        "backbone=clip: this loop pre-trains the tiny CLIP; the real CLIP is run by the "
        "method (nshot.methods.atha.paper)"
    )


def _work_dir(cfg: AthaConfig) -> Path:
    """Where the pre-training keeps its resume state: beside the run's folder (never inside
    it: nshot looks for its checkpoints there)."""
    info = session.run_info()
    digest = hashlib.sha256(
        json.dumps(
            {k: v for k, v in info.config.items() if k not in ("fail_at_step", "fail_rank")},
            sort_keys=True,
        ).encode()
    ).hexdigest()[:12]
    if info.local_dir is not None:
        run = Path(info.local_dir)
        return run.with_name(f".{run.name}-tinyclip-{digest}")
    import ray.train

    ctx = ray.train.get_context()
    try:
        root = Path(ctx.get_storage().experiment_fs_path)
        if not root.is_absolute():
            raise ValueError(root)
        return root.with_name(f".{root.name}-tinyclip-{digest}")
    except Exception:  # noqa: BLE001 - remote storage: the cache of this node
        from nshot.data.cache import cache_dir

        return cache_dir() / "atha-pretrain" / f"{ctx.get_experiment_name()}-{digest}"


class PretrainRecipe(Recipe):
    """The tiny CLIP's pre-training as :mod:`nshot.train.trainer` runs it. A chunk of
    ``checkpoint_every`` steps is one call of :func:`nshot.train.clip.pretrain` (its own loop,
    resumable from the work folder), made at the chunk's first step; each step's stats are the
    loss that loop recorded for it, and the chunk ends with a report and a checkpoint (the
    tiny CLIP's weights on rank 0, its config in ``extra``; the final metrics at the end, the
    episode accuracy at each checkpoint of a Tune trial)."""

    samples_per_step = 1

    def build(self) -> None:
        cfg = self.cfg
        check_backbone(cfg)
        from nshot.train.clip import clip_config

        self.work = _work_dir(cfg)
        self.clip_extra = {
            "clip_config": clip_config(cfg.clip_preset, cfg.text).to_dict(),
            "clip_preset": cfg.clip_preset,
            "text": cfg.text,
        }
        self.began = False
        self.chunk = (0, 0)  # the chunk's steps: (first - 1, last)
        self.losses: list[float] = []
        self.weights: dict[str, torch.Tensor] = {}

    def schedule(self) -> tuple[int, int, int]:
        every = int(self.cfg.checkpoint_every)
        return int(self.cfg.steps), every, every

    def step(self, step: int) -> dict[str, float]:
        cfg = self.cfg
        if not self.began:
            self.began = True
            if self.restored is None and self.rank == 0:
                shutil.rmtree(self.work, ignore_errors=True)  # a fresh run starts from scratch
            if self.world_size > 1:  # no rank reads the work folder before it is cleared
                import torch.distributed as dist

                dist.barrier()
        if step > self.chunk[1]:
            from nshot.train.clip import pretrain

            first = step - 1
            end = min(cfg.steps, (first // cfg.checkpoint_every + 1) * cfg.checkpoint_every)
            self.t0 = time.time()
            result = pretrain(
                cfg.clip_preset,
                out=self.work,
                text=cfg.text,
                seed=cfg.seed,
                steps=cfg.steps,
                stop_at=end,
                threads=cfg.torch_threads,
            )
            self.chunk, self.losses = (first, end), list(result.losses)
        return {"loss": self.losses[step - 1]}

    def on_report(self, step: int, metrics: dict[str, float]) -> dict[str, float]:
        from safetensors.torch import load_file

        cfg = self.cfg
        first, end = self.chunk
        losses = self.losses[first:end]
        metrics = {"loss": float(np.mean(losses)) if losses else float("nan")}
        self.weights = {}
        if self.rank == 0:
            folder = (
                self.work if end == cfg.steps else self.work / "checkpoints" / f"step-{end:06d}"
            )
            self.weights = load_file(str(folder / "model.safetensors"))
            clip_cfg = self.clip_extra["clip_config"]
            if end == cfg.steps:
                metrics.update(_final_metrics(clip_cfg, self.weights, cfg))
            elif session.run_info().tune is not None:  # a Tune trial: the objective each time
                metrics.update(_episode_metrics(clip_cfg, self.weights, cfg))
        print(f"[nshot atha] pre-training steps {first}-{end}: {time.time() - self.t0:.0f}s",
              flush=True)  # fmt: skip
        return metrics

    def state(self) -> dict[str, torch.Tensor]:
        return self.weights

    def extra(self) -> dict[str, Any]:
        return self.clip_extra


def train_loop(cfg: AthaConfig) -> None:
    """Pre-train the tiny CLIP (``clip_preset``, ``text``) for ``steps`` steps, resumable."""
    train(PretrainRecipe(cfg))


def _final_metrics(
    clip_cfg: dict[str, Any], state: dict[str, torch.Tensor], cfg: AthaConfig
) -> dict[str, float]:
    """The precondition (zero-shot 8-way shape accuracy on fresh source-style images) and
    ATHA's 1-shot accuracy on ``eval_episodes`` episodes per domain (the Tune objective)."""
    from nshot.train.clip import zero_shot_report

    from .model import clip_from_state

    clip = clip_from_state(clip_cfg, state)
    out = {"acc_src_8way": float(zero_shot_report(clip, cfg.clip_preset, cfg.seed)["acc_src_8way"])}
    out.update(episode_accuracy(Backbone(clip), cfg, ["atha"]))
    return out


def _episode_metrics(
    clip_cfg: dict[str, Any], state: dict[str, torch.Tensor], cfg: AthaConfig
) -> dict[str, float]:
    """ATHA's 1-shot accuracy on ``eval_episodes`` episodes per domain of the CLIP so far
    (reported at every checkpoint of a Tune trial: its objective and learning curve)."""
    from .model import clip_from_state

    return episode_accuracy(Backbone(clip_from_state(clip_cfg, state)), cfg, ["atha"])


# --------------------------------------------------------------------------------------------
# episodes


@dataclass
class EpisodeResult:
    probs: torch.Tensor  # [q, n] query probabilities
    epochs_run: int
    rates: dict[str, list[float]]
    loss: float


def adapt(
    backbone: Backbone,
    names: Sequence[str],
    support_x: torch.Tensor,
    support_y: torch.Tensor,
    query_x: torch.Tensor,
    cfg: AthaConfig,
    system: str,
    *,
    shots: int,
    seed: int,
    epochs: int | None = None,
) -> EpisodeResult:
    """Adapt a fresh episode model on the support set and classify the queries."""
    epochs = cfg.epochs if epochs is None else epochs
    make = getattr(backbone, "episode_model", None)  # a real CLIP's backbone builds its own
    if make is not None:
        model = make(names, cfg, system, shots=shots, seed=seed)
    else:
        model = EpisodeModel(backbone, names, cfg, system, shots=shots, seed=seed)
    opts: list[torch.optim.Optimizer] = []
    if model.lora_parameters():
        opts.append(torch.optim.AdamW(model.lora_parameters(), lr=cfg.lr_lora))
    if model.ctx.requires_grad:
        opts.append(
            torch.optim.SGD(
                [model.ctx],
                lr=cfg.lr_ctx,
                momentum=cfg.momentum,
                weight_decay=cfg.sgd_weight_decay,
            )
        )
    if model.rate_parameters():
        opts.append(
            torch.optim.SGD(
                model.rate_parameters(),
                lr=cfg.lr_rates,
                momentum=cfg.momentum,
                weight_decay=cfg.sgd_weight_decay,
            )
        )
    loss_value = float("nan")
    run = epochs if opts else 0
    if opts:
        model.train_mode()
        torch.manual_seed(seed + 1)  # LoRA's dropout masks
        for _ in range(run):
            loss = F.cross_entropy(model(support_x), support_y)
            for o in opts:
                o.zero_grad(set_to_none=True)
            loss.backward()
            for o in opts:
                o.step()
            loss_value = float(loss.detach())
    model.eval()
    with torch.no_grad():
        probs = model(query_x).softmax(-1)
    return EpisodeResult(probs, run, model.rates(), loss_value)


def run_episode(
    backbone: Backbone, ep: Episode, cfg: AthaConfig, system: str, *, shots: int, seed: int
) -> dict[str, Any]:
    """Accuracy (and the learned rates) of ``system`` on one episode."""
    res = adapt(
        backbone,
        ep.names,
        torch.from_numpy(ep.support_x),
        torch.from_numpy(ep.support_y),
        torch.from_numpy(ep.query_x),
        cfg,
        system,
        shots=shots,
        seed=seed,
    )
    acc = float((res.probs.argmax(-1).numpy() == ep.query_y).mean())
    return {"acc": acc, "rates": res.rates, "loss": res.loss}


def episode_seed(cfg: AthaConfig, domain: str, episode: int) -> int:
    """The seed of an episode's model (LoRA init, dropout, random tokens): the same for every
    system."""
    return cfg.seed * 1_000_003 + DOMAINS.index(domain) * 100_003 + episode


def run_block(
    bb: Backbone, cfg: AthaConfig, system: str, domain: str, shots: int, episodes: list[int]
) -> list[dict[str, Any]]:
    """``system`` on episodes ``episodes`` of ``domain`` (one dict per episode)."""
    pool = domain_pool(domain, cfg.pool_per_class, cfg.seed)
    out = []
    for e in episodes:
        ep = sample_episode(
            pool, seed=cfg.seed, episode=e, n_way=cfg.n_way, shots=shots, queries=cfg.queries
        )
        out.append(run_episode(bb, ep, cfg, system, shots=shots, seed=episode_seed(cfg, domain, e)))
    return out


def episode_accuracy(bb: Backbone, cfg: AthaConfig, systems: Sequence[str]) -> dict[str, float]:
    """1-shot accuracy of ``systems`` on ``eval_episodes`` episodes per domain, in this
    process: ``acc_1shot_<domain>`` and ``acc_1shot_avg`` for the first system, the same with
    ``_<system>`` appended for the others, and ``paired_gain_vs_<second>`` in points."""
    out: dict[str, float] = {}
    per: dict[str, list[float]] = {}
    eps = list(range(cfg.eval_episodes))
    for i, s in enumerate(systems):
        suffix = "" if i == 0 else f"_{s}"
        accs = []
        for d in cfg.domains:
            a = [r["acc"] for r in run_block(bb, cfg, s, d, 1, eps)]
            out[f"acc_1shot_{d}{suffix}"] = float(np.mean(a))
            accs.append(a)
        per[s] = list(np.mean(accs, axis=0))
        out[f"acc_1shot_avg{suffix}"] = float(np.mean(per[s]))
    if len(systems) > 1:
        gain = np.asarray(per[systems[0]]) - np.asarray(per[systems[1]])
        out[f"paired_gain_vs_{systems[1]}"] = float(100 * gain.mean())
    return out
