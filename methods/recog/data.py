"""Offline data for ReCoG: a molecule × property label matrix, a target split, episodes.

Two tracks share one representation (:class:`Track`):

* ``moleculeace`` (the main benchmark): the 30 ChEMBL targets shipped in the MoleculeACE 3.0.0
  wheel (read from the wheel by path; the package itself is never imported). ``y`` is
  −log10 of the activity in nM, so pAct = y + 9 and a molecule is active on a target when
  pAct ≥ ``active_pact`` (7.0: at most 100 nM). Auxiliary context per molecule: the labels of the
  22 training targets (NaN where unmeasured), 30 RDKit-computed binary properties and
  ``n_distractors`` injected random-label properties.
* ``synthetic`` (smoke data, tests and the exact ground truth of the gate check): the molecules
  shipped in RDKit itself (``Data/NCI/first_5K.smi``, ``Data/Pains/test_data/wehi_mols.csv``)
  with the 30 computed properties as labels (5 % flipped, 20 % hidden) plus the distractors.

Properties are split into meta-training and test targets; a test target is never an auxiliary.
An :class:`Episode` for target ``t`` holds k positive + k negative support molecules, queries, and
the labels of the episode's auxiliaries on all of them (never the queries' labels on ``t``).
"""

from __future__ import annotations

import csv
import io
import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from functools import cache

import numpy as np
import pyarrow as pa

from nshot.data.cache import DataError, cached_table
from nshot.data.molecules import canonical_smiles, ecfp, parse_smiles, require_rdkit
from nshot.data.wheels import MOLECULEACE, wheel_files

from .config import RecogConfig

MOLECULEACE_GLOB = "MoleculeACE/Data/benchmark_data/*.csv"
# real correlated auxiliaries must exist for some test targets (opioid receptors, DAT / PPAR)
MUST_TEST = ("CHEMBL237_Ki",)
ONE_OF_TEST = ("CHEMBL238_Ki", "CHEMBL239_EC50")

# The 30 computed binary properties: RDKit fragment counters (> 0) with 5-50 % prevalence on
# RDKit's shipped molecules (near-duplicate counters dropped), and descriptor thresholds.
FRAGMENTS = (
    "fr_Al_COO", "fr_Al_OH", "fr_ArN", "fr_Ar_N", "fr_Ar_OH", "fr_COO", "fr_C_O", "fr_NH0",
    "fr_NH1", "fr_NH2", "fr_amide", "fr_aniline", "fr_aryl_methyl", "fr_bicyclic", "fr_ester",
    "fr_ether", "fr_halogen", "fr_ketone", "fr_nitro", "fr_para_hydroxylation", "fr_phenol",
    "fr_pyridine", "fr_unbrch_alkane",
)  # fmt: skip
DESCRIPTORS = (
    ("MolLogP", ">", 2.0), ("TPSA", ">", 60.0), ("NumRotatableBonds", ">", 4.0),
    ("NumAromaticRings", ">=", 2.0), ("NumHDonors", ">", 2.0), ("MolWt", ">", 300.0),
    ("FractionCSP3", ">", 0.5),
)  # fmt: skip
COMPUTED = FRAGMENTS + tuple(f"{n}{op}{v:g}" for n, op, v in DESCRIPTORS)


def computed_properties(mols: Sequence) -> np.ndarray:
    """The 30 computed properties (``COMPUTED`` order) of RDKit molecules, ``[n, 30]`` uint8."""
    require_rdkit()
    from rdkit.Chem import Descriptors, Fragments

    frs = [getattr(Fragments, f) for f in FRAGMENTS]
    descs = [(getattr(Descriptors, n), op, v) for n, op, v in DESCRIPTORS]
    out = np.zeros((len(mols), len(COMPUTED)), dtype=np.uint8)
    for i, m in enumerate(mols):
        row = [f(m) > 0 for f in frs]
        for fn, op, v in descs:
            x = fn(m)
            row.append(x > v if op == ">" else x >= v)
        out[i] = row
    return out


def _pack(fp: np.ndarray) -> list[bytes]:
    return [bytes(r) for r in np.packbits(fp, axis=1)]


