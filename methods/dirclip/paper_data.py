"""dirclip's ``paper`` data: training and evaluation images from an ImageFolder (``data_path``),
read per batch, for a real CLIP (``backbone='clip'``); the rest of the method is the toy's.

``data_path`` holds ``train/<class>/*.png|jpg|jpeg`` (the fine-tuning set; ``val_images`` of
it held out for model selection) and ``val/<class>/...`` with the same class folders (the
evaluation set). Class names come from ``data_path/class_names.json`` (folder → name; e.g.
TinyImageNet's WordNet ids to words) or else from the folder names (``_`` as spaces). Images
are read per batch with PIL and CLIP's resize / centre crop (:func:`nshot.nn.hfclip.load_image`);
the normalisation is the backbone's, so attacks run in pixel space as on the toy. Validation
and evaluation run in chunks of ``CHUNK`` images on the model's device; the toy's shifted
domains (``clean_rolled``, ``pgd_rolled``, ``clean_mnist8``) have no counterpart; the
zero-shot datasets of ``eval_paths`` are :mod:`.paper_zeroshot`'s.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from nshot.errors import CheckpointError, ConfigError
from nshot.nn.hfclip import FolderImages

from .config import DirclipConfig
from .paper_zeroshot import CHUNK


def check_paper(cfg: DirclipConfig) -> None:
    """Raise a :class:`ConfigError` naming everything that keeps ``backbone='clip'`` from
    running: the CLIP (``clip_path`` not set, missing, missing files, not a CLIP; the
    tokenizer), ``data_path`` (not set, missing, no ``train/`` or ``val/`` class folders) and
    ``eval_paths`` (:func:`.paper_zeroshot.problems`: a missing folder, fewer than two class
    folders, a name twice, each naming ``eval_paths[i]``)."""
    from nshot.nn.backbone import backbone_problems, raise_problems

    from .paper_zeroshot import problems

    missing = backbone_problems(cfg.backbone_spec())
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
    missing += problems(cfg)
    raise_problems(f"dirclip backbone 'clip' (preset {cfg.preset!r})", missing,
                   "methods/dirclip/README.md (Paper preset)")  # fmt: skip


@dataclass(frozen=True)
class FolderSplits:
    """The interface of :class:`.data.Splits` without the shifted domains."""

    x_train: FolderImages
    y_train: np.ndarray
    x_val: FolderImages
    y_val: np.ndarray
    x_test: FolderImages
    y_test: np.ndarray
    class_names: list[str]
    chunk: int = CHUNK
    shifts: bool = False


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
