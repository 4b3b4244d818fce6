"""VideoMAE on spectrum videos (transformers' implementation), bsr's backbone family: the
config's ``backbone`` names what masked pretraining starts from, through
:mod:`nshot.nn.backbone` (:class:`VideoMAEBackbone`; kinds ``videomae-scratch``, randomly
initialised, and ``videomae``, a VideoMAE checkpoint on disk read by
:mod:`nshot.nn.hfvideomae`).

Stage 1 (paper §3, following VideoMAE): tube masking (one spatial mask repeated over every
temporal position), an encoder on the visible tubelets, a light decoder over all tokens, MSE on
masked tubelets against per-patch normalised targets. The BSR addition: the loss averages only
over masked tubelets whose centre lies inside the head disc (pixels outside it are always 0).

Stage 2: mean-pooled encoder tokens → LayerNorm → linear head, trained with layer-wise lr decay
(``head_pool="position"``, a reported deviation: each in-head spatial token's time-mean →
LayerNorm, concatenated → linear head; :class:`PositionClassifier`). Videos are
(B, F, 3, H, W), the layout of transformers' VideoMAE.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from types import SimpleNamespace
from typing import Any, ClassVar

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from nshot.errors import CheckpointError, ConfigError, NshotError
from nshot.nn.backbone import (
    Backbone,
    BackboneKind,
    backbone_from_record,
    raise_problems,
    register_backbone,
)
from nshot.nn.hfvideomae import read_videomae, state_fingerprint, videomae_problems
from nshot.train.checkpoint import LoadedCheckpoint

from .config import ARCH_FIELDS, BsrConfig
from .data import CLASSES

LN_EPS = 1e-6  # VideoMAE's LayerNorms (its models' norm_layer); transformers' default is 1e-12
HEAD_INIT_SCALE = 1e-3  # VideoMAE's fine-tuning scales its new head's initial weights by this


def vmae_config(cfg: BsrConfig | Any, num_labels: int = len(CLASSES), *,
                pretraining: bool = False):  # fmt: skip
    """transformers' VideoMAE config of ``cfg`` (a config, or any object with its
    ``ARCH_FIELDS``). The pretrainer's encoder ends in a LayerNorm
    (VideoMAE's pre-training encoder, and the tensors ``videomae.layernorm.*`` of its
    checkpoints: ``use_mean_pooling=False``); the classifier mean-pools the tokens into its own
    ``fc_norm`` instead (VideoMAE's fine-tuning), so it drops that LayerNorm."""
    from transformers import VideoMAEConfig

    return VideoMAEConfig(
        image_size=cfg.grid, patch_size=cfg.patch, num_channels=3, num_frames=cfg.frames,
        tubelet_size=cfg.tubelet, hidden_size=cfg.width, num_hidden_layers=cfg.depth,
        num_attention_heads=cfg.heads, intermediate_size=4 * cfg.width,
        decoder_hidden_size=cfg.dec_width, decoder_num_hidden_layers=cfg.dec_depth,
        decoder_num_attention_heads=cfg.dec_heads, decoder_intermediate_size=4 * cfg.dec_width,
        norm_pix_loss=True, use_mean_pooling=not pretraining, num_labels=num_labels,
        hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0, layer_norm_eps=LN_EPS,
    )  # fmt: skip


def build_pretrainer(cfg: BsrConfig | Any) -> nn.Module:
    """``VideoMAEForPreTraining`` of the config (or any object with its ``ARCH_FIELDS``),
    randomly initialised as VideoMAE's pre-training model is (:func:`videomae_init`)."""
    from transformers import VideoMAEForPreTraining

    model = VideoMAEForPreTraining(vmae_config(cfg, pretraining=True))
    videomae_init(model)
    return model


def videomae_init(model: nn.Module) -> None:
    """VideoMAE's pre-training initialisation, in place of transformers' (normal, std 0.02):
    every Linear layer of the encoder and the decoder Xavier-uniform with zero bias, their
    LayerNorms 1 and 0; the tubelet embedding (a Conv3d) and the encoder-to-decoder projection
    keep PyTorch's default initialisation (VideoMAE initialises neither); the mask token a
    normal of std 0.02 truncated at ±0.02. Draws from torch's global generator."""

    for part in (model.videomae.encoder, model.videomae.layernorm, model.decoder):
        _init_linears_and_norms(part, nn.init.xavier_uniform_)
    model.videomae.embeddings.patch_embeddings.projection.reset_parameters()
    model.encoder_to_decoder.reset_parameters()
    with torch.no_grad():
        nn.init.trunc_normal_(model.mask_token, std=0.02, a=-0.02, b=0.02)


def _init_linears_and_norms(module: nn.Module, weight_init) -> None:
    """Every Linear layer of ``module``: ``weight_init`` on its weight, a zero bias; every
    LayerNorm: weight 1, bias 0 (both of VideoMAE's initialisations)."""

    def init(m: nn.Module) -> None:
        if isinstance(m, nn.Linear):
            weight_init(m.weight)
            if m.bias is not None:
                nn.init.zeros_(m.bias)
        elif isinstance(m, nn.LayerNorm):
            nn.init.ones_(m.weight)
            nn.init.zeros_(m.bias)

    module.apply(init)  # children first, as nn.Module.apply visits them: the draws' order


def no_weight_decay(name: str, param: nn.Parameter) -> bool:
    """VideoMAE's exemptions from weight decay: biases, every 1-D parameter (norms, the
    attention's q / v biases) and the mask token."""
    return param.ndim <= 1 or name.endswith(".bias") or name.split(".")[-1] == "mask_token"


def pretrain_param_groups(model: nn.Module, weight_decay: float) -> list[dict]:
    """The pretrainer's AdamW groups: decayed weights, then the exempt parameters."""
    decay, exempt = [], []
    for name, p in model.named_parameters():
        (exempt if no_weight_decay(name, p) else decay).append(p)
    return [{"params": decay, "weight_decay": weight_decay},
            {"params": exempt, "weight_decay": 0.0}]  # fmt: skip


# --------------------------------------------------------------------------------------------
# the backbone family: what masked pretraining starts from


class VideoMAEBackbone(Backbone):
    """A ``VideoMAEForPreTraining`` (:attr:`model`: encoder ``videomae``, its final LayerNorm,
    the decoder) that bsr trains: masked pretraining on the spectrum videos, then its encoder
    fine-tuned per subject (:func:`build_classifier`). Loaded with
    ``load_backbone(cfg.backbone_spec(), trainable=True)``; a checkpoint keeps all its
    weights (the pretrained ones), and its :meth:`record` the architecture and where the
    initial weights came from."""

    weights_in_checkpoint: ClassVar[bool] = True

    def __init__(self, model: nn.Module, options: Mapping[str, Any]) -> None:
        self.model = model
        self.options = dict(options)

    @property
    def encoder(self) -> nn.Module:
        """The encoder (transformers' ``VideoMAEModel``) the classifiers take."""
        return self.model.videomae

    def record(self) -> dict[str, Any]:
        return {"kind": self.kind, **{f: self.options[f] for f in ARCH_FIELDS}}

    def copy(self) -> VideoMAEBackbone:
        out = copy.copy(self)
        out.model = copy.deepcopy(self.model)
        return out


class ScratchVideoMAE(VideoMAEBackbone):
    """Kind ``videomae-scratch``: VideoMAE of the options' shape, VideoMAE's pre-training
    initialisation (:func:`videomae_init`) drawn after seeding torch's global generator with
    the option ``seed`` (the same initial weights on every rank)."""

    kind: ClassVar[str] = "videomae-scratch"


class PretrainedVideoMAE(VideoMAEBackbone):
    """Kind ``videomae``: :class:`ScratchVideoMAE`'s model with the VideoMAE checkpoint at the
    option ``init_weights`` read over it (:func:`nshot.nn.hfvideomae.read_videomae`: a
    pretrainer whole, a classifier's or a bare encoder into the encoder, the rest keeping its
    initialisation). Its record adds ``init_weights`` and ``init_sha256``, the fingerprint of
    the tensors read."""

    kind: ClassVar[str] = "videomae"

    def __init__(self, model: nn.Module, options: Mapping[str, Any],
                 init_sha256: str | None = None) -> None:  # fmt: skip
        super().__init__(model, options)
        self.init_sha256 = init_sha256

    def record(self) -> dict[str, Any]:
        return {**super().record(), "init_weights": self.options.get("init_weights"),
                "init_sha256": self.init_sha256}  # fmt: skip


def _architecture(options: Mapping[str, Any]) -> SimpleNamespace:
    if missing := [f for f in ARCH_FIELDS if f not in options]:
        raise ConfigError(f"a VideoMAE backbone needs the options {missing}")
    return SimpleNamespace(**{f: int(options[f]) for f in ARCH_FIELDS})


def _initialised(options: Mapping[str, Any]) -> nn.Module:
    if options.get("seed") is not None:
        torch.manual_seed(int(options["seed"]))
    return build_pretrainer(_architecture(options))


def _load_scratch(options: Mapping[str, Any]) -> ScratchVideoMAE:
    return ScratchVideoMAE(_initialised(options), options)


def _videomae_problems(options: Mapping[str, Any]) -> list[str]:
    return videomae_problems(options.get("init_weights"), "init_weights")


def _load_videomae(options: Mapping[str, Any]) -> PretrainedVideoMAE:
    raise_problems("bsr backbone 'videomae'", _videomae_problems(options),
                   "methods/bsr/README.md (Backbones)")  # fmt: skip
    model = _initialised(options)
    state = read_videomae(options["init_weights"], model.config, "init_weights")
    model.load_state_dict(state, strict=False)
    return PretrainedVideoMAE(model, options, state_fingerprint(state))


def _from_record(record: Mapping[str, Any], where: Any) -> VideoMAEBackbone:
    """The architecture a checkpoint records, freshly initialised (the checkpoint holds the
    weights; the initial weights are not read again)."""
    try:
        model = build_pretrainer(_architecture(record))
    except ConfigError as err:
        raise CheckpointError(f"{where}: {err}") from None
    if record.get("kind") == "videomae":
        return PretrainedVideoMAE(model, record, record.get("init_sha256"))
    return ScratchVideoMAE(model, record)


register_backbone("videomae-scratch", BackboneKind(load=_load_scratch, from_record=_from_record))
register_backbone(
    "videomae",
    BackboneKind(load=_load_videomae, problems=_videomae_problems, from_record=_from_record),
)


def backbone_record(cfg: BsrConfig, extra: Mapping[str, Any]) -> dict[str, Any]:
    """The backbone record of a checkpoint: its ``extra["backbone"]``, or, in a checkpoint
    written before bsr's backbones were named, the ``videomae-scratch`` architecture of its
    config (its weights are all in the checkpoint either way)."""
    if isinstance(extra.get("backbone"), Mapping):
        return dict(extra["backbone"])
    return {"kind": "videomae-scratch", **{f: getattr(cfg, f) for f in ARCH_FIELDS}}


class PositionClassifier(nn.Module):
    """The classifier of ``head_pool="position"``: transformers' VideoMAE encoder (``videomae``,
    no final LayerNorm, as the mean-pooling classifier's), then for each in-head spatial patch
    the mean of its tokens over time, a LayerNorm shared by the positions (``fc_norm``), the
    positions concatenated and a linear layer (``classifier``). The parameter names are the
    mean-pooling classifier's, so layer-wise lr decay treats both alike."""

    def __init__(self, cfg: BsrConfig, num_labels: int = len(CLASSES)) -> None:
        from transformers import VideoMAEModel

        super().__init__()
        self.cfg = cfg
        self.videomae = VideoMAEModel(vmae_config(cfg, num_labels))
        self.fc_norm = nn.LayerNorm(cfg.width, eps=LN_EPS)
        self.register_buffer("in_head", patch_in_head(cfg), persistent=False)
        self.classifier = nn.Linear(int(self.in_head.sum()) * cfg.width, num_labels)

    def forward(self, pixel_values: torch.Tensor):
        from transformers.modeling_outputs import ImageClassifierOutput

        h = self.videomae(pixel_values=pixel_values).last_hidden_state
        x = self.fc_norm(position_tokens(self.cfg, h, self.in_head)).flatten(1)
        return ImageClassifierOutput(logits=self.classifier(x))


def position_tokens(
    cfg: BsrConfig, hidden: torch.Tensor, in_head: torch.Tensor | None = None
) -> torch.Tensor:
    """(B, n_in_head, width): the time-mean of each in-head spatial patch's tokens of the
    encoder's last block ``hidden`` (B, T'·S, width; transformers' time-major token order);
    ``in_head``: :func:`patch_in_head`'s mask when the caller holds it."""
    t, s = tokens_per_clip(cfg)
    head = (patch_in_head(cfg) if in_head is None else in_head).to(hidden.device)
    return hidden.view(hidden.shape[0], t, s, -1).mean(1)[:, head]


def build_classifier(cfg: BsrConfig, encoder_state: dict | None = None) -> nn.Module:
    """``VideoMAEForVideoClassification`` (``head_pool="mean"``, VideoMAE's own head) or a
    :class:`PositionClassifier`; ``encoder_state`` is a pretrainer's ``videomae`` state dict
    (every encoder tensor must fit; the pre-training encoder's final ``layernorm``, which the
    classifier's head replaces by its ``fc_norm``, is left out, as VideoMAE's fine-tuning
    does)."""
    from transformers import VideoMAEForVideoClassification

    if cfg.head_pool == "position":
        clf: nn.Module = PositionClassifier(cfg)
    else:
        clf = VideoMAEForVideoClassification(vmae_config(cfg))
        clf.fc_norm.eps = LN_EPS  # transformers builds it with LayerNorm's default, 1e-5
    videomae_finetune_init(clf)
    if encoder_state is not None:
        encoder_state = {k: v for k, v in encoder_state.items()
                         if not k.startswith("layernorm.")}  # fmt: skip
        res = clf.videomae.load_state_dict(encoder_state, strict=False)
        if res.missing_keys or res.unexpected_keys:
            raise NshotError(
                f"encoder weights do not fit: missing {res.missing_keys[:3]}, "
                f"unexpected {res.unexpected_keys[:3]}"
            )
    return clf


def videomae_finetune_init(clf: nn.Module) -> None:
    """VideoMAE's fine-tuning model initialisation, in place of transformers' (an untruncated
    normal of std 0.02): every Linear layer a normal of std 0.02 truncated at ±0.02 (VideoMAE's
    own truncation) with zero bias, LayerNorms 1 and 0, the tubelet embedding (a Conv3d) at
    PyTorch's default; then the head's weights scaled by ``HEAD_INIT_SCALE`` (its fine-tuning
    default ``init_scale``), so that training starts from near-uniform predictions. A
    pretrained encoder is loaded over it. Draws from torch's global generator."""

    _init_linears_and_norms(clf, lambda w: nn.init.trunc_normal_(w, std=0.02, a=-0.02, b=0.02))
    clf.videomae.embeddings.patch_embeddings.projection.reset_parameters()
    with torch.no_grad():
        clf.classifier.weight.mul_(HEAD_INIT_SCALE)


def tokens_per_clip(cfg: BsrConfig) -> tuple[int, int]:
    """(temporal positions, spatial patches) of a clip."""
    return cfg.frames // cfg.tubelet, cfg.spatial_patches


def tube_mask(cfg: BsrConfig, batch: int, generator: torch.Generator) -> torch.Tensor:
    """(batch, T'·S) boolean mask: ``cfg.n_masked`` spatial patches per clip, the same at every
    temporal position (so every clip masks the same number of tokens, and at least one spatial
    patch stays visible)."""
    t, s = tokens_per_clip(cfg)
    scores = torch.rand(batch, s, generator=generator)
    idx = scores.argsort(dim=1)[:, : cfg.n_masked]
    spatial = torch.zeros(batch, s, dtype=torch.bool)
    spatial.scatter_(1, idx, True)
    return spatial.repeat(1, t)


def patch_in_head(cfg: BsrConfig) -> torch.Tensor:
    """(S,) whether each spatial patch's centre lies inside the head disc."""
    n = cfg.grid // cfg.patch
    c = (np.arange(n) + 0.5) * cfg.patch / cfg.grid * 2.0 - 1.0
    gx, gy = np.meshgrid(c, -c)
    return torch.from_numpy((gx**2 + gy**2).ravel() <= 1.0)


def patchify(cfg: BsrConfig, videos: torch.Tensor) -> torch.Tensor:
    """(B, F, 3, H, W) → (B, T'·S, tubelet·p·p, 3) in transformers' token order."""
    b, f, ch, h, w = videos.shape
    p, ts = cfg.patch, cfg.tubelet
    x = videos.view(b, f // ts, ts, ch, h // p, p, w // p, p)
    x = x.permute(0, 1, 4, 6, 2, 5, 7, 3).contiguous()
    return x.view(b, (f // ts) * (h // p) * (w // p), ts * p * p, ch)


def normalised_targets(cfg: BsrConfig, videos: torch.Tensor) -> torch.Tensor:
    """Per-tubelet, per-channel normalised targets (B, L, ts·p·p·3): (x − mean) /
    (unbiased std + 1e-6), VideoMAE's ``norm_pix_loss``."""
    x = patchify(cfg, videos)
    x = (x - x.mean(dim=-2, keepdim=True)) / (
        x.var(dim=-2, unbiased=True, keepdim=True).sqrt() + 1e-6
    )
    return x.flatten(2)


def masked_loss(cfg: BsrConfig, model: nn.Module, videos: torch.Tensor,
                mask: torch.Tensor) -> torch.Tensor:  # fmt: skip
    """MSE over the masked tubelets whose centre is inside the head disc."""
    out = model(pixel_values=videos, bool_masked_pos=mask)
    b = videos.shape[0]
    target = normalised_targets(cfg, videos)[mask].view(b, -1, out.logits.shape[-1])
    t, _ = tokens_per_clip(cfg)
    in_head = patch_in_head(cfg).repeat(t).to(videos.device)
    weight = in_head.unsqueeze(0).expand(b, -1)[mask].view(b, -1).float()
    per_token = ((out.logits - target) ** 2).mean(-1)
    return (per_token * weight).sum() / weight.sum().clamp_min(1.0)


def encode(model: nn.Module, videos: torch.Tensor, cfg: BsrConfig | None = None) -> torch.Tensor:
    """Encoder features of a pretrainer or classifier, all tokens visible: the last block's
    output, before the pretrainer's final LayerNorm (which the classifier drops), so that both
    give the same features; read as ``cfg.head_pool`` says (the mean over tokens, (B, width),
    without ``cfg``; ``"position"``: the in-head positions' time-means concatenated)."""
    out = model.videomae(pixel_values=videos, output_hidden_states=True)
    h = out.hidden_states[-1]
    if cfg is not None and cfg.head_pool == "position":
        return position_tokens(cfg, h).flatten(1)
    return h.mean(1)


def layer_decay_groups(clf: nn.Module, cfg: BsrConfig, lr: float, weight_decay: float) -> list:
    """AdamW parameter groups with layer-wise lr decay: the head gets ``lr``, encoder block i
    ``lr · decay^(depth − i)``, the embeddings ``lr · decay^(depth + 1)``; no decay on biases
    and norms."""
    groups: dict[tuple[int, bool], list] = {}
    for name, p in clf.named_parameters():
        if not p.requires_grad:
            continue
        if name.startswith("videomae.embeddings"):
            layer = 0
        elif name.startswith("videomae.encoder.layer."):
            layer = int(name.split(".")[3]) + 1
        else:
            layer = cfg.depth + 1
        no_wd = p.ndim == 1 or name.endswith(".bias")
        groups.setdefault((layer, no_wd), []).append(p)
    return [
        {"params": ps, "lr": lr * cfg.layer_decay ** (cfg.depth + 1 - layer),
         "weight_decay": 0.0 if no_wd else weight_decay}
        for (layer, no_wd), ps in sorted(groups.items())
    ]  # fmt: skip


class Probe:
    """The linear probe on frozen embeddings: features standardised with the support's mean
    and std (MAE's probe puts a BatchNorm without affine before its linear layer), then an
    L2-regularised multinomial logistic regression fitted on the support to convergence."""

    def __init__(self, emb: np.ndarray, y: np.ndarray, c: float = 1.0) -> None:
        from sklearn.linear_model import LogisticRegression

        emb = np.asarray(emb, np.float64)
        self.mu, self.sd = emb.mean(0), emb.std(0) + 1e-6
        self.clf = LogisticRegression(max_iter=2000, C=c).fit(self._z(emb), y)

    def _z(self, emb: np.ndarray) -> np.ndarray:
        return (np.asarray(emb, np.float64) - self.mu) / self.sd

    def predict(self, emb: np.ndarray) -> np.ndarray:
        return self.clf.predict(self._z(emb))

    def predict_proba(self, emb: np.ndarray, n_classes: int) -> np.ndarray:
        """(n, n_classes) probabilities; classes absent from the support get 0."""
        out = np.zeros((len(emb), n_classes))
        out[:, self.clf.classes_] = self.clf.predict_proba(self._z(emb))
        return out


def fit_probe(emb: np.ndarray, y: np.ndarray, c: float = 1.0) -> Probe:
    """:class:`Probe` of inverse L2 strength ``c`` (the config's ``lr_c``)."""
    return Probe(emb, y, c)


def smoothed_ce(logits: torch.Tensor, y: torch.Tensor, smoothing: float) -> torch.Tensor:
    return F.cross_entropy(logits, y, label_smoothing=smoothing)


def load_model(checkpoint: LoadedCheckpoint) -> tuple[nn.Module, BsrConfig, dict]:
    """The pretrainer of a bsr checkpoint (eval mode, frozen), its config and its extra
    record; the backbone's architecture from its record (:func:`backbone_record`)."""
    cfg = BsrConfig.validated(checkpoint.config)
    extra = dict(checkpoint.extra)
    model = backbone_from_record(backbone_record(cfg, extra), checkpoint.path).model
    try:
        model.load_state_dict(checkpoint.weights())
    except RuntimeError as err:
        raise NshotError(f"{checkpoint.path}: weights do not fit the config: {err}") from None
    return model.eval(), cfg, extra
