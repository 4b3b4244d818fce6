"""ATHA's ``paper`` preset on a real CLIP: ``nshot train`` / ``eval`` / ``reproduce`` for
``backbone='clip'`` (:mod:`.clip_backbone`), with the toy's episode loop
(:func:`.train.run_episode`) and table (:func:`.experiments.summarise`).

* ``train_loop`` (:class:`PaperRecipe`): the CLIP is pre-trained already, so nothing is
  pre-trained: the run reports one checkpoint with ATHA's and CoOp + LoRA's 1-shot accuracy
  on ``eval_episodes`` episodes per domain (the Tune objective ``acc_1shot_avg``). It holds no
  weights (every episode, and every request to the predictor, adapts a fresh copy of the
  CLIP): it records the CLIP
  (``clip_path``, tokenizer, architecture in its config; a parameter fingerprint in
  ``extra.clip``), which :mod:`.serve` reads back from that path.
* ``evaluate``: the same on the checkpoint's CLIP.
* ``run_experiments``: every system on the same episodes of every domain, as Ray tasks of
  ``episodes_per_job`` episodes on ``job_gpus`` GPUs each, an episode's images read once for
  all systems; the toy's rows, metrics and paired gains (``acc_src_8way``, the tiny CLIP's
  precondition, has no counterpart: null).
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import numpy as np
import torch

from nshot.errors import CheckpointError
from nshot.experiment import Job, check_gpus, is_planning, run_jobs
from nshot.method import ResultsTable
from nshot.train.trainer import Recipe, local_device, train

from .clip_backbone import (
    FolderPool,
    HFBackbone,
    folder_pool,
    load_hf_backbone,
    paper_domains,
    sample_folder_episode,
)
from .config import AthaConfig
from .experiments import ATHA_VARIANTS, summarise
from .train import run_episode


def _device() -> torch.device:
    return local_device()


def episode_seed(cfg: AthaConfig, pool: FolderPool, episode: int) -> int:
    """The seed of an episode's model, the same for every system."""
    return cfg.seed * 1_000_003 + pool.index * 100_003 + episode


def domain_episodes(bb: HFBackbone, cfg: AthaConfig, pool: FolderPool, shots: int,
                    episodes: Iterable[int], systems: list[str]) -> list[dict[str, Any]]:  # fmt: skip
    """Every system on each of ``episodes`` of ``pool`` at ``shots`` (an episode's images read
    once for all systems): ``[{"system", "episode", "acc", "rates"}]`` in episode order."""
    out: list[dict[str, Any]] = []
    for e in episodes:
        ep = sample_folder_episode(pool, seed=cfg.seed, episode=e, n_way=cfg.n_way, shots=shots,
                                   queries=cfg.queries)  # fmt: skip
        for s in systems:
            r = run_episode(bb, ep, cfg, s, shots=shots, seed=episode_seed(cfg, pool, e))
            out.append({"system": s, "episode": e, "acc": r["acc"], "rates": r["rates"]})
    return out


def paper_accuracy(
    bb: HFBackbone, cfg: AthaConfig, systems: list[str], episodes: int | None = None
) -> dict[str, float]:
    """1-shot accuracy of ``systems`` on ``eval_episodes`` episodes per domain, keyed as
    :func:`.train.episode_accuracy` keys it."""
    n = cfg.eval_episodes if episodes is None else episodes
    out: dict[str, float] = {}
    per: dict[str, list[float]] = {s: [] for s in systems}
    accs: dict[tuple[str, str], list[float]] = {}
    domains = paper_domains(cfg)
    for d in domains:
        pool = folder_pool(cfg, d, bb.image_size)
        for r in domain_episodes(bb, cfg, pool, 1, range(n), systems):
            accs.setdefault((r["system"], d), []).append(r["acc"])
    for i, s in enumerate(systems):
        suffix = "" if i == 0 else f"_{s}"
        for d in domains:
            out[f"acc_1shot_{d}{suffix}"] = float(np.mean(accs[(s, d)]))
        per[s] = list(np.mean([accs[(s, d)] for d in domains], axis=0))
        out[f"acc_1shot_avg{suffix}"] = float(np.mean(per[s]))
    if len(systems) > 1:
        gain = np.asarray(per[systems[0]]) - np.asarray(per[systems[1]])
        out[f"paired_gain_vs_{systems[1]}"] = float(100 * gain.mean())
    return out


class PaperRecipe(Recipe):
    """The real CLIP's run as :mod:`nshot.train.trainer` runs it: nothing is trained; the last
    step measures ATHA's and CoOp + LoRA's 1-shot accuracy, and the run reports it once, with a
    checkpoint that holds no weights (the CLIP it records is read back from ``clip_path``). A
    resumed run that reached ``steps`` does nothing."""

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
        from nshot.nn.hfclip import clip_record

        t0 = time.time()
        bb = load_hf_backbone(cfg, self.device)
        clip = clip_record(cfg, bb.pre)  # the CLIP the predictor must find at clip_path
        self.metrics = paper_accuracy(bb, cfg, ["atha", "coop_lora"])
        self.clip_extra = {"backbone": "clip", "clip_path": str(cfg.clip_path), "clip": clip,
                           "domains": paper_domains(cfg)}  # fmt: skip
        print(f"[nshot atha] paper backbone: {time.time() - t0:.0f}s", flush=True)
        return {}

    def on_report(self, step: int, metrics: dict[str, float]) -> dict[str, float]:
        return dict(self.metrics)

    def state(self) -> dict[str, torch.Tensor]:
        return {}

    def extra(self) -> dict[str, Any]:
        return self.clip_extra


