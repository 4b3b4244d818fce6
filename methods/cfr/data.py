"""Generated RGB + organised-xyz images of objects with and without defects.

No 3-D anomaly benchmark ships in any package (MVTec 3D-AD and Eyecandies are downloads), so the
default data are generated, following the benchmark's layout: per class, normal training images
(the pool the k shots are drawn from) and normal plus anomalous test images with pixel masks,
plus a few normal and anomalous validation images (the metric ``nshot tune`` optimises).

Height-field objects (``generator="heightfield"``), seen from straight above:

* four classes: a Gaussian bump, a half-cylinder, a saddle and a ring ridge, each with a random
  pose per image (shift ±10 %, rotation, scale ±10 %);
* xyz: x, y are the pixel's normalised coordinates in (0, 1), z the surface height plus
  N(0, 0.002²); background pixels are exactly (0, 0, 0), the invalid-point convention of
  MVTec 3D-AD;
* RGB: Lambertian shading from the surface normal times a stripe texture whose orientation,
  frequency (3–8 cycles across the object) and colour pair (from a three-colour class palette)
  are random per image. Geometry does not determine colour: the one-to-many ambiguity between
  3-D and RGB features that CFR addresses (paper §1);
* anomalies inside the object, balanced over three types: geometric (a dent or bump of depth
  ±0.05 and radius 3–6 % of the image: changes xyz and shading), colour (a stain of an
  off-palette colour: RGB only) and both at once, each with its pixel mask.

Generator version 2 (``generator_version=2``, the ``small`` preset; :mod:`.taxonomy`) replaces
the height fields' classes, texture and defects by stand-ins for MVTec 3D-AD's ten classes with
a fixed texture per class and its defect taxonomy (shape-only, colour-only in the object's own
palette, combined); version 1 stays as it was.

Every image comes from its own generator seeded by (data_seed, class, split, index), so a table
is the same whatever order it is built in; it is cached as verified Parquet.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pyarrow as pa

from nshot.data.cache import cached_table

from .config import CfrConfig, generator_classes
from .sample import Sample
from .taxonomy import taxonomy_sample

DATA_VERSION = "1"
DEFECTS = ("good", "geometric", "colour", "both")
BACKGROUND_GREY = 0.45
LIGHT = np.array([0.35, 0.25, 0.90]) / np.linalg.norm([0.35, 0.25, 0.90])

# three colours per class (RGB in [0, 1]); stains use colours far from every palette
PALETTES = {
    "bump": ((0.85, 0.75, 0.55), (0.60, 0.45, 0.30), (0.80, 0.60, 0.40)),
    "cylinder": ((0.55, 0.65, 0.80), (0.35, 0.45, 0.65), (0.70, 0.75, 0.85)),
    "saddle": ((0.60, 0.75, 0.55), (0.40, 0.55, 0.35), (0.75, 0.80, 0.60)),
    "ring": ((0.80, 0.55, 0.60), (0.60, 0.35, 0.45), (0.85, 0.70, 0.70)),
}
STAINS = ((0.10, 0.10, 0.10), (0.95, 0.10, 0.80), (0.10, 0.85, 0.90), (0.95, 0.95, 0.10))


def _height(cls: str, a: np.ndarray, b: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Height and footprint of class ``cls`` in object coordinates (a, b)."""
    r = np.hypot(a, b)
    if cls == "bump":
        return 0.30 * np.exp(-(r**2) / (2 * 0.30**2)), r < 0.75
    if cls == "cylinder":
        inside = (np.abs(a) < 0.75) & (np.abs(b) < 0.45)
        return 0.30 * np.sqrt(np.clip(1 - (b / 0.45) ** 2, 0, None)), inside
    if cls == "saddle":
        return 0.20 + 0.25 * (a**2 - b**2), r < 0.72
    if cls == "ring":
        return 0.05 + 0.25 * np.exp(-((r - 0.45) ** 2) / (2 * 0.12**2)), r < 0.75
    raise ValueError(f"unknown class {cls!r}")


