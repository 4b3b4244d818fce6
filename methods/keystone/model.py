"""The model a keystone run works on: loading it, and the state its checkpoints keep.

Checkpoints never hold the model itself: ``keystones`` (the K* neuron ids) and, after
keystone-only SFT, the Δ rows (``delta.<name>``); the predictor reloads the model from its
source (:mod:`.serve`).
"""

from __future__ import annotations

import sys

import torch

from .config import KeystoneConfig
from .neurons import NeuronSpace


def log(msg: str) -> None:
    print(f"[keystone] {msg}", file=sys.stderr, flush=True)


def load_model(source: str, cfg: KeystoneConfig):
    """``(model, tokenizer)`` of ``source`` on ``cfg.device``."""
    from nshot.nn.lm import load_causal_lm, resolve_device

    torch.set_num_threads(cfg.torch_threads)
    return load_causal_lm(
        source, allow_download=cfg.allow_download, device=resolve_device(cfg.device)
    )


def checkpoint_state(space: NeuronSpace, gids: list[int], delta=None) -> dict[str, torch.Tensor]:
    """The tensors of a checkpoint: the K* ids and, when given, the Δ rows."""
    state = {"keystones": torch.tensor(gids, dtype=torch.long)}
    if delta is not None:
        state.update({f"delta.{k}": v.detach().cpu() for k, v in delta.state_dict().items()})
    return state
