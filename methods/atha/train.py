"""ATHA's two kinds of training.

* :func:`train_loop` (``nshot train atha``): the backbone every episode starts from. The tiny
  CLIP is pre-trained contrastively (:class:`PretrainRecipe` on :mod:`nshot.train.trainer`), with
  the seed of ``clip_seed`` (:func:`.config.clip_seed_for`, the CLIP the experiments adapt), run by
  :func:`nshot.train.clip.pretrain` in this worker (on a worker group its loop all-gathers the
  image features and averages the gradients over the workers). It runs in chunks of
  ``checkpoint_every`` steps; after each chunk rank 0 reports an nshot checkpoint (the tiny
  CLIP's weights, its config in ``extra``). The pre-training's own
  resume state (weights, optimizer, losses) lives in a work folder beside the run, so a resumed
  run continues from it and ends with the weights of an uninterrupted run. A real CLIP
  (``paper``) is pre-trained already (:class:`PretrainedRecipe`): nothing is trained, and the
  run reports its episode accuracy once, with a checkpoint that records the CLIP.
* :func:`run_episode`: one episode (paper §4.1): a fresh :class:`~.model.EpisodeModel` on the
  backbone, trained ``epochs`` full-support steps (AdamW on LoRA, SGD with momentum on the
  context (:func:`ctx_learning_rate`) and on the rates, cross-entropy at the small logit
  scale), then its queries
  classified; :func:`run_block` every system on a block of a domain's episodes (an episode's
  images read once) and :func:`episode_accuracy` the 1-shot accuracy over the config's domains
  (:func:`pools_of`: the generated ones, or a real CLIP's image folders), the same on either
  backbone.
"""

from __future__ import annotations

import hashlib
import json
import shutil
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from nshot.nn.backbone import CLIPBackbone, load_backbone
from nshot.train import session
from nshot.train.trainer import Recipe, train

from .config import AthaConfig, clip_seed_for
from .data import Episode, Pool, domain_pool, sample_episode
from .model import EpisodeModel, backbone_from_weights

