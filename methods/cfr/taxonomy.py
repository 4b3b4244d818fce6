"""Generator version 2: height-field stand-ins for MVTec 3D-AD's ten classes and its defects.

``generator="heightfield"`` with ``generator_version=2`` (the ``small`` preset). MVTec 3D-AD
(Bergmann et al., VISAPP 2022) scans each object from above: an organised point cloud (a height
field) with an aligned RGB image, ten object classes, and defects that its taxonomy groups into
shape changes (crack, hole, cut, bent, ...), colour changes (color, contamination) and combined
ones. CFR's premise (paper §1, §3) is crossmodal: on a normal object each modality predicts the
other, and an anomaly breaks that mapping. Version 1 gave the mapping nothing to learn (stripe
orientation, phase and colour pair drawn per image, so every object pixel was equally ambiguous)
and its stains were off-palette colours that an RGB memory bank finds without any 3-D. Version 2
follows the benchmark instead:

* **Ten classes named after MVTec 3D-AD's** (bagel, cable_gland, carrot, cookie, dowel, foam,
  peach, potato, rope, tire): a shape and a **fixed texture per class**. The colour is a fixed
  function of the object's surface, nothing of it drawn per image: mostly of the local shape (a
  bagel's crust browns where it rises, a cookie's chocolate chips are bumps, a potato's eyes are
  pits, a rope's strands and a tire's treads are lighter on their ridges and darker in their
  grooves, foam darkens at its bevelled edges), partly of position alone on a symmetric shape (a
  peach's red cheek on one side, a potato's light patches, a dowel's grain): the one-to-many part
  of the 3-D → RGB mapping that CFR's replacement addresses (paper §1). Per image only the pose
  (shift ±10 %, rotation, scale ±10 %), an exposure factor (±5 %) and the noise vary.
* **Uniform light**: RGB = albedo × exposure + noise, no shading, so a change of shape alone
  leaves the image unchanged (as a shallow dent under diffuse light).
* **Defects** balanced over three types, with pixel masks:

  - ``geometric`` (MVTec 3D-AD's crack, hole, and dents or bumps): a dent or bump (radius 3–6 %
    of the image, depth ±0.03–0.05), a hole (radius 2–4 %, a flat-bottomed pit 0.06–0.10 deep)
    or a crack (a groove 2.2 pixels wide, 8–15 % of the image long, 0.03–0.05 deep); z changes,
    the RGB image is identical to the clean object's;
  - ``colour`` (MVTec 3D-AD's color): a disc (radius 3–6 %) painted with one of the class's own
    palette colours, one whose tone lies at least ``MIN_TONE_GAP`` from the surface's tone at its
    centre (a colour the object has elsewhere); the point cloud is identical to the clean one;
  - ``both`` (MVTec 3D-AD's combined): a geometric defect painted like a colour one.

  So a third of the defects is invisible to the RGB image and a third to the point cloud:
  ``taxonomy_pair`` returns each image with its clean twin (the same draws without the defect),
  and the tests measure these shares.

Objects are seen from straight above: x, y are the pixel's normalised coordinates in (0, 1), z
the height plus N(0, 0.002²), background pixels exactly (0, 0, 0).
"""

from __future__ import annotations

import numpy as np

from .config import TAXONOMY_CLASSES
from .sample import Sample

DEFECTS = ("good", "geometric", "colour", "both")
GEOMETRIC_KINDS = ("dent", "hole", "crack")
BACKGROUND_GREY = 0.45
PALETTE_TONES = (0.0, 0.5, 1.0)  # a palette's three colours sit at these tones of the ramp
MIN_TONE_GAP = 0.4  # a colour defect's palette colour lies this far (in tone) from the surface's

