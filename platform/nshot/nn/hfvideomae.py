"""A VideoMAE checkpoint read by path (Tong et al. 2022, *VideoMAE: Masked Autoencoders are
Data-Efficient Learners for Self-Supervised Video Pre-Training*): a Hugging Face folder holding
``model.safetensors``, or that file, read by ``transformers``' own loader into a
``VideoMAEForPreTraining`` of a given ``VideoMAEConfig``; safetensors only (a pickled
``pytorch_model.bin`` is never read) and without network access.

Accepted: a pretrainer (``VideoMAEForPreTraining``: encoder, its final LayerNorm and decoder),
a video classifier or a bare ``VideoMAEModel`` (their encoder; the classifier's head is left
out). Every encoder tensor must be there with the config's shape and finite; a checkpoint of
another width or depth is refused. The errors name the config field that gave the path.

::

    problems = videomae_problems(path)                      # no weight read
    state = read_videomae(path, pretrainer.config)          # what the checkpoint holds
    pretrainer.load_state_dict(state, strict=False)         # the rest keeps its initialisation
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import torch

from nshot.errors import NshotError

__all__ = ["read_videomae", "state_fingerprint", "videomae_folder", "videomae_problems"]


def videomae_folder(path: str | Path) -> Path:
    """The folder of a VideoMAE checkpoint: ``path``, or its parent when it names the
    ``model.safetensors`` file."""
    p = Path(path).expanduser()
    return p.parent if p.name == "model.safetensors" else p


def videomae_problems(path: str | Path | None, field: str = "init_weights") -> list[str]:
    """What keeps ``path`` from being read as a VideoMAE checkpoint, found without reading a
    weight (empty: nothing)."""
    if not path:
        return [f"field '{field}' is not set (a VideoMAE Hugging Face folder or its "
                "model.safetensors)"]  # fmt: skip
    if not (videomae_folder(path) / "model.safetensors").is_file():
        return [
            f"field '{field}': {path}: no model.safetensors there (pickled .bin / .pt files are "
            "not read: convert one where you trust it, with save_pretrained(..., "
            "safe_serialization=True))"
        ]
    return []


def read_videomae(path: str | Path, config: Any, field: str = "init_weights") -> dict[str, Any]:
    """The tensors of the VideoMAE checkpoint at ``path`` as a ``VideoMAEForPreTraining`` of
    ``config`` names them: the encoder's always, the final LayerNorm's and the decoder's when
    the checkpoint has them (a classifier or a bare encoder has neither). A
    :class:`~nshot.errors.NshotError` naming ``field`` when the files are missing, the
    checkpoint does not fit ``config`` (a tensor of another shape, one the config lacks, an
    encoder tensor missing) or a tensor is not finite."""
    from transformers import VideoMAEForPreTraining

    if problems := videomae_problems(path, field):
        raise NshotError(problems[0])
    folder = videomae_folder(path)
    c = config
    shape = (f"width {c.hidden_size}, depth {c.num_hidden_layers}, patch {c.patch_size}, "
             f"frames {c.num_frames}")  # fmt: skip
    with torch.random.fork_rng():  # the loader's own initialisation leaves the seed alone
        try:
            loaded, info = VideoMAEForPreTraining.from_pretrained(
                str(folder), config=config, use_safetensors=True, local_files_only=True,
                output_loading_info=True, ignore_mismatched_sizes=True,
            )  # fmt: skip
        except (OSError, RuntimeError, ValueError) as err:
            msg = " ".join(str(err).split())[:400]
            raise NshotError(
                f"field '{field}': {folder} does not load into this config's VideoMAE "
                f"({shape}): {msg}"
            ) from None
    if wrong := [str(m) for m in info.get("mismatched_keys", [])]:
        raise NshotError(
            f"field '{field}': {folder} does not fit this config's VideoMAE ({shape}): "
            f"shapes of {len(wrong)} tensors differ, e.g. {'; '.join(sorted(wrong)[:2])}"
        )
    # a video classifier's head is of no use here; any other tensor the config lacks means a
    # deeper or otherwise different model
    if extra := sorted(k for k in info["unexpected_keys"]
                       if not k.startswith(("classifier.", "fc_norm."))):  # fmt: skip
        raise NshotError(
            f"field '{field}': {folder} holds tensors this config's VideoMAE ({shape}) "
            f"lacks: {len(extra)}, e.g. {extra[:2]}"
        )
    missing = set(info["missing_keys"])
    # a fine-tuned encoder (bare or a classifier's) has no final LayerNorm: it stays fresh
    if enc_missing := sorted(k for k in missing if k.startswith("videomae.")
                             and not k.startswith("videomae.layernorm.")):  # fmt: skip
        raise NshotError(
            f"field '{field}': {folder} lacks encoder tensors of this config's VideoMAE: "
            f"{enc_missing[:3]}"
        )
    state = {k: v for k, v in loaded.state_dict().items() if k not in missing}
    for name, t in state.items():
        if not torch.isfinite(t).all():
            raise NshotError(f"field '{field}': {folder}: tensor {name} is not finite")
    return state


def state_fingerprint(state: Mapping[str, torch.Tensor]) -> str:
    """SHA-256 of named tensors (what was read): :func:`nshot.nn.hfclip.clip_fingerprint`'s
    digest, which a module with this state dict has too."""
    from nshot.nn.hfclip import clip_fingerprint

    return clip_fingerprint(SimpleNamespace(state_dict=lambda: state))