# --------------------------------------------------------------------------------------------
# the backbone (nshot train atha)


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
        from nshot.train.clip import clip_config

        self.work = _work_dir(cfg)
        self.clip_extra = {
            "clip_config": clip_config(cfg.clip_preset, cfg.text).to_dict(),
            "clip_preset": cfg.clip_preset,
            "text": cfg.text,
            "clip_seed": clip_seed_for(cfg),
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
                seed=clip_seed_for(cfg),
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


class PretrainedRecipe(Recipe):
    """A backbone pre-trained already (a real CLIP) as :mod:`nshot.train.trainer` runs it:
    nothing is trained; the last step measures ATHA's and CoOp + LoRA's 1-shot accuracy on
    ``eval_episodes`` episodes per domain (the Tune objective ``acc_1shot_avg``), and the run
    reports it once, with a checkpoint that holds no weights (every episode, and every request
    to the predictor, adapts a fresh copy) and records the backbone (``extra.clip``: its path
    and fingerprint, which :func:`.model.load_model` reads back). A resumed run that reached
    ``steps`` does nothing."""

    def build(self) -> None:
        self.metrics: dict[str, float] = {}
        self.clip_extra: dict[str, Any] = {}

    def schedule(self) -> tuple[int, int, int]:
        steps = int(self.cfg.steps)
        return steps, steps, steps

    def step(self, step: int) -> dict[str, float]:
        cfg = self.cfg
        if step < cfg.steps:
            return {}
        t0 = time.time()
        prepare_data(cfg)
        bb = load_backbone(cfg.backbone_spec(), self.device)
        record = bb.record()  # the CLIP the predictor must find at clip_path
        pools = pools_of(cfg, bb.image_size)
        self.metrics = episode_accuracy(bb, cfg, ["atha", "coop_lora"], pools)  # type: ignore[arg-type]
        self.clip_extra = {"backbone": "clip", "clip_path": str(cfg.clip_path), "clip": record,
                           "domains": list(pools)}  # fmt: skip
        print(f"[nshot atha] pre-trained backbone: {time.time() - t0:.0f}s", flush=True)
        return {}

    def on_report(self, step: int, metrics: dict[str, float]) -> dict[str, float]:
        return dict(self.metrics)

    def state(self) -> dict[str, torch.Tensor]:
        return {}

    def extra(self) -> dict[str, Any]:
        return self.clip_extra


def train_loop(cfg: AthaConfig) -> None:
    """The tiny CLIP (``clip_preset``, ``text``) pre-trained for ``steps`` steps, resumable; or
    one report of a real CLIP's episode accuracy (nothing to pre-train)."""
    train(PretrainRecipe(cfg) if cfg.backbone == "tiny" else PretrainedRecipe(cfg))


def _final_metrics(
    clip_cfg: dict[str, Any], state: dict[str, torch.Tensor], cfg: AthaConfig
) -> dict[str, float]:
    """The precondition (zero-shot 8-way shape accuracy on fresh source-style images) and
    ATHA's 1-shot accuracy on ``eval_episodes`` episodes per domain (the Tune objective)."""
    from nshot.train.clip import zero_shot_report

    bb = backbone_from_weights(clip_cfg, state)
    report = zero_shot_report(bb.model, cfg.clip_preset, clip_seed_for(cfg))  # type: ignore[arg-type]
    out = {"acc_src_8way": float(report["acc_src_8way"])}
    out.update(episode_accuracy(bb, cfg, ["atha"]))
    return out


def _episode_metrics(
    clip_cfg: dict[str, Any], state: dict[str, torch.Tensor], cfg: AthaConfig
) -> dict[str, float]:
    """ATHA's 1-shot accuracy on ``eval_episodes`` episodes per domain of the CLIP so far
    (reported at every checkpoint of a Tune trial: its objective and learning curve)."""
    return episode_accuracy(backbone_from_weights(clip_cfg, state), cfg, ["atha"])


# --------------------------------------------------------------------------------------------
# the config's target domains


def pool_of(cfg: AthaConfig, domain: str, image_size: int) -> Pool:
    """Domain ``domain`` of the config as a pool: a generated domain (a cached table), or with
    ``backbone='clip'`` an image folder of ``data_path`` at the backbone's ``image_size``
    (:func:`.paper_data.folder_pool`)."""
    if cfg.backbone == "clip":
        from .paper_data import folder_pool

        return folder_pool(cfg, domain, image_size)
    return domain_pool(domain, cfg.pool_per_class, cfg.seed)


def domains_of(cfg: AthaConfig) -> list[str]:
    """The config's target domains: ``domains``, or with ``backbone='clip'`` the image folders
    of ``data_path`` (:func:`.paper_data.paper_domains`)."""
    if cfg.backbone == "clip":
        from .paper_data import paper_domains

        return paper_domains(cfg)
    return list(cfg.domains)


def pools_of(cfg: AthaConfig, image_size: int) -> dict[str, Pool]:
    """Every target domain of the config as a pool (:func:`pool_of`)."""
    return {d: pool_of(cfg, d, image_size) for d in domains_of(cfg)}


def prepare_data(cfg: AthaConfig) -> None:
    """Before episodes on a real CLIP: one :class:`~nshot.errors.ConfigError` naming everything
    missing (the CLIP's files and the image folders: :func:`.paper_data.check_paper`). The
    generated domains need nothing."""
    if cfg.backbone == "clip":
        from .paper_data import check_paper

        check_paper(cfg)


# --------------------------------------------------------------------------------------------
# episodes


@dataclass
class EpisodeResult:
    probs: torch.Tensor  # [q, n] query probabilities
    epochs_run: int
    rates: dict[str, list[float]]
    loss: float


def ctx_learning_rate(cfg: AthaConfig, scale: float) -> float:
    """The context's SGD learning rate at logit scale ``scale``: ``lr_ctx``, or with
    ``lr_ctx_logit_scale`` set ``lr_ctx`` carried from that scale to this one (the gradient
    reaching the context is proportional to the logit scale, so CoOp's 2e-3, set at CLIP's
    scale of 100, takes steps 50 times shorter at ATHA's s = 2)."""
    if cfg.lr_ctx_logit_scale is None:
        return cfg.lr_ctx
    return cfg.lr_ctx * cfg.lr_ctx_logit_scale / scale


def adapt(
    backbone: CLIPBackbone,
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
    model = EpisodeModel(backbone, names, cfg, system, shots=shots, seed=seed)
    opts: list[torch.optim.Optimizer] = []
    if model.lora_parameters():
        opts.append(torch.optim.AdamW(model.lora_parameters(), lr=cfg.lr_lora))
    if model.ctx.requires_grad:
        opts.append(
            torch.optim.SGD(
                [model.ctx],
                lr=ctx_learning_rate(cfg, model.scale),
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
    backbone: CLIPBackbone, ep: Episode, cfg: AthaConfig, system: str, *, shots: int, seed: int
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


def episode_seed(cfg: AthaConfig, pool: Pool, episode: int) -> int:
    """The seed of an episode's model (LoRA init, dropout, random tokens): the same for every
    system."""
    return cfg.seed * 1_000_003 + pool.index * 100_003 + episode


def run_block(
    bb: CLIPBackbone,
    cfg: AthaConfig,
    pool: Pool,
    shots: int,
    episodes: Iterable[int],
    systems: Sequence[str],
) -> list[dict[str, Any]]:
    """Every system on each of ``episodes`` of ``pool`` at ``shots`` (an episode's images read
    once for all systems): ``[{"system", "episode", "acc", "rates"}]``, episodes in order."""
    out: list[dict[str, Any]] = []
    for e in episodes:
        ep = sample_episode(pool, seed=cfg.seed, episode=e, n_way=cfg.n_way, shots=shots,
                            queries=cfg.queries)  # fmt: skip
        for s in systems:
            r = run_episode(bb, ep, cfg, s, shots=shots, seed=episode_seed(cfg, pool, e))
            out.append({"system": s, "episode": e, "acc": r["acc"], "rates": r["rates"]})
    return out


def episode_accuracy(
    bb: CLIPBackbone,
    cfg: AthaConfig,
    systems: Sequence[str],
    pools: dict[str, Pool] | None = None,
) -> dict[str, float]:
    """1-shot accuracy of ``systems`` on ``eval_episodes`` episodes of each domain (``pools``,
    default the config's: :func:`pools_of`), in this process: ``acc_1shot_<domain>`` and
    ``acc_1shot_avg`` for the first system, the same with ``_<system>`` appended for the
    others, and ``paired_gain_vs_<second>`` in points."""
    pools = pools_of(cfg, bb.image_size) if pools is None else pools
    accs: dict[tuple[str, str], list[float]] = {}
    for d, pool in pools.items():
        for r in run_block(bb, cfg, pool, 1, range(cfg.eval_episodes), systems):
            accs.setdefault((r["system"], d), []).append(r["acc"])
    out: dict[str, float] = {}
    per: dict[str, list[float]] = {}
    for i, s in enumerate(systems):
        suffix = "" if i == 0 else f"_{s}"
        for d in pools:
            out[f"acc_1shot_{d}{suffix}"] = float(np.mean(accs[(s, d)]))
        per[s] = list(np.mean([accs[(s, d)] for d in pools], axis=0))
        out[f"acc_1shot_avg{suffix}"] = float(np.mean(per[s]))
    if len(systems) > 1:
        gain = np.asarray(per[systems[0]]) - np.asarray(per[systems[1]])
        out[f"paired_gain_vs_{systems[1]}"] = float(100 * gain.mean())
    return out
