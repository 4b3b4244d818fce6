"""The meta-networks of the MNIST-INR experiment (``experiment="mnist_inr"``): classifiers of an
INR's digit from its weights, and the OCE dilation editor, on SIREN 2-32-32-1 INRs.

Classifiers (invariant functionals of the weights):

* ``np_nfn_cls`` / ``gmn_cls``: the NP-NFN and GMN backbones of :mod:`.backbones` (equivariant
  per-entry features), an invariant pooling (the mean over every hidden-neuron index of each
  weight and bias feature; input and output neurons keep their identity), and an MLP to 10
  logits: exactly invariant to hidden-neuron permutations.
* ``mlp_flat``: an MLP on the flattened weights (each feature standardised on the training set),
  the baseline without the symmetry: permuting hidden neurons changes its input and its output.
* ``canon_mlp``: the same MLP on the weights after sorting each hidden layer's neurons by bias
  (the paper's Theorem 6.3 canonicalisation, :func:`.canon.canonicalise`): invariant on inputs in
  general position.

Editor: ``dilate_k<k>``: NP-NFN features and the equivariant OCE head (:class:`.backbones.OCEHead`)
predict k edited INRs, v_i = v + s_i dv_i, whose rendered functions are averaged (the paper's
output capacity expansion); k = 1 is the plain equivariant editor. Its channel width is the
largest at which the trainable parameters stay at or below the k = 1 editor's.

Inputs are scaled per weight tensor by one number each (the training set's standard deviation of
W_l and of b_l): a scalar per tensor keeps the equivariance, and the edits are made in the scaled
coordinates and mapped back, so each layer's delta has that layer's scale.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence

import torch
from torch import Tensor, nn

from .backbones import GMN, NPNFN, SIREN_OMEGA0, Layers, OCEHead, count_params
from .canon import canonicalise
from .mnist_inrs import siren_render

Scales = list[tuple[float, float]]


def layer_scales(layers: Sequence[tuple[Tensor, Tensor]]) -> Scales:
    """One scale per weight tensor and per bias (their standard deviations over a set)."""
    return [(float(w.std()), float(b.std())) for w, b in layers]


def scaled(layers: Sequence[tuple[Tensor, Tensor]], scales: Scales) -> Layers:
    return [(w / sw, b / sb) for (w, b), (sw, sb) in zip(layers, scales, strict=True)]


def flatten(layers: Sequence[tuple[Tensor, Tensor]]) -> Tensor:
    """[B, N]: W_1, b_1, ..., W_L, b_L flattened in order."""
    return torch.cat([t.reshape(t.shape[0], -1) for wb in layers for t in wb], dim=1)


def invariant_pool(features: Sequence[tuple[Tensor, Tensor]]) -> Tensor:
    """[B, D]: every per-entry feature averaged over its hidden-neuron indices (rows of W_l and
    entries of b_l for l < L, columns of W_l for l > 1); input/output indices are kept."""
    n = len(features)
    out = []
    for ell, (fw, fb) in enumerate(features):
        rows_hidden, cols_hidden = ell < n - 1, ell > 0
        dims = tuple(d for d, hidden in ((1, rows_hidden), (2, cols_hidden)) if hidden)
        pw = fw.mean(dims) if dims else fw
        pb = fb.mean(1) if rows_hidden else fb
        out += [pw.reshape(pw.shape[0], -1), pb.reshape(pb.shape[0], -1)]
    return torch.cat(out, dim=1)


def pooled_dim(widths: Sequence[int], channels: int) -> int:
    n = len(widths) - 1
    total = 0
    for ell in range(n):
        rows_hidden, cols_hidden = ell < n - 1, ell > 0
        w_keep = (1 if rows_hidden else widths[ell + 1]) * (1 if cols_hidden else widths[ell])
        b_keep = 1 if rows_hidden else widths[ell + 1]
        total += (w_keep + b_keep) * channels
    return total


def _head(d_in: int, hidden: int, classes: int) -> nn.Sequential:
    return nn.Sequential(nn.Linear(d_in, hidden), nn.ReLU(), nn.Linear(hidden, classes))


class EquivariantClassifier(nn.Module):
    """Backbone (``np_nfn`` or ``gmn``) → invariant pooling → MLP → logits."""

    def __init__(
        self,
        backbone: str,
        widths: Sequence[int],
        scales: Scales,
        channels: int,
        depth: int = 3,
        hidden: int = 128,
        classes: int = 10,
    ):
        super().__init__()
        self.widths, self.scales = list(widths), list(scales)
        if backbone == "np_nfn":
            self.backbone: nn.Module = NPNFN(widths, channels=channels, layers=depth)
        elif backbone == "gmn":
            self.backbone = GMN(widths, channels=channels, rounds=depth)
        else:
            raise ValueError(f"backbone must be 'np_nfn' or 'gmn', got {backbone!r}")
        self.head = _head(pooled_dim(widths, channels), hidden, classes)

    def forward(self, layers: Sequence[tuple[Tensor, Tensor]]) -> Tensor:
        feats = self.backbone(scaled(layers, self.scales))
        return self.head(invariant_pool(feats))


class FlatMLP(nn.Module):
    """MLP on the flattened weights, each feature standardised (``mean``/``std`` of the training
    set); ``canonical=True`` sorts each hidden layer's neurons by bias first (Theorem 6.3)."""

    def __init__(
        self,
        mean: Tensor,
        std: Tensor,
        hidden: int = 256,
        depth: int = 2,
        classes: int = 10,
        canonical: bool = False,
    ):
        super().__init__()
        self.canonical = canonical
        self.register_buffer("mean", mean.clone())
        self.register_buffer("std", std.clamp_min(1e-8).clone())
        dims = [mean.numel()] + [hidden] * depth
        mods: list[nn.Module] = []
        for a, b in itertools.pairwise(dims):
            mods += [nn.Linear(a, b), nn.ReLU()]
        mods.append(nn.Linear(dims[-1], classes))
        self.net = nn.Sequential(*mods)

    @staticmethod
    def inputs(layers: Sequence[tuple[Tensor, Tensor]], canonical: bool) -> Tensor:
        return flatten(canonicalise(layers) if canonical else layers)

    def forward(self, layers: Sequence[tuple[Tensor, Tensor]]) -> Tensor:
        x = self.inputs(layers, self.canonical)
        return self.net((x - self.mean) / self.std)


