"""FRONT's model: the ViT (ancestry or descendant) a front checkpoint stores."""

from __future__ import annotations

from nshot.errors import NshotError
from nshot.nn.vit import ViT
from nshot.train.checkpoint import LoadedCheckpoint

#: what a ViT shape recorded in a front checkpoint may be (every preset is far inside)
VIT_BOUNDS = {
    "img_size": (1, 64), "patch": (1, 16), "in_chans": (1, 4), "num_classes": (1, 1000),
    "width": (1, 1024), "depth": (1, 48), "heads": (1, 64),
}  # fmt: skip


def load_model(checkpoint: LoadedCheckpoint) -> ViT:
    """The ViT (ancestry or descendant) stored in a front checkpoint, in eval mode."""
    shape = checkpoint.extra.get("shape")
    if not isinstance(shape, dict):
        raise NshotError(f"{checkpoint.path}: not a front checkpoint (no ViT shape)")
    model = ViT(**shape)
    try:
        model.load_state_dict(checkpoint.weights())
    except RuntimeError as err:
        raise NshotError(f"{checkpoint.path}: weights do not fit the stored shape: {err}") from None
    return model.eval()
