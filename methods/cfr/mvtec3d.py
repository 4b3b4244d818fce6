"""MVTec 3D-AD read from ``data_path`` (CFR §4.1; the loading and pre-processing of CFM, whose
features, pre-processing and scoring CFR keeps).

Layout (the dataset as downloaded): ``<data_path>/<class>/{train,validation,test}/<type>/``
with ``rgb/*.png``, ``xyz/*.tiff`` (organised point clouds: three float32 channels x, y, z per
pixel, (0, 0, 0) where the sensor saw nothing) and, for the test defects, ``gt/*.png`` (the
defect masks); ``train`` and ``validation`` hold ``good`` only, ``test`` holds ``good`` and
one folder per defect type. Files pair by name (``000.png`` with ``000.tiff``). A missing
folder or an unpaired file is an error naming the path.

Per image, as CFM's ``models/dataset.py``:

* RGB: padded to a square by repeating the edge pixels (``SquarePad``), bicubic resize to
  ``grid`` (PIL's, as torchvision's ``Resize`` on a PIL image), 0–255;
* xyz: nearest-neighbour resize to ``grid`` (``torch.nn.functional.interpolate``, mode
  ``nearest``), non-finite values set to 0;
* gt: the same square pad and a nearest resize, foreground where the value is above 0.5
  (of 1); a ``good`` image has no defect pixel.

``preprocess="cfm"`` first applies CFM's ``processing/preprocess_mvtec.py`` to the full-size
xyz (the pre-processing the paper uses, CFR §4.1: the background plane removed), written with
numpy and SciPy instead of Open3D: a plane fitted by RANSAC to the valid points of the
10-pixel image border (samples of 50 points, 1,000 iterations, inliers within 0.004, then
refitted to the inliers of the best sample, as Open3D's ``segment_plane``), every point within
0.005 of it set to 0, zero padding to a square whose side is rounded up to 100, and every
point outside the largest DBSCAN cluster (eps 0.006, 30 points; :func:`dbscan_labels`, checked
against scikit-learn's DBSCAN in the tests) set to 0. RANSAC draws its
samples from a generator seeded by the file name, so a run is repeatable (Open3D's draws are
not). With fewer than 50 valid border points (a cloud already pre-processed) the plane step
does nothing, so applying it to CFM-pre-processed files changes nothing but the cost.
``preprocess="none"`` reads the files as they are (e.g. after running CFM's script in place).

TIFF: ``tifffile`` when it is installed (``pip install -e ".[cfr-paper]"``), else
:func:`read_float_tiff`, a reader of the baseline float TIFFs MVTec 3D-AD and ``tifffile``
write (strips, uncompressed or Deflate, no predictor); ``tests/test_cfr_paper.py`` checks it
against ``tifffile`` where that is installed.

Loaded images are cached as verified Parquet under ``$NSHOT_CACHE``, keyed by the data path,
the listed files' sizes and modification times, the grid and the pre-processing.
"""

from __future__ import annotations

import hashlib
import math
import struct
import zlib
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa

from nshot.data.cache import cached_table
from nshot.errors import ConfigError

MVTEC3D_CLASSES = (
    "bagel", "cable_gland", "carrot", "cookie", "dowel", "foam", "peach", "potato", "rope",
    "tire",
)  # fmt: skip
FOLDERS = {"train": "train", "val": "validation", "test": "test"}
LAYOUT = "<class>/{train,validation,test}/<good|defect>/{rgb/*.png, xyz/*.tiff, gt/*.png}"
DATA_VERSION = "1"


# --------------------------------------------------------------------------------------------
# TIFF


_TYPES = {1: ("B", 1), 2: ("s", 1), 3: ("H", 2), 4: ("I", 4), 5: ("II", 8), 6: ("b", 1),
          7: ("B", 1), 8: ("h", 2), 9: ("i", 4), 11: ("f", 4), 12: ("d", 8), 16: ("Q", 8)}  # fmt: skip


