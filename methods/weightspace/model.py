"""The `small` meta-network: DeepSets over the hidden neurons of a 1→3→1 ReLU INR, with an OCE head.

For one hidden layer with fixed input and output sizes, the permutation-equivariant backbones
(DWSNets, NP-NFN, GMN) reduce to DeepSets over hidden neurons:
token_j = embed(W1[j], b1[j], W2[:, j]); residual layers H ← H + ReLU(Linear([H, mean_j H])).

OCE head (the paper's output capacity expansion): a per-neuron Linear(width → 3k) gives (ΔW1_j, Δb1_j, ΔW2_j) for each of the
k copies and an invariant pooled Linear(width → k) the output-bias deltas; v̂_i = v + s_i·Δv_i
with a learnable s_i per copy (init 1), and the output function is the mean of the k rendered
INRs. The head starts at N(0, 1e-3); ``head_init="zero"`` (zero head, one shared s) is the
collapse control: every copy then gets the same gradient forever.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
from torch import nn

from nshot.errors import NshotError

if TYPE_CHECKING:
    from nshot.train.checkpoint import LoadedCheckpoint


class DeepSetsOCE(nn.Module):
    def __init__(self, width: int, res_layers: int, k: int, head_init: str = "random") -> None:
        super().__init__()
        if head_init not in ("random", "zero"):
            raise ValueError(f"head_init must be random or zero, got {head_init!r}")
        self.width, self.k, self.res, self.head_init = width, k, res_layers, head_init
        self.embed = nn.Linear(3, width)
        self.layers = nn.ModuleList(nn.Linear(2 * width, width) for _ in range(res_layers))
        self.neuron_head = nn.Linear(width, 3 * k)
        self.pooled_head = nn.Linear(width, k)
        if head_init == "random":
            self.s = nn.Parameter(torch.ones(k))
            for h in (self.neuron_head, self.pooled_head):
                nn.init.normal_(h.weight, std=1e-3)
                nn.init.normal_(h.bias, std=1e-3)
        else:
            self.s = nn.Parameter(torch.ones(1))
            for h in (self.neuron_head, self.pooled_head):
                nn.init.zeros_(h.weight)
                nn.init.zeros_(h.bias)

    def describe(self) -> dict[str, int | str]:
        return {"width": self.width, "res_layers": self.res, "k": self.k,
                "head_init": self.head_init}  # fmt: skip

    def features(self, W1: torch.Tensor, b1: torch.Tensor, W2: torch.Tensor) -> torch.Tensor:
        tokens = torch.stack([W1[..., 0], b1, W2[:, 0, :]], dim=-1)  # [B, 3 neurons, 3]
        h = self.embed(tokens)
        for layer in self.layers:
            pooled = h.mean(dim=1, keepdim=True).expand_as(h)
            h = h + torch.relu(layer(torch.cat([h, pooled], dim=-1)))
        return h  # [B, n, width]

    def forward(
        self, W1: torch.Tensor, b1: torch.Tensor, W2: torch.Tensor, b2: torch.Tensor
    ) -> tuple[torch.Tensor, ...]:
        """The k edited INRs: W1 [B, k, n, 1], b1 [B, k, n], W2 [B, k, 1, n], b2 [B, k, 1],
        and the deltas [B, k, 3n + 1] (for the copy separation)."""
        h = self.features(W1, b1, W2)
        b, n, _ = h.shape
        d = self.neuron_head(h).view(b, n, self.k, 3).permute(0, 2, 1, 3)  # [B, k, n, 3]
        db2 = self.pooled_head(h.mean(dim=1))  # [B, k]
        s = self.s.expand(self.k) if self.head_init == "zero" else self.s
        sk = s.view(1, self.k, 1)
        eW1 = W1[:, None, :, :] + (sk * d[..., 0])[..., None]
        eb1 = b1[:, None, :] + sk * d[..., 1]
        eW2 = W2[:, None, :, :] + (sk * d[..., 2])[:, :, None, :]
        eb2 = b2[:, None, :] + (s.view(1, self.k) * db2)[..., None]
        deltas = torch.cat([d.reshape(b, self.k, 3 * n), db2[..., None]], dim=-1)
        return eW1, eb1, eW2, eb2, deltas * sk


def render(W1, b1, W2, b2, x: torch.Tensor) -> torch.Tensor:
    """f(x) = W2 relu(W1 x + b1) + b2 on points x [P], for 1→n→1 INRs with any leading batch
    dims (e.g. [B, k] for the edited copies). The training hot path: a broadcast over the
    copies, which is faster here than :func:`.backbones.render`'s batched matmul over a
    flattened batch (and the recorded results were measured with it)."""
    pre = x.view(*([1] * (b1.dim() - 1)), -1, 1) * W1[..., None, :, 0] + b1[..., None, :]
    return (torch.relu(pre) * W2[..., None, 0, :]).sum(-1) + b2


def oce_render(model: DeepSetsOCE, W1, b1, W2, b2, x: torch.Tensor) -> torch.Tensor:
    """The mean of the k edited INRs' functions on ``x``: [B, P]."""
    eW1, eb1, eW2, eb2, _ = model(W1, b1, W2, b2)
    return render(eW1, eb1, eW2, eb2, x).mean(dim=1)


def rel_mse(pred: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """Per INR: MSE / Var(target) on the grid."""
    return ((pred - target) ** 2).mean(-1) / target.var(-1, unbiased=False)


def load_model(checkpoint: LoadedCheckpoint) -> DeepSetsOCE:
    """The trained meta-network of a weightspace checkpoint (its shape from ``extra["model"]``),
    in eval mode."""
    arch = checkpoint.extra.get("model")
    if not isinstance(arch, dict):
        raise NshotError(f"{checkpoint.path}: not a weightspace checkpoint (no model shape)")
    model = DeepSetsOCE(int(arch["width"]), int(arch["res_layers"]), int(arch["k"]),
                        str(arch["head_init"]))  # fmt: skip
    try:
        model.load_state_dict(checkpoint.weights())
    except RuntimeError as err:
        raise NshotError(f"{checkpoint.path}: weights do not fit the stored shape: {err}") from None
    return model.eval()
