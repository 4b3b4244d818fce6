"""Constructive baselines: nearest-neighbour feasible greedy, Clarke–Wright savings, and a
random feasible policy."""

from __future__ import annotations

import math

import numpy as np
import torch

from .checker import route_ok
from .env import Env
from .representation import Instances, distances


@torch.no_grad()
def nearest_neighbour(inst: Instances) -> list[dict]:
    """From the depot, always go to the nearest feasible customer; return to the depot only
    when no customer is feasible (the same step-wise masks as the decoder)."""
    env = Env(inst, 1)
    for _ in range(2 * env.V + 2):
        mask = env.mask()
        if bool(env.done.all()):
            break
        d_to = env._leg()[0]
        score = d_to.masked_fill(env.is_dep, 1e9).masked_fill(~mask, math.inf)
        env.step(score.argmin(-1))
    out = []
    for b in range(env.B):
        routes, deps = env.solution(b, 0)
        out.append({"routes": routes, "depots": deps, "cost": float(env.cost[b, 0]),
                    "stuck": bool(env.stuck[b, 0])})  # fmt: skip
    return out


def savings(inst: Instances, i: int = 0) -> dict | None:
    """Clarke–Wright parallel savings for a single-depot instance (None for multi-depot).

    Starts from one route per customer and merges route A (ending at a) with route B (starting
    at b) in decreasing order of ``d_a0 + d_0b − d_ab`` (open routes: ``d_0b − d_ab``), keeping
    a merge only when the merged route satisfies every per-route constraint (capacity,
    precedence, windows, distance limit), checked by the independent checker.
    """
    if inst.num_depots != 1:
        return None
    one = inst[i]
    M = 1
    V = one.locs.shape[1]
    D = distances(one.locs[0])
    closed = not bool(one.open_route[0])
    routes: dict[int, list[int]] = {}
    where: dict[int, int] = {}
    for c in range(M, V):
        routes[c] = [c]
        where[c] = c
    cust = np.arange(M, V)
    a, b = np.meshgrid(cust, cust, indexing="ij")
    keep = a != b
    a, b = a[keep], b[keep]
    s = D[0, b] - D[a, b] + (D[a, 0] if closed else 0.0)
    order = np.argsort(-s, kind="stable")
    for k in order:
        if s[k] <= 0 and closed:
            break
        x, y = int(a[k]), int(b[k])
        rx, ry = where[x], where[y]
        if rx == ry:
            continue
        A, B = routes[rx], routes[ry]
        if A[-1] != x or B[0] != y:
            continue
        merged = A + B
        if not route_ok(one, merged, 0):
            continue
        routes[rx] = merged
        del routes[ry]
        for c in B:
            where[c] = rx
    out = list(routes.values())
    return {"routes": out, "depots": [0] * len(out)}


@torch.no_grad()
def random_policy(inst: Instances, seed: int = 0) -> list[dict]:
    """Uniformly random feasible action at every step (one rollout per instance)."""
    from .model import solve

    return solve(None, inst, starts=1, aug=1, mode="random", seed=seed)
