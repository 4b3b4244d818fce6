"""Batched multi-task VRP environment: step-wise feasibility masks from the UDR attributes.

State is kept per rollout, shape ``[B, R]`` (R = POMO starts × augmentations), in float64 so
that the masks agree with the independent checker. A candidate customer j is feasible when:

- it is not visited;
- **capacity**: classic backhaul (precedence): no linehaul after a backhaul on the route,
  Σ linehaul ≤ Q and Σ backhaul ≤ Q; otherwise (mixed, or no backhauls) the exact load rule:
  with ``Lin`` the route's linehaul so far and ``Mx`` = max over route prefixes of
  (picked up − delivered), the route stays load-feasible iff ``Lin' + Mx' ≤ Q``;
- **time**: arrival ``a = max(t + d_ij, e_j) ≤ l_j`` and, for closed routes,
  ``a + s_j + d_j,depot ≤ l_depot``;
- **distance**: ``len + d_ij (+ d_j,depot if closed) ≤ L``;
- **multi-depot**: a route starts at the depot nearest its first customer (that depot dominates
  every other for the first leg and, when closed, the return) and ends at its own depot.

The depot (the route's own) is selectable when the route is not empty (never twice in a row);
for a pure TSP (no capacity, windows or limit) only when no customer is left.
"""

from __future__ import annotations

import torch

from .representation import Instances

INF = float("inf")