def _unpack(col: pa.ChunkedArray, bits: int) -> np.ndarray:
    raw = np.frombuffer(b"".join(col.to_pylist()), dtype=np.uint8).reshape(len(col), -1)
    return np.unpackbits(raw, axis=1)[:, :bits]


def _molecule_table(smiles: list[str], bits: int) -> pa.Table:
    """Canonical SMILES with packed ECFP4 bits and the computed properties."""
    mols = [parse_smiles(s, i) for i, s in enumerate(smiles)]
    props = computed_properties(mols)
    cols = {"smiles": smiles, "fp": _pack(ecfp(smiles, n_bits=bits))}
    for j, name in enumerate(COMPUTED):
        cols[name] = props[:, j]
    return pa.table(cols)


# --------------------------------------------------------------------------- RDKit's molecules


def _rdkit_files() -> list[tuple[str, str]]:
    from rdkit import RDConfig

    nci = os.path.join(RDConfig.RDDataDir, "NCI", "first_5K.smi")
    wehi = os.path.join(RDConfig.RDDataDir, "Pains", "test_data", "wehi_mols.csv")
    out: list[tuple[str, str]] = []
    with open(nci) as fh:
        out += [("nci", line.split()[0]) for line in fh if line.strip()]
    with open(wehi) as fh:
        out += [("wehi", row[0]) for row in csv.reader(fh) if row]
    return out


def pool_smiles(limit: int = 0) -> list[str]:
    """RDKit's shipped molecules in a fixed shuffled order of the files' lines (so that a prefix
    mixes both files): parsed, 5-50 heavy atoms, unique canonical SMILES; the first ``limit``
    (0: all). Only as many lines are parsed as the prefix needs."""
    Chem = require_rdkit()
    lines = _rdkit_files()
    order = np.random.default_rng(20260).permutation(len(lines))
    seen: dict[str, None] = {}
    dropped = 0
    for i in order:
        mol = Chem.MolFromSmiles(lines[i][1])
        if mol is None or not 5 <= mol.GetNumHeavyAtoms() <= 50:
            dropped += 1
            continue
        seen.setdefault(Chem.MolToSmiles(mol), None)
        if limit and len(seen) == limit:
            break
    if not limit:
        print(f"[nshot recog] RDKit pool: {len(seen)} molecules ({dropped} dropped)", flush=True)
    return list(seen)


def rdkit_pool(bits: int = 1024, limit: int = 0) -> pa.Table:
    """The first ``limit`` molecules of the pool (0: all) with fingerprints and properties."""
    key = f"recog-rdkit-pool-{bits}-{limit or 'all'}"
    return cached_table(key, lambda: _molecule_table(pool_smiles(limit), bits), version="2")


# --------------------------------------------------------------------------- MoleculeACE


def _read_moleculeace(fetch: bool) -> pa.Table:
    """The 30 targets as one long table: target, canonical SMILES, pAct (= y + 9), cliff."""
    import pandas as pd

    files = wheel_files(MOLECULEACE, MOLECULEACE_GLOB, fetch=fetch)
    frames = []
    for path, data in files.items():
        df = pd.read_csv(io.BytesIO(data))
        df["target"] = os.path.basename(path)[: -len(".csv")]
        frames.append(df)
    df = pd.concat(frames, ignore_index=True)
    canon = {s: canonical_smiles(s, i) for i, s in enumerate(dict.fromkeys(df["smiles"]))}
    return pa.table(
        {
            "target": df["target"].astype(str).tolist(),
            "smiles": [canon[s] for s in df["smiles"]],
            "pact": (df["y"].astype(float) + 9.0).tolist(),
            "cliff": df["cliff_mol"].astype(bool).tolist(),
        }
    )


def moleculeace_long(fetch: bool = False) -> pa.Table:
    return cached_table("recog-moleculeace", lambda: _read_moleculeace(fetch), version="1")


def moleculeace_molecules(smiles: list[str], bits: int) -> pa.Table:
    return cached_table(
        f"recog-moleculeace-mols-{bits}", lambda: _molecule_table(smiles, bits), version="1"
    )


def binarise(pact: np.ndarray, threshold: float) -> np.ndarray:
    """1.0 where pAct ≥ threshold (active), else 0.0."""
    return (np.asarray(pact, dtype=float) >= threshold).astype(np.float32)