def _normals(z: np.ndarray, step: float) -> np.ndarray:
    gy, gx = np.gradient(z, step)
    n = np.stack([-gx, -gy, np.ones_like(z)], axis=-1)
    return n / np.linalg.norm(n, axis=-1, keepdims=True)


def heightfield_sample(cls: str, grid: int, defect: str, rng: np.random.Generator) -> Sample:
    """One image of class ``cls`` with the given defect type (``"good"``: none)."""
    if defect not in DEFECTS:
        raise ValueError(f"unknown defect {defect!r}")
    coords = (np.arange(grid) + 0.5) / grid  # pixel centres in (0, 1)
    px, py = np.meshgrid(coords, coords)  # x along columns, y along rows
    u, v = 2 * px - 1, 2 * py - 1
    shift = rng.uniform(-0.1, 0.1, 2)
    rot = rng.uniform(0, 2 * np.pi)
    scale = rng.uniform(0.9, 1.1)
    c, s = np.cos(rot), np.sin(rot)
    du, dv = u - shift[0], v - shift[1]
    a, b = (c * du + s * dv) / scale, (-s * du + c * dv) / scale
    h, inside = _height(cls, a, b)
    h = np.where(inside, h, 0.0)

    mask = np.zeros((grid, grid), bool)
    stain = None
    if defect != "good":
        ii, jj = np.nonzero(inside)
        # a centre well inside the object: its pixel has an interior neighbourhood
        for _ in range(100):
            k = rng.integers(len(ii))
            rad = rng.uniform(0.03, 0.06) * 2  # 3–6 % of the image side, in (u, v) units
            d = np.hypot(u - u[ii[k], jj[k]], v - v[ii[k], jj[k]])
            disc = (d < rad) & inside
            if disc.sum() >= max(3, 0.6 * (d < rad).sum()):
                break
        mask = disc
        if defect in ("geometric", "both"):
            depth = rng.uniform(0.03, 0.05) * rng.choice([-1.0, 1.0])
            h = h + np.where(disc, depth * (1 - (d / rad) ** 2), 0.0)
        if defect in ("colour", "both"):
            stain = np.asarray(STAINS[rng.integers(len(STAINS))])

    z = h + rng.normal(0, 0.002, h.shape)
    xyz = np.where(inside[..., None], np.stack([px, py, z], axis=-1), 0.0).astype(np.float32)

    # texture: stripes in object coordinates, random orientation, frequency and colour pair
    pal = np.asarray(PALETTES[cls])
    i1, i2 = rng.choice(3, size=2, replace=False)
    phi = rng.uniform(0, np.pi)
    freq = rng.uniform(3, 8) / 1.5  # cycles across the object's ~1.5-unit width
    t = 0.5 + 0.5 * np.sin(
        2 * np.pi * freq * (a * np.cos(phi) + b * np.sin(phi)) + rng.uniform(0, 6.3)
    )
    colour = pal[i1] * t[..., None] + pal[i2] * (1 - t[..., None])
    if stain is not None:
        colour = np.where(mask[..., None], stain, colour)
    shade = 0.25 + 0.75 * np.clip(_normals(h, 2.0 / grid) @ LIGHT, 0, None)
    obj = colour * shade[..., None]
    bg = BACKGROUND_GREY + rng.normal(0, 0.02, (grid, grid, 1))
    img = np.where(inside[..., None], obj, bg) + rng.normal(0, 0.01, (grid, grid, 3))
    rgb = np.clip(np.round(img * 255), 0, 255).astype(np.uint8)
    return Sample(rgb=rgb, xyz=xyz, mask=mask, defect=defect)


MESH_PALETTES = {
    "box": PALETTES["bump"], "cylinder": PALETTES["cylinder"],
    "sphere": PALETTES["saddle"], "capsule": PALETTES["ring"],
}  # fmt: skip
_BASE_MESHES: dict[str, object] = {}


