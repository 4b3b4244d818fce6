"""Molecules as graphs and fingerprints, with RDKit.

One place turns a SMILES string (or an RDKit molecule) into what a graph network reads: node
features, a directed edge list with both directions of every bond, and bond features. Methods that
work on molecules (``recog``, ``scgfm``) use these and nothing else from RDKit's graph side, so a
molecule reads the same in every method.

Node features (``ATOM_FEATURE_DIM`` = 23): one-hot element (C, N, O, S, F, Cl, Br, I, P, other),
one-hot heavy-atom degree (0-4, 5+), formal charge (-1, 0, +1 as one-hot), aromatic, in a ring,
number of attached hydrogens / 4, and a constant 1. Edge features (``BOND_FEATURE_DIM`` = 4):
one-hot single, double, triple, aromatic.

RDKit is imported only inside the functions that need it.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import numpy as np

from nshot.data.cache import DataError, MissingExtraError

ELEMENTS = ("C", "N", "O", "S", "F", "Cl", "Br", "I", "P")
ATOM_FEATURE_DIM = len(ELEMENTS) + 1 + 6 + 3 + 4
BOND_FEATURE_DIM = 4
# The largest molecule a request may carry (atoms); far above any drug-like molecule.
MAX_ATOMS = 500


class InvalidSmilesError(DataError):
    """A SMILES string does not parse; ``index`` is its position in the input, when known."""

    def __init__(self, smiles: str, index: int | None = None, reason: str = "does not parse"):
        where = f" at index {index}" if index is not None else ""
        super().__init__(f"SMILES{where} {smiles[:80]!r} {reason}")
        self.smiles = smiles
        self.index = index


def require_rdkit():
    """RDKit's ``Chem`` module, or a :class:`MissingExtraError` naming the install line."""
    try:
        from rdkit import Chem, RDLogger
    except ImportError as exc:  # pragma: no cover - rdkit is a core dependency
        raise MissingExtraError("RDKit is required for molecules: pip install rdkit") from exc
    RDLogger.DisableLog("rdApp.*")  # parse errors are reported by nshot, one line each
    return Chem


@dataclass(frozen=True)
class MolGraph:
    """One molecule as a graph: ``x`` (n, ATOM_FEATURE_DIM) float32, ``edge_index`` (2, E) int64
    with both directions of every bond, ``edge_attr`` (E, BOND_FEATURE_DIM) float32."""

    x: np.ndarray
    edge_index: np.ndarray
    edge_attr: np.ndarray
    smiles: str = ""

    @property
    def num_nodes(self) -> int:
        return int(self.x.shape[0])

    def adjacency(self) -> np.ndarray:
        """The symmetric 0/1 adjacency matrix (n, n), float64."""
        a = np.zeros((self.num_nodes, self.num_nodes))
        a[self.edge_index[0], self.edge_index[1]] = 1.0
        return a


def parse_smiles(smiles: str, index: int | None = None):
    """An RDKit molecule, or :class:`InvalidSmilesError` naming the string (and its index)."""
    Chem = require_rdkit()
    if not isinstance(smiles, str) or not smiles.strip():
        raise InvalidSmilesError(str(smiles), index, "is empty")
    mol = Chem.MolFromSmiles(smiles)
    if mol is None:
        raise InvalidSmilesError(smiles, index)
    if mol.GetNumAtoms() == 0:
        raise InvalidSmilesError(smiles, index, "has no atoms")
    if mol.GetNumAtoms() > MAX_ATOMS:
        raise InvalidSmilesError(smiles, index, f"has more than {MAX_ATOMS} atoms")
    return mol


def _atom_features(atom) -> list[float]:
    sym = atom.GetSymbol()
    element = [float(sym == e) for e in ELEMENTS] + [float(sym not in ELEMENTS)]
    deg = min(atom.GetDegree(), 5)
    degree = [float(deg == d) for d in range(6)]
    charge = atom.GetFormalCharge()
    charges = [float(charge < 0), float(charge == 0), float(charge > 0)]
    rest = [
        float(atom.GetIsAromatic()),
        float(atom.IsInRing()),
        min(atom.GetTotalNumHs(), 4) / 4.0,
        1.0,
    ]
    return element + degree + charges + rest