# three colours per class, at tones 0, 0.5 and 1 (RGB in [0, 1]); the texture interpolates them
PALETTES = {
    "bagel": ((0.93, 0.80, 0.55), (0.78, 0.55, 0.28), (0.50, 0.30, 0.14)),
    "cable_gland": ((0.12, 0.12, 0.13), (0.36, 0.36, 0.38), (0.64, 0.64, 0.67)),
    "carrot": ((0.98, 0.62, 0.22), (0.88, 0.48, 0.14), (0.60, 0.30, 0.08)),
    "cookie": ((0.90, 0.75, 0.50), (0.72, 0.52, 0.30), (0.28, 0.16, 0.09)),
    "dowel": ((0.92, 0.78, 0.55), (0.80, 0.62, 0.40), (0.60, 0.42, 0.25)),
    "foam": ((0.88, 0.88, 0.74), (0.76, 0.76, 0.60), (0.60, 0.60, 0.44)),
    "peach": ((0.98, 0.82, 0.42), (0.95, 0.58, 0.34), (0.78, 0.22, 0.22)),
    "potato": ((0.90, 0.80, 0.58), (0.74, 0.60, 0.40), (0.42, 0.30, 0.18)),
    "rope": ((0.88, 0.84, 0.70), (0.66, 0.62, 0.48), (0.40, 0.36, 0.26)),
    "tire": ((0.40, 0.40, 0.42), (0.22, 0.22, 0.24), (0.07, 0.07, 0.08)),
}
# fixed features in object coordinates (a, b)
COOKIE_CHIPS = ((0.25, 0.10), (-0.20, 0.30), (-0.35, -0.15), (0.05, -0.40), (0.40, -0.25),
                (-0.05, 0.05), (0.15, 0.45))  # fmt: skip
# (a, b, height)
POTATO_BUMPS = ((0.35, 0.15, 0.012), (-0.30, -0.20, 0.012), (0.0, 0.30, -0.010),
                (-0.45, 0.15, 0.010), (0.50, -0.20, -0.010))  # fmt: skip
POTATO_EYES = ((0.20, -0.25), (-0.15, 0.20), (-0.50, -0.05), (0.55, 0.10))
POTATO_PATCHES = ((0.10, 0.05, 0.18), (-0.35, -0.30, 0.14))  # (a, b, radius): flat, lighter


def _cos_bump(d: np.ndarray, rad: float) -> np.ndarray:
    """1 at d = 0, falling smoothly to 0 at d = rad (0 beyond)."""
    return np.where(d < rad, 0.5 * (1 + np.cos(np.pi * np.clip(d / rad, 0, 1))), 0.0)


def _half_disc(x: np.ndarray, rad: np.ndarray | float) -> np.ndarray:
    """sqrt(1 − (x / rad)²), 0 outside: a cylinder's or sphere's profile."""
    return np.sqrt(np.clip(1 - (x / rad) ** 2, 0, None))