def _base_mesh(cls: str):  # -> trimesh.Trimesh
    """The class's mesh in object units (about 0.6 of the image wide), finely subdivided so
    that a defect of radius 3 % of the image moves many vertices; built once per process."""
    import trimesh

    if cls not in _BASE_MESHES:
        if cls == "box":
            m = trimesh.creation.box(extents=(0.6, 0.42, 0.25)).subdivide_to_size(0.012)
        elif cls == "cylinder":
            m = trimesh.creation.cylinder(radius=0.17, height=0.62, sections=64)
            m.apply_transform(trimesh.transformations.rotation_matrix(np.pi / 2, [0, 1, 0]))
            m = m.subdivide_to_size(0.02)
        elif cls == "sphere":
            m = trimesh.creation.icosphere(subdivisions=5, radius=0.3)
        elif cls == "capsule":
            m = trimesh.creation.capsule(height=0.4, radius=0.16, count=[48, 48])
            m.apply_transform(trimesh.transformations.rotation_matrix(np.pi / 2, [0, 1, 0]))
            m = m.subdivide_to_size(0.02)
        else:
            raise ValueError(f"unknown mesh class {cls!r}")
        _BASE_MESHES[cls] = m
    return _BASE_MESHES[cls]


def _cast(mesh, grid: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Orthographic rays straight down through the pixel centres: (pixel index, hit point,
    face index) of every pixel that sees the mesh."""
    coords = (np.arange(grid) + 0.5) / grid
    px, py = np.meshgrid(coords, coords)
    origins = np.stack([px.ravel(), py.ravel(), np.full(px.size, 10.0)], -1)
    dirs = np.tile([0.0, 0.0, -1.0], (px.size, 1))
    loc, ray, tri = mesh.ray.intersects_location(origins, dirs, multiple_hits=False)
    return ray, loc, tri


def mesh_sample(cls: str, grid: int, defect: str, rng: np.random.Generator) -> Sample:
    """One image of mesh class ``cls``: a posed primitive, ray-cast to an organised xyz map."""
    import trimesh

    if defect not in DEFECTS:
        raise ValueError(f"unknown defect {defect!r}")
    base = _base_mesh(cls)
    obj = base.vertices.copy()  # object coordinates, for the texture
    rot = trimesh.transformations.euler_matrix(
        rng.uniform(-0.25, 0.25), rng.uniform(-0.25, 0.25), rng.uniform(0, 2 * np.pi)
    )[:3, :3]
    scale = rng.uniform(0.9, 1.1)
    v = obj @ rot.T * scale
    v[:, :2] += 0.5 + rng.uniform(-0.1, 0.1, 2)
    v[:, 2] += 0.05 - v[:, 2].min()  # resting above the ground plane z = 0
    mesh = trimesh.Trimesh(v, base.faces, process=False)

    vmask = np.zeros(len(v), bool)
    stain = None
    if defect != "good":
        ray, loc, _ = _cast(mesh, grid)
        normals = mesh.vertex_normals
        # a centre on the visible surface, away from the silhouette
        for _ in range(100):
            centre = loc[rng.integers(len(loc))]
            rad = rng.uniform(0.03, 0.06)
            near = np.linalg.norm(v - centre, axis=1) < rad
            if near.sum() >= 8 and normals[near][:, 2].mean() > 0.3:
                break
        vmask = near
        if defect in ("geometric", "both"):
            depth = rng.uniform(0.015, 0.035) * rng.choice([-1.0, 1.0])
            dist = np.linalg.norm(v[near] - centre, axis=1)
            v = v.copy()
            v[near] += normals[near] * (depth * (1 - (dist / rad) ** 2))[:, None]
            mesh = trimesh.Trimesh(v, base.faces, process=False)
        if defect in ("colour", "both"):
            stain = np.asarray(STAINS[rng.integers(len(STAINS))])

    ray, loc, tri = _cast(mesh, grid)
    # texture: stripes in object coordinates, random orientation, frequency and colour pair
    pal = np.asarray(MESH_PALETTES[cls])
    i1, i2 = rng.choice(3, size=2, replace=False)
    direction = rng.normal(size=3)
    direction /= np.linalg.norm(direction)
    freq = rng.uniform(3, 8) / 0.6
    phase = rng.uniform(0, 2 * np.pi)
    faces = base.faces[tri]
    centre_obj = obj[faces].mean(1)
    t = 0.5 + 0.5 * np.sin(2 * np.pi * freq * centre_obj @ direction + phase)
    colour = pal[i1] * t[:, None] + pal[i2] * (1 - t[:, None])
    hit_mask = vmask[faces].any(1)
    if stain is not None:
        colour = np.where(hit_mask[:, None], stain, colour)
    shade = 0.25 + 0.75 * np.clip(mesh.face_normals[tri] @ LIGHT, 0, None)

    n = grid * grid
    img = BACKGROUND_GREY + rng.normal(0, 0.02, (n, 1)) * np.ones((1, 3))
    img[ray] = colour * shade[:, None]
    img = img + rng.normal(0, 0.01, (n, 3))
    xyz = np.zeros((n, 3))
    xyz[ray] = loc + np.c_[np.zeros((len(loc), 2)), rng.normal(0, 0.002, len(loc))]
    mask = np.zeros(n, bool)
    mask[ray] = hit_mask
    rgb = np.clip(np.round(img * 255), 0, 255).astype(np.uint8).reshape(grid, grid, 3)
    return Sample(rgb=rgb, xyz=xyz.astype(np.float32).reshape(grid, grid, 3),
                  mask=mask.reshape(grid, grid), defect=defect)  # fmt: skip


def _rows(cfg: CfrConfig, cls: str) -> list[dict]:
    ci = generator_classes(cfg.generator, cfg.generator_version).index(cls)
    plan = [("train", i, "good") for i in range(cfg.n_train)]
    plan += [("test", i, "good") for i in range(cfg.n_test_good)]
    plan += [("test", cfg.n_test_good + i, DEFECTS[1 + i % 3]) for i in range(cfg.n_test_bad)]
    plan += [("val", i, "good") for i in range(cfg.n_val_good)]
    plan += [("val", cfg.n_val_good + i, DEFECTS[1 + i % 3]) for i in range(cfg.n_val_bad)]
    make = mesh_sample if cfg.generator == "mesh" else heightfield_sample
    if cfg.generator_version == 2:
        make = taxonomy_sample
    rows = []
    for split, idx, defect in plan:
        stream = {"train": 0, "test": 1, "val": 2}[split]
        rng = np.random.default_rng([cfg.data_seed, ci, stream, idx])
        smp = make(cls, cfg.grid, defect, rng)
        rows.append({
            "class_name": cls, "split": split, "index": idx, "defect": defect,
            "label": int(defect != "good"),
            "rgb": smp.rgb.reshape(-1).tolist(), "xyz": smp.xyz.reshape(-1).tolist(),
            "mask": smp.mask.reshape(-1).astype(np.uint8).tolist(),
        })  # fmt: skip
    return rows


SCHEMA = pa.schema([
    ("class_name", pa.string()), ("split", pa.string()), ("index", pa.int32()),
    ("defect", pa.string()), ("label", pa.int8()), ("rgb", pa.list_(pa.uint8())),
    ("xyz", pa.list_(pa.float32())), ("mask", pa.list_(pa.uint8())),
])  # fmt: skip


def table_key(cfg: CfrConfig, cls: str) -> str:
    version = "" if cfg.generator_version == 1 else f"-v{cfg.generator_version}"
    return (f"cfr-{cfg.generator}{version}-{cls}-g{cfg.grid}-n{cfg.n_train}-{cfg.n_test_good}-"
            f"{cfg.n_test_bad}-v{cfg.n_val_good}-{cfg.n_val_bad}-s{cfg.data_seed}")  # fmt: skip


def class_table(cfg: CfrConfig, cls: str) -> pa.Table:
    """The images of one class, built once and read from the verified Parquet cache."""
    known = generator_classes(cfg.generator, cfg.generator_version) or ()
    if cls not in known:
        raise ValueError(f"unknown {cfg.generator} class {cls!r}; choose from "
                         f"{list(known)}")  # fmt: skip
    return cached_table(
        table_key(cfg, cls),
        lambda: pa.Table.from_pylist(_rows(cfg, cls), schema=SCHEMA),
        version=DATA_VERSION,
    )


@dataclass(frozen=True)
class Split:
    rgb: np.ndarray  # n × H × W × 3 uint8
    xyz: np.ndarray  # n × H × W × 3 float32
    mask: np.ndarray  # n × H × W bool
    label: np.ndarray  # n int
    defect: list[str]

    def __len__(self) -> int:
        return len(self.label)

    def take(self, idx: np.ndarray | list[int]) -> Split:
        idx = np.asarray(idx, dtype=int)
        return Split(self.rgb[idx], self.xyz[idx], self.mask[idx], self.label[idx],
                     [self.defect[i] for i in idx])  # fmt: skip


def _split_of(tab: pa.Table, g: int) -> Split:
    def arr(name: str, dtype: type, shape: tuple[int, ...]) -> np.ndarray:
        flat = tab.column(name).combine_chunks().flatten().to_numpy(zero_copy_only=False)
        return flat.astype(dtype).reshape(len(tab), *shape)

    return Split(
        rgb=arr("rgb", np.uint8, (g, g, 3)), xyz=arr("xyz", np.float32, (g, g, 3)),
        mask=arr("mask", np.uint8, (g, g)).astype(bool),
        label=np.asarray(tab.column("label").to_pylist(), dtype=int),
        defect=tab.column("defect").to_pylist(),
    )  # fmt: skip


def check_inputs(cfg: CfrConfig) -> None:
    """A :class:`~nshot.errors.ConfigError` naming everything that keeps the config's backbone
    (:func:`~nshot.nn.backbone.backbone_problems`: the paper's weight files) or its real data
    (``data_path``) from loading, found without reading either."""
    from pathlib import Path

    from nshot.nn.backbone import backbone_problems, raise_problems

    from . import features  # noqa: F401 - registers the backbone kinds

    missing = backbone_problems(cfg.backbone_spec())
    if cfg.generator == "mvtec3d":
        if not cfg.data_path:
            missing.append("field 'data_path' is not set (the MVTec 3D-AD root)")
        elif not Path(cfg.data_path).is_dir():
            missing.append(f"field 'data_path': {cfg.data_path} is not a directory")
    raise_problems(f"cfr (preset {cfg.preset!r}, generator {cfg.generator}, features "
                   f"{cfg.features})", missing, "methods/cfr/README.md (Paper path)")  # fmt: skip


def _real(cfg: CfrConfig, cls: str, split: str, indices: list[int] | None = None) -> pa.Table:
    from .mvtec3d import split_table

    check_inputs(cfg)
    return split_table(cfg.data_path or "", cls, split, cfg.grid, cfg.preprocess, indices)


def synthetic_anomalies(normal: Split, seed: int) -> Split:
    """``normal`` followed by one anomalous copy of each image: a defect pasted inside the
    object, as the generators make them (geometric, colour, both; in turn), with its mask.

    For real validation images, which are all normal (MVTec 3D-AD's), so that ``nshot tune``
    has an objective there. The defect is a disc of radius 3–6 % of the image centred on a valid
    (non-zero) point: geometric moves the points along the camera's z by a cosine bump of depth
    ±(0.5–1) × its radius in world units (the image's median distance between neighbouring
    points × the radius in pixels), shading nothing; colour blends an off-palette stain in with
    weight 0.8 × the bump profile; both does the two. Only valid pixels inside the disc change
    and form the mask. Seeded per image by (seed, index)."""
    n, h, w = normal.mask.shape
    rgb, xyz, mask = normal.rgb.copy(), normal.xyz.copy(), np.zeros_like(normal.mask)
    defects = []
    yy, xx = np.mgrid[0:h, 0:w]
    for i in range(n):
        rng = np.random.default_rng([seed, 4242, i])
        kind = DEFECTS[1 + i % 3]
        valid = np.abs(xyz[i]).sum(-1) > 0
        if not valid.any():
            raise ValueError(f"validation image {i}: no valid point to put a defect on")
        cy, cx = np.argwhere(valid)[rng.integers(valid.sum())]
        r = rng.uniform(0.03, 0.06) * h
        d = np.hypot(yy - cy, xx - cx)
        prof = np.where(d < r, 0.5 * (1 + np.cos(np.pi * np.clip(d / r, 0, 1))), 0.0) * valid
        both = valid[:, 1:] & valid[:, :-1]
        steps = np.linalg.norm(xyz[i][:, 1:] - xyz[i][:, :-1], axis=-1)[both]
        spacing = float(np.median(steps)) if steps.size else 1e-3
        if kind in ("geometric", "both"):
            depth = rng.choice([-1.0, 1.0]) * rng.uniform(0.5, 1.0) * r * spacing
            xyz[i, ..., 2] += (depth * prof).astype(np.float32)
        if kind in ("colour", "both"):
            stain = np.asarray(STAINS[int(rng.integers(len(STAINS)))]) * 255.0
            a = 0.8 * prof[..., None]
            rgb[i] = np.clip((1 - a) * rgb[i] + a * stain, 0, 255).round().astype(np.uint8)
        mask[i] = prof > 0
        defects.append(f"synthetic-{kind}")
    return Split(
        np.concatenate([normal.rgb, rgb]), np.concatenate([normal.xyz, xyz]),
        np.concatenate([normal.mask, mask]),
        np.concatenate([normal.label, np.ones(n, dtype=normal.label.dtype)]),
        [*normal.defect, *defects],
    )  # fmt: skip


def load_class(cfg: CfrConfig, cls: str) -> dict[str, Split]:
    """``{"train": normal pool, "test": normal + anomalous, "val": normal + anomalous}`` of
    class ``cls`` as arrays (the validation images are for tuning; never in the results).
    For real data (``generator="mvtec3d"``): ``test`` and ``val``; MVTec 3D-AD's validation
    images are all normal, so with ``val_synthetic`` (default) ``val`` adds an anomalous copy
    of each (:func:`synthetic_anomalies`); the k training images come from
    :func:`shot_split`."""
    if cfg.generator == "mvtec3d":
        out = {s: _split_of(_real(cfg, cls, s), cfg.grid) for s in ("test", "val")}
        if cfg.val_synthetic:
            out["val"] = synthetic_anomalies(out["val"], cfg.data_seed)
        return out
    tab = class_table(cfg, cls)
    split_col = np.asarray(tab.column("split").to_pylist())
    return {split: _split_of(tab.take(pa.array(np.nonzero(split_col == split)[0])), cfg.grid)
            for split in ("train", "test", "val")}  # fmt: skip


def shot_split(cfg: CfrConfig, cls: str, k: int) -> Split:
    """The k normal training images: ``fewshot_indices`` over the sorted pool."""
    if cfg.generator != "mvtec3d":
        pool = load_class(cfg, cls)["train"]
        return pool.take(fewshot_indices(len(pool), k, cfg.fewshot_seed))
    from nshot.errors import ConfigError

    from .mvtec3d import list_items

    check_inputs(cfg)
    n = len(list_items(cfg.data_path or "", cls, "train"))
    if k > n:
        raise ConfigError(f"field 'shots': k = {k}, but {cls}/train/good holds {n} images")
    idx = [int(i) for i in fewshot_indices(n, k, cfg.fewshot_seed)]
    return _split_of(_real(cfg, cls, "train", idx), cfg.grid)


def fewshot_indices(n_pool: int, k: int, seed: int = 42) -> np.ndarray:
    """The k training images: ``default_rng(seed).choice`` over the sorted pool (paper code)."""
    return np.sort(np.random.default_rng(seed).choice(n_pool, size=k, replace=False))


def data_tables(cfg: CfrConfig) -> dict[str, pa.Table]:
    """Every class's table (normal training pool and test images with masks; for real data
    the test images)."""
    if cfg.generator == "mvtec3d":
        return {cls: _real(cfg, cls, "test") for cls in cfg.classes}
    return {cls: class_table(cfg, cls) for cls in cfg.classes}