def train_loop(cfg: AthaConfig) -> None:
    """One report: the real CLIP's ATHA and CoOp + LoRA 1-shot accuracy (no pre-training)."""
    train(PaperRecipe(cfg))


def evaluate(checkpoint: Any, cfg: AthaConfig) -> dict[str, float]:
    """ATHA's and CoOp + LoRA's 1-shot accuracy on the checkpoint's CLIP and domains."""
    ckpt_cfg = AthaConfig.validated(checkpoint.config)
    if ckpt_cfg.backbone != "clip":
        raise CheckpointError(f"{checkpoint.path}: not an atha checkpoint of backbone 'clip'")
    run_cfg = ckpt_cfg.replace(**{k: getattr(cfg, k) for k in AthaConfig.EVAL_FIELDS
                                  if k != "domains"})  # fmt: skip
    return paper_accuracy(load_hf_backbone(run_cfg, _device()), run_cfg, ["atha", "coop_lora"])


def unit_checks(bb: HFBackbone, cfg: AthaConfig, names: list[str]) -> dict[str, float]:
    """On the run's CLIP: ρ = 0 against CoOp + LoRA (max |Δ logit|), zero-shot prompt features
    against the CLIP's own text features (max |Δ|), the anchors' reconstruction (relative)."""
    x = torch.rand(2, 3, bb.image_size, bb.image_size, generator=torch.Generator().manual_seed(0))
    a = bb.episode_model(names, cfg, "atha", shots=1, seed=0)
    b = bb.episode_model(names, cfg, "coop_lora", shots=1, seed=0)
    z = bb.episode_model(names, cfg, "zero_shot", shots=1, seed=0)
    with torch.no_grad():
        a.rho_plus.zero_()
        diff = float((a(x) - b(x)).abs().max())
        text, anchor_text = z.text_features()
        ref = bb.pre.encode_text([f"{cfg.ctx_init} {n}" for n in names])
        prompt = float((text - ref).abs().max())
        ln = z.vision.post_layernorm
        back = z.visual_projection(z.anchors(anchor_text) * ln.weight + ln.bias)
        rel = float(((back - anchor_text).norm(dim=-1) / anchor_text.norm(dim=-1)).max())
    return {"rho0_max_abs_logit_diff": diff, "prompt_max_abs_diff": prompt,
            "anchor_rel_error": rel}  # fmt: skip


def episodes_job(cfg_dict: dict, domain: str, shots: int, episodes: list[int],
                 systems: list[str]) -> list[dict[str, Any]]:  # fmt: skip
    """One task of the reproduction: :func:`domain_episodes` of ``domain`` on this task's
    device (its GPU when it reserved one)."""
    cfg = AthaConfig.validated(cfg_dict)
    bb = load_hf_backbone(cfg, _device())
    return domain_episodes(bb, cfg, folder_pool(cfg, domain, bb.image_size), shots, episodes,
                           systems)  # fmt: skip


def run_experiments(cfg: AthaConfig, workdir: Path) -> ResultsTable:
    """Every system on the same episodes of every image-folder domain (see the module
    docstring), as Ray tasks of ``episodes_per_job`` episodes that reserve ``job_gpus`` GPUs
    each (a fraction shares a GPU); the unit checks in this process."""
    t0 = time.time()
    workdir.mkdir(parents=True, exist_ok=True)
    check_gpus(cfg.job_gpus)
    if is_planning():  # a dry run lists the grid from the config: no weights, no images read
        domains = list(cfg.data_domains) or ["<each domain folder of data_path>"]
    else:
        bb = load_hf_backbone(cfg, _device())
        domains = paper_domains(cfg)
        pools = {d: folder_pool(cfg, d, bb.image_size) for d in domains}  # checks every domain
    shots_runs = [(1, cfg.episodes_1shot, list(cfg.systems))]
    if cfg.episodes_5shot:
        shots_runs.append((5, cfg.episodes_5shot, list(cfg.systems_5shot)))
    jobs = [
        Job((d, shots, start), episodes_job,
            (cfg.model_dump(), d, shots,
             list(range(start, min(n_ep, start + cfg.episodes_per_job))), systems),
            num_gpus=cfg.job_gpus, trains=True)
        for shots, n_ep, systems in shots_runs for d in domains
        for start in range(0, n_ep, cfg.episodes_per_job)
    ]  # fmt: skip
    done = run_jobs(jobs, description=f"atha {cfg.preset}")
    acc: dict[tuple[str, str, int], list[float]] = {}
    rates: dict[str, list[dict[str, list[float]]]] = {}
    for (d, shots, _), res in done.items():  # the jobs' order: episodes in order per domain
        for r in res:
            acc.setdefault((r["system"], d, shots), []).append(r["acc"])
            rates.setdefault(r["system"], []).append(r["rates"])
    table = summarise(cfg.model_copy(update={"domains": domains}), acc, None)
    extra = table.extra
    extra["unit"] = unit_checks(bb, cfg, list(pools[domains[0]].names[:2]))
    extra["rates_per_block"] = {
        s: {k: np.mean([r[k] for r in rates[s]], 0).round(4).tolist() for k in ("head", "tail")}
        for s in ATHA_VARIANTS
        if s in rates
    }
    extra["clip"] = {"path": str(cfg.clip_path), "arch": cfg.clip_arch, "domains": domains}
    extra["seconds"] = {"total": round(time.time() - t0, 1)}
    table.notes.append(f"backbone: CLIP {cfg.clip_arch} from {cfg.clip_path}; domains {domains}")
    table.runtime_s = time.time() - t0
    return table
