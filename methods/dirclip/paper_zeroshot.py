"""dirclip's zero-shot evaluation datasets (``eval_paths``, ``backbone='clip'`` only): the
paper's claim is zero-shot robustness and calibration over many datasets (its main table
averages 16 zero-shot sets), so a ``paper`` checkpoint is also scored on image folders it was
never tuned on, each on the prompts of its own classes.

Each entry of ``eval_paths`` is ``PATH`` (named by its folder's name) or ``NAME=PATH`` (NAME:
letters, digits, ``.``, ``_``, ``-``; not ``mean``; names unique). The evaluation images are
``PATH/test/<class>/*`` when ``PATH/test`` exists, else ``PATH/val/<class>/*`` when
``PATH/val`` exists, else ``PATH/<class>/*``; at least two class folders. Class names come
from ``PATH/class_names.json`` (folder → name) or else the folder names (``_`` as spaces), as
for ``data_path``. The tuned tower is scored with the frozen text tower's features of
``template.format(name)`` for that dataset's names (nothing was trained on them), by the
evaluation of ``data_path``'s ``val/`` (:func:`.evaluation.evaluate_model`: the same metrics,
PGD on every image, APGD-CE on ``apgd_images`` of them), read per batch in chunks of
:data:`CHUNK` on the model's device. Metrics are ``zs/<name>/<metric>``, and
``zs/mean/<metric>`` the mean over the datasets of each metric every dataset has.
"""

from __future__ import annotations

import re
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from nshot.errors import CheckpointError, ConfigError
from nshot.nn.hfclip import FolderImages, ImageFolder

from .config import DirclipConfig

CHUNK = 128  # images per forward / attack in validation and evaluation (the paper path)

PREFIX = "zs"  # metric names: zs/<dataset>/<metric>, zs/mean/<metric>
MEAN = "mean"
NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")
SPLITS = ("test", "val")  # the evaluation images' folder, the first that exists
SEE = "methods/dirclip/README.md (Paper preset)"


@dataclass(frozen=True)
class EvalSet:
    """One zero-shot dataset: its name, the folder given, its evaluation images and their
    class names."""

    name: str
    root: Path
    folder: ImageFolder
    class_names: list[str]


@dataclass(frozen=True)
class EvalImages:
    """The part of :class:`.paper_data.FolderSplits` that :func:`.evaluation.evaluate_model`
    reads: the evaluation images, their labels, the chunk, no shifted domains."""

    x_test: FolderImages
    y_test: np.ndarray
    chunk: int
    shifts: bool = False


def parse_entry(entry: str) -> tuple[str, Path]:
    """``(name, path)`` of an ``eval_paths`` entry: ``NAME=PATH`` when the text before the first
    ``=`` is a name, else ``PATH`` named by its folder."""
    name, sep, rest = entry.partition("=")
    if sep and NAME.fullmatch(name):
        return name, Path(rest).expanduser()
    path = Path(entry).expanduser()
    return (path.resolve().name if entry else ""), path


def names(cfg: DirclipConfig) -> list[str]:
    """The datasets' names, in order (read from the config alone)."""
    return [parse_entry(e)[0] for e in cfg.eval_paths]


def split_dir(root: Path) -> Path:
    """The folder of a dataset's evaluation images: ``test/``, else ``val/``, else the root."""
    return next((root / s for s in SPLITS if (root / s).is_dir()), root)


def problems(cfg: DirclipConfig) -> list[str]:
    """Every problem of ``eval_paths``, each naming ``eval_paths[i]``: an unusable or reserved
    name, a name given twice, a missing folder, fewer than two class folders."""
    out: list[str] = []
    seen: dict[str, int] = {}
    for i, entry in enumerate(cfg.eval_paths):
        field = f"field 'eval_paths[{i}]'"
        name, root = parse_entry(entry)
        if not entry.strip():
            out.append(f"{field}: empty")
            continue
        if not NAME.fullmatch(name):
            out.append(f"{field}: the folder name {name!r} is not a dataset name (letters, "
                       "digits, '.', '_', '-'); give one as NAME=PATH")  # fmt: skip
        elif name == MEAN:
            out.append(f"{field}: the name {MEAN!r} is reserved (zs/mean/...); give another "
                       "as NAME=PATH")  # fmt: skip
        elif name in seen:
            out.append(f"{field}: the name {name!r} is eval_paths[{seen[name]}]'s too; give "
                       "each dataset its own as NAME=PATH")  # fmt: skip
        else:
            seen[name] = i
        if not root.is_dir():
            out.append(f"{field}: {root} is not a directory")
            continue
        d = split_dir(root)
        classes = [c for c in d.iterdir() if c.is_dir() and not c.name.startswith(".")]
        if len(classes) < 2:
            out.append(f"{field}: {d} has {len(classes)} class folder(s); zero-shot "
                       "evaluation needs at least 2")  # fmt: skip
    return out


