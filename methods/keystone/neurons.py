"""Neurons of a decoder LM and the forward hooks that read or change them.

A *neuron* is output channel ``j`` of a linear module ``m`` of decoder layer ``ℓ``; its activation
on a token is ``(W_{ℓ,m} h + b)_j``. The modules are named ``q, k, v, o`` (attention projections,
hooked on the linear outputs: before the reshape into heads and before rotary embedding) and
``gate, up`` (MLP); ``down`` is available as an option. A block is one ``(layer, module)``.

:class:`NeuronSpace` numbers every neuron of the chosen modules with one global id (block after
block, layer-major in the order of ``modules``) and converts between global ids and
``(layer, module, index)``.

:class:`NeuronHooks` is the one intervention mechanism, a context manager that puts a forward
hook on every affected linear module:

* ``scale``: ``out[..., idx] *= r`` (``r = 0`` zeroes the neurons: identical to zeroing the rows
  ``W[idx, :]`` and biases ``b[idx]``);
* ``delta``: ``out[..., idx] += x @ Δᵀ`` with a row-sparse :class:`DeltaRows` (identical to
  adding ``Δ`` to the rows ``W[idx, :]``; base weights untouched);
* ``record``: running sums of ``|a|`` per neuron and per batch row over the tokens of the forward
  passes made while ``recording`` is true (never per-token storage).

Scale factors, Δ rows and the recorded sums live on the device of the hooked module's weights
(the model's device); :meth:`NeuronHooks.mean_abs` returns a NumPy array on the CPU.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass

import numpy as np
import torch
from torch import nn

from nshot.nn.lm import LMError, decoder_layers

__all__ = [
    "ALL_MODULES",
    "DEFAULT_MODULES",
    "DeltaRows",
    "Neuron",
    "NeuronHooks",
    "NeuronSpace",
]

MODULE_PATHS = {
    "q": ("self_attn", "q_proj"),
    "k": ("self_attn", "k_proj"),
    "v": ("self_attn", "v_proj"),
    "o": ("self_attn", "o_proj"),
    "gate": ("mlp", "gate_proj"),
    "up": ("mlp", "up_proj"),
    "down": ("mlp", "down_proj"),
}
ALL_MODULES = tuple(MODULE_PATHS)
DEFAULT_MODULES = ("q", "k", "v", "o", "gate", "up")


@dataclass(frozen=True)
class Neuron:
    layer: int
    module: str
    index: int


class NeuronSpace:
    """Global numbering of the neurons of ``modules`` in every decoder layer of ``model``."""

    def __init__(self, model: nn.Module, modules: Sequence[str] = DEFAULT_MODULES) -> None:
        bad = [m for m in modules if m not in MODULE_PATHS]
        if bad or not modules:
            raise ValueError(f"modules: unknown {bad}; choose from {list(ALL_MODULES)}")
        if len(set(modules)) != len(modules):
            raise ValueError(f"modules: {list(modules)} lists a module twice")
        self.modules = tuple(modules)
        layers = decoder_layers(model)
        self.n_layers = len(layers)
        self.blocks: list[tuple[int, str]] = []
        self.linears: list[nn.Linear] = []
        for li, layer in enumerate(layers):
            for m in self.modules:
                obj = layer
                for part in MODULE_PATHS[m]:
                    obj = getattr(obj, part, None)
                    if obj is None:
                        raise LMError(
                            f"layer {li} of {type(model).__name__} has no "
                            f"{'.'.join(MODULE_PATHS[m])} (module {m!r})"
                        )
                if not isinstance(obj, nn.Linear):
                    raise LMError(f"layer {li} module {m!r} is {type(obj).__name__}, not Linear")
                self.blocks.append((li, m))
                self.linears.append(obj)
        self.widths = np.array([lin.out_features for lin in self.linears], dtype=np.int64)
        self.offsets = np.concatenate([[0], np.cumsum(self.widths)])
        self.total = int(self.offsets[-1])
        self._block_index = {b: i for i, b in enumerate(self.blocks)}
        self.block_id = np.repeat(np.arange(len(self.blocks)), self.widths)  # [total]

    # ------------------------------------------------------------------ indexing
    def block(self, layer: int, module: str) -> int:
        try:
            return self._block_index[(layer, module)]
        except KeyError:
            raise ValueError(f"no block (layer={layer}, module={module!r})") from None

    def gid(self, layer: int, module: str, index: int) -> int:
        b = self.block(layer, module)
        if not 0 <= index < self.widths[b]:
            raise ValueError(f"index {index} out of range for ({layer}, {module!r})")
        return int(self.offsets[b] + index)

    def neuron(self, gid: int) -> Neuron:
        if not 0 <= gid < self.total:
            raise ValueError(f"neuron id {gid} out of range (0..{self.total - 1})")
        b = int(self.block_id[gid])
        layer, module = self.blocks[b]
        return Neuron(layer, module, int(gid - self.offsets[b]))

    def split(self, gids: Iterable[int]) -> dict[int, torch.Tensor]:
        """Global ids -> ``{block: sorted local indices}``."""
        g = np.unique(np.asarray(list(gids), dtype=np.int64))
        if g.size and (g[0] < 0 or g[-1] >= self.total):
            raise ValueError(f"neuron ids must lie in 0..{self.total - 1}")
        out: dict[int, torch.Tensor] = {}
        for b in np.unique(self.block_id[g]):
            sel = g[self.block_id[g] == b] - self.offsets[b]
            out[int(b)] = torch.as_tensor(sel, dtype=torch.long)
        return out

    def module_of(self, gids: Iterable[int]) -> list[str]:
        return [self.blocks[int(self.block_id[g])][1] for g in gids]

    # ------------------------------------------------------------------ summaries
    def per_layer_counts(self) -> dict[str, int]:
        """Neurons per layer and module (e.g. ``{"q": 576, ...}``; the same in every layer)."""
        return {m: int(self.widths[self.block(0, m)]) for m in self.modules}

    def describe(self) -> dict:
        counts = self.per_layer_counts()
        return {
            "modules": list(self.modules),
            "layers": self.n_layers,
            "per_layer": counts,
            "per_layer_total": int(sum(counts.values())),
            "total": self.total,
        }

    @torch.no_grad()
    def row_norms(self) -> np.ndarray:
        """``‖W[j, :]‖₂`` of every neuron (global order)."""
        return np.concatenate(
            [lin.weight.detach().float().norm(dim=1).cpu().numpy() for lin in self.linears]
        )

    def module_histogram(self, gids: Iterable[int]) -> dict[str, int]:
        hist = dict.fromkeys(self.modules, 0)
        for m in self.module_of(gids):
            hist[m] += 1
        return {m: c for m, c in hist.items() if c}


class DeltaRows(nn.Module):
    """Row-sparse weight deltas: one ``Δ_b ∈ R^{|idx_b| × in}`` per affected block (zero init),
    with the dtype and on the device of the block's weight.

    Only these tensors are parameters, so an optimiser (and its weight decay, and ZeRO's
    partitioning) sees nothing but the selected rows. Parameter names are ``delta.<layer>.<module>``
    and the local indices are a buffer ``index.<layer>.<module>``, so a ``state_dict`` is a
    self-describing checkpoint of the update.
    """

    def __init__(self, space: NeuronSpace, gids: Iterable[int]) -> None:
        super().__init__()
        self.space = [space]  # a list: keep it out of the module tree
        self.deltas = nn.ParameterDict()
        self.blocks: dict[str, int] = {}
        for b, idx in space.split(gids).items():
            layer, module = space.blocks[b]
            key = f"{layer}_{module}"
            lin = space.linears[b]
            dev = lin.weight.device
            self.deltas[key] = nn.Parameter(
                torch.zeros(len(idx), lin.in_features, dtype=lin.weight.dtype, device=dev)
            )
            self.register_buffer(f"index_{key}", idx.to(dev, copy=True))
            self.blocks[key] = b

    def index(self, key: str) -> torch.Tensor:
        return getattr(self, f"index_{key}")

    def items(self) -> Iterator[tuple[int, torch.Tensor, nn.Parameter]]:
        for key, b in self.blocks.items():
            yield b, self.index(key), self.deltas[key]

    @property
    def n_rows(self) -> int:
        return sum(int(d.shape[0]) for d in self.deltas.values())

    @property
    def n_params(self) -> int:
        return sum(int(d.numel()) for d in self.deltas.values())

    @torch.no_grad()
    def merge_into(self) -> None:
        """Add the deltas to the base weights in place (``W[idx] += Δ``)."""
        space = self.space[0]
        for b, idx, d in self.items():
            w = space.linears[b].weight
            w[idx.to(w.device)] += d.to(w.dtype)


class NeuronHooks:
    """Forward hooks on the space's linear modules: scale/zero neurons, add Δ rows, record |a|.

    ``scale`` maps global ids to a factor (``{gid: r}``) or is ``(gids, r)``. ``record=True``
    keeps, per neuron, the sum of ``|a|`` over the tokens of every forward pass made while
    :attr:`recording` is true, separately for each batch row (``sums[b]`` is ``[rows, width_b]``),
    and the number of tokens counted per row (``counts``). Use as a context manager.
    """

    def __init__(
        self,
        space: NeuronSpace,
        *,
        scale: dict[int, float] | tuple[Iterable[int], float] | None = None,
        delta: DeltaRows | None = None,
        record: bool = False,
    ) -> None:
        self.space = space
        self.factors: dict[int, torch.Tensor] = {}
        if scale is not None:
            if isinstance(scale, tuple):
                gids, r = scale
                scale = dict.fromkeys((int(g) for g in gids), float(r))
            for b, idx in space.split(scale).items():
                f = torch.ones(int(space.widths[b]))
                off = int(space.offsets[b])
                for i in idx.tolist():
                    f[i] = scale[off + i]
                self.factors[b] = f.to(space.linears[b].weight.device)
        self.delta = delta
        self._delta_blocks = {b: (idx, d) for b, idx, d in delta.items()} if delta else {}
        self.record = record
        self.recording = False
        self.sums: dict[int, torch.Tensor] = {}
        self.counts: torch.Tensor | None = None
        self._handles: list = []

    def _hook(self, b: int):
        factor = self.factors.get(b)
        dl = self._delta_blocks.get(b)
        record = self.record

        def hook(mod: nn.Module, args: tuple, out: torch.Tensor) -> torch.Tensor:
            if dl is not None:
                idx, d = dl
                idx = idx.to(out.device)
                out = out.index_add(-1, idx, args[0] @ d.to(out.dtype).t())
            if factor is not None:
                out = out * factor.to(out.device, out.dtype)
            if record and self.recording:
                s = out.detach().abs().float().sum(dim=tuple(range(1, out.ndim - 1)))
                prev = self.sums.get(b)
                self.sums[b] = s if prev is None else prev + s
                if b == 0:
                    n = torch.full(
                        (out.shape[0],), out[0].numel() // out.shape[-1], device=out.device
                    )
                    self.counts = n if self.counts is None else self.counts + n
            return out

        return hook

    def __enter__(self) -> NeuronHooks:
        blocks = set(self.factors) | set(self._delta_blocks)
        if self.record:
            blocks = set(range(len(self.space.blocks)))
        for b in sorted(blocks):
            self._handles.append(self.space.linears[b].register_forward_hook(self._hook(b)))
        return self

    def __exit__(self, *exc: object) -> None:
        for h in self._handles:
            h.remove()
        self._handles.clear()

    def mean_abs(self) -> np.ndarray:
        """``[rows, total]``: mean ``|a|`` per neuron over the recorded tokens of each row."""
        if self.counts is None:
            raise RuntimeError("nothing was recorded")
        parts = [self.sums[b].cpu() for b in range(len(self.space.blocks))]
        s = torch.cat(parts, dim=-1) / self.counts.cpu()[:, None].float()
        return s.numpy().astype(np.float64)