def surface(cls: str, a: np.ndarray, b: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Height, footprint and texture tone (in [0, 1]) of class ``cls`` at object coordinates
    (a, b): a fixed function, nothing drawn."""
    r = np.hypot(a, b)
    if cls == "bagel":  # a torus; the crust browns where it rises
        dome = _half_disc(r - 0.45, 0.26)
        return 0.04 + 0.20 * dome, np.abs(r - 0.45) < 0.26, dome**1.5
    if cls == "cable_gland":  # a hexagonal nut, a threaded boss (concentric ridges), a bore
        hexr = np.max([np.abs(a * np.cos(t) + b * np.sin(t)) for t in (0, np.pi / 3, 2 * np.pi / 3)],
                      axis=0)  # fmt: skip
        ridge = np.cos(2 * np.pi * r / 0.07)
        boss, bore = r < 0.34, r < 0.12
        h = np.where(bore, 0.12, np.where(boss, 0.20 + 0.012 * ridge, 0.10))
        tone = np.where(bore, 0.0, np.where(boss, 0.65 + 0.25 * ridge, 0.25))
        return h, hexr < 0.62, tone
    if cls == "carrot":  # a tapered half-cylinder with darker ring grooves
        rho = 0.30 - 0.14 * (a + 0.85) / 1.7
        groove = np.clip(np.cos(2 * np.pi * a / 0.21 + 3 * b), 0, None) ** 10
        inside = (np.abs(a) < 0.85) & (np.abs(b) < rho)
        return 0.03 + rho * _half_disc(b, rho) - 0.015 * groove, inside, 0.3 + 0.6 * groove
    if cls == "cookie":  # a low disc with a golden rim and chocolate chips that stand out
        chip = np.max([_cos_bump(np.hypot(a - ca, b - cb), 0.08) for ca, cb in COOKIE_CHIPS], 0)
        rim = np.clip((r - 0.55) / 0.15, 0, 1)
        h = 0.05 + 0.05 * _half_disc(r, 0.70) + 0.03 * chip
        return h, r < 0.70, np.maximum(0.45 * rim, chip)
    if cls == "dowel":  # a half-cylinder with wood grain along it and darker end grain
        grain = 0.5 + 0.3 * np.sin(2 * np.pi * b / 0.085 + 0.6 * np.sin(2.5 * a))
        inside = (np.abs(a) < 0.80) & (np.abs(b) < 0.22)
        return 0.03 + 0.22 * _half_disc(b, 0.22), inside, np.where(np.abs(a) > 0.74, 0.95, grain)
    if cls == "foam":  # a slab with bevelled edges, darker on the bevel
        edge = np.clip(np.minimum(0.75 - np.abs(a), 0.5 - np.abs(b)) / 0.08, 0, 1)
        inside = (np.abs(a) < 0.75) & (np.abs(b) < 0.5)
        return 0.04 + 0.12 * edge, inside, 0.15 + 0.6 * (1 - edge)
    if cls == "peach":  # a dome with a crease; red on one side: not a function of shape
        crease = 0.025 * np.exp(-(b**2) / (2 * 0.035**2)) * np.clip((0.55 - np.abs(a)) / 0.1, 0, 1)
        tone = 0.5 + 0.45 * np.tanh(3 * (a + 0.2 * b))
        return 0.04 + 0.24 * _half_disc(r, 0.66) - crease, r < 0.66, tone
    if cls == "potato":  # an ellipsoid with bumps, dark eyes in pits and light flat patches
        q = np.sqrt((a / 0.78) ** 2 + (b / 0.52) ** 2)
        h = 0.04 + 0.18 * _half_disc(q, 1.0)
        for ca, cb, amp in POTATO_BUMPS:
            h = h + amp * _cos_bump(np.hypot(a - ca, b - cb), 0.15)
        eye = np.max([_cos_bump(np.hypot(a - ca, b - cb), 0.06) for ca, cb in POTATO_EYES], 0)
        patch = np.max([_cos_bump(np.hypot(a - ca, b - cb), rad)
                        for ca, cb, rad in POTATO_PATCHES], 0)  # fmt: skip
        return h - 0.02 * eye, q < 1, np.clip(0.45 + 0.55 * eye - 0.4 * patch, 0, 1)
    if cls == "rope":  # a half-cylinder of twisted strands: light crests, dark grooves
        phase = 2 * np.pi * (a / 0.16 + b / 0.30)
        inside = (np.abs(a) < 0.85) & (np.abs(b) < 0.20)
        h = 0.03 + 0.20 * _half_disc(b, 0.20) + 0.018 * np.cos(phase)
        return h, inside, 0.5 - 0.4 * np.cos(phase)
    if cls == "tire":  # a torus with tread grooves on the crown and a lighter sidewall band
        s = (r - 0.52) / 0.22
        crown = np.clip((0.6 - np.abs(s)) / 0.1, 0, 1)
        groove = np.clip(np.cos(18 * np.arctan2(b, a)), 0, None) ** 6 * crown
        band = np.clip((np.abs(s) - 0.7) / 0.1, 0, 1)
        h = 0.04 + 0.16 * _half_disc(s, 1.0) - 0.02 * groove
        return h, np.abs(s) < 1, np.clip(0.55 + 0.45 * groove - 0.4 * band, 0, 1)
    raise ValueError(f"unknown class {cls!r}; choose from {list(TAXONOMY_CLASSES)}")


def albedo(cls: str, tone: np.ndarray) -> np.ndarray:
    """The class's colour at each tone: its palette interpolated (tones 0, 0.5, 1)."""
    pal = np.asarray(PALETTES[cls])
    t = np.clip(tone, 0, 1)[..., None] * 2
    return np.where(t < 1, pal[0] + (pal[1] - pal[0]) * t, pal[1] + (pal[2] - pal[1]) * (t - 1))


def _geometric(kind: str, u, v, cu, cv, grid: int, rng: np.random.Generator):
    """The height change of one geometric defect centred at (cu, cv), and its support."""
    if kind == "crack":
        phi = rng.uniform(0, np.pi)
        half_len, half_w = rng.uniform(0.08, 0.15), 1.1 / grid  # 2.2 pixels wide (u in [-1, 1])
        depth = -rng.uniform(0.03, 0.05)
        along = (u - cu) * np.cos(phi) + (v - cv) * np.sin(phi)
        across = -(u - cu) * np.sin(phi) + (v - cv) * np.cos(phi)
        prof = np.clip(1 - (across / half_w) ** 2, 0, None) * np.clip(1 - (along / half_len) ** 2,
                                                                      0, None)  # fmt: skip
        return depth * prof, prof > 0
    d = np.hypot(u - cu, v - cv)
    if kind == "hole":
        rad, depth = rng.uniform(0.04, 0.08), -rng.uniform(0.06, 0.10)
        return depth * np.clip(1 - (d / rad) ** 4, 0, None), d < rad
    rad = rng.uniform(0.06, 0.12)  # a dent or a bump
    depth = rng.uniform(0.03, 0.05) * rng.choice([-1.0, 1.0])
    return depth * np.clip(1 - (d / rad) ** 2, 0, None), d < rad


def taxonomy_pair(
    cls: str,
    grid: int,
    defect: str,
    rng: np.random.Generator,
    pose: tuple[tuple[float, float], float, float] | None = None,
):
    """One image of class ``cls`` with the given defect type and its clean twin (the same pose,
    exposure and noise, without the defect): two :class:`~.sample.Sample` objects. ``pose``
    ((shift u, shift v), rotation, scale) fixes the pose instead of drawing it."""
    if defect not in DEFECTS:
        raise ValueError(f"unknown defect {defect!r}")
    coords = (np.arange(grid) + 0.5) / grid  # pixel centres in (0, 1)
    px, py = np.meshgrid(coords, coords)  # x along columns, y along rows
    u, v = 2 * px - 1, 2 * py - 1
    if pose is None:
        shift, rot, scale = (
            rng.uniform(-0.1, 0.1, 2),
            rng.uniform(0, 2 * np.pi),
            rng.uniform(0.9, 1.1),
        )
    else:
        shift, rot, scale = np.asarray(pose[0]), pose[1], pose[2]
    exposure = rng.uniform(0.95, 1.05)
    c, s = np.cos(rot), np.sin(rot)
    du, dv = u - shift[0], v - shift[1]
    a, b = (c * du + s * dv) / scale, (-s * du + c * dv) / scale
    h, inside, tone = surface(cls, a, b)
    h = np.where(inside, h, 0.0)
    colour = albedo(cls, tone)

    dh = np.zeros_like(h)
    mask = np.zeros((grid, grid), bool)
    paint = None
    if defect != "good":
        ii, jj = np.nonzero(inside)
        kind = GEOMETRIC_KINDS[int(rng.integers(len(GEOMETRIC_KINDS)))]
        for _ in range(100):  # a centre whose defect lies mostly on the object
            k = rng.integers(len(ii))
            cu, cv = u[ii[k], jj[k]], v[ii[k], jj[k]]
            if defect == "colour":
                rad = rng.uniform(0.06, 0.12)
                support, change = np.hypot(u - cu, v - cv) < rad, None
            else:
                change, support = _geometric(kind, u, v, cu, cv, grid, rng)
            if (support & inside).sum() >= max(3, 0.6 * support.sum()):
                break
        mask = support & inside
        if change is not None:
            dh = np.where(mask, change, 0.0)
        if defect in ("colour", "both"):
            t0 = tone[ii[k], jj[k]]
            options = [j for j, t in enumerate(PALETTE_TONES) if abs(t - t0) >= MIN_TONE_GAP]
            paint = np.asarray(PALETTES[cls][options[int(rng.integers(len(options)))]])

    z_noise = rng.normal(0, 0.002, (grid, grid))
    bg = BACKGROUND_GREY + rng.normal(0, 0.02, (grid, grid, 1))
    noise = rng.normal(0, 0.01, (grid, grid, 3))

    def render(dh: np.ndarray, paint: np.ndarray | None, mask: np.ndarray) -> Sample:
        z = h + dh + z_noise
        xyz = np.where(inside[..., None], np.stack([px, py, z], -1), 0.0).astype(np.float32)
        col = colour if paint is None else np.where(mask[..., None], paint, colour)
        img = np.where(inside[..., None], col * exposure, bg) + noise
        rgb = np.clip(np.round(img * 255), 0, 255).astype(np.uint8)
        return Sample(rgb=rgb, xyz=xyz, mask=mask, defect=defect)

    clean = render(np.zeros_like(h), None, np.zeros_like(mask))
    return render(dh, paint, mask), Sample(clean.rgb, clean.xyz, clean.mask, "good")


def taxonomy_sample(cls: str, grid: int, defect: str, rng: np.random.Generator):
    """One image of class ``cls`` (generator version 2) with the given defect type."""
    return taxonomy_pair(cls, grid, defect, rng)[0]
