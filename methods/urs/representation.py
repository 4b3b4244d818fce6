"""The unified data representation (UDR) and the offline multi-task VRP generator.

Every variant is one :class:`Instances` batch with the same fields; an attribute a variant lacks
takes its neutral value:

====================  ===========================================  =======================
field                 meaning                                      neutral (absent) value
====================  ===========================================  =======================
``locs``              [B, V, 2] coordinates, depots first          —
``num_depots``        M, the first M nodes are depots              1
``linehaul``          [B, V] delivery demand (depots 0)            0 (TSP)
``backhaul``          [B, V] pickup demand                         0
``capacity``          [B] vehicle capacity                         ∞ (TSP)
``tw``                [B, V, 2] time windows ``[e, l]``            ``[0, ∞]``
``service``           [B, V] service times                         0
``open_route``        [B] no return arc                            False
``distance_limit``    [B] maximum route length                     ∞
``backhaul_class``    [B] 1 classic (linehaul first), 2 mixed      1 (irrelevant w/o B)
====================  ===========================================  =======================

The neural model reads the UDR features (:func:`udr_features`): per node
``[x, y, q_lin/Q, q_back/Q, e/T, l/T, s/T, is_depot]`` and per instance
``[10/Q, closed, 1/L, precedence, 1/T]``, where every absent attribute maps to 0 (or l/T = 1),
so an unseen variant is an unseen *combination of values*, never a new token.

Data conventions follow RouteFinder's multi-task generator: uniform locations,
demands U{1..9}, capacity 30 (N ≤ 20), 30 + ⌊N/5⌋ (N ≤ 1000), 230 + ⌊(N − 1000)/33.3⌋ above;
backhaul customers with p = 0.2; service U[0.15, 0.18], window length U[0.18, 0.2], window start
(1 + (h_max − 1)u)·d_i with h_max = (4.6 − s − len)/d_i − 1 (d_i: distance to the nearest
depot), depot window [0, 4.6]; distance limit U[2·max d_i, 2.8].

Besides uniform locations, a ``clustered`` layout places customers in Gaussian clusters around
S ~ U{3..8} seeds, as the X benchmark's generator (Uchoa et al.) does for its clustered
instances: seeds uniform in [0.1, 0.9]², each customer around a random seed with a spread
σ ~ U[0.03, 0.07] per instance (clipped to the unit square); depots stay uniform. A test set of
that layout is named ``"<variant>@clustered"`` (e.g. ``"VRPTW@clustered"``).
"""

from __future__ import annotations

import hashlib
import math
import re
from dataclasses import dataclass, field
from typing import Any

import numpy as np

HORIZON = 4.6
MD_DEPOTS = 3
LAYOUTS = ("uniform", "clustered")
_VARIANT = re.compile(r"^(MD)?(O)?VRP(MB|B)?(L)?(TW)?$")


@dataclass(frozen=True)
class VariantSpec:
    name: str
    open_route: bool = False
    backhaul: int = 0  # 0 none, 1 classic, 2 mixed
    limit: bool = False
    tw: bool = False
    num_depots: int = 1
    tsp: bool = False


def parse_variant(name: str) -> VariantSpec:
    """``"OVRPBLTW"`` → its attributes; raises ValueError naming an unknown variant."""
    if name == "TSP":
        return VariantSpec("TSP", tsp=True)
    m = _VARIANT.match("VRP" if name == "CVRP" else name)
    if not m or name == "VRP":
        raise ValueError(
            f"unknown variant {name!r}: expected TSP, CVRP or [MD][O]VRP[B|MB][L][TW] (e.g. OVRPBLTW)"
        )
    md, o, b, lim, tw = m.groups()
    return VariantSpec(
        name=name,
        open_route=bool(o),
        backhaul={None: 0, "B": 1, "MB": 2}[b],
        limit=bool(lim),
        tw=bool(tw),
        num_depots=MD_DEPOTS if md else 1,
    )


