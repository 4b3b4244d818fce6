"""dirclip's ``paper`` backbone: UCAT on a real CLIP (ViT-B/32 in the paper, §4) read by path
with :func:`nshot.nn.hfclip.load_pretrained_clip` (a Hugging Face folder, or an OpenAI-format
safetensors file plus its tokenizer), and training images from an ImageFolder.

* Data (``data_path``): ``train/<class>/*.png|jpg|jpeg`` (the fine-tuning set; ``val_images``
  of it held out for model selection) and ``val/<class>/...`` with the same class folders (the
  evaluation set). Class names come from ``data_path/class_names.json`` (folder → name; e.g.
  TinyImageNet's WordNet ids to words) or else from the folder names (``_`` as spaces).
  Images are read per batch with PIL and CLIP's 224 resize / centre crop
  (:func:`nshot.nn.hfclip.load_image`); the normalisation is inside the model, so attacks run
  in pixel space as on the toy.
* The model (:class:`HFDirClip`) has the toy's interface: g is the whole image tower and its
  projection (trainable), g₀ a frozen copy of both, the text tower and the logit scale frozen,
  the text features of ``template`` for the training classes a buffer, logits ``100 · cos``.
* Training reuses the toy's recipe (:class:`.train.DirclipRecipe`: the loss, the attack, the
  schedule and the checkpoints are the toy's code; :func:`.train.fit_model` in-process);
  validation and evaluation run in chunks of ``CHUNK`` images on the worker's device and give
  the toy's metrics except the toy's shifted domains (``clean_rolled``, ``pgd_rolled``,
  ``clean_mnist8``), which have no counterpart.
* A checkpoint holds g's current and selected (``best.*``) weights and the optimiser, and
  records the CLIP it was tuned from (``clip_path``, tokenizer, architecture and a fingerprint
  of its parameters); :func:`load_paper_model` rebuilds the rest from that path, for
  ``nshot eval`` and for the predictor (:mod:`.paper_serve`).
"""

from __future__ import annotations

import copy
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from nshot.errors import CheckpointError, ConfigError
from nshot.method import ResultsTable
from nshot.train.checkpoint import LoadedCheckpoint
from nshot.train.trainer import local_device, train

from .attacks import apgd_ce
from .config import DirclipConfig
from .evaluation import _acc, attack_pgd, harmonic, logit_metrics
from .model import SCALE
from .train import DirclipRecipe, fit_model, trainable_state

CHUNK = 128  # images per forward / attack in validation and evaluation
METRICS = {"clean": True, "pgd": True, "apgd": True, "h": True, "ece_clean": False,
           "ece_adv": False, "ent_ratio": True}  # fmt: skip


# --------------------------------------------------------------------------------------------
# checks


def check_paper(cfg: DirclipConfig) -> None:
    """Raise a :class:`ConfigError` naming everything that keeps ``backbone='clip'`` from
    running: ``clip_path`` (not set, missing, missing files, not a CLIP), the tokenizer, and
    ``data_path`` (not set, missing, no ``train/`` or ``val/`` class folders)."""
    from nshot.nn.hfclip import clip_field_problems

    missing = clip_field_problems(cfg.clip_path, cfg.clip_tokenizer, "openai/clip-vit-base-patch32")
    if not cfg.data_path:
        missing.append("field 'data_path' is not set (an ImageFolder root with train/ and val/)")
    else:
        root = Path(cfg.data_path)
        if not root.is_dir():
            missing.append(f"field 'data_path': {root} is not a directory")
        else:
            for split in ("train", "val"):
                d = root / split
                if not d.is_dir() or not any(c.is_dir() for c in d.iterdir()):
                    missing.append(f"field 'data_path': {d} has no class folders")
    if missing:
        raise ConfigError(
            f"dirclip backbone 'clip' (preset {cfg.preset!r}) needs: " + "; ".join(missing)
            + ". See methods/dirclip/README.md (Paper preset)."
        )  # fmt: skip


# --------------------------------------------------------------------------------------------
# data


