"""FRONT configuration and presets (the paper's section 3 settings, at CPU scale)."""

from __future__ import annotations

from typing import ClassVar, Literal

from pydantic import Field, model_validator

from nshot.method import MethodConfig

VERSION = "1"  # of the checkpoint format

Init = Literal["front", "random", "truncation", "uniform", "weight_selection"]
Fill = Literal["zero", "random", "consistence", "repeat"]


class FrontConfig(MethodConfig):
    # what `nshot train front` trains
    stage: Literal["ancestry", "descendant"] = Field(
        "descendant",
        description="ancestry: train the source ViT; descendant: initialise a ViT from the "
        "ancestry (trained first and cached when `ancestry_path` is not given) and train it",
    )
    ancestry_path: str | None = Field(
        None, description="an nshot checkpoint of a front ancestry (stage=ancestry) to start from"
    )
    learngene_path: str | None = Field(
        None,
        description="a learngene folder (python -m nshot.methods.front.tool extract): the "
        "descendant is initialised from it instead of from an ancestry (init=front only)",
    )
    task: Literal["digits", "parity"] = Field(
        "digits", description="descendant task: the ten digits, or parity (digit mod 2, new head)"
    )
    img_size: Literal[8, 16] = Field(
        8,
        description="descendant input side: 8 (digits as shipped) or 16 (upsampled; the "
        "position embedding is then transferred by DCT padding)",
    )
    patch: int = Field(2, ge=1, le=8, description="ViT patch side (ancestry and descendant)")
    # ancestry (source) ViT
    anc_width: int = Field(64, ge=8, le=1024, description="ancestry width")
    anc_depth: int = Field(12, ge=1, le=48, description="ancestry depth (blocks)")
    anc_heads: int = Field(4, ge=1, le=64, description="ancestry attention heads")
    anc_epochs: int = Field(30, ge=1, description="ancestry training epochs")
    anc_warmup: int = Field(5, ge=0, description="ancestry linear warm-up epochs (DeiT-style)")
    anc_lr: float | None = Field(
        None,
        gt=0.0,
        description="ancestry AdamW peak learning rate; None: DeiT's linear scaling rule, "
        "5e-4 x batch / 512 (6.25e-5 at batch 64); the refinement continues at it. The earlier "
        "recipe trained the ancestry and its refinement at `lr` (1e-3): --set anc_lr=0.001",
    )
    # descendant ViT
    width: int = Field(64, ge=8, le=1024, description="descendant width")
    depth: int = Field(4, ge=1, le=48, description="descendant depth (blocks)")
    heads: int = Field(4, ge=1, le=64, description="descendant attention heads")
    epochs: int = Field(15, ge=1, description="descendant training epochs")
    warmup: int = Field(1, ge=0, description="descendant linear warm-up epochs")
    init: Init = Field("front", description="descendant initialisation")
    # FRONT knobs (the paper's section 2)
    keep_ratio: float = Field(1.0, gt=0.0, le=1.0, description="share of DCT frequencies kept")
    fill: Fill = Field("zero", description="depth fill mode when the descendant is deeper")
    mlp_dct_dim: Literal["2d", "1d"] = Field("2d", description="DCT of the MLP matrices")
    use_ratio: bool = Field(False, description="amplitude compensation on matrix axes")
    depth_fix: bool = Field(False, description="depth amplitude fix (x L_t/L_s); off = faithful")
    dct_skip: list[Literal["qkv", "o", "mlp", "norm"]] = Field(
        [], description="parameter kinds left at random init"
    )
    # optional refinement of the ancestry (the paper's section 2, as reconstructed here)
    refine: bool = Field(False, description="refine the ancestry with the spectral regulariser")
    refine_lambda: float = Field(1e-3, ge=0.0, description="lambda, per regularised parameter")
    refine_frac: float = Field(0.2, gt=0.0, le=1.0, description="refinement steps / ancestry's")
    refine_lr_scale: float = Field(
        1.0, gt=0.0, description="refinement lr / the ancestry's lr (it continues its training)"
    )
    refine_keep_ratio: float = Field(
        0.5, gt=0.0, lt=1.0, description="frequencies outside this block are penalised"
    )
    # optimisation (the descendants; the ancestry and its refinement take anc_lr)
    lr: float = Field(1e-3, gt=0.0, description="the descendants' AdamW learning rate")
    weight_decay: float = Field(0.05, ge=0.0, description="AdamW weight decay")
    batch: int = Field(64, ge=1, description="images per step (global)")
    # experiments
    seeds: int = Field(3, ge=1, description="seeds of the reproduction")
    exp_depths: list[int] = Field([2, 4, 6], min_length=1, description="descendant depths")
    exp_width32: bool = Field(True, description="also a width-32 depth-4 descendant (use_ratio)")
    exp_parity: bool = Field(True, description="also the parity descendant task")
    exp_16px: bool = Field(True, description="also the 16x16 descendant (pos_embed by DCT)")

    # A step of the train loop is an epoch: each preset's ``steps`` is its descendant ``epochs``
    # and ``checkpoint_every`` counts epochs (fault injection, ``fail_at_step``, too).
    PRESETS: ClassVar[dict[str, dict]] = {
        # smoke's one-epoch, 4-layer ancestry keeps the lr its recorded trace was made with
        "smoke": {
            "anc_width": 32, "anc_depth": 4, "anc_heads": 2, "anc_epochs": 1, "anc_lr": 1e-3,
            "width": 32, "depth": 2, "heads": 2, "epochs": 1, "seeds": 1,
            "steps": 1, "checkpoint_every": 1,
            "exp_depths": [2], "exp_width32": False, "exp_parity": False, "exp_16px": False,
        },
        "small": {"steps": 15, "checkpoint_every": 5},
        "paper": {"seeds": 3, "anc_epochs": 300, "epochs": 100, "steps": 100,
                  "checkpoint_every": 25},
    }  # fmt: skip

    def ancestry_lr(self) -> float:
        """The ancestry's AdamW peak learning rate: ``anc_lr``, else DeiT's linear scaling rule
        (5e-4 per 512 images of batch; Touvron et al. 2021, the recipe of FRONT's DeiT
        ancestries)."""
        return self.anc_lr if self.anc_lr is not None else 5e-4 * self.batch / 512

    @model_validator(mode="after")
    def _check(self) -> FrontConfig:
        if self.anc_width % self.anc_heads:
            raise ValueError(f"field 'anc_heads': {self.anc_heads} does not divide anc_width")
        if self.width % self.heads:
            raise ValueError(f"field 'heads': {self.heads} does not divide width {self.width}")
        if 8 % self.patch or self.img_size % self.patch:
            raise ValueError(f"field 'patch': {self.patch} must divide the image side (8)")
        if self.learngene_path is not None and self.init != "front":
            raise ValueError("field 'learngene_path': a learngene initialises init=front only")
        if any(d < 1 for d in self.exp_depths):
            raise ValueError("field 'exp_depths': depths must be positive")
        return self