def class_balance(long: pa.Table, threshold: float) -> dict[str, float]:
    """Active fraction per target."""
    t = np.asarray(long.column("target").to_pylist())
    y = binarise(long.column("pact").to_numpy(), threshold)
    return {name: float(y[t == name].mean()) for name in sorted(set(t.tolist()))}


def choose_split(
    names: list[str],
    shared: np.ndarray,
    n_test: int,
    min_shared: int,
    seed: int,
    must: Sequence[str] = (),
    one_of: Sequence[str] = (),
) -> list[str]:
    """Test targets drawn by ``seed``: those in ``must``, one of ``one_of`` (when given), the rest
    at random, redrawn until every test target shares ≥ ``min_shared`` labelled molecules with
    some training target (``shared[i, j]``: molecules labelled on both)."""
    rng = np.random.default_rng([seed, 237])
    idx = {n: i for i, n in enumerate(names)}
    fixed = [n for n in must if n in idx]
    opts = [n for n in one_of if n in idx]
    for _ in range(10_000):
        test = list(fixed)
        if opts:
            test.append(str(rng.choice(opts)))
        rest = [n for n in names if n not in test]
        need = n_test - len(test)
        if need < 0:
            raise DataError(f"n_test_targets={n_test} is smaller than the required test targets")
        test += [str(x) for x in rng.choice(rest, size=need, replace=False)]
        train = [idx[n] for n in names if n not in test]
        if all(shared[idx[n], train].max() >= min_shared for n in test):
            return sorted(test)
    raise DataError(
        f"no split puts every one of {n_test} test targets next to a training target sharing "
        f">= {min_shared} molecules"
    )


# --------------------------------------------------------------------------- the track


@dataclass
class Track:
    """A label matrix over molecules and properties, with its target split."""

    name: str
    smiles: list[str]
    fp: np.ndarray  # [N, bits] uint8
    labels: np.ndarray  # [N, P] float32, NaN = unmeasured (targets read here)
    aux_labels: np.ndarray  # [N, P] the same, or rows permuted (shuffled context)
    props: list[str]
    kinds: list[str]  # "target" | "computed" | "distractor"
    train_targets: list[int]
    test_targets: list[int]
    aux: list[int]  # informative auxiliaries: every property except the test targets
    distractors: list[int]
    cliff: np.ndarray | None = None  # [N, P] bool: activity-cliff molecule on that target
    pair_counts: np.ndarray = field(default=None)  # [P, P, 4] (y_p, y_p') counts, aux labels
    record: dict = field(default_factory=dict)

    def labelled(self, p: int) -> np.ndarray:
        return np.flatnonzero(~np.isnan(self.labels[:, p]))


def pair_counts(labels: np.ndarray) -> np.ndarray:
    """``C[p, p', 2a + b]``: molecules with label a on p and b on p' (both observed)."""
    ones = np.nan_to_num(labels, nan=0.0) == 1
    zeros = np.nan_to_num(labels, nan=1.0) == 0
    ind = [zeros.astype(np.float32), ones.astype(np.float32)]
    return np.stack([ind[a].T @ ind[b] for a in (0, 1) for b in (0, 1)], axis=-1)


def _distractors(n_mol: int, count: int, prevalences: np.ndarray, hide: float, seed: int):
    rng = np.random.default_rng([seed, 99])
    out = np.zeros((n_mol, count), dtype=np.float32)
    for j in range(count):
        p = float(rng.choice(prevalences))
        col = (rng.random(n_mol) < p).astype(np.float32)
        col[rng.random(n_mol) < hide] = np.nan
        out[:, j] = col
    return out