def mol_to_graph(mol, smiles: str = "") -> MolGraph:
    """The graph of an RDKit molecule (hydrogens implicit)."""
    Chem = require_rdkit()
    bond_types = (
        Chem.BondType.SINGLE,
        Chem.BondType.DOUBLE,
        Chem.BondType.TRIPLE,
        Chem.BondType.AROMATIC,
    )
    x = np.asarray([_atom_features(a) for a in mol.GetAtoms()], dtype=np.float32)
    src: list[int] = []
    dst: list[int] = []
    attrs: list[list[float]] = []
    for bond in mol.GetBonds():
        i, j = bond.GetBeginAtomIdx(), bond.GetEndAtomIdx()
        feat = [float(bond.GetBondType() == t) for t in bond_types]
        src += [i, j]
        dst += [j, i]
        attrs += [feat, feat]
    edge_index = np.asarray([src, dst], dtype=np.int64).reshape(2, -1)
    edge_attr = np.asarray(attrs, dtype=np.float32).reshape(-1, BOND_FEATURE_DIM)
    return MolGraph(x=x, edge_index=edge_index, edge_attr=edge_attr, smiles=smiles)


def smiles_to_graph(smiles: str, index: int | None = None) -> MolGraph:
    """The graph of one SMILES string; :class:`InvalidSmilesError` if it does not parse."""
    return mol_to_graph(parse_smiles(smiles, index), smiles)


def canonical_smiles(smiles: str, index: int | None = None) -> str:
    """RDKit's canonical SMILES of ``smiles`` (the key under which a molecule is looked up)."""
    Chem = require_rdkit()
    return Chem.MolToSmiles(parse_smiles(smiles, index))


def ecfp(smiles: Sequence[str], *, radius: int = 2, n_bits: int = 1024) -> np.ndarray:
    """Morgan/ECFP fingerprints (len(smiles), n_bits) as uint8; radius 2 is ECFP4."""
    require_rdkit()
    from rdkit import DataStructs
    from rdkit.Chem import rdFingerprintGenerator

    gen = rdFingerprintGenerator.GetMorganGenerator(radius=radius, fpSize=n_bits)
    out = np.zeros((len(smiles), n_bits), dtype=np.uint8)
    for k, s in enumerate(smiles):
        fp = gen.GetFingerprint(parse_smiles(s, k))
        DataStructs.ConvertToNumpyArray(fp, out[k])
    return out


def read_sdf_bytes(data: bytes, props: Iterable[str] = ()) -> list[tuple[object, dict[str, str]]]:
    """The molecules of an SDF file given as bytes, with the named string properties.

    Records RDKit cannot read are skipped; a missing property is an empty string.
    """
    Chem = require_rdkit()
    supplier = Chem.SDMolSupplier()
    supplier.SetData(data.decode("utf-8", errors="replace"))
    out = []
    wanted = tuple(props)
    for mol in supplier:
        if mol is None or mol.GetNumAtoms() == 0:
            continue
        values = {p: (mol.GetProp(p) if mol.HasProp(p) else "") for p in wanted}
        out.append((mol, values))
    return out


def batch_graphs(graphs: Sequence[MolGraph]):
    """Stack graphs into one disjoint graph, as torch tensors.

    Returns ``(x, edge_index, edge_attr, batch)``: node features (N, F), edges (2, E) with node
    indices offset per graph, edge features (E, B), and ``batch`` (N,) giving each node's graph.
    """
    import torch

    if not graphs:
        raise DataError("batch_graphs needs at least one graph")
    offsets = np.cumsum([0] + [g.num_nodes for g in graphs[:-1]])
    x = torch.from_numpy(np.concatenate([g.x for g in graphs]))
    edge_index = torch.from_numpy(
        np.concatenate([g.edge_index + o for g, o in zip(graphs, offsets)], axis=1)
    )
    edge_attr = torch.from_numpy(np.concatenate([g.edge_attr for g in graphs]))
    batch = torch.from_numpy(
        np.concatenate([np.full(g.num_nodes, k, dtype=np.int64) for k, g in enumerate(graphs)])
    )
    return x, edge_index, edge_attr, batch