class DilationOCE(nn.Module):
    """NP-NFN features + the OCE head: k edited SIRENs whose rendered images are averaged."""

    def __init__(
        self,
        widths: Sequence[int],
        scales: Scales,
        channels: int,
        k: int,
        depth: int = 3,
        head_init: str = "random",
        omega: float = SIREN_OMEGA0,
    ):
        super().__init__()
        self.widths, self.scales, self.k, self.omega = list(widths), list(scales), k, omega
        self.channels = channels
        self.backbone = NPNFN(widths, channels=channels, layers=depth)
        self.head = OCEHead(len(widths) - 1, channels, k, init=head_init)

    def edit(self, layers: Sequence[tuple[Tensor, Tensor]]) -> tuple[list[Layers], list[Layers]]:
        """(edited, deltas): k edited INRs in weight units, and the raw head outputs."""
        z = scaled(layers, self.scales)
        edited_z, deltas = self.head(z, self.backbone(z))
        edited = [
            [(w * sw, b * sb) for (w, b), (sw, sb) in zip(copy, self.scales, strict=True)]
            for copy in edited_z
        ]
        return edited, deltas

    def forward(self, layers: Sequence[tuple[Tensor, Tensor]], x: Tensor) -> Tensor:
        """f_OCE on the points ``x`` [P, 2]: [B, P], the mean of the k copies' renders."""
        edited, _ = self.edit(layers)
        bsz = layers[0][0].shape[0]
        stacked = [
            (torch.cat([c[ell][0] for c in edited]), torch.cat([c[ell][1] for c in edited]))
            for ell in range(len(layers))
        ]
        out = siren_render(stacked, x, self.omega)  # [k * B, P], copies outermost
        return out.view(self.k, bsz, -1).mean(0)


def matched_channels(widths: Sequence[int], channels_k1: int, k: int, depth: int = 3) -> int:
    """The largest channel width whose k-copy editor has at most the k = 1 editor's trainable
    parameters (at ``channels_k1``)."""
    scales = [(1.0, 1.0)] * (len(widths) - 1)
    budget = count_params(DilationOCE(widths, scales, channels_k1, 1, depth))
    c = channels_k1
    while c > 1 and count_params(DilationOCE(widths, scales, c, k, depth)) > budget:
        c -= 1
    return c


__all__ = [
    "DilationOCE",
    "EquivariantClassifier",
    "FlatMLP",
    "flatten",
    "invariant_pool",
    "layer_scales",
    "matched_channels",
    "pooled_dim",
    "scaled",
]