def build_synthetic(cfg: RecogConfig) -> Track:
    """RDKit's molecules with the computed properties as (noisy, partly hidden) labels."""
    table = rdkit_pool(cfg.fp_bits, cfg.synthetic_pool)
    n = table.num_rows
    rng = np.random.default_rng([cfg.split_seed, 31])
    props = np.stack([table.column(c).to_numpy() for c in COMPUTED], axis=1).astype(np.float32)
    flip = rng.random(props.shape) < cfg.flip_rate
    labels = np.where(flip, 1.0 - props, props).astype(np.float32)
    labels[rng.random(labels.shape) < cfg.hide_rate] = np.nan
    dis = _distractors(n, cfg.n_distractors, props.mean(0), cfg.hide_rate, cfg.split_seed)
    all_labels = np.concatenate([labels, dis], axis=1)
    names = list(COMPUTED) + [f"distractor_{j}" for j in range(cfg.n_distractors)]
    kinds = ["target"] * len(COMPUTED) + ["distractor"] * cfg.n_distractors
    test = sorted(rng.choice(len(COMPUTED), size=cfg.n_test_targets, replace=False).tolist())
    train = [j for j in range(len(COMPUTED)) if j not in test]
    return _finish(
        cfg, "synthetic", table.column("smiles").to_pylist(), _unpack(table.column("fp"),
        cfg.fp_bits), all_labels, names, kinds, train, test, None,
        {"molecules": n, "test_targets": [names[j] for j in test],
         "train_targets": [names[j] for j in train]},
    )  # fmt: skip


def build_moleculeace(cfg: RecogConfig) -> Track:
    """The 30 ChEMBL targets binarised at ``active_pact``, with computed and distractor
    auxiliaries, split so that each test target has a training partner."""
    long = moleculeace_long(cfg.fetch_data)
    smiles = sorted(set(long.column("smiles").to_pylist()))
    mols = moleculeace_molecules(smiles, cfg.fp_bits)
    if mols.column("smiles").to_pylist() != smiles:
        raise DataError("the cached MoleculeACE molecules do not match the targets' SMILES")
    index = {s: i for i, s in enumerate(smiles)}
    targets = sorted(set(long.column("target").to_pylist()))
    tix = {t: j for j, t in enumerate(targets)}
    n, nt = len(smiles), len(targets)
    rows = np.array([index[s] for s in long.column("smiles").to_pylist()])
    cols = np.array([tix[t] for t in long.column("target").to_pylist()])
    y = binarise(long.column("pact").to_numpy(), cfg.active_pact)
    labels = np.full((n, nt), np.nan, dtype=np.float32)
    cliff = np.zeros((n, nt), dtype=bool)
    labels[rows, cols] = y  # duplicates (none in MoleculeACE) would keep the last
    cliff[rows, cols] = np.asarray(long.column("cliff").to_pylist(), dtype=bool)
    observed = (~np.isnan(labels)).astype(np.float32)
    shared = observed.T @ observed
    np.fill_diagonal(shared, 0)
    test_names = choose_split(
        targets, shared, cfg.n_test_targets, cfg.min_shared, cfg.split_seed,
        MUST_TEST, ONE_OF_TEST,
    )  # fmt: skip
    test = [tix[t] for t in test_names]
    train = [j for j in range(nt) if j not in test]
    comp = np.stack([mols.column(c).to_numpy() for c in COMPUTED], axis=1).astype(np.float32)
    dis = _distractors(n, cfg.n_distractors, comp.mean(0), cfg.hide_rate, cfg.split_seed)
    all_labels = np.concatenate([labels, comp, dis], axis=1)
    names = targets + list(COMPUTED) + [f"distractor_{j}" for j in range(cfg.n_distractors)]
    kinds = ["target"] * nt + ["computed"] * len(COMPUTED) + ["distractor"] * cfg.n_distractors
    cliff_all = np.zeros(all_labels.shape, dtype=bool)
    cliff_all[:, :nt] = cliff
    balance = class_balance(long, cfg.active_pact)
    partners = {
        t: {
            targets[j]: int(shared[tix[t], j]) for j in train if shared[tix[t], j] >= cfg.min_shared
        }
        for t in test_names
    }
    record = {
        "molecules": n, "labels": int(observed.sum()), "active_pact": cfg.active_pact,
        "test_targets": test_names, "train_targets": [targets[j] for j in train],
        "active_fraction": balance, "partners": partners,
    }  # fmt: skip
    return _finish(
        cfg, "moleculeace", smiles, _unpack(mols.column("fp"), cfg.fp_bits), all_labels, names,
        kinds, train, test, cliff_all, record,
    )  # fmt: skip