class FolderImages:
    """Images of an ImageFolder read on demand: ``x[rows]`` is ``float32 [n, 3, S, S]``."""

    def __init__(self, paths: Sequence[Path], size: int) -> None:
        self.paths = list(paths)
        self.size = size

    def __len__(self) -> int:
        return len(self.paths)

    def __getitem__(self, rows: Any) -> np.ndarray:
        from concurrent.futures import ThreadPoolExecutor

        from nshot.nn.hfclip import load_image

        idx = np.atleast_1d(np.arange(len(self.paths))[rows])
        with ThreadPoolExecutor(max_workers=max(1, min(8, len(idx)))) as pool:  # PIL frees the GIL
            images = list(pool.map(lambda i: load_image(self.paths[i], self.size), idx))
        return np.stack(images)


@dataclass(frozen=True)
class FolderSplits:
    x_train: FolderImages
    y_train: np.ndarray
    x_val: FolderImages
    y_val: np.ndarray
    x_test: FolderImages
    y_test: np.ndarray
    class_names: list[str]


def folder_splits(cfg: DirclipConfig, size: int, seed: int | None = None) -> FolderSplits:
    """``data_path``'s train / held-out / evaluation images (the held-out ones drawn from
    ``train/`` by ``seed`` as on the toy)."""
    from nshot.nn.hfclip import image_folder

    root = Path(cfg.data_path or "")
    try:
        train, test = image_folder(root / "train"), image_folder(root / "val")
    except CheckpointError as e:
        raise ConfigError(f"field 'data_path': {e}") from None
    if test.classes != train.classes:
        raise ConfigError(
            f"field 'data_path': {root / 'val'} has other class folders than {root / 'train'}"
        )
    if cfg.val_images >= len(train.paths):
        raise ConfigError(
            f"field 'val_images': {cfg.val_images} >= the {len(train.paths)} training images"
        )
    seed = cfg.seed if seed is None else seed
    order = np.random.default_rng([seed, 17]).permutation(len(train.paths))
    val, rest = order[: cfg.val_images], order[cfg.val_images :]
    paths = np.array(train.paths, dtype=object)
    names = train.class_names(root / "class_names.json")
    return FolderSplits(
        x_train=FolderImages(paths[rest], size), y_train=train.labels[rest],
        x_val=FolderImages(paths[val], size), y_val=train.labels[val],
        x_test=FolderImages(test.paths, size), y_test=test.labels, class_names=names,
    )  # fmt: skip


# --------------------------------------------------------------------------------------------
# the model


class HFDirClip(nn.Module):
    """UCAT's model on a ``transformers.CLIPModel`` (see the module docstring); the interface
    of :class:`.model.DirClip`."""

    TRAINABLE = ("clip.vision_model.", "clip.visual_projection.")
    #: s of the logits: real CLIP's own frozen scale (its logit_scale is clamped at ln 100)
    scale: float = SCALE

    def __init__(self, pretrained: Any, class_names: Sequence[str], template: str) -> None:
        super().__init__()
        self.pre = pretrained
        self.clip = pretrained.model
        self.orig_vision = copy.deepcopy(self.clip.vision_model)
        self.orig_proj = copy.deepcopy(self.clip.visual_projection)
        for p in self.parameters():
            p.requires_grad_(False)
        for p in self.trainable():
            p.requires_grad_(True)
        self.register_buffer("mean", torch.tensor(pretrained.mean)[:, None, None])
        self.register_buffer("std", torch.tensor(pretrained.std)[:, None, None])
        self.class_names = list(class_names)
        self.template = template
        self.register_buffer("text_features", self.text_features_of(self.class_names, template))

    def trainable(self) -> list[nn.Parameter]:
        return [*self.clip.vision_model.parameters(), *self.clip.visual_projection.parameters()]

    def images(self, x: torch.Tensor) -> torch.Tensor:
        return x

    @torch.no_grad()
    def text_features_of(self, class_names: Sequence[str], template: str) -> torch.Tensor:
        return self.pre.encode_text([template.format(n) for n in class_names], normalize=True)

    def features(self, images: torch.Tensor, original: bool = False) -> torch.Tensor:
        x = (images - self.mean) / self.std
        if original:
            return self.orig_proj(self.orig_vision(pixel_values=x).pooler_output)
        return self.clip.visual_projection(self.clip.vision_model(pixel_values=x).pooler_output)

    def logits(
        self,
        images: torch.Tensor,
        original: bool = False,
        text_features: torch.Tensor | None = None,
    ) -> torch.Tensor:
        t = self.text_features if text_features is None else text_features
        img = F.normalize(self.features(images, original), dim=-1)
        return self.scale * img @ t.T

    def forward(self, images: torch.Tensor, features: bool = False) -> torch.Tensor:
        return self.features(images) if features else self.logits(images)


