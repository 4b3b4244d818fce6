"""SCGFM predictor: graphs as edge lists (+ optional node features) → structural coordinates,
optional embeddings, and with a labelled support set few-shot labels and probabilities.

The bases, the decoder and the GW solver are frozen (the checkpoint's); with a support set a
logistic regression (C = 1) is fitted on the support embeddings of this request (paper §3.3),
after standardising every embedding of the request by the mean and spread of all its rows
(labels unused).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
from pydantic import BaseModel, Field, model_validator

from nshot.method import Predictor
from nshot.serve.schema import StrictRequest, check_label_types
from nshot.train.checkpoint import LoadedCheckpoint

from .data import Graph, graph_from_nx
from .model import embed_graphs, load_model

MAX_NODES = 500  # the largest graph a request may hold (GW cost grows as N² · M per solve)
MAX_GRAPHS = 256  # graphs of one request, queries and support together
MAX_FEATURES = 1024


class GraphIn(StrictRequest):
    num_nodes: int = Field(..., description="nodes are 0 .. num_nodes − 1")
    edges: list[list[int]] = Field(..., description="undirected edges [i, j]")
    x: list[list[float]] | None = Field(None, description="node features (num_nodes × F)")


class SupportGraph(StrictRequest):
    graph: GraphIn
    label: int | str


def check_graph(g: GraphIn, name: str, max_nodes: int = MAX_NODES) -> None:
    """Raises ``ValueError`` naming ``name`` and the field for a graph SCGFM cannot embed."""
    if not 2 <= g.num_nodes <= max_nodes:
        raise ValueError(f"{name}.num_nodes: must lie in [2, {max_nodes}], got {g.num_nodes}")
    if len(g.edges) > g.num_nodes * (g.num_nodes - 1):
        raise ValueError(f"{name}.edges: more edges than a simple graph on these nodes holds")
    real = 0
    for k, e in enumerate(g.edges):
        if len(e) != 2:
            raise ValueError(f"{name}.edges[{k}]: an edge is a pair [i, j], got {len(e)} values")
        i, j = e
        if not (0 <= i < g.num_nodes and 0 <= j < g.num_nodes):
            raise ValueError(
                f"{name}.edges[{k}]: endpoint outside 0..{g.num_nodes - 1} in [{i}, {j}]"
            )
        real += i != j
    if real == 0:
        raise ValueError(f"{name}.edges: a graph with no edges (self-loops ignored)")
    if g.x is not None:
        if len(g.x) != g.num_nodes:
            raise ValueError(f"{name}.x: {len(g.x)} rows for {g.num_nodes} nodes")
        f = len(g.x[0])
        if not 1 <= f <= MAX_FEATURES:
            raise ValueError(f"{name}.x: F must lie in [1, {MAX_FEATURES}], got {f}")
        for r, row in enumerate(g.x):
            if len(row) != f:
                raise ValueError(f"{name}.x[{r}]: {len(row)} features, row 0 has {f}")
            if not all(math.isfinite(v) for v in row):
                raise ValueError(f"{name}.x[{r}]: contains NaN or inf")


class ScgfmRequest(StrictRequest):
    graphs: list[GraphIn] = Field(..., min_length=1, max_length=MAX_GRAPHS)
    support: list[SupportGraph] | None = Field(
        None, max_length=MAX_GRAPHS, description="labelled graphs: fit a few-shot head"
    )
    return_embedding: bool = False

    @model_validator(mode="after")
    def _check(self) -> ScgfmRequest:
        named = [(f"graphs[{i}]", g) for i, g in enumerate(self.graphs)]
        named += [(f"support[{i}].graph", s.graph) for i, s in enumerate(self.support or [])]
        if len(named) > MAX_GRAPHS:
            raise ValueError(f"graphs: at most {MAX_GRAPHS} graphs with the support set")
        for name, g in named:
            check_graph(g, name)
        dims = {(None if g.x is None else len(g.x[0])) for _, g in named}
        if len(dims) > 1:
            first = named[0][1]
            f0 = None if first.x is None else len(first.x[0])
            for name, g in named:
                f = None if g.x is None else len(g.x[0])
                if f != f0:
                    raise ValueError(
                        f"{name}.x: F = {f} differs from graphs[0] (F = {f0}); all graphs of "
                        "a request share F (or all omit x)"
                    )
        if self.support is not None:
            labels = [s.label for s in self.support]
            check_label_types("support", labels)
            if len(set(labels)) < 2:
                raise ValueError("support: a support set needs at least 2 classes")
        return self


class GraphOut(BaseModel):
    coords: list[float]
    embedding: list[float] | None = None
    label: int | str | None = None
    probs: dict[str, float] | None = None


class ScgfmResponse(BaseModel):
    graphs: list[GraphOut]
    classes: list[int | str] | None = None
    model: dict[str, Any]


def to_graph(g: GraphIn) -> Graph:
    pairs = {(min(i, j), max(i, j)) for i, j in g.edges if i != j}
    edges = np.array(sorted(pairs), dtype=np.int64).reshape(-1, 2)
    x = None if g.x is None else np.asarray(g.x, dtype=np.float64)
    return Graph(g.num_nodes, edges, x)


def standardise(z: np.ndarray) -> np.ndarray:
    mu, sd = z.mean(0, keepdims=True), z.std(0, keepdims=True)
    return (z - mu) / np.where(sd > 1e-9, sd, 1.0)


def fit_head(z_support: np.ndarray, y_support: np.ndarray):
    from sklearn.linear_model import LogisticRegression

    return LogisticRegression(C=1.0, max_iter=1000).fit(z_support, y_support)


class ScgfmPredictor(Predictor[ScgfmRequest, ScgfmResponse]):
    Request = ScgfmRequest
    Response = ScgfmResponse

    def __init__(self, checkpoint: LoadedCheckpoint) -> None:
        self.model, self.solver, self.tau = load_model(checkpoint)
        self.max_nodes = min(int(checkpoint.config.get("max_nodes", MAX_NODES)), MAX_NODES)
        self.info = {"n_bases": self.model.n_bases, "basis_size": self.model.basis_size,
                     "solver": self.solver.name, "step": checkpoint.step}  # fmt: skip

    def metadata(self) -> dict[str, Any]:
        return {**self.info, "tau": self.tau, "max_nodes": self.max_nodes,
                "max_graphs": MAX_GRAPHS, "sigma_delta": float(self.model.sigma_delta)}  # fmt: skip

    def example_request(self) -> dict[str, Any]:
        """Two labelled trees and two labelled caveman graphs, and one of each to label."""
        import networkx as nx

        def as_json(g: nx.Graph) -> dict[str, Any]:
            gr = graph_from_nx(g)
            return {"num_nodes": gr.n, "edges": gr.edges.tolist(), "x": None}

        trees = [nx.random_labeled_tree(n, seed=s) for n, s in ((12, 1), (14, 2), (13, 3))]
        caves = [nx.connected_caveman_graph(c, k) for c, k in ((3, 4), (2, 5), (3, 5))]
        support = [{"graph": as_json(g), "label": "tree"} for g in trees[:2]]
        support += [{"graph": as_json(g), "label": "caveman"} for g in caves[:2]]
        return {"graphs": [as_json(trees[2]), as_json(caves[2])], "support": support,
                "return_embedding": False}  # fmt: skip

    def _embed(self, request: ScgfmRequest) -> tuple[np.ndarray, np.ndarray, int]:
        graphs = [to_graph(g) for g in request.graphs]
        support = [to_graph(s.graph) for s in request.support or []]
        for name, g in [(f"graphs[{i}]", g) for i, g in enumerate(graphs)] + [
            (f"support[{i}].graph", g) for i, g in enumerate(support)
        ]:
            if g.n > self.max_nodes:
                raise ValueError(f"{name}.num_nodes: this model takes at most {self.max_nodes}")
        emb = embed_graphs(self.model, graphs + support, self.solver, self.tau)
        return emb.w, emb.z(), len(graphs)

    def one_shot_embeddings(self, request: ScgfmRequest, kind: str | None = None):
        """Standardised embeddings z of the support and query graphs (for CAOS prediction sets):
        a function of each graph and of the request's unlabelled rows only."""
        from nshot.conformal import OneShotEpisode

        if not request.support:
            raise ValueError("support: prediction sets need a labelled support set")
        _, z, q = self._embed(request)
        z = standardise(z)
        classes = list(dict.fromkeys(s.label for s in request.support))
        index = {c: i for i, c in enumerate(classes)}
        return OneShotEpisode(
            support_emb=z[q:], support_labels=np.array([index[s.label] for s in request.support]),
            query_emb=z[:q], classes=classes,
        )  # fmt: skip

    def __call__(self, request: ScgfmRequest) -> ScgfmResponse:
        w, z, q = self._embed(request)
        out = [
            GraphOut(
                coords=[round(float(v), 8) for v in w[i]],
                embedding=[round(float(v), 8) for v in z[i]] if request.return_embedding else None,
            )
            for i in range(q)
        ]
        classes = None
        if request.support:
            classes = list(dict.fromkeys(s.label for s in request.support))
            index = {c: i for i, c in enumerate(classes)}
            zs = standardise(z)
            y = np.array([index[s.label] for s in request.support])
            head = fit_head(zs[q:], y)
            probs = head.predict_proba(zs[:q])
            for i, o in enumerate(out):
                p = {
                    str(classes[int(c)]): round(float(v), 6)
                    for c, v in zip(head.classes_, probs[i])
                }
                o.probs = p
                o.label = classes[int(head.classes_[int(np.argmax(probs[i]))])]
        return ScgfmResponse(graphs=out, classes=classes, model=self.info)