def _finish(cfg, name, smiles, fp, labels, names, kinds, train, test, cliff, record) -> Track:
    aux_labels = labels
    if cfg.system == "recog_shuffled_context":  # every molecule gets another one's context
        perm = np.random.default_rng([cfg.split_seed, 4242]).permutation(len(smiles))
        aux_labels = labels[perm]
    distractors = [j for j, k in enumerate(kinds) if k == "distractor"]
    aux = [j for j, k in enumerate(kinds) if k != "distractor" and j not in test]
    context = aux_labels.copy()
    context[:, test] = np.nan  # the pair statistics never see a test target's labels
    return Track(
        name=name, smiles=smiles, fp=fp, labels=labels, aux_labels=aux_labels, props=names,
        kinds=kinds, train_targets=train, test_targets=test, aux=aux, distractors=distractors,
        cliff=cliff, pair_counts=pair_counts(context), record=record,
    )  # fmt: skip


def load_track(cfg: RecogConfig, track: str | None = None) -> Track:
    """The config's track (or ``track``), built from the cached tables."""
    name = track or cfg.track
    if name == "synthetic":
        return build_synthetic(cfg)
    if name == "moleculeace":
        return build_moleculeace(cfg)
    raise DataError(f"unknown track {name!r}")


@cache
def _cached_track(cfg_json: str, track: str) -> Track:
    return load_track(RecogConfig.model_validate_json(cfg_json), track)


def track_for(cfg: RecogConfig, track: str | None = None) -> Track:
    """``load_track`` memoised per process (keyed by the fields that shape the data)."""
    keep = ("track", "fetch_data", "active_pact", "split_seed", "n_test_targets", "min_shared",
            "synthetic_pool", "flip_rate", "hide_rate", "n_distractors", "fp_bits", "system")  # fmt: skip
    base = RecogConfig.from_preset("smoke").model_dump()
    values = {**base, **{k: getattr(cfg, k) for k in keep}}
    if values["system"] != "recog_shuffled_context":
        values["system"] = "recog"
    return _cached_track(RecogConfig.validated(values).model_dump_json(), track or cfg.track)


# --------------------------------------------------------------------------- episodes


@dataclass
class Episode:
    """One few-shot task on target ``target``; ``yq`` is for scoring only (never a model input)."""

    target: int
    xs: np.ndarray  # [S, bits] float32
    ys: np.ndarray  # [S] float32 in {0, 1}
    xq: np.ndarray  # [Q, bits]
    yq: np.ndarray  # [Q]
    ls: np.ndarray  # [S, A] auxiliary labels (NaN = unmeasured)
    lq: np.ndarray  # [Q, A]
    aux: np.ndarray  # [A] property indices
    distractor: np.ndarray  # [A] bool
    r_aux: np.ndarray  # [A, A, 4] auxiliary pair counts (training labels, no episode label)
    smiles_s: list[str] = field(default_factory=list)
    smiles_q: list[str] = field(default_factory=list)
    cliff_q: np.ndarray | None = None  # [Q] bool
    # [A] the property embeddings the model reads (None: ``aux``); with fresh distractor
    # identities the distractors take those of informative properties the episode left out
    aux_ids: np.ndarray | None = None


def rank_aux(assay: np.ndarray, observed: np.ndarray, n_aux: int, rng) -> np.ndarray:
    """Positions of the chosen auxiliaries among candidates: first the assay properties
    observed on the episode's molecules, most observed first (ties at random), then the others
    (computed properties, unobserved assays) in random order; ``observed`` counts labels, it
    never looks at them."""
    key = np.where(assay & (observed > 0), 2.0 + observed + 0.5 * rng.random(len(observed)),
                   rng.random(len(observed)))  # fmt: skip
    return np.argsort(-key, kind="stable")[:n_aux]


def choose_aux(
    track: Track, target: int, mols: np.ndarray, n_aux: int, n_distractors: int, rng
) -> np.ndarray:
    """The episode's auxiliaries (:func:`rank_aux` over every informative property but the
    target), then ``n_distractors`` distractors."""
    cand = np.array([p for p in track.aux if p != target])
    observed = (~np.isnan(track.aux_labels[np.ix_(mols, cand)])).sum(0)
    assay = np.array([track.kinds[p] == "target" for p in cand])
    chosen = cand[rank_aux(assay, observed, n_aux, rng)]
    dis = np.array(track.distractors[:n_distractors], dtype=int)
    return np.concatenate([chosen, dis]).astype(int)


