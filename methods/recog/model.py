"""ReCoG's model: a molecule–property context graph with cross-property relational learning
(CPR) and a context-graph information bottleneck (CGIB), and the ProtoNet baseline.

One episode is one graph (paper §3): property nodes (the target ``t`` and the auxiliaries), the
2k support molecules and the queries. Molecule–property edges are typed by the label (0, 1, or
unmeasured, weighted ``nan_w``); the queries have no edge to ``t``. Molecule–molecule edges join
each molecule to its most similar support molecules (``w_ij = σ(MLP(exp(−|h_i − h_j|)))``, top
``max(1, 2k − 1)``). Property nodes read the support molecules only and queries send no message,
so a query's prediction depends on the support, the auxiliaries and its own molecule, never on
another query nor on any query's label.

* CPR (paper §3.2, reconstructed from its description): per property pair a relation histogram
  ``R_pp'`` over the four label pairs (00, 01, 10, 11): auxiliary pairs from the training labels,
  target–auxiliary pairs from the support only, with a +1 prior per bin; ``e_pp' = MLP(R_pp')``
  gates property-to-property messages and carries triplet messages (molecule, p, p') typed by the
  molecule's own label pair. ``L_rel`` predicts the label pair of hidden auxiliary edges.
* CGIB (paper §3.3, reconstructed, GSAT-style): ``π_a = σ(MLP([h_t; h_a; e_ta]))`` per auxiliary,
  a Gumbel-relaxed mask in training and ``π_a`` itself at test, multiplying every edge of ``a``;
  ``L_IB = KL(Bern(π_a) ‖ Bern(r0))``.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from nshot.errors import NshotError
from nshot.train.checkpoint import LoadedCheckpoint

from .config import RecogConfig

ABSENT, NEG, POS, UNMEASURED = -1, 0, 1, 2

SYSTEM_MODULES = {  # system -> (CPR, CGIB)
    "recog": (True, True),
    "recog_shuffled_context": (True, True),
    "context_graph": (False, False),
    "recog_no_cpr": (False, True),
    "recog_no_cgib": (True, False),
}


def mlp(i: int, h: int, o: int, dropout: float = 0.0) -> nn.Sequential:
    return nn.Sequential(nn.Linear(i, h), nn.ReLU(), nn.Dropout(dropout), nn.Linear(h, o))


class Encoder(nn.Module):
    """Molecule encoder: an MLP on ECFP4 bits, or a GIN on the molecular graph."""

    def __init__(self, cfg: RecogConfig) -> None:
        super().__init__()
        self.kind = cfg.encoder
        if self.kind == "ecfp_mlp":
            self.net = mlp(cfg.fp_bits, 2 * cfg.d, cfg.d, cfg.dropout)
        else:
            from nshot.data.molecules import ATOM_FEATURE_DIM, BOND_FEATURE_DIM
            from nshot.nn.graph import GIN

            self.net = GIN(ATOM_FEATURE_DIM, cfg.d, cfg.d, n_layers=cfg.gin_layers,
                           edge_dim=BOND_FEATURE_DIM, dropout=cfg.dropout)  # fmt: skip

    def forward(self, fp: torch.Tensor, smiles: list[str] | None = None) -> torch.Tensor:
        if self.kind == "ecfp_mlp":
            return self.net(fp)
        from nshot.data.molecules import batch_graphs, smiles_to_graph

        x, ei, ea, b = batch_graphs([smiles_to_graph(s, i) for i, s in enumerate(smiles or [])])
        return self.net(x, ei, b, len(smiles or []), edge_attr=ea)


@dataclass
class Output:
    logits: torch.Tensor  # [Q]
    gates: torch.Tensor | None  # [A] π_a
    loss_ib: torch.Tensor
    loss_rel: torch.Tensor


def label_states(labels: torch.Tensor) -> torch.Tensor:
    """{0, 1, NaN} → NEG, POS, UNMEASURED (long)."""
    return torch.where(torch.isnan(labels), UNMEASURED, labels.nan_to_num(0.0).long())


class RecogModel(nn.Module):
    def __init__(self, cfg: RecogConfig, n_props: int, system: str | None = None) -> None:
        super().__init__()
        system = system or cfg.system
        if system not in SYSTEM_MODULES:
            raise NshotError(f"system {system!r} is not a context-graph model")
        self.use_cpr, self.use_cgib = SYSTEM_MODULES[system]
        d = cfg.d
        self.d, self.n_layers = d, cfg.layers
        self.nan_w, self.tau, self.r0 = cfg.nan_w, cfg.tau, cfg.r0
        self.rel_frac = cfg.rel_frac
        self.encoder = Encoder(cfg)
        self.prop_emb = nn.Embedding(n_props, d)
        self.t_token = nn.Parameter(torch.randn(d) * 0.1)
        self.read = nn.ModuleList([nn.Linear(d, d), nn.Linear(d, d)])  # by support label
        self.type_emb = nn.Embedding(3, d)  # NEG, POS, UNMEASURED edges
        self.sim = mlp(d, 16, 1)  # a narrow MLP: it runs on every molecule × support pair
        self.drop = nn.Dropout(cfg.dropout)
        L = cfg.layers
        self.p_root = nn.ModuleList(nn.Linear(d, d) for _ in range(L))
        self.p_nb = nn.ModuleList(nn.Linear(d, d) for _ in range(L))
        self.m_root = nn.ModuleList(nn.Linear(d, d) for _ in range(L))
        self.m_prop = nn.ModuleList(nn.Linear(d, d) for _ in range(L))
        self.m_mol = nn.ModuleList(nn.Linear(d, d) for _ in range(L))
        if self.use_cpr or self.use_cgib:
            self.rel = mlp(4, d, d)
        if self.use_cpr:
            self.pp_gate = nn.ModuleList(nn.Linear(3 * d, 1) for _ in range(L))
            self.pp_w = nn.ModuleList(nn.Linear(d, d) for _ in range(L))
            self.tri = nn.ModuleList(nn.Linear(3 * d, d) for _ in range(L))
            self.tri_rel = nn.Parameter(torch.randn(L, 4, d) * 0.1)
            self.rel_head = mlp(3 * d, d, 4)
        if self.use_cgib:
            self.gate = mlp(3 * d, d, 1)
        self.head = mlp(2 * d, d, 1, cfg.dropout)
        self.support_readout = cfg.readout == "support"
        if self.support_readout:  # the prototype term's scale (no random draw: init unchanged)
            self.proto_scale = nn.Parameter(torch.tensor(5.0))
        # (y_p, y_p') counts of every property pair on the training labels: R_pp' of the
        # auxiliary pairs of any episode, kept with the weights for serving
        self.register_buffer("pair_counts", torch.zeros(n_props, n_props, 4))

    # ------------------------------------------------------------------ pieces

    @staticmethod
    def relation_hist(ys: torch.Tensor, ls_states: torch.Tensor) -> torch.Tensor:
        """Target–auxiliary counts ``[A, 4]`` over the support: (y_t, y_a) both observed."""
        obs = ls_states <= POS
        code = 2 * ys.long().unsqueeze(1) + ls_states.clamp(0, 1)
        onehot = F.one_hot(code, 4).float() * obs.unsqueeze(-1)
        return onehot.sum(0)

    def _readout(self, h_s, states_s, base):
        """Initial property states: embedding + label-wise means of the support molecules."""
        out = base
        for y in (NEG, POS):
            m = (states_s == y).float()  # [S, P']
            mean = (m.t() @ h_s) / m.sum(0).clamp_min(1.0).unsqueeze(1)
            out = out + self.read[y](mean) * (m.sum(0) > 0).float().unsqueeze(1)
        return out

    def forward(
        self,
        xs: torch.Tensor,
        ys: torch.Tensor,
        xq: torch.Tensor,
        ls: torch.Tensor,
        lq: torch.Tensor,
        aux: torch.Tensor,
        r_aux: torch.Tensor,
        *,
        smiles_s: list[str] | None = None,
        smiles_q: list[str] | None = None,
        generator: torch.Generator | None = None,
    ) -> Output:
        S, Q, A = xs.shape[0], xq.shape[0], aux.shape[0]
        dev = xs.device  # the worker's device; random draws come from the CPU generator
        h_mol = self.encoder(torch.cat([xs, xq]), (smiles_s or []) + (smiles_q or []))
        h_s0 = h_mol[:S]
        st_s, st_q = label_states(ls), label_states(lq)
        loss_rel = h_mol.new_zeros(())
        hidden = None
        if self.training and self.use_cpr and A > 0:  # hide auxiliary edges for L_rel
            obs = torch.cat([st_s, st_q]) <= POS
            pick = torch.rand(obs.shape, generator=generator).to(dev) < self.rel_frac
            hidden = obs & pick
            st_all = torch.cat([st_s, st_q]).masked_fill(hidden, ABSENT)
            st_s, st_q_in = st_all[:S], st_all[S:]
            true_all = torch.cat([label_states(ls), label_states(lq)])
        else:
            st_q_in = st_q
        # property × molecule states, target column first (queries: no edge to t)
        tgt_s = ys.long().unsqueeze(1)
        tgt_q = torch.full((Q, 1), ABSENT, dtype=torch.long, device=dev)
        st = torch.cat([torch.cat([tgt_s, st_s], 1), torch.cat([tgt_q, st_q_in], 1)])  # [M, P']
        P = A + 1
        base = torch.cat([self.t_token.unsqueeze(0), self.prop_emb(aux)])
        h_p = self._readout(h_s0, st[:S], base)
        # relation embeddings (auxiliary pairs: training labels; target pairs: the support)
        e = None
        if self.use_cpr or self.use_cgib:
            counts = torch.zeros(P, P, 4, device=dev)
            counts[1:, 1:] = r_aux
            ta = self.relation_hist(ys, st[:S, 1:])
            counts[0, 1:] = ta
            counts[1:, 0] = ta[:, [0, 2, 1, 3]]  # (y_a, y_t) order
            hist = (counts + 1.0) / (counts + 1.0).sum(-1, keepdim=True)
            e = self.rel(hist)  # [P, P, d]
        # CGIB gates
        gates = None
        loss_ib = h_mol.new_zeros(())
        g = torch.ones(P, device=dev)
        if self.use_cgib and A > 0:
            z = torch.cat([h_p[0].expand(A, -1), h_p[1:], e[0, 1:]], dim=1)
            logit = self.gate(z).squeeze(-1)
            gates = torch.sigmoid(logit)
            if self.training:
                u1 = torch.rand(A, generator=generator).to(dev).clamp(1e-6, 1 - 1e-6)
                u2 = torch.rand(A, generator=generator).to(dev).clamp(1e-6, 1 - 1e-6)
                gumbel = torch.log(-torch.log(u2)) - torch.log(-torch.log(u1))
                mask = torch.sigmoid((logit + gumbel) / self.tau)
            else:
                mask = gates
            g = torch.cat([torch.ones(1, device=dev), mask])
            pi = gates.clamp(1e-6, 1 - 1e-6)
            loss_ib = (
                pi * torch.log(pi / self.r0) + (1 - pi) * torch.log((1 - pi) / (1 - self.r0))
            ).mean()
        # edge weights molecule × property
        w_edge = ((st == NEG) | (st == POS)).float() + self.nan_w * (st == UNMEASURED).float()
        w_edge = w_edge * g.unsqueeze(0)
        types = self.type_emb(st.clamp(min=0))  # [M, P', d] (absent edges weigh 0)
        n_edge = (st != ABSENT).float().sum(1, keepdim=True).clamp_min(1.0)
        n_edge_p = (st[:S] != ABSENT).float().sum(0).clamp_min(1.0).unsqueeze(1)
        # molecule–molecule edges to the support (no self loops)
        diff = torch.exp(-(h_mol.unsqueeze(1) - h_s0.unsqueeze(0)).abs())  # [M, S, d]
        w_mm = torch.sigmoid(self.sim(diff).squeeze(-1))
        self_mask = torch.zeros(S + Q, S, dtype=torch.bool, device=dev)
        self_mask[torch.arange(S), torch.arange(S)] = True
        w_mm = w_mm.masked_fill(self_mask, 0.0)
        keep = max(1, S - 1)
        if keep < S:
            thr = w_mm.topk(keep, dim=1).values[:, -1:]
            w_mm = w_mm * (w_mm >= thr).float()
        w_mm = w_mm / w_mm.sum(1, keepdim=True).clamp_min(1e-6)
        # triplet relation indicators (observed label pairs), for CPR
        if self.use_cpr:
            obs01 = ((st == NEG) | (st == POS)).float() * g.unsqueeze(0)  # [M, P']
            y01 = (st == POS).float()
            ind = [obs01 * (1 - y01), obs01 * y01]  # label 0 / 1 observed, gated
            off = 1.0 - torch.eye(P, device=dev)
            iu = torch.triu_indices(P, P, 1, device=dev)  # unordered property pairs p < p'
            pairs = [ind[a][:, iu[0]] * ind[b][:, iu[1]] for a in (0, 1) for b in (0, 1)]
            n_pairs = sum(p.sum(1) for p in pairs).clamp_min(1.0).unsqueeze(1)
        h_m = h_mol
        for layer in range(self.n_layers):
            h_s = h_m[:S]
            # property nodes: from the support molecules
            msg_p = torch.einsum("sp,spd->pd", w_edge[:S], self.p_nb[layer](h_s).unsqueeze(1)
                                 + types[:S]) / n_edge_p  # fmt: skip
            new_p = F.relu(self.p_root[layer](h_p) + msg_p)
            if self.use_cpr:
                pair = torch.cat([h_p.unsqueeze(1).expand(P, P, -1),
                                  h_p.unsqueeze(0).expand(P, P, -1), e], dim=-1)  # fmt: skip
                a = torch.sigmoid(self.pp_gate[layer](pair).squeeze(-1)) * off * g.unsqueeze(0)
                new_p = new_p + (a @ self.pp_w[layer](h_p)) / max(P - 1, 1)
            # molecule nodes: from properties (typed, gated) and similar support molecules
            msg_m = torch.einsum("mp,mpd->md", w_edge, self.m_prop[layer](h_p).unsqueeze(0)
                                 + types) / n_edge  # fmt: skip
            msg_m = msg_m + w_mm @ self.m_mol[layer](h_s)
            new_m = F.relu(self.m_root[layer](h_m) + msg_m)
            if self.use_cpr:
                z = F.relu(self.tri[layer](pair[iu[0], iu[1]]))  # [K, d]
                tri = sum((pairs[r] @ z) * self.tri_rel[layer, r] for r in range(4))
                new_m = new_m + tri / n_pairs
            h_p, h_m = self.drop(new_p), self.drop(new_m)
        logits = self.head(torch.cat([h_m[S:], h_p[0].expand(Q, -1)], dim=1)).squeeze(-1)
        if self.support_readout:
            logits = logits + self._prototype_logits(h_m[:S], ys, h_m[S:])
        if hidden is not None:
            loss_rel = self._relation_loss(h_m, h_p, st, hidden, true_all, generator)
        return Output(logits=logits, gates=gates, loss_ib=loss_ib, loss_rel=loss_rel)

    def _prototype_logits(self, h_s, ys, h_q):
        """s · (cos(h_q, mean of the positive support) − cos(h_q, mean of the negative))."""
        pos = h_s[ys == 1].mean(0, keepdim=True)
        neg = h_s[ys == 0].mean(0, keepdim=True)
        sim = F.cosine_similarity(h_q, pos, dim=1) - F.cosine_similarity(h_q, neg, dim=1)
        return self.proto_scale * sim

    def _relation_loss(self, h_m, h_p, st, hidden, true_all, generator, cap: int = 64):
        """CE of the label pair (y_mp, y_mp') of hidden edges (m, p') from [h_m; h_p; h_p'],
        ``p`` an observed property of ``m`` (the target included for support molecules)."""
        ms, ps = torch.nonzero(hidden, as_tuple=True)
        if len(ms) == 0:
            return h_m.new_zeros(())
        if len(ms) > cap:
            sel = torch.randperm(len(ms), generator=generator)[:cap].to(ms.device)
            ms, ps = ms[sel], ps[sel]
        obs = (st[ms] == NEG) | (st[ms] == POS)  # [n, P'] observed properties
        ok = obs.any(1)
        ms, ps, obs = ms[ok], ps[ok], obs[ok]
        if len(ms) == 0:
            return h_m.new_zeros(())
        r = torch.rand(obs.shape, generator=generator).to(obs.device) * obs.float()
        p_other = r.argmax(1)
        y_other = st[ms, p_other]
        y_hidden = true_all[ms, ps]  # auxiliary column ps of the label block
        target = 2 * y_other + y_hidden
        z = torch.cat([h_m[ms], h_p[p_other], h_p[ps + 1]], dim=1)
        return F.cross_entropy(self.rel_head(z), target)


class ProtoNet(nn.Module):
    """Prototypical network on the molecule encoder (squared Euclidean distance)."""

    def __init__(self, cfg: RecogConfig) -> None:
        super().__init__()
        self.encoder = Encoder(cfg)
        self.scale = nn.Parameter(torch.tensor(1.0 / cfg.d))

    def forward(self, xs, ys, xq, *_, smiles_s=None, smiles_q=None, **__) -> Output:
        h = self.encoder(torch.cat([xs, xq]), (smiles_s or []) + (smiles_q or []))
        hs, hq = h[: xs.shape[0]], h[xs.shape[0] :]
        pos, neg = hs[ys == 1].mean(0), hs[ys == 0].mean(0)
        d_pos = ((hq - pos) ** 2).sum(1)
        d_neg = ((hq - neg) ** 2).sum(1)
        zero = h.new_zeros(())
        return Output(logits=self.scale * (d_neg - d_pos), gates=None, loss_ib=zero, loss_rel=zero)


def build_model(cfg: RecogConfig, n_props: int, system: str | None = None) -> nn.Module:
    system = system or cfg.system
    if system == "protonet":
        return ProtoNet(cfg)
    return RecogModel(cfg, n_props, system)


def episode_tensors(ep, device: torch.device | str = "cpu") -> dict:
    """The model inputs of an :class:`~.data.Episode` (never its query labels), on ``device``."""

    def t(a, dtype):  # noqa: ANN001, ANN202
        return torch.from_numpy(np.ascontiguousarray(a, dtype=dtype)).to(device)

    return {
        "xs": t(ep.xs, np.float32),
        "ys": t(ep.ys, np.float32),
        "xq": t(ep.xq, np.float32),
        "ls": t(ep.ls, np.float32),
        "lq": t(ep.lq, np.float32),
        "aux": t(ep.aux if ep.aux_ids is None else ep.aux_ids, np.int64),
        "r_aux": t(ep.r_aux, np.float32),
        "smiles_s": list(ep.smiles_s),
        "smiles_q": list(ep.smiles_q),
    }


def load_model(checkpoint: LoadedCheckpoint) -> tuple[nn.Module, RecogConfig, dict]:
    """The model of a recog checkpoint (eval mode), its config and its property record."""
    cfg = RecogConfig.validated(checkpoint.config)
    props = checkpoint.extra.get("props")
    if not isinstance(props, dict) or not isinstance(props.get("names"), list):
        raise NshotError(f"{checkpoint.path}: not a recog checkpoint (no property list)")
    model = build_model(cfg, len(props["names"]))
    try:
        model.load_state_dict(checkpoint.weights())
    except RuntimeError as err:
        raise NshotError(f"{checkpoint.path}: weights do not fit the config: {err}") from None
    return model.eval(), cfg, props