def capacity_for(n: int) -> int:
    if n <= 20:
        return 30
    if n <= 1000:
        return 30 + n // 5
    return 230 + int((n - 1000) // 33.3)


@dataclass
class Instances:
    """A batch of instances in the unified representation (numpy, float64)."""

    locs: np.ndarray
    linehaul: np.ndarray
    backhaul: np.ndarray
    capacity: np.ndarray
    tw: np.ndarray
    service: np.ndarray
    open_route: np.ndarray
    distance_limit: np.ndarray
    backhaul_class: np.ndarray
    num_depots: int = 1
    variants: list[str] = field(default_factory=list)

    def __len__(self) -> int:
        return int(self.locs.shape[0])

    @property
    def num_customers(self) -> int:
        return int(self.locs.shape[1]) - self.num_depots

    def __getitem__(self, idx: Any) -> Instances:
        if isinstance(idx, int):
            idx = slice(idx, idx + 1)
        return Instances(
            **{k: getattr(self, k)[idx] for k in _ARRAYS},
            num_depots=self.num_depots,
            variants=list(np.asarray(self.variants, dtype=object)[idx]),
        )

    @staticmethod
    def concat(parts: list[Instances]) -> Instances:
        if len({p.num_depots for p in parts}) != 1 or len({p.locs.shape[1] for p in parts}) != 1:
            raise ValueError("only instances with the same node and depot counts batch together")
        return Instances(
            **{k: np.concatenate([getattr(p, k) for p in parts]) for k in _ARRAYS},
            num_depots=parts[0].num_depots,
            variants=[v for p in parts for v in p.variants],
        )

    def augment(self, k: int) -> Instances:
        """The same instances with coordinates under symmetry ``k`` of the unit square."""
        return Instances(
            **{a: getattr(self, a) for a in _ARRAYS if a != "locs"},
            locs=symmetry(self.locs, k),
            num_depots=self.num_depots,
            variants=list(self.variants),
        )

    def hash(self, i: int) -> str:
        h = hashlib.sha256()
        for k in _ARRAYS:
            h.update(np.ascontiguousarray(getattr(self, k)[i]).tobytes())
        h.update(str(self.num_depots).encode())
        return h.hexdigest()[:20]

    def to_rows(self) -> list[dict[str, Any]]:
        """One JSON-able dict per instance (also the Arrow/Parquet row and the serving schema)."""
        rows = []
        for i in range(len(self)):
            rows.append(
                {
                    "variant": self.variants[i] if self.variants else variant_name(self, i),
                    "num_depots": self.num_depots,
                    "locs": self.locs[i].tolist(),
                    "linehaul": self.linehaul[i].tolist(),
                    "backhaul": self.backhaul[i].tolist(),
                    "capacity": _f(self.capacity[i]),
                    "tw": [[_f(e), _f(lv)] for e, lv in self.tw[i]],
                    "service": self.service[i].tolist(),
                    "open_route": bool(self.open_route[i]),
                    "distance_limit": _f(self.distance_limit[i]),
                    "backhaul_class": int(self.backhaul_class[i]),
                }
            )
        return rows

    @staticmethod
    def from_rows(rows: list[dict[str, Any]]) -> Instances:
        def g(r: dict[str, Any], k: str) -> np.ndarray:
            return np.asarray([np.inf if v is None else v for v in _flat(r[k])], np.float64)

        return Instances(
            locs=np.stack([np.asarray(r["locs"], np.float64) for r in rows]),
            linehaul=np.stack([np.asarray(r["linehaul"], np.float64) for r in rows]),
            backhaul=np.stack([np.asarray(r["backhaul"], np.float64) for r in rows]),
            capacity=np.asarray([_inf(r["capacity"]) for r in rows], np.float64),
            tw=np.stack([g(r, "tw").reshape(-1, 2) for r in rows]),
            service=np.stack([np.asarray(r["service"], np.float64) for r in rows]),
            open_route=np.asarray([bool(r["open_route"]) for r in rows]),
            distance_limit=np.asarray([_inf(r["distance_limit"]) for r in rows], np.float64),
            backhaul_class=np.asarray([int(r["backhaul_class"]) for r in rows], np.int64),
            num_depots=int(rows[0]["num_depots"]),
            variants=[r.get("variant", "") for r in rows],
        )


_ARRAYS = (
    "locs",
    "linehaul",
    "backhaul",
    "capacity",
    "tw",
    "service",
    "open_route",
    "distance_limit",
    "backhaul_class",
)


def _f(v: float) -> float | None:
    return None if not math.isfinite(float(v)) else float(v)


def _inf(v: float | None) -> float:
    return math.inf if v is None else float(v)


def _flat(x: Any) -> list[Any]:
    out: list[Any] = []
    for v in x:
        if isinstance(v, list | tuple):
            out.extend(v)
        else:
            out.append(v)
    return out


def variant_name(inst: Instances, i: int = 0) -> str:
    """The variant name derived from the attributes of instance ``i``."""
    M = inst.num_depots
    cap_inf = not math.isfinite(inst.capacity[i])
    has_tw = bool(np.isfinite(inst.tw[i, :, 1]).any())
    has_l = bool(math.isfinite(inst.distance_limit[i]))
    has_b = bool((inst.backhaul[i, M:] > 0).any())
    if cap_inf and not has_tw and not has_l and not has_b and M == 1 and not inst.open_route[i]:
        return "TSP"
    name = ("MD" if M > 1 else "") + ("O" if inst.open_route[i] else "") + "VRP"
    if has_b:
        name += "MB" if inst.backhaul_class[i] == 2 else "B"
    name += ("L" if has_l else "") + ("TW" if has_tw else "")
    return "CVRP" if name == "VRP" else name


def symmetry(locs: np.ndarray, k: int) -> np.ndarray:
    """The 8 symmetries of the unit square (POMO augmentation); k = 0 is the identity."""
    x, y = locs[..., 0], locs[..., 1]
    pairs = [(x, y), (1 - x, y), (x, 1 - y), (1 - x, 1 - y), (y, x), (1 - y, x), (y, 1 - x),
             (1 - y, 1 - x)]  # fmt: skip
    a, b = pairs[k]
    return np.stack([a, b], axis=-1)


def distances(locs: np.ndarray) -> np.ndarray:
    """Exact Euclidean distances [..., V, V] in float64."""
    diff = locs[..., :, None, :] - locs[..., None, :, :]
    return np.sqrt((diff**2).sum(-1))


def split_layout(name: str) -> tuple[str, str]:
    """``"VRPTW@clustered"`` → ``("VRPTW", "clustered")``; a bare variant is ``uniform``."""
    variant, _, layout = name.partition("@")
    layout = layout or "uniform"
    if layout not in LAYOUTS:
        raise ValueError(f"unknown layout {layout!r} in {name!r}; known: {', '.join(LAYOUTS)}")
    parse_variant(variant)
    return variant, layout


def clustered_locations(rng: np.random.Generator, num: int, M: int, n: int) -> np.ndarray:
    """[num, M + n, 2]: depots uniform, customers in Gaussian clusters around 3–8 seeds."""
    locs = np.empty((num, M + n, 2))
    locs[:, :M] = rng.uniform(0.0, 1.0, (num, M, 2))
    for b in range(num):
        seeds = rng.uniform(0.1, 0.9, (int(rng.integers(3, 9)), 2))
        sigma = rng.uniform(0.03, 0.07)
        which = rng.integers(0, len(seeds), n)
        locs[b, M:] = np.clip(seeds[which] + rng.normal(0.0, sigma, (n, 2)), 0.0, 1.0)
    return locs


def generate(
    variant: str,
    n: int,
    num: int,
    seed: int | np.random.Generator,
    layout: str = "uniform",
) -> Instances:
    """``num`` instances of ``variant`` with ``n`` customers (RouteFinder conventions), their
    customers placed uniformly or (``layout="clustered"``) in Gaussian clusters."""
    spec = parse_variant(variant)
    rng = seed if isinstance(seed, np.random.Generator) else np.random.default_rng(seed)
    M = spec.num_depots
    V = M + n
    if layout == "uniform":
        locs = rng.uniform(0.0, 1.0, (num, V, 2))
    elif layout == "clustered":
        locs = clustered_locations(rng, num, M, n)
    else:
        raise ValueError(f"unknown layout {layout!r}; known: {', '.join(LAYOUTS)}")
    dist = distances(locs)
    d_near = dist[:, :, :M].min(-1)  # [num, V]
    lin = np.zeros((num, V))
    back = np.zeros((num, V))
    if spec.tsp:
        cap = np.full(num, np.inf)
    else:
        q = rng.integers(1, 10, (num, n)).astype(np.float64)
        cap = np.full(num, float(capacity_for(n)))
        is_back = rng.random((num, n)) < 0.2 if spec.backhaul else np.zeros((num, n), bool)
        lin[:, M:] = np.where(is_back, 0.0, q)
        back[:, M:] = np.where(is_back, q, 0.0)
    tw = np.zeros((num, V, 2))
    tw[..., 1] = np.inf
    service = np.zeros((num, V))
    if spec.tw:
        s = rng.uniform(0.15, 0.18, (num, n))
        length = rng.uniform(0.18, 0.2, (num, n))
        d = d_near[:, M:]
        h_max = (HORIZON - s - length) / d - 1.0
        start = (1.0 + (h_max - 1.0) * rng.random((num, n))) * d
        tw[:, M:, 0] = start
        tw[:, M:, 1] = start + length
        tw[:, :M, 1] = HORIZON
        service[:, M:] = s
    limit = np.full(num, np.inf)
    if spec.limit:
        lo = 2.0 * d_near[:, M:].max(-1) * (1 + 1e-3) + 1e-3
        limit = rng.uniform(lo, np.maximum(2.8, lo + 0.05))
    return Instances(
        locs=locs,
        linehaul=lin,
        backhaul=back,
        capacity=cap,
        tw=tw,
        service=service,
        open_route=np.full(num, spec.open_route),
        distance_limit=limit,
        backhaul_class=np.full(num, 2 if spec.backhaul == 2 else 1, np.int64),
        num_depots=M,
        variants=[variant] * num,
    )


def generate_mixed(
    variants: list[str],
    n: int,
    num: int,
    rng: np.random.Generator,
    layouts: tuple[str, ...] | list[str] = ("uniform",),
) -> Instances:
    """A training batch mixing single-depot ``variants`` uniformly (and, with more than one
    layout, each instance's layout uniformly among ``layouts``)."""
    picks = rng.integers(0, len(variants), num)
    # one layout draws nothing more: the uniform-only stream is the one before layouts existed
    lay = rng.integers(0, len(layouts), num) if len(layouts) > 1 else np.zeros(num, np.int64)
    parts = []
    for v in np.unique(picks):
        for k in np.unique(lay[picks == v]):
            count = int(((picks == v) & (lay == k)).sum())
            parts.append(generate(variants[v], n, count, rng, layouts[k]))
    return Instances.concat(parts)


# --------------------------------------------------------------------------- UDR features

NODE_DIM = 8
GLOBAL_DIM = 5
FLAG_DIM = 5


def udr_features(inst: Instances) -> tuple[np.ndarray, np.ndarray]:
    """Node features [B, V, 8] and global features [B, 5] (float32); absent → neutral values."""
    M = inst.num_depots
    B, V, _ = inst.locs.shape
    cap = inst.capacity[:, None]
    finite_q = np.isfinite(cap)
    q_scale = np.where(finite_q, cap, 1.0)
    lin = np.where(finite_q, inst.linehaul / q_scale, 0.0)
    back = np.where(finite_q, inst.backhaul / q_scale, 0.0)
    has_tw = np.isfinite(inst.tw[:, :, 1]).any(-1)  # [B]
    T = np.where(has_tw, np.where(np.isfinite(inst.tw[:, :M, 1]), inst.tw[:, :M, 1], 0).max(-1), 1)
    T = np.where(T > 0, T, 1.0)[:, None]
    e = np.where(has_tw[:, None], inst.tw[:, :, 0] / T, 0.0)
    lt = np.where(has_tw[:, None], np.minimum(inst.tw[:, :, 1] / T, 1.0), 1.0)
    s = np.where(has_tw[:, None], inst.service / T, 0.0)
    is_dep = np.zeros((B, V))
    is_dep[:, :M] = 1.0
    node = np.concatenate(
        [inst.locs, np.stack([lin, back, e, lt, s, is_dep], axis=-1)], axis=-1
    ).astype(np.float32)
    L = inst.distance_limit
    glob = np.stack(
        [
            np.where(np.isfinite(inst.capacity), 10.0 / np.where(np.isfinite(inst.capacity),
                                                                 inst.capacity, 1.0), 0.0),
            (~inst.open_route.astype(bool)).astype(np.float64),
            np.where(np.isfinite(L), 1.0 / np.where(np.isfinite(L), L, 1.0), 0.0),
            ((inst.backhaul_class == 1) & (inst.backhaul[:, M:] > 0).any(-1)).astype(np.float64),
            np.where(has_tw, 1.0 / T[:, 0], 0.0),
        ],
        axis=-1,
    ).astype(np.float32)  # fmt: skip
    return node, glob


def flag_features(inst: Instances) -> np.ndarray:
    """Problem enumeration (the MTPOMO-style baseline): binary flags O, B, L, TW, MD."""
    M = inst.num_depots
    return np.stack(
        [
            inst.open_route.astype(np.float64),
            (inst.backhaul[:, M:] > 0).any(-1).astype(np.float64),
            np.isfinite(inst.distance_limit).astype(np.float64),
            np.isfinite(inst.tw[:, :, 1]).any(-1).astype(np.float64),
            np.full(len(inst), float(M > 1)),
        ],
        axis=-1,
    ).astype(np.float32)


def test_set(name: str, n: int, num: int, seed: int) -> Instances:
    """The fixed test instances of (``name``, n): seeded by name and size, distinct from
    training; ``name`` is a variant, or ``"<variant>@clustered"`` for the clustered layout."""
    variant, layout = split_layout(name)
    key = int(hashlib.sha256(f"{name}/{n}".encode()).hexdigest()[:8], 16)
    return generate(variant, n, num, np.random.default_rng([seed, key]), layout)