def fresh_identities(track: Track, target: int, aux: np.ndarray, rng) -> np.ndarray:
    """The embeddings ids of an episode's auxiliaries with fresh distractor identities: each
    distractor takes the id of an informative property (not the target) that the episode did
    not choose, drawn anew per episode, so a gate cannot learn which ids are distractors."""
    dis = np.array([track.kinds[a] == "distractor" for a in aux])
    used = set(aux[~dis].tolist()) | {target}
    free = np.array([p for p in track.aux if p not in used], dtype=int)
    ids = aux.copy()
    if dis.any():
        ids[dis] = rng.choice(free, size=int(dis.sum()), replace=len(free) < dis.sum())
    return ids


def make_episode(
    track: Track,
    target: int,
    support: np.ndarray,
    queries: np.ndarray,
    aux: np.ndarray,
) -> Episode:
    """The episode over molecule indices ``support`` and ``queries`` with auxiliaries ``aux``."""
    lab = track.aux_labels
    return Episode(
        target=int(target),
        xs=track.fp[support].astype(np.float32),
        ys=track.labels[support, target].astype(np.float32),
        xq=track.fp[queries].astype(np.float32),
        yq=track.labels[queries, target].astype(np.float32),
        ls=lab[np.ix_(support, aux)],
        lq=lab[np.ix_(queries, aux)],
        aux=aux,
        distractor=np.array([track.kinds[a] == "distractor" for a in aux]),
        r_aux=track.pair_counts[np.ix_(aux, aux)],
        smiles_s=[track.smiles[i] for i in support],
        smiles_q=[track.smiles[i] for i in queries],
        cliff_q=None if track.cliff is None else track.cliff[queries, target],
    )


def sample_episode(
    track: Track,
    target: int,
    k: int,
    n_query: int,
    rng,
    *,
    n_aux: int,
    n_distractors: int,
    stratified: bool = False,
    fresh_distractors: bool = False,
) -> Episode:
    """k positives + k negatives as support; ``n_query`` of the other labelled molecules as
    queries (``stratified``: the same active fraction as the target's remaining molecules)."""
    mols = track.labelled(target)
    y = track.labels[mols, target]
    pos, neg = rng.permutation(mols[y == 1]), rng.permutation(mols[y == 0])
    if len(pos) <= k or len(neg) <= k:
        raise DataError(f"target {track.props[target]} has too few molecules of a class for k={k}")
    support = np.concatenate([pos[:k], neg[:k]])
    rest_pos, rest_neg = pos[k:], neg[k:]
    if stratified:
        n = min(n_query, len(rest_pos) + len(rest_neg))
        n_pos = int(round(n * len(rest_pos) / (len(rest_pos) + len(rest_neg))))
        n_pos = min(max(n_pos, 1), len(rest_pos), n - 1)
        queries = np.concatenate([rest_pos[:n_pos], rest_neg[: n - n_pos]])
    else:
        rest = np.concatenate([rest_pos, rest_neg])
        queries = rng.choice(rest, size=min(n_query, len(rest)), replace=False)
    aux = choose_aux(track, target, np.concatenate([support, queries]), n_aux, n_distractors, rng)
    ep = make_episode(track, target, support, queries, aux)
    if fresh_distractors:
        ep.aux_ids = fresh_identities(track, target, aux, rng)
    return ep


def data_tables(cfg: RecogConfig) -> dict[str, pa.Table]:
    """The label matrix as a long table (``molecule``, ``smiles``, ``property``, ``label``,
    ``split``) and the property list."""
    track = track_for(cfg)
    rows, cols = np.nonzero(~np.isnan(track.labels))
    split = {p: "test" for p in track.test_targets}
    split.update({p: "train" for p in track.train_targets})
    prop_split = [split.get(p, "aux") for p in range(len(track.props))]
    return {
        "labels": pa.table(
            {
                "molecule": rows.astype(np.int64),
                "smiles": [track.smiles[i] for i in rows],
                "property": [track.props[j] for j in cols],
                "label": track.labels[rows, cols].astype(np.int8),
                "split": [prop_split[j] for j in cols],
            }
        ),
        "properties": pa.table({"property": track.props, "kind": track.kinds, "split": prop_split}),
    }
