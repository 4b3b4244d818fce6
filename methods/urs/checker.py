"""An independent feasibility checker and objective.

Written apart from the decoder's masks (``env.py``): it simulates each route from the raw
instance fields in plain Python floats, with its own distance computation, and reports every
violated constraint. A solution is ``routes`` (lists of customer node indices) and, for
multi-depot instances, ``depots`` (the start/end depot of each route; default depot 0).

Constraints checked (``violations`` entries start with the constraint's name):

- ``coverage``: every customer visited exactly once; routes hold only customer indices;
- ``depot``: a route's depot is a depot index;
- ``capacity``: the load never exceeds Q (delivery goods are loaded at the depot, pickups
  accumulate: load = Σ linehaul of the route − delivered + picked up);
- ``precedence``: classic backhaul — no linehaul customer after a backhaul customer;
- ``time_window``: arrival ``max(t + d, e)`` ≤ l at every customer; ``depot_time``: a closed
  route is back by the depot's l;
- ``distance_limit``: route length (without the return arc for open routes) ≤ L;
- ``single_route``: a pure TSP (no capacity, windows or limit) is one tour.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from .representation import Instances

TOL = 1e-7


@dataclass
class Report:
    feasible: bool
    cost: float
    violations: list[str] = field(default_factory=list)

    def kinds(self) -> set[str]:
        return {v.split(":", 1)[0] for v in self.violations}


def _dist(a: list[float], b: list[float]) -> float:
    return math.hypot(a[0] - b[0], a[1] - b[1])


def check(
    inst: Instances, routes: list[list[int]], depots: list[int] | None = None, i: int = 0
) -> Report:
    """Check the solution ``routes`` of instance ``i`` of ``inst``; the cost is always computed."""
    M = inst.num_depots
    locs = inst.locs[i].tolist()
    V = len(locs)
    lin = inst.linehaul[i].tolist()
    back = inst.backhaul[i].tolist()
    Q = float(inst.capacity[i])
    tw = inst.tw[i].tolist()
    svc = inst.service[i].tolist()
    closed = not bool(inst.open_route[i])
    L = float(inst.distance_limit[i])
    classic = int(inst.backhaul_class[i]) == 1
    depots = list(depots) if depots is not None else [0] * len(routes)
    bad: list[str] = []
    if len(depots) != len(routes):
        bad.append(f"depot: {len(depots)} depots for {len(routes)} routes")
        depots = (depots + [0] * len(routes))[: len(routes)]
    seen: dict[int, int] = {}
    cost = 0.0
    for r, (route, dep) in enumerate(zip(routes, depots)):
        if not 0 <= dep < M:
            bad.append(f"depot: route {r} starts at node {dep}, not a depot")
            dep = 0
        if not route:
            continue
        t = tw[dep][0] if math.isfinite(tw[dep][0]) else 0.0
        length = 0.0
        load = sum(lin[j] for j in route if M <= j < V)
        peak = load
        phase_back = False
        prev = dep
        for j in route:
            if not M <= j < V:
                bad.append(f"coverage: route {r} visits node {j}, which is not a customer")
                continue
            seen[j] = seen.get(j, 0) + 1
            d = _dist(locs[prev], locs[j])
            length += d
            arrive = max(t + d, tw[j][0])
            if arrive > tw[j][1] + TOL:
                bad.append(f"time_window: route {r} reaches {j} at {arrive:.6g} > l={tw[j][1]:.6g}")
            t = arrive + svc[j]
            load += back[j] - lin[j]
            peak = max(peak, load)
            if classic:
                if back[j] > 0:
                    phase_back = True
                elif lin[j] > 0 and phase_back:
                    bad.append(f"precedence: route {r} serves linehaul {j} after a backhaul")
            prev = j
        if peak > Q + TOL:
            bad.append(f"capacity: route {r} carries {peak:g} > Q={Q:g}")
        if closed:
            d = _dist(locs[prev], locs[dep])
            length += d
            if t + d > tw[dep][1] + TOL:
                bad.append(f"depot_time: route {r} returns at {t + d:.6g} > l={tw[dep][1]:.6g}")
        if length > L + TOL:
            bad.append(f"distance_limit: route {r} has length {length:.6g} > L={L:.6g}")
        cost += length
    for j in range(M, V):
        c = seen.get(j, 0)
        if c == 0:
            bad.append(f"coverage: customer {j} is not visited")
        elif c > 1:
            bad.append(f"coverage: customer {j} is visited {c} times")
    pure_tsp = (
        not math.isfinite(Q)
        and not math.isfinite(L)
        and not any(math.isfinite(w[1]) for w in tw)
        and M == 1
    )
    if pure_tsp and sum(1 for r in routes if r) > 1:
        bad.append(f"single_route: a TSP tour must be one route, got {len(routes)}")
    return Report(feasible=not bad, cost=cost, violations=bad)


def route_ok(inst: Instances, route: list[int], dep: int = 0, i: int = 0) -> bool:
    """Whether one route alone satisfies every per-route constraint (used by savings)."""
    rep = check(inst, [route], [dep], i)
    return not any(k != "coverage" for k in rep.kinds())