def check(cfg: DirclipConfig) -> None:
    """One :class:`ConfigError` naming every problem of ``eval_paths``; nothing when none."""
    found = problems(cfg)
    if found:
        raise ConfigError("dirclip zero-shot datasets: " + "; ".join(found) + f". See {SEE}.")


def eval_sets(cfg: DirclipConfig) -> list[EvalSet]:
    """The datasets of ``eval_paths``, listed (:func:`check` first: every problem at once;
    then a class folder without images or an unreadable ``class_names.json``, naming
    ``eval_paths[i]``)."""
    from nshot.nn.hfclip import image_folder

    check(cfg)
    out = []
    for i, entry in enumerate(cfg.eval_paths):
        name, root = parse_entry(entry)
        try:
            folder = image_folder(split_dir(root))
            class_names = folder.class_names(root / "class_names.json")
        except CheckpointError as e:
            raise ConfigError(f"field 'eval_paths[{i}]': {e}") from None
        if len(set(class_names)) < len(class_names):
            raise ConfigError(f"field 'eval_paths[{i}]': two classes share a name in "
                              f"{root / 'class_names.json'}")  # fmt: skip
        out.append(EvalSet(name, root, folder, class_names))
    return out


@contextmanager
def class_prompts(model, class_names: list[str]) -> Iterator[None]:  # noqa: ANN001
    """The model's classifier set, for the block, to the frozen text tower's features of
    ``class_names`` (the training classes' afterwards)."""
    saved = model.text_features, model.class_names
    feats = model.text_features_of(class_names, model.template).to(saved[0])
    model.text_features, model.class_names = feats, list(class_names)
    try:
        yield
    finally:
        model.text_features, model.class_names = saved


def _say(msg: str) -> None:
    print(f"[dirclip] {msg}", file=sys.stderr, flush=True)


def zero_shot_metrics(
    model, sets: list[EvalSet], cfg: DirclipConfig, seed: int, *, evaluate, apgd: bool = True,
    apgd_offset: int = 0,
) -> dict[str, float]:  # fmt: skip
    """``zs/<name>/<metric>`` for every dataset (:func:`.evaluation.evaluate_model` on its
    images and class prompts, one line of progress each) and ``zs/mean/<metric>``: the mean
    over the datasets of each metric all of them have. ``evaluate`` is
    :func:`.evaluation.evaluate_model` (passed in: that module imports this one)."""
    out: dict[str, float] = {}
    per: list[dict[str, float]] = []
    size = model.backbone.image_size
    for k, s in enumerate(sets):
        t0 = time.time()
        images = EvalImages(FolderImages(s.folder.paths, size), s.folder.labels, CHUNK)
        with class_prompts(model, s.class_names):
            m = evaluate(model, images, cfg, seed, shifts=False, apgd=apgd,
                         apgd_offset=apgd_offset)  # fmt: skip
        per.append(m)
        out.update({f"{PREFIX}/{s.name}/{key}": v for key, v in m.items()})
        shown = ", ".join(f"{key} {m[key]:.3f}" for key in ("clean", "pgd", "apgd", "ece_adv")
                          if key in m)  # fmt: skip
        _say(f"zero-shot {s.name} ({k + 1}/{len(sets)}): {len(s.folder.paths)} images of "
             f"{len(s.class_names)} classes: {shown} ({time.time() - t0:.0f} s)")  # fmt: skip
    for key in per[0] if per else ():
        if all(key in m for m in per):
            out[f"{PREFIX}/{MEAN}/{key}"] = float(np.mean([m[key] for m in per]))
    return out
