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


def load_model(source: str, cfg: KeystoneConfig, device: str | None = None):
    """``(model, tokenizer)`` of ``source`` (a tiny LM name is trained on first use) on
    ``device`` (a device setting; default ``cfg.device``)."""
    from nshot.nn.lm import load_causal_lm, resolve_device
    from nshot.train.tinylm import resolve_lm_source

    torch.set_num_threads(cfg.torch_threads)
    return load_causal_lm(
        resolve_lm_source(source),
        allow_download=cfg.allow_download,
        device=resolve_device(device or cfg.device),
    )


def checkpoint_state(space: NeuronSpace, gids: list[int], delta=None) -> dict[str, torch.Tensor]:
    """The tensors of a checkpoint: the K* ids and, when given, the Δ rows."""
    state = {"keystones": torch.tensor(gids, dtype=torch.long)}
    if delta is not None:
        state.update({f"delta.{k}": v.detach().cpu() for k, v in delta.state_dict().items()})
    return state
