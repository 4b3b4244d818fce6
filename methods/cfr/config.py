"""CFR configuration and presets.

One training run is one (object class, shot count k): stage 1 (the crossmodal mappings f23 and
f32, paper §3.2), stage 2 (the memory banks, one no-grad pass) and stage 3 (the attention
retriever, paper §3.3). A step is one epoch of stage 1 or of stage 3, so
``steps = map_epochs + ret_epochs`` for the systems that train a retriever, ``map_epochs`` for
the others, and 1 for the memory-bank-only baselines (PatchCore, BTF); it is set from them.

``smoke`` (height fields, generator version 1) and ``small`` (generator version 2: height-field
stand-ins for MVTec 3D-AD's ten classes and its defect taxonomy) run on generated RGB +
organised-xyz images with frozen random feature extractors; ``paper`` is the paper's scale
(§4.1): MVTec 3D-AD read from ``data_path`` (:mod:`.mvtec3d`), DINO ViT-B/8 and Point-MAE
features from local weight files (``dino_path``, ``pointmae_path``), 224² grids,
k ∈ {1, 2, 4}, θ = 0.4. The extractors are the backbone the config names
(:meth:`CfrConfig.backbone_spec`, kinds ``random-features`` and ``dino-pointmae`` of
:mod:`.features`): the presets swap the backbone, the method's code is the same.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, ClassVar, Literal

from pydantic import Field, model_validator

from nshot.method import MethodConfig
from nshot.tune.space import Float, Int, TuneSpec

if TYPE_CHECKING:
    from nshot.nn.backbone import BackboneSpec

VERSION = "1"  # of the checkpoint format

CLASSES = ("bump", "cylinder", "saddle", "ring")  # the height-field objects
MESH_CLASSES = ("box", "cylinder", "sphere", "capsule")
GENERATOR_CLASSES = {"heightfield": CLASSES, "mesh": MESH_CLASSES}
MVTEC3D_CLASSES = (
    "bagel", "cable_gland", "carrot", "cookie", "dowel", "foam", "peach", "potato", "rope",
    "tire",
)  # fmt: skip
# generator version 2 (:mod:`.taxonomy`): height-field stand-ins named after MVTec 3D-AD's classes
TAXONOMY_CLASSES = MVTEC3D_CLASSES


def generator_classes(generator: str, version: int) -> tuple[str, ...] | None:
    """The classes a generator (and version) makes; None for real data (any class folder)."""
    if generator == "heightfield" and version == 2:
        return TAXONOMY_CLASSES
    return GENERATOR_CLASSES.get(generator)


System = Literal[
    "cfr",
    "cfr_cyclic_only",
    "cfr_nn_fallback",
    "cfm",
    "patchcore_rgb",
    "patchcore_3d",
    "btf",
    "cfr_random_replace",
]
# systems by what they train: both mapping stages, the retriever, nothing (banks only)
MAPPING_SYSTEMS = frozenset(
    {"cfr", "cfr_cyclic_only", "cfr_nn_fallback", "cfm", "cfr_random_replace"}
)
RETRIEVER_SYSTEMS = frozenset({"cfr"})


class CfrConfig(MethodConfig):
    system: System = Field(
        "cfr",
        description="cfr (cyclic mappings + retriever replacement), cfr_cyclic_only (no "
        "replacement), cfr_nn_fallback (replacement by the nearest RGB-bank row of the observed "
        "F2), cfm (one-way mappings), patchcore_rgb, patchcore_3d, btf (joint [F2, F3] bank) or "
        "cfr_random_replace (negative control: as many pixels as cfr, chosen at random)",
    )
    # data
    generator: Literal["heightfield", "mesh", "mvtec3d"] = Field(
        "heightfield",
        description="generated objects: heightfield (height fields seen from above; classes "
        "bump, cylinder, saddle, ring) or mesh (trimesh primitives ray-cast from above; classes "
        "box, cylinder, sphere, capsule); or mvtec3d: real images read from data_path (MVTec "
        "3D-AD's layout; the classes are its folders)",
    )
    generator_version: Literal[1, 2] = Field(
        1,
        description="version of the generated data: 1 (random stripe texture per image, "
        "off-palette stains; heightfield or mesh) or 2 (heightfield only: stand-ins for MVTec "
        "3D-AD's ten classes with a fixed texture per class and its defect taxonomy, a third of "
        "the defects invisible in RGB and a third in depth; nshot.methods.cfr.taxonomy)",
    )
    data_path: str | None = Field(
        None, description="generator mvtec3d: the dataset root (<class>/{train,validation,test})"
    )
    preprocess: Literal["cfm", "none"] = Field(
        "cfm",
        description="generator mvtec3d: cfm (CFM's background-plane removal and largest-cluster "
        "cleaning of each point cloud, as the paper) or none (files already pre-processed)",
    )
    grid: int = Field(64, ge=16, le=256, description="image side in pixels (H = W)")
    classes: list[str] = Field(list(CLASSES), min_length=1, description="object classes")
    class_name: str = Field("bump", description="the class `nshot train cfr` trains")
    n_train: int = Field(20, ge=1, le=500, description="normal training images per class")
    n_test_good: int = Field(20, ge=1, le=500, description="normal test images per class")
    n_test_bad: int = Field(20, ge=3, le=500, description="anomalous test images per class")
    n_val_good: int = Field(4, ge=1, le=500, description="normal validation images per class")
    n_val_bad: int = Field(6, ge=3, le=500, description="anomalous validation images per class")
    data_seed: int = Field(0, ge=0, description="seed of the generated images")
    val_synthetic: bool = Field(
        True,
        description="generator mvtec3d: add a synthetic defect to a copy of each (all normal) "
        "validation image, so that nshot tune has an objective (val_aupro30) on real data; "
        "the results never read the validation images",
    )
    # features (frozen, never trained)
    features: Literal["random", "paper"] = Field(
        "random",
        description="the frozen extractors (backbone_spec): random (backbone random-features: "
        "seeded random CNN and geometric-descriptor MLP) or paper (backbone dino-pointmae: DINO "
        "ViT-B/8 patch tokens from dino_path, Point-MAE group features from pointmae_path)",
    )
    rgb_dim: int = Field(96, ge=3, le=3072, description="C2: RGB feature channels")
    xyz_dim: int = Field(64, ge=2, le=4096, description="C3: 3D feature channels")
    feature_seed: int = Field(0, ge=0, description="seed of the frozen random extractors")
    dino_path: str | None = Field(
        None, description="features paper: a Hugging Face ViT folder or a timm / DINO "
        ".safetensors file (DINO ViT-B/8)",
    )  # fmt: skip
    pointmae_path: str | None = Field(
        None, description="features paper: Point-MAE's pretrain weights as .safetensors"
    )
    pointmae_groups: int = Field(1024, ge=1, le=65_536, description="Point-MAE groups (FPS)")
    pointmae_group_size: int = Field(128, ge=1, le=4096, description="points per group (kNN)")
    job_gpus: float = Field(
        0.0, ge=0.0, le=8.0, description="GPUs each reproduction task reserves (Ray)"
    )
    # stage 1: crossmodal mappings
    shot: int = Field(4, ge=1, le=64, description="k: few-shot training images of the run")
    shots: list[int] = Field([1, 4], min_length=1, description="k values the reproduction runs")
    fewshot_seed: int = Field(42, ge=0, description="seed of the k-shot choice (paper: 42)")
    cycles: bool = Field(True, description="the two cycle terms of stage 1 (False: CFM)")
    map_epochs: int = Field(40, ge=1, le=10_000, description="stage-1 epochs over the k images")
    map_lr: float = Field(1e-3, gt=0.0, le=1.0, description="stage-1 Adam learning rate")
    # stage 2: memory banks
    coreset_frac: float = Field(0.1, gt=0.0, le=1.0, description="greedy coreset fraction")
    coreset_proj: int = Field(32, ge=1, le=1024, description="random projection of the coreset")
    # stage 3: attention retriever
    use_retriever: bool = Field(True, description="train the retriever (stage 3)")
    d_model: int = Field(32, ge=1, le=1024, description="retriever attention width")
    top_k: int = Field(3, ge=1, le=64, description="bank candidates per query")
    ret_epochs: int = Field(40, ge=1, le=10_000, description="stage-3 epochs")
    ret_lr: float = Field(1e-3, gt=0.0, le=1.0, description="stage-3 Adam learning rate")
    bank_subsample: int = Field(4000, ge=1, description="bank rows searched per retriever step")
    max_queries: int = Field(4000, ge=1, description="retriever queries per image")
    query_chunk: int = Field(4096, ge=1, description="queries per retriever chunk")
    # inference
    theta_mode: Literal["fixed", "quantile"] = Field(
        "quantile",
        description="fixed: replace where d >= theta; quantile: theta = the theta_quantile of d "
        "over the valid pixels of the training images",
    )
    theta: float = Field(0.4, gt=0.0, le=2.0, description="fixed threshold on d (paper: 0.4)")
    theta_quantile: float = Field(0.9, gt=0.0, lt=1.0, description="quantile of d (quantile)")
    theta_sweep: list[float] = Field(
        [0.1, 0.2, 0.3, 0.4, 0.5], description="fixed thetas the reproduction sweeps"
    )
    infer_seed: int = Field(42, ge=0, description="seed of inference randomness (paper: 42)")
    smooth: int = Field(5, ge=1, le=31, description="box filter side on the score map (odd)")
    pro_thresholds: int | None = Field(
        None,
        ge=2,
        le=10_000,
        description="thresholds of the AUPRO curve; None: the exact curve (every distinct score), "
        "the reference, which 99 thresholds miss by more than 0.005 on maps that are mostly "
        "background",
    )
    seeds: int = Field(1, ge=1, le=20, description="training seeds of the reproduction")

    TUNE: ClassVar[TuneSpec] = TuneSpec(
        space={
            "map_lr": Float(1e-4, 1e-2, log=True),
            "ret_lr": Float(1e-4, 1e-2, log=True),
            "theta_quantile": Float(0.5, 0.99),
            "d_model": Int(8, 64),
        },
        metric="val_aupro30",
        mode="max",
        curve=("val_aupro30", "loss"),
    )
    EVAL_FIELDS: ClassVar[frozenset[str]] = MethodConfig.EVAL_FIELDS | {
        "theta_mode",
        "theta",
        "theta_quantile",
        "infer_seed",
        "pro_thresholds",
        "n_test_good",
        "n_test_bad",
        "data_path",  # the same MVTec 3D-AD, wherever it lies on the evaluating machine
    }

    PRESETS: ClassVar[dict[str, dict]] = {
        "smoke": {
            "grid": 32, "classes": ["bump"], "class_name": "bump", "n_train": 4,
            "n_test_good": 4, "n_test_bad": 6, "n_val_good": 2, "n_val_bad": 3, "rgb_dim": 30, "xyz_dim": 16, "shot": 1,
            "shots": [1, 4], "map_epochs": 3, "ret_epochs": 3, "coreset_proj": 16, "d_model": 8,
            "bank_subsample": 500, "max_queries": 500, "log_every": 1, "checkpoint_every": 2,
            "theta_sweep": [0.2, 0.4],
        },
        "small": {
            "generator": "heightfield", "generator_version": 2,
            "classes": list(TAXONOMY_CLASSES), "class_name": "bagel", "grid": 64,
            "map_epochs": 100, "ret_epochs": 100, "seeds": 3, "log_every": 10,
            "checkpoint_every": 20,
        },
        "paper": {
            "grid": 224, "rgb_dim": 768, "xyz_dim": 1152, "map_epochs": 100, "ret_epochs": 100,
            "ret_lr": 1e-4, "coreset_proj": 128, "d_model": 128, "bank_subsample": 20_000,
            "max_queries": 20_000, "shots": [1, 2, 4], "theta_mode": "fixed", "theta": 0.4,
            "log_every": 10, "checkpoint_every": 50, "generator": "mvtec3d",
            "features": "paper", "classes": list(MVTEC3D_CLASSES), "class_name": "bagel",
            "job_gpus": 1.0,
        },
    }  # fmt: skip

    @model_validator(mode="after")
    def _check(self) -> CfrConfig:
        if self.generator_version == 2 and self.generator == "mesh":
            raise ValueError(
                "field 'generator_version': version 2 is a height-field generator; use "
                "generator heightfield (or generator_version 1 for meshes)"
            )
        known = generator_classes(self.generator, self.generator_version)
        unknown = [c for c in self.classes if known is not None and c not in known]
        if unknown:
            raise ValueError(
                f"field 'classes': unknown {unknown} for the {self.generator} generator "
                f"(version {self.generator_version}); "
                f"choose from {list(known)}"
            )
        if self.class_name not in self.classes:
            raise ValueError(f"field 'class_name': {self.class_name!r} is not in {self.classes}")
        if self.features == "random" and self.rgb_dim % 3:
            raise ValueError("field 'rgb_dim': must be a multiple of 3 (three CNN layers)")
        if any(not c or "/" in c or c.startswith(".") for c in self.classes):
            raise ValueError("field 'classes': a class is a folder name (no '/', not hidden)")
        if self.smooth % 2 == 0:
            raise ValueError("field 'smooth': the box filter side must be odd")
        pool = self.n_train if self.generator != "mvtec3d" else 10_000  # real: checked on load
        if any(k < 1 or k > pool for k in [self.shot, *self.shots]):
            raise ValueError(f"field 'shots': each k must lie in [1, n_train={self.n_train}]")
        if any(not 0.0 < t <= 2.0 for t in self.theta_sweep):
            raise ValueError("field 'theta_sweep': each theta must lie in (0, 2]")
        if self.system == "cfr" and not self.use_retriever:
            raise ValueError(
                "field 'use_retriever': system 'cfr' replaces by the retriever; "
                "use system 'cfr_nn_fallback' for replacement without it"
            )
        if self.system == "cfm" and self.cycles:
            # CFM is the one-way baseline: its mappings never see the cycle terms
            self.__dict__["cycles"] = False
        self.__dict__["steps"] = self.planned_steps()
        return self

    def backbone_spec(self) -> BackboneSpec:
        """The frozen extractors this config names (:mod:`nshot.nn.backbone`; the kinds are
        registered by :mod:`.features`): the seeded random ones (``random-features``) or DINO
        ViT-B/8 and Point-MAE from ``dino_path`` and ``pointmae_path`` (``dino-pointmae``)."""
        from nshot.nn.backbone import BackboneSpec

        if self.features == "paper":
            return BackboneSpec("dino-pointmae", {
                "dino_path": self.dino_path, "pointmae_path": self.pointmae_path,
                "pointmae_groups": self.pointmae_groups,
                "pointmae_group_size": self.pointmae_group_size,
            })  # fmt: skip
        return BackboneSpec("random-features", {"rgb_dim": self.rgb_dim, "xyz_dim": self.xyz_dim,
                                                "seed": self.feature_seed})  # fmt: skip

    def planned_steps(self) -> int:
        """Epochs of the stages this system trains (1 for the bank-only baselines)."""
        if self.system not in MAPPING_SYSTEMS:
            return 1
        ret = self.ret_epochs if self.system in RETRIEVER_SYSTEMS and self.use_retriever else 0
        return self.map_epochs + ret