def read_float_tiff(path: str | Path) -> np.ndarray:
    """The first image of a baseline TIFF of float samples (strips; compression none or
    Deflate; no predictor) as ``H × W × samples`` (``H × W`` for one sample)."""
    p = Path(path)
    data = p.read_bytes()
    if data[:4] not in (b"II*\x00", b"MM\x00*"):
        big = data[:4] in (b"II+\x00", b"MM\x00+")
        raise ValueError(f"{p}: " + ("a BigTIFF (install tifffile to read it)" if big
                                     else "not a TIFF file"))  # fmt: skip
    end = "<" if data[:2] == b"II" else ">"
    (ifd,) = struct.unpack_from(end + "I", data, 4)
    (n,) = struct.unpack_from(end + "H", data, ifd)
    tags: dict[int, list] = {}
    for i in range(n):
        tag, typ, count, raw = struct.unpack_from(end + "HHI4s", data, ifd + 2 + 12 * i)
        if typ not in _TYPES:
            continue
        fmt, size = _TYPES[typ]
        total = size * count
        buf = raw if total <= 4 else data[struct.unpack(end + "I", raw)[0] :][:total]
        if typ == 2:
            continue
        vals = list(struct.unpack(end + fmt[0] * (count * len(fmt)), buf[:total]))
        tags[tag] = vals
    need = {256: "ImageWidth", 257: "ImageLength", 273: "StripOffsets", 279: "StripByteCounts"}
    for tag, name in need.items():
        if tag not in tags:
            tiled = 322 in tags
            raise ValueError(f"{p}: no {name} tag" + (" (a tiled TIFF: install tifffile)"
                                                     if tiled else ""))  # fmt: skip
    w, h = tags[256][0], tags[257][0]
    spp = tags.get(277, [1])[0]
    bps = tags.get(258, [1])[0]
    fmt_code = tags.get(339, [1])[0]
    comp = tags.get(259, [1])[0]
    planar = tags.get(284, [1])[0]
    predictor = tags.get(317, [1])[0]
    if fmt_code != 3 or bps not in (32, 64):
        raise ValueError(f"{p}: samples of format {fmt_code} and {bps} bits, not float32/64")
    if comp not in (1, 8, 32946):
        raise ValueError(f"{p}: compression {comp} (this reader knows none and Deflate; "
                         "install tifffile)")  # fmt: skip
    if predictor != 1:
        raise ValueError(f"{p}: predictor {predictor} (install tifffile to read it)")
    chunks = []
    for off, cnt in zip(tags[273], tags[279], strict=True):
        chunk = data[off : off + cnt]
        chunks.append(zlib.decompress(chunk) if comp != 1 else chunk)
    dtype = np.dtype(f"{end}f{bps // 8}")
    arr = np.frombuffer(b"".join(chunks), dtype=dtype)
    if arr.size < h * w * spp:
        raise ValueError(f"{p}: {arr.size} samples, the tags say {h} × {w} × {spp}")
    arr = arr[: h * w * spp]
    arr = arr.reshape(spp, h, w).transpose(1, 2, 0) if planar == 2 else arr.reshape(h, w, spp)
    arr = arr.astype(dtype.newbyteorder("="))
    return arr[..., 0] if spp == 1 else arr