def load_backbone(cfg: DirclipConfig) -> Any:
    """The CLIP at ``clip_path``, checked against ``clip_arch``."""
    from nshot.nn.hfclip import load_clip_fields

    check_paper(cfg)
    return load_clip_fields(cfg.clip_path, cfg.clip_tokenizer, cfg.clip_arch)


def build_paper_model(cfg: DirclipConfig, class_names: Sequence[str]) -> HFDirClip:
    return HFDirClip(load_backbone(cfg), class_names, cfg.template)


# --------------------------------------------------------------------------------------------
# validation and evaluation (chunked, on the model's device)


def _device(model: nn.Module) -> torch.device:
    return next(model.parameters()).device


@torch.no_grad()
def _logits(model: HFDirClip, x: torch.Tensor) -> torch.Tensor:
    return model.logits(x).cpu()


def _clean_and_pgd(
    model: HFDirClip, images: FolderImages, y: np.ndarray, cfg: DirclipConfig, steps: int,
    generator: torch.Generator, limit: int | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:  # fmt: skip
    """Clean and PGD-``steps`` logits (CPU) of the first ``limit`` images, chunk by chunk."""
    dev = _device(model)
    n = len(y) if limit is None else min(limit, len(y))
    lc, la = [], []
    for i in range(0, n, CHUNK):
        rows = np.arange(i, min(n, i + CHUNK))
        x, yy = torch.from_numpy(images[rows]).to(dev), torch.from_numpy(y[rows]).to(dev)
        lc.append(_logits(model, x))
        la.append(_logits(model, attack_pgd(model, x, yy, cfg, steps, generator)))
    return torch.cat(lc), torch.cat(la), torch.from_numpy(y[:n])


def paper_validation(
    model: HFDirClip, splits: FolderSplits, cfg: DirclipConfig, step: int
) -> dict[str, float]:
    """The toy's selection criterion on the held-out training images, in chunks."""
    gen = torch.Generator().manual_seed(cfg.seed * 1_000_003 + step)
    was = model.training
    model.eval()
    lc, la, y = _clean_and_pgd(model, splits.x_val, splits.y_val, cfg, cfg.val_pgd_steps, gen)
    model.train(was)
    clean, adv = _acc(lc, y), _acc(la, y)
    return {"val_clean": clean, "val_pgd": adv, "val_h": harmonic(clean, adv)}


def paper_evaluate(
    model: HFDirClip, splits: FolderSplits, cfg: DirclipConfig, seed: int
) -> dict[str, float]:
    """The toy's metrics on ``val/`` (clean, PGD-``pgd_steps``, APGD-CE on the first
    ``apgd_images``, ECE, the entropy ratio, the Dirichlet read-outs)."""
    model.eval()
    gen = torch.Generator().manual_seed(10_007 * seed + 1)
    lc, la, y = _clean_and_pgd(model, splits.x_test, splits.y_test, cfg, cfg.pgd_steps, gen)
    out = logit_metrics(lc, la, y)
    dev = _device(model)
    n = min(cfg.apgd_images, len(y))
    gen_a = torch.Generator().manual_seed(10_007 * seed + 2)
    right = 0.0
    for i in range(0, n, CHUNK):
        rows = np.arange(i, min(n, i + CHUNK))
        x = torch.from_numpy(splits.x_test[rows]).to(dev)
        yy = torch.from_numpy(splits.y_test[rows]).to(dev)
        xa = apgd_ce(model.logits, x, yy, cfg.eps, cfg.apgd_steps, generator=gen_a)
        right += float((_logits(model, xa).argmax(-1) == yy.cpu()).sum())
    out["apgd"] = right / n if n else float("nan")
    out["pgd_on_apgd_images"] = float((la[:n].argmax(-1) == y[:n]).double().mean())
    return {k: float(v) for k, v in out.items() if v == v}


# --------------------------------------------------------------------------------------------
# training under Ray Train, checkpoints


def _record(cfg: DirclipConfig, model: HFDirClip, clip: dict[str, Any]) -> dict[str, Any]:
    """The checkpoint's model record: the CLIP it is tuned from (``clip``: path, tokenizer,
    architecture, parameter fingerprint), the training classes and the template."""
    return {"backbone": "clip", **clip, "class_names": model.class_names,
            "template": model.template}  # fmt: skip


class PaperRecipe(DirclipRecipe):
    """The toy's recipe (:class:`.train.DirclipRecipe`) on the real CLIP: each worker attacks
    and trains on its shard of the global batch on its device (DDP averages g's gradients);
    validation by :func:`paper_validation`; checkpoints hold g only (current and ``best.*``),
    and record the CLIP it was tuned from."""

    clean_rows = CHUNK

    def __init__(self, cfg: DirclipConfig) -> None:
        super().__init__(cfg, validate=paper_validation)

    def make(self) -> None:
        from nshot.nn.hfclip import clip_record

        cfg = self.cfg
        pre = load_backbone(cfg)
        self.clip = clip_record(cfg, pre)  # of the CLIP as read, before any weight is tuned
        self.splits = folder_splits(cfg, pre.image_size)
        torch.manual_seed(cfg.seed)
        self.net = HFDirClip(pre, self.splits.class_names, cfg.template)

    def current_state(self) -> dict[str, torch.Tensor]:
        return trainable_state(self.net)

    def model_record(self) -> dict[str, Any]:
        return _record(self.cfg, self.net, self.clip)


def train_loop(cfg: DirclipConfig) -> None:
    """The toy's training loop on the real CLIP (:class:`PaperRecipe`)."""
    train(PaperRecipe(cfg))


def load_paper_model(checkpoint: LoadedCheckpoint) -> tuple[HFDirClip, DirclipConfig, dict]:
    """The selected g of a ``backbone='clip'`` checkpoint on the CLIP of its ``clip_path``:
    the frozen parts (g₀, the text tower) are read from that path, checked against the
    recorded fingerprint, and the checkpoint's ``best.*`` weights replace g. Needs no
    ``data_path`` (serving); a :class:`CheckpointError` names ``clip_path`` when this machine
    lacks that CLIP."""
    from nshot.nn.hfclip import load_recorded_clip

    cfg = DirclipConfig.validated(checkpoint.config)
    rec = checkpoint.extra.get("model")
    if not isinstance(rec, dict) or rec.get("backbone") != "clip":
        raise CheckpointError(f"{checkpoint.path}: not a dirclip checkpoint of backbone 'clip'")
    names = rec.get("class_names")
    if not isinstance(names, list) or not 2 <= len(names) <= 100_000:
        raise CheckpointError(f"{checkpoint.path}: the model record's class names are invalid")
    pre = load_recorded_clip(checkpoint.config, rec, checkpoint.path)
    model = HFDirClip(pre, names, str(rec.get("template", cfg.template)))
    state = dict(checkpoint.weights())
    best = {k.removeprefix("best."): v for k, v in state.items() if k.startswith("best.")}
    expected = set(trainable_state(model))
    if set(best) != expected:
        odd = sorted(set(best) ^ expected)
        raise CheckpointError(f"{checkpoint.path}: best.* weights do not fit g (e.g. {odd[0]!r})")
    try:
        model.load_state_dict({**model.state_dict(), **best})
    except RuntimeError as err:
        raise CheckpointError(f"{checkpoint.path}: weights do not fit the model: {err}") from None
    return model.eval(), cfg, checkpoint.extra


def evaluate(checkpoint: LoadedCheckpoint, cfg: DirclipConfig) -> dict[str, float]:
    model, ckpt_cfg, _ = load_paper_model(checkpoint)
    run_cfg = ckpt_cfg.replace(**{k: getattr(cfg, k) for k in DirclipConfig.EVAL_FIELDS})
    model = model.to(local_device())
    splits = folder_splits(run_cfg, model.pre.image_size)
    return paper_evaluate(model, splits, run_cfg, run_cfg.seed)


# --------------------------------------------------------------------------------------------
# the reproduction at the paper's scale (one process, the rows in turn on one device)


def paper_job(cfg_dict: dict[str, Any], system: str, seed: int) -> dict[str, Any]:
    """One (row, seed) of the paper comparison as a Ray task: the CLIP at ``clip_path`` and
    the image folders loaded here, on this task's device (its GPU when it holds one), the row
    trained (the untrained ``clip`` row only evaluated) and evaluated."""
    from .experiments import SYSTEMS

    t0 = time.time()
    cfg = DirclipConfig.validated(cfg_dict)
    device = local_device()
    pre = load_backbone(cfg)
    splits = folder_splits(cfg, pre.image_size)
    over = SYSTEMS[system]
    run = cfg.replace(**(over or {}), seed=seed)
    torch.manual_seed(seed)
    model = HFDirClip(pre, splits.class_names, cfg.template).to(device)
    step = None
    if over is not None:
        model, best = fit_model(run, splits, model, validate=paper_validation)
        step = best.get("step")
    metrics = paper_evaluate(model, splits, run, seed)
    print(f"[nshot dirclip paper] {system} seed {seed}: {metrics}", flush=True)
    return {
        "metrics": metrics,
        "step": step,
        "seconds": round(time.time() - t0, 1),
        "n_train": len(splits.y_train),
        "n_classes": len(splits.class_names),
        "n_test": len(splits.y_test),
    }


def run_experiments(cfg: DirclipConfig, workdir: Path) -> ResultsTable:
    """Every row of the toy's table (``clip`` untrained, the trained losses, the λ = 0 control)
    for ``seeds`` seeds, one Ray task per (row, seed) (:func:`paper_job`; each training task
    asks for a GPU under ``nshot reproduce --scale``); the weights and folders are checked here
    first, so a missing path fails before any task starts."""
    from nshot.experiment import Job, aggregate, is_planning, run_jobs

    from .experiments import SYSTEMS

    t0 = time.time()
    workdir.mkdir(parents=True, exist_ok=True)
    if not is_planning():  # a dry run lists the grid without the user's weights and images
        check_paper(cfg)
    seeds = [cfg.seed + i for i in range(cfg.seeds)]
    jobs = [
        Job((system, seed), paper_job, (cfg.model_dump(), system, seed), trains=over is not None)
        for system, over in SYSTEMS.items()
        for seed in seeds
    ]
    done = run_jobs(jobs, description=f"dirclip {cfg.preset}")
    per = {key: res["metrics"] for key, res in done.items()}
    selected: dict[str, list[Any]] = {}
    for (system, _), res in done.items():
        if SYSTEMS[system] is not None:
            selected.setdefault(system, []).append(res["step"])
    seconds = {f"{system}/{seed}": res["seconds"] for (system, seed), res in done.items()}
    first = next(iter(done.values()))
    rows, stds, samples = aggregate(per)
    return ResultsTable(
        method="dirclip", preset=cfg.preset, seeds=len(seeds), metrics=METRICS, rows=rows,
        stds=stds, samples=samples, runtime_s=time.time() - t0,
        notes=[f"CLIP {cfg.clip_arch} from {cfg.clip_path}; {first['n_train']} training "
               f"images of {first['n_classes']} classes ({cfg.val_images} held out), "
               f"{first['n_test']} evaluation images; {cfg.steps} steps of "
               f"{cfg.batch_size}, {cfg.optimizer} lr {cfg.lr:g}, ε = {cfg.eps:g}."],
        extra={"selected_step": selected, "job_seconds": seconds},
    )  # fmt: skip
