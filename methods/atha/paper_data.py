"""ATHA's ``paper`` data: target domains in image folders (``data_path``), for a real CLIP
(``backbone='clip'``); the rest of the method is the toy's.

One folder per domain, each an ImageFolder (``<domain>/<class>/*.png|jpg|jpeg``; BSCD-FSL's
CropDiseases, EuroSAT, ISIC2018, ChestX arranged so); ``data_domains`` picks some (default:
every subfolder). Class names as :meth:`nshot.nn.hfclip.ImageFolder.class_names` (a
``class_names.json`` in the domain folder, or the folder names). A domain is a
:class:`.data.Pool` whose images are read when an episode takes them (CLIP's preprocessing at
the backbone's resolution, :func:`nshot.nn.hfclip.load_image`, kept in a per-process cache), so
episodes are sampled as on the toy (:func:`.data.sample_episode`, a function of ``(seed,
domain, episode)``).
"""

from __future__ import annotations

import zlib
from pathlib import Path

import numpy as np

from nshot.errors import CheckpointError, ConfigError
from nshot.nn.hfclip import FolderImages

from .config import AthaConfig
from .data import Pool


def check_paper(cfg: AthaConfig) -> None:
    """Raise a :class:`ConfigError` naming everything that keeps ``backbone='clip'`` from
    running: the CLIP (``clip_path`` not set, missing, missing files, not a CLIP; the
    tokenizer) and ``data_path`` (not set, missing, no domain folders, an unknown
    ``data_domains`` entry)."""
    from nshot.nn.backbone import backbone_problems, raise_problems

    missing = backbone_problems(cfg.backbone_spec())
    if not cfg.data_path:
        missing.append(
            "field 'data_path' is not set (a folder of target domains, each class folders)"
        )
    else:
        root = Path(cfg.data_path)
        if not root.is_dir():
            missing.append(f"field 'data_path': {root} is not a directory")
        else:
            found = _domain_folders(root)
            if not found:
                missing.append(f"field 'data_path': {root} has no domain folders")
            for d in cfg.data_domains:
                if d not in found:
                    missing.append(f"field 'data_domains': {d!r} is not a folder of {root}")
    raise_problems(f"atha backbone 'clip' (preset {cfg.preset!r})", missing,
                   "methods/atha/README.md (Paper preset)")  # fmt: skip


def _domain_folders(root: Path) -> list[str]:
    return sorted(d.name for d in root.iterdir() if d.is_dir() and not d.name.startswith("."))


def paper_domains(cfg: AthaConfig) -> list[str]:
    """The target domains of ``backbone='clip'``: ``data_domains`` or every subfolder."""
    return list(cfg.data_domains) or _domain_folders(Path(cfg.data_path or ""))


def folder_pool(cfg: AthaConfig, domain: str, size: int) -> Pool:
    """Domain ``domain`` of ``data_path`` as a pool of ``size``-pixel images, checked: at least
    ``n_way`` classes of at least 10 + ``queries`` images each."""
    from nshot.nn.hfclip import image_folder

    domains = paper_domains(cfg)
    try:
        f = image_folder(Path(cfg.data_path or "") / domain)
    except CheckpointError as e:
        raise ConfigError(f"field 'data_path': {e}") from None
    if len(f.classes) < cfg.n_way:
        raise ConfigError(
            f"field 'n_way': {cfg.n_way} > the {len(f.classes)} classes of domain {domain!r}"
        )
    counts = np.bincount(f.labels, minlength=len(f.classes))
    if counts.min() < 10 + cfg.queries:
        c = f.classes[int(counts.argmin())]
        raise ConfigError(
            f"field 'queries': class {c!r} of domain {domain!r} has {counts.min()} images; "
            f"episodes need 10 + queries = {10 + cfg.queries}"
        )
    index = domains.index(domain) if domain in domains else zlib.crc32(domain.encode())
    images = FolderImages(f.paths, size, cache=True)
    return Pool(domain, images, f.labels, tuple(f.class_names()), index)


def folder_pools(cfg: AthaConfig, size: int) -> dict[str, Pool]:
    """Every domain of :func:`paper_domains` as a pool."""
    return {d: folder_pool(cfg, d, size) for d in paper_domains(cfg)}