def write_float_tiff(path: str | Path, arr: np.ndarray) -> Path:
    """An uncompressed little-endian float32 TIFF of ``H × W × C`` (one strip): the layout of
    MVTec 3D-AD's xyz files, for tests."""
    a = np.ascontiguousarray(arr, dtype="<f4")
    h, w, c = a.shape
    entries = [(256, 4, 1, w), (257, 4, 1, h), (258, 3, c, None), (259, 3, 1, 1),
               (262, 3, 1, 2 if c == 3 else 1), (273, 4, 1, None), (277, 3, 1, c),
               (278, 4, 1, h), (279, 4, 1, a.nbytes), (284, 3, 1, 1), (339, 3, c, None)]  # fmt: skip
    ifd = 8
    extra = ifd + 2 + 12 * len(entries) + 4
    arrays = {258: struct.pack("<" + "H" * c, *[32] * c), 339: struct.pack("<" + "H" * c, *[3] * c)}
    blobs = b""
    offsets = {}
    for tag in (258, 339):
        if c > 2:
            offsets[tag] = extra + len(blobs)
            blobs += arrays[tag]
    data_off = extra + len(blobs)
    out = bytearray(b"II*\x00" + struct.pack("<I", ifd) + struct.pack("<H", len(entries)))
    for tag, typ, count, val in entries:
        if tag == 273:
            val = data_off
        if tag in (258, 339):
            if c > 2:
                out += struct.pack("<HHII", tag, typ, count, offsets[tag])
            else:
                out += struct.pack("<HHI", tag, typ, count) + arrays[tag].ljust(4, b"\0")
            continue
        if typ == 3:
            out += struct.pack("<HHIHH", tag, typ, count, val, 0)
        else:
            out += struct.pack("<HHII", tag, typ, count, val)
    out += struct.pack("<I", 0) + blobs + a.tobytes()
    p = Path(path)
    p.write_bytes(bytes(out))
    return p


def read_tiff(path: str | Path) -> np.ndarray:
    """A float TIFF: ``tifffile.imread`` when tifffile is installed, else :func:`read_float_tiff`."""
    try:
        import tifffile
    except ImportError:
        return read_float_tiff(path)
    return np.asarray(tifffile.imread(str(path)))


# --------------------------------------------------------------------------------------------
# CFM's pre-processing of a point cloud (processing/preprocess_mvtec.py)


def _plane_of(points: np.ndarray) -> np.ndarray:
    """(a, b, c, d) with a unit normal, least squares through ``points`` [n, 3]."""
    centre = points.mean(0)
    _, vecs = np.linalg.eigh(np.cov((points - centre).T))
    normal = vecs[:, 0]
    return np.r_[normal, -normal @ centre]


def ransac_plane(
    points: np.ndarray, rng: np.random.Generator, threshold: float = 0.004, n: int = 50,
    iterations: int = 1000,
) -> np.ndarray:  # fmt: skip
    """Open3D's ``segment_plane``: the sample plane with the most inliers (then the lowest
    inlier RMSE), refitted to its inliers."""
    pts = points.astype(np.float64)
    samples = np.stack([rng.choice(len(pts), n, replace=False) for _ in range(iterations)])
    sub = pts[samples]  # it × n × 3
    centre = sub.mean(1)
    cov = np.einsum("kni,knj->kij", sub - centre[:, None], sub - centre[:, None])
    _, vecs = np.linalg.eigh(cov)
    normals = vecs[:, :, 0]
    ds = -(normals * centre).sum(1)
    best, best_key = 0, (-1, 0.0)
    for s in range(0, iterations, 50):
        dist = np.abs(pts @ normals[s : s + 50].T + ds[s : s + 50])  # N × 50
        inl = dist < threshold
        count = inl.sum(0)
        rmse = np.sqrt(np.where(inl, dist**2, 0).sum(0) / np.maximum(count, 1))
        for j in range(len(count)):
            key = (int(count[j]), -float(rmse[j]))
            if key > best_key:
                best, best_key = s + j, key
    dist = np.abs(pts @ normals[best] + ds[best])
    inliers = pts[dist < threshold]
    return _plane_of(inliers) if len(inliers) >= 3 else np.r_[normals[best], ds[best]]


def _edges(xyz: np.ndarray) -> np.ndarray:
    parts = [xyz[:10].reshape(-1, 3), xyz[-10:].reshape(-1, 3), xyz[:, :10].reshape(-1, 3),
             xyz[:, -10:].reshape(-1, 3)]  # fmt: skip
    e = np.concatenate(parts)
    return e[(e != 0).all(1)]