class Env:
    def __init__(self, inst: Instances, rollouts: int, device: str | torch.device = "cpu"):
        f64 = dict(dtype=torch.float64, device=device)
        self.inst = inst
        self.M = M = inst.num_depots
        self.B = B = len(inst)
        self.V = V = inst.locs.shape[1]
        self.N = V - M
        self.R = R = rollouts
        locs = torch.as_tensor(inst.locs, **f64)
        diff = locs[:, :, None, :] - locs[:, None, :, :]
        self.dist = torch.sqrt((diff**2).sum(-1))  # [B, V, V] exact
        near = self.dist[:, :, :M].min(-1)
        self.d_near, self.near_dep = near.values, near.indices  # [B, V]
        self.lin = torch.as_tensor(inst.linehaul, **f64)
        self.back = torch.as_tensor(inst.backhaul, **f64)
        self.cap = torch.as_tensor(inst.capacity, **f64)[:, None, None]
        tw = torch.as_tensor(inst.tw, **f64)
        self.e, self.l = tw[..., 0], tw[..., 1]
        self.svc = torch.as_tensor(inst.service, **f64)
        self.closed = torch.as_tensor(~inst.open_route.astype(bool), device=device)[:, None, None]
        self.limit = torch.as_tensor(inst.distance_limit, **f64)[:, None, None]
        self.classic = torch.as_tensor(inst.backhaul_class == 1, device=device)[:, None, None]
        self.tsp = torch.as_tensor(
            (~torch.isfinite(torch.as_tensor(inst.capacity)))
            & (~torch.isfinite(torch.as_tensor(inst.distance_limit)))
            & (~torch.isfinite(torch.as_tensor(inst.tw[:, :, 1])).any(-1))
            & torch.tensor(M == 1),
            device=device,
        )[:, None]
        # constants of the state features
        finite_q = torch.isfinite(self.cap[:, :, 0])
        self._qs = torch.where(finite_q, self.cap[:, :, 0], torch.ones_like(self.cap[:, :, 0]))
        self._finite_q = finite_q
        has_tw = torch.isfinite(self.l).any(-1, keepdim=True)
        T = torch.where(torch.isfinite(self.l[:, :M]), self.l[:, :M], 0.0).max(-1, keepdim=True)
        self._T = torch.where(has_tw, T.values.clamp_min(1e-9), 1.0)
        self._has_tw = has_tw
        lim = self.limit[:, :, 0]
        self._lim_inv = torch.where(torch.isfinite(lim), 1.0 / lim, 0.0)
        self._cache: dict[str, torch.Tensor] | None = None
        # which constraints any instance of the batch has: an absent one is skipped in the mask
        # (the same mask; the checks it would make hold everywhere)
        self._any_cap = bool(torch.isfinite(self.cap).any())
        self._any_back = bool((self.back != 0).any() or (self.lin < 0).any())
        self._any_tw = bool(torch.isfinite(self.l).any())
        self._any_limit = bool(torch.isfinite(self.limit).any())
        self.is_dep = torch.zeros(V, dtype=torch.bool, device=device)
        self.is_dep[:M] = True
        z = torch.zeros(B, R, **f64)
        self.cur = torch.zeros(B, R, dtype=torch.long, device=device)
        self.rdep = torch.zeros(B, R, dtype=torch.long, device=device)
        self.empty = torch.ones(B, R, dtype=torch.bool, device=device)
        self.done = torch.zeros(B, R, dtype=torch.bool, device=device)
        self.stuck = torch.zeros(B, R, dtype=torch.bool, device=device)
        self.visited = torch.zeros(B, R, V, dtype=torch.bool, device=device)
        self.t, self.length, self.load_lin, self.load_back, self.mx = z, z.clone(), z.clone(), \
            z.clone(), z.clone()  # fmt: skip
        self.has_back = torch.zeros(B, R, dtype=torch.bool, device=device)
        self.cost = z.clone()
        self.actions: list[torch.Tensor] = []

    # ------------------------------------------------------------------ helpers
    def _rows(self, idx: torch.Tensor) -> torch.Tensor:
        """dist[b, idx[b, r], :] → [B, R, V]."""
        return torch.gather(self.dist, 1, idx[:, :, None].expand(-1, -1, self.V))

    def cur_dist(self) -> torch.Tensor:
        """Distance from each rollout's position to every node [B, R, V] (the decoder's bias)."""
        if self._cache is not None:
            return self._cache["cur"]
        return self._rows(self.cur)

    def _leg(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(d to j, depot of the route if j is next, d from j back to that depot) [B, R, V]."""
        if self._cache is not None:
            c = self._cache
            return c["d_to"], c["dep"], c["d_ret"]
        empty = self.empty[:, :, None]
        d_near = self.d_near[:, None, :].expand(-1, self.R, -1)
        cur = self._rows(self.cur)
        d_to = torch.where(empty, d_near, cur)
        dep = torch.where(empty, self.near_dep[:, None, :], self.rdep[:, :, None])
        if self.M == 1:
            d_ret = self.dist[:, 0:1, :].expand(-1, self.R, -1)
        else:
            d_ret = torch.where(empty, d_near, self._rows(self.rdep))
        self._cache = {"cur": cur, "d_to": d_to, "dep": dep, "d_ret": d_ret}
        return d_to, dep, d_ret

    # ------------------------------------------------------------------ masks
    def mask(self) -> torch.Tensor:
        """Feasible actions [B, R, V] (bool). Rollouts that are done may only stay put.

        A constraint no instance of the batch has (capacity, backhauls, time windows, a
        distance limit) is not evaluated: its check holds for every candidate (with no
        backhaul and no negative linehaul both capacity rules reduce to ``Lin + q_j ≤ Q``)."""
        empty = self.empty[:, :, None]
        d_to, dep, d_ret = self._leg()
        zero = torch.zeros((), dtype=torch.float64, device=d_to.device)
        cust = ~self.visited & ~self.is_dep
        if self._any_cap:
            lin = self.lin[:, None, :]
            ll = torch.where(empty, zero, self.load_lin[:, :, None])
            if self._any_back:
                back = self.back[:, None, :]
                lb = torch.where(empty, zero, self.load_back[:, :, None])
                mx = torch.where(empty, zero, self.mx[:, :, None])
                hb = self.has_back[:, :, None] & ~empty
                classic_ok = ((lin <= 0) | ~hb) & (ll + lin <= self.cap) & (lb + back <= self.cap)
                lin_new = ll + lin
                mx_new = torch.maximum(mx, lb + back - lin_new)
                mixed_ok = lin_new + mx_new <= self.cap
                cust &= torch.where(self.classic, classic_ok, mixed_ok)
            else:
                cust &= ll + lin <= self.cap
        if self._any_tw:
            if self.M == 1:
                e_dep = self.e[:, :1, None]
                l_dep = self.l[:, :1, None]
            else:
                e_dep = torch.gather(self.e, 1, dep.reshape(self.B, -1)).reshape(dep.shape)
                l_dep = torch.gather(self.l, 1, dep.reshape(self.B, -1)).reshape(dep.shape)
            t0 = torch.where(empty, e_dep, self.t[:, :, None])
            arrive = torch.maximum(t0 + d_to, self.e[:, None, :])
            cust &= (arrive <= self.l[:, None, :]) & (
                ~self.closed | (arrive + self.svc[:, None, :] + d_ret <= l_dep)
            )
        if self._any_limit:
            len0 = torch.where(empty, zero, self.length[:, :, None])
            cust &= len0 + d_to + torch.where(self.closed, d_ret, zero) <= self.limit
        any_cust = cust.any(-1, keepdim=True)
        dep_ok = ~empty & (self.rdep[:, :, None] == torch.arange(self.V, device=d_to.device))
        dep_ok = dep_ok & ~(self.tsp[:, :, None] & any_cust)
        m = cust | dep_ok
        # an empty route with no feasible customer left: stuck (only infeasible customers remain)
        stuck = ~m.any(-1) & ~self.done
        self.stuck |= stuck
        self.done |= stuck
        if not bool(self.done.any()):
            return m
        stay = torch.nn.functional.one_hot(self.cur, self.V).bool()
        return torch.where(self.done[:, :, None], stay, m)

    # ------------------------------------------------------------------ transition
    def step(self, action: torch.Tensor) -> None:
        act = action[:, :, None]
        active = ~self.done
        to_dep = self.is_dep[action] & active
        to_cust = ~self.is_dep[action] & active
        d_to, dep, d_ret = self._leg()
        d = torch.gather(d_to, 2, act)[..., 0]
        new_dep = torch.gather(dep, 2, act)[..., 0]
        d_back = self.cur_dist().gather(2, self.rdep[:, :, None])[..., 0]
        lin = self.lin.gather(1, action)
        back = self.back.gather(1, action)
        e = self.e.gather(1, action)
        svc = self.svc.gather(1, action)
        closed = self.closed[:, :, 0]
        # customers
        empty = self.empty
        t0 = torch.where(empty, self.e.gather(1, new_dep), self.t)
        len0 = torch.where(empty, 0.0, self.length)
        ll = torch.where(empty, 0.0, self.load_lin)
        lb = torch.where(empty, 0.0, self.load_back)
        mx = torch.where(empty, 0.0, self.mx)
        hb = torch.where(empty, False, self.has_back)
        cust_t = torch.maximum(t0 + d, e) + svc
        ll2 = ll + lin
        lb2 = lb + back
        mx2 = torch.maximum(mx, lb2 - ll2)
        self.cost = (
            self.cost + torch.where(to_cust, d, 0.0) + torch.where(to_dep & closed, d_back, 0.0)
        )
        self.t = torch.where(to_cust, cust_t, torch.where(to_dep, 0.0, self.t))
        self.length = torch.where(to_cust, len0 + d, torch.where(to_dep, 0.0, self.length))
        self.load_lin = torch.where(to_cust, ll2, torch.where(to_dep, 0.0, self.load_lin))
        self.load_back = torch.where(to_cust, lb2, torch.where(to_dep, 0.0, self.load_back))
        self.mx = torch.where(to_cust, mx2, torch.where(to_dep, 0.0, self.mx))
        self.has_back = torch.where(to_cust, hb | (back > 0), self.has_back & ~to_dep)
        self.rdep = torch.where(to_cust, new_dep, self.rdep)
        self.visited = self.visited.scatter(
            2, act, torch.gather(self.visited, 2, act) | to_cust[:, :, None]
        )
        self.empty = torch.where(to_cust, False, torch.where(to_dep, True, self.empty))
        self.cur = torch.where(active, action, self.cur)
        all_seen = self.visited[:, :, self.M :].all(-1)
        self.done = self.done | (all_seen & self.empty)
        self.actions.append(torch.where(active, action, -1))
        self._cache = None

    # ------------------------------------------------------------------ read-out
    def state_features(self) -> torch.Tensor:
        """Dynamic decoder context [B, R, 7] (float32), neutral values for absent attributes."""
        qs, finite_q = self._qs, self._finite_q
        slack_lin = torch.where(finite_q, (qs - self.load_lin - self.mx) / qs, 1.0)
        slack_back = torch.where(finite_q, (qs - self.load_back) / qs, 1.0)
        t = torch.where(self._has_tw, self.t / self._T, 0.0)
        fl = self.length * self._lim_inv
        left = 1.0 - self.visited[:, :, self.M :].float().mean(-1).double()
        feats = torch.stack(
            [slack_lin, slack_back, t, fl, self.has_back.double(), self.empty.double(), left], -1
        )
        return feats.float()

    def solution(self, b: int, r: int) -> tuple[list[list[int]], list[int]]:
        """Rollout r of instance b: (routes of customer indices, the depot of each route)."""
        acts = torch.stack([a[b, r] for a in self.actions]).cpu().numpy()
        near = self.near_dep[b].cpu().numpy()
        routes: list[list[int]] = []
        deps: list[int] = []
        cur: list[int] = []
        for a in acts:
            if a < 0:
                continue
            if a < self.M:
                if cur:
                    routes.append(cur)
                    cur = []
                continue
            if not cur:
                deps.append(int(near[a]))
            cur.append(int(a))
        if cur:
            routes.append(cur)
        return routes, deps