def _pad_square(a: np.ndarray) -> np.ndarray:
    h, w = a.shape[:2]
    side = max(math.ceil(h / 100) * 100, math.ceil(w / 100) * 100)
    top, left = (side - h) // 2, (side - w) // 2
    pad = ((top, side - top - h), (left, side - left - w)) + ((0, 0),) * (a.ndim - 2)
    return np.pad(a, pad, mode="constant")


def dbscan_labels(points: np.ndarray, eps: float = 0.006, min_samples: int = 30) -> np.ndarray:
    """DBSCAN's labels (``-1``: noise), computed without DBSCAN's per-point neighbour lists,
    which hold thousands of entries per point on a dense scan (gigabytes at 800²):

    * a point is core when at least ``min_samples`` points (itself included) lie within
      ``eps``: counted within a radius r ≤ eps first (four times the median spacing), and
      within ``eps`` only for the points that fall short;
    * clusters are the connected components of the core points linked within r (a refinement
      of DBSCAN's, whose links reach eps), merged wherever a core point of a component other
      than the largest lies within ``eps`` of another component's core point (every link
      missed in the first pass has such an end): DBSCAN's clusters of core points exactly;
    * a non-core point within ``eps`` of a core point joins the cluster of its nearest core
      point (DBSCAN: of the first cluster that reaches it; the two differ only for a point
      within ``eps`` of two clusters), the others are noise.
    """
    from scipy.sparse import coo_matrix
    from scipy.sparse.csgraph import connected_components
    from scipy.spatial import cKDTree

    pts = np.asarray(points, dtype=np.float64)
    n = len(pts)
    labels = np.full(n, -1, dtype=np.int64)
    if n == 0:
        return labels
    tree = cKDTree(pts)
    sample = pts[:: max(1, n // 2000)]
    spacing = float(np.median(tree.query(sample, k=2)[0][:, 1])) if n > 1 else eps
    r = min(eps, max(4 * spacing, 1e-12))
    counts = tree.query_ball_point(pts, r, return_length=True)
    short = np.nonzero(counts < min_samples)[0]
    if len(short) and r < eps:
        counts[short] = tree.query_ball_point(pts[short], eps, return_length=True)
    core = np.nonzero(counts >= min_samples)[0]
    if len(core) == 0:
        return labels
    ctree = cKDTree(pts[core])
    pairs = ctree.query_pairs(r, output_type="ndarray")
    graph = coo_matrix((np.ones(len(pairs)), (pairs[:, 0], pairs[:, 1])), shape=(len(core),) * 2)
    _, comp = connected_components(graph, directed=False)
    sizes = np.bincount(comp)
    if r < eps and len(sizes) > 1:
        parent = np.arange(len(sizes))

        def find(i: int) -> int:
            while parent[i] != i:
                parent[i] = parent[parent[i]]
                i = parent[i]
            return i

        others = np.nonzero(comp != np.argmax(sizes))[0]
        for chunk in np.array_split(others, max(1, len(others) // 2000)):
            for i, nbrs in zip(chunk, ctree.query_ball_point(pts[core[chunk]], eps), strict=True):
                for j in set(comp[nbrs].tolist()) - {int(comp[i])}:
                    a, b = find(int(comp[i])), find(int(j))
                    if a != b:
                        parent[max(a, b)] = min(a, b)
        comp = np.array([find(int(c)) for c in range(len(sizes))])[comp]
    _, comp = np.unique(comp, return_inverse=True)
    labels[core] = comp
    rest = np.setdiff1d(np.arange(n), core)
    if len(rest):
        dist, idx = ctree.query(pts[rest], distance_upper_bound=eps)
        near = np.isfinite(dist) & (dist <= eps)
        labels[rest[near]] = comp[idx[near]]
    return labels


def cfm_preprocess(xyz: np.ndarray, seed: int) -> np.ndarray:
    """CFM's pre-processing of one full-size organised point cloud (module docstring)."""
    pc = np.array(xyz, dtype=np.float32)
    edges = _edges(pc)
    if len(edges) >= 50:
        plane = ransac_plane(edges, np.random.default_rng(seed))
        flat = pc.reshape(-1, 3)
        dist = np.abs(flat.astype(np.float64) @ plane[:3] + plane[3])
        flat[dist < 0.005] = 0
        pc = flat.reshape(pc.shape)
    pc = _pad_square(pc)
    flat = pc.reshape(-1, 3)
    keep = np.nonzero((flat != 0).all(1))[0]
    if len(keep):
        labels = dbscan_labels(flat[keep], eps=0.006, min_samples=30)
        ids, sizes = np.unique(labels, return_counts=True)
        flat[keep[labels != ids[np.argmax(sizes)]]] = 0
    return flat.reshape(pc.shape)


# --------------------------------------------------------------------------------------------
# the layout and one image


@dataclass(frozen=True)
class Item:
    rgb: Path
    xyz: Path
    gt: Path | None
    defect: str  # "good" or the defect folder's name


def _pairs(folder: Path, kind: str, suffix: str) -> dict[str, Path]:
    d = folder / kind
    if not d.is_dir():
        raise ConfigError(f"field 'data_path': {d} is missing (MVTec 3D-AD layout: {LAYOUT})")
    return {f.stem: f for f in sorted(d.iterdir()) if f.suffix.lower() == suffix}


def list_items(root: str | Path, cls: str, split: str) -> list[Item]:
    """The images of one class and split (``train``, ``val``, ``test``), sorted by type and
    name; ``train`` and ``val`` read ``good`` only (as CFM)."""
    base = Path(root) / cls / FOLDERS[split]
    if not base.is_dir():
        raise ConfigError(f"field 'data_path': {base} is missing (MVTec 3D-AD layout: {LAYOUT})")
    types = (["good"] if split != "test"
             else sorted(t.name for t in base.iterdir() if t.is_dir()))  # fmt: skip
    items: list[Item] = []
    for t in types:
        folder = base / t
        rgbs, xyzs = _pairs(folder, "rgb", ".png"), _pairs(folder, "xyz", ".tiff")
        gts = _pairs(folder, "gt", ".png") if t != "good" else {}
        for stem in sorted(set(rgbs) | set(xyzs)):
            if stem not in rgbs:
                raise ConfigError(f"field 'data_path': {xyzs[stem]} has no rgb/{stem}.png")
            if stem not in xyzs:
                raise ConfigError(f"field 'data_path': {rgbs[stem]} has no xyz/{stem}.tiff")
            if t != "good" and stem not in gts:
                raise ConfigError(f"field 'data_path': {rgbs[stem]} has no gt/{stem}.png")
            items.append(Item(rgbs[stem], xyzs[stem], gts.get(stem), t))
    if not items:
        raise ConfigError(f"field 'data_path': {base} holds no rgb/*.png + xyz/*.tiff pairs")
    return items


def _square_pad_edge(a: np.ndarray) -> np.ndarray:
    """CFM's ``SquarePad``: the shorter side padded (edge values) to the longer, centred."""
    h, w = a.shape[:2]
    side = max(h, w)
    top, left = (side - h) // 2, (side - w) // 2
    pad = ((top, side - top - h), (left, side - left - w)) + ((0, 0),) * (a.ndim - 2)
    return np.pad(a, pad, mode="edge")


def load_item(item: Item, grid: int, preprocess: str) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(rgb ``grid × grid × 3`` uint8, xyz ``grid × grid × 3`` float32, mask ``grid × grid``
    bool) of one image, pre-processed as the module docstring says."""
    import torch
    from PIL import Image

    try:
        xyz = np.asarray(read_tiff(item.xyz), dtype=np.float32)
    except (OSError, ValueError) as e:
        raise ConfigError(f"field 'data_path': {item.xyz}: unreadable ({e})") from None
    if xyz.ndim != 3 or xyz.shape[2] != 3:
        raise ConfigError(f"field 'data_path': {item.xyz}: shape {xyz.shape}, not H × W × 3")
    xyz = np.where(np.isfinite(xyz), xyz, 0).astype(np.float32)
    if preprocess == "cfm":
        seed = int.from_bytes(hashlib.sha256(str(item.xyz.name).encode()).digest()[:4], "little")
        xyz = cfm_preprocess(xyz, seed)
    elif len(_edges(xyz)) >= 50:
        import warnings

        warnings.warn(
            f"{item.xyz}: points along the image border (a background plane?) with "
            "preprocess=none; CFM's pre-processing removes them (preprocess=cfm)",
            stacklevel=2,
        )
    t = torch.from_numpy(np.ascontiguousarray(xyz)).permute(2, 0, 1)[None]
    xyz_r = torch.nn.functional.interpolate(t, size=(grid, grid), mode="nearest")
    xyz_out = xyz_r[0].permute(1, 2, 0).contiguous().numpy()
    try:
        with Image.open(item.rgb) as im:
            rgb = np.asarray(im.convert("RGB"))
        rgb = np.asarray(Image.fromarray(_square_pad_edge(rgb)).resize(
            (grid, grid), Image.Resampling.BICUBIC))  # fmt: skip
        mask = np.zeros((grid, grid), bool)
        if item.gt is not None:
            with Image.open(item.gt) as im:
                gt = np.asarray(im.convert("L"))
            gt = np.asarray(Image.fromarray(_square_pad_edge(gt)).resize(
                (grid, grid), Image.Resampling.NEAREST))  # fmt: skip
            mask = gt / 255.0 > 0.5
    except OSError as e:
        raise ConfigError(f"field 'data_path': {item.rgb.parent.parent}: unreadable image "
                          f"({e})") from None  # fmt: skip
    return rgb.astype(np.uint8), xyz_out.astype(np.float32), mask


# --------------------------------------------------------------------------------------------
# tables


SCHEMA = pa.schema([
    ("class_name", pa.string()), ("split", pa.string()), ("index", pa.int32()),
    ("defect", pa.string()), ("label", pa.int8()), ("rgb", pa.list_(pa.uint8())),
    ("xyz", pa.list_(pa.float32())), ("mask", pa.list_(pa.uint8())),
])  # fmt: skip


def split_table(
    root: str | Path, cls: str, split: str, grid: int, preprocess: str,
    indices: list[int] | None = None,
) -> pa.Table:  # fmt: skip
    """The images ``indices`` (all when None) of one class and split, loaded once and cached."""
    items = list_items(root, cls, split)
    idx = list(range(len(items))) if indices is None else sorted(indices)
    if idx and (idx[0] < 0 or idx[-1] >= len(items)):
        raise ConfigError(f"field 'shots': {Path(root) / cls / FOLDERS[split]} has "
                          f"{len(items)} images, fewer than the k shots need")  # fmt: skip
    h = hashlib.sha256(str(Path(root).resolve()).encode())
    for i in idx:
        for f in (items[i].rgb, items[i].xyz, items[i].gt):
            if f is not None:
                st = f.stat()
                h.update(f"{f.relative_to(root)}:{st.st_size}:{st.st_mtime_ns};".encode())
    key = f"cfr-mvtec3d-{cls}-{split}-g{grid}-{preprocess}-{h.hexdigest()[:16]}"

    def build() -> pa.Table:
        rows = []
        for i in idx:
            rgb, xyz, mask = load_item(items[i], grid, preprocess)
            rows.append({
                "class_name": cls, "split": split, "index": i, "defect": items[i].defect,
                "label": int(items[i].defect != "good"), "rgb": rgb.reshape(-1).tolist(),
                "xyz": xyz.reshape(-1).tolist(), "mask": mask.reshape(-1).astype(np.uint8).tolist(),
            })  # fmt: skip
        return pa.Table.from_pylist(rows, schema=SCHEMA)

    return cached_table(key, build, version=DATA_VERSION)
