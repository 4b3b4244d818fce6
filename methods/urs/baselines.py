"""Reference solvers with a fixed time limit per instance.

- **PyVRP 0.14** (iterated local search) for every variant it expresses: capacity, time
  windows, open routes (zero-cost arcs back to the depot), distance limits (the vehicle type's
  ``max_distance``), mixed backhauls (client ``pickup``: load-feasible in any order) and
  multi-depot (one vehicle type per depot, routes end where they start).
- **OR-Tools** routing (guided local search) for classic backhauls, which PyVRP cannot
  express: a dimension counts the backhauls visited and is pinned to 0 at every linehaul node;
  linehaul and backhaul loads are two capacity dimensions.

Both need integers: distances, durations and windows are scaled by 10⁴ and rounded
*conservatively* (distances, durations, service times and window starts up, window ends and
limits down), so a solution that is feasible for the solver is feasible for the float
checker; the objective is recomputed in floats by :mod:`checker`.
"""

from __future__ import annotations

import math
import time

import numpy as np

from .representation import Instances, distances

SCALE = 10_000


def _up(x: float) -> int:
    return int(math.ceil(x * SCALE - 1e-9))


def _down(x: float) -> int:
    return int(math.floor(x * SCALE + 1e-9))


def pyvrp_version() -> str:
    import importlib.metadata

    return importlib.metadata.version("pyvrp")


def supports_pyvrp(inst: Instances, i: int = 0) -> bool:
    """PyVRP expresses every attribute except classic (linehaul-first) backhauls."""
    has_back = bool((inst.backhaul[i, inst.num_depots :] > 0).any())
    return not (has_back and int(inst.backhaul_class[i]) == 1)


def solve_pyvrp(inst: Instances, i: int, seconds: float, seed: int = 0) -> dict:
    from pyvrp import Model
    from pyvrp.stop import MaxRuntime

    M = inst.num_depots
    locs = inst.locs[i]
    V = len(locs)
    N = V - M
    D = distances(locs)
    tw = inst.tw[i]
    closed = not bool(inst.open_route[i])
    Q = float(inst.capacity[i])
    tsp = not math.isfinite(Q)
    m = Model()
    L = [m.add_location(x=float(x), y=float(y)) for x, y in locs]
    depots = []
    for k in range(M):
        kw = {}
        if math.isfinite(tw[k, 1]) and closed:
            kw = {"tw_early": _up(tw[k, 0]), "tw_late": _down(tw[k, 1])}
        depots.append(m.add_depot(L[k], **kw))
    for k in range(M):
        vt = {"num_available": 1 if tsp else N, "start_depot": depots[k], "end_depot": depots[k]}
        vt["capacity"] = 0 if tsp else int(Q)
        if math.isfinite(inst.distance_limit[i]):
            vt["max_distance"] = _down(float(inst.distance_limit[i]))
        m.add_vehicle_type(**vt)
    for j in range(M, V):
        kw = {"delivery": 0 if tsp else int(inst.linehaul[i, j]),
              "pickup": 0 if tsp else int(inst.backhaul[i, j])}  # fmt: skip
        if math.isfinite(tw[j, 1]):
            kw.update(
                service_duration=_up(inst.service[i, j]),
                tw_early=_up(tw[j, 0]),
                tw_late=_down(tw[j, 1]),
            )
        m.add_client(L[j], **kw)
    for a in range(V):
        for b in range(V):
            if a == b:
                continue
            d = 0 if (b < M and not closed) else _up(D[a, b])
            m.add_edge(L[a], L[b], distance=d, duration=d)
    t0 = time.time()
    res = m.solve(stop=MaxRuntime(seconds), seed=seed, display=False)
    routes, deps = [], []
    for r in res.best.routes():
        visits = [M + int(v.idx) for v in r.schedule() if v.is_client()]  # client idx: 0-based
        if visits:
            routes.append(visits)
            deps.append(int(r.start_depot()))
    return {
        "routes": routes,
        "depots": deps,
        "solver_feasible": bool(res.is_feasible()),
        "time_s": time.time() - t0,
        "solver": f"pyvrp {pyvrp_version()}",
    }


def solve_ortools(inst: Instances, i: int, seconds: float) -> dict:
    from ortools.constraint_solver import pywrapcp, routing_enums_pb2

    M = inst.num_depots
    V = inst.locs.shape[1]
    N = V - M
    D = distances(inst.locs[i])
    closed = not bool(inst.open_route[i])
    lin = inst.linehaul[i].astype(int)
    back = inst.backhaul[i].astype(int)
    Q = int(inst.capacity[i]) if math.isfinite(inst.capacity[i]) else 10**9
    tw = inst.tw[i]
    svc = inst.service[i]
    has_tw = bool(np.isfinite(tw[:, 1]).any())
    dist_int = [[0 if (b < M and not closed) else _up(D[a, b]) for b in range(V)] for a in range(V)]
    t0 = time.time()

    def attempt(n_veh_per_depot: int):
        starts = [k for k in range(M) for _ in range(n_veh_per_depot)]
        manager = pywrapcp.RoutingIndexManager(V, len(starts), starts, starts)
        routing = pywrapcp.RoutingModel(manager)

        def node(idx: int) -> int:
            return manager.IndexToNode(idx)

        dist_cb = routing.RegisterTransitCallback(lambda a, b: dist_int[node(a)][node(b)])
        routing.SetArcCostEvaluatorOfAllVehicles(dist_cb)
        lin_cb = routing.RegisterUnaryTransitCallback(lambda a: int(lin[node(a)]))
        back_cb = routing.RegisterUnaryTransitCallback(lambda a: int(back[node(a)]))
        nv = len(starts)
        routing.AddDimensionWithVehicleCapacity(lin_cb, 0, [Q] * nv, True, "Lin")
        routing.AddDimensionWithVehicleCapacity(back_cb, 0, [Q] * nv, True, "Back")
        bh_cb = routing.RegisterUnaryTransitCallback(lambda a: int(back[node(a)] > 0))
        routing.AddDimension(bh_cb, 0, V + 1, True, "BH")
        bh = routing.GetDimensionOrDie("BH")
        for j in range(M, V):
            if lin[j] > 0:
                bh.CumulVar(manager.NodeToIndex(j)).SetRange(0, 0)
        if has_tw:
            horizon = max(_down(float(tw[k, 1])) for k in range(M)) if closed else 10**9
            svc_int = [_up(float(s)) for s in svc]

            def time_cb(a: int, b: int) -> int:
                na, nb = node(a), node(b)
                return svc_int[na] + dist_int[na][nb]

            tcb = routing.RegisterTransitCallback(time_cb)
            routing.AddDimension(tcb, 10**9, 10**9, False, "Time")
            tdim = routing.GetDimensionOrDie("Time")
            for j in range(M, V):
                if math.isfinite(tw[j, 1]):
                    tdim.CumulVar(manager.NodeToIndex(j)).SetRange(
                        _up(float(tw[j, 0])), _down(float(tw[j, 1]))
                    )
            for v in range(nv):
                tdim.CumulVar(routing.Start(v)).SetRange(0, 0)
                tdim.CumulVar(routing.End(v)).SetRange(0, horizon)
        if math.isfinite(inst.distance_limit[i]):
            routing.AddDimension(dist_cb, 0, _down(float(inst.distance_limit[i])), True, "Dist")
        params = pywrapcp.DefaultRoutingSearchParameters()
        params.first_solution_strategy = routing_enums_pb2.FirstSolutionStrategy.PATH_CHEAPEST_ARC
        params.local_search_metaheuristic = (
            routing_enums_pb2.LocalSearchMetaheuristic.GUIDED_LOCAL_SEARCH
        )
        params.time_limit.FromMilliseconds(int(max(seconds - (time.time() - t0), 0.1) * 1000))
        sol = routing.SolveWithParameters(params)
        if sol is None:
            return None
        routes, deps = [], []
        for v in range(nv):
            idx = sol.Value(routing.NextVar(routing.Start(v)))
            r = []
            while not routing.IsEnd(idx):
                r.append(node(idx))
                idx = sol.Value(routing.NextVar(idx))
            if r:
                routes.append(r)
                deps.append(starts[v])
        return routes, deps

    est = int(math.ceil(lin.sum() / Q) + math.ceil(back.sum() / Q)) if Q < 10**9 else 1
    guess = min(N, 2 * est + 4 + (N // 4 if has_tw or math.isfinite(inst.distance_limit[i]) else 0))
    out = attempt(max(1, math.ceil(guess / M)))
    if out is None:
        out = attempt(N)
    routes, deps = out if out is not None else ([], [])
    return {
        "routes": routes,
        "depots": deps,
        "solver_feasible": out is not None,
        "time_s": time.time() - t0,
        "solver": "ortools",
    }


def reference(inst: Instances, i: int, seconds: float, seed: int = 0) -> dict:
    """PyVRP where it expresses the variant, OR-Tools otherwise. Without OR-Tools this fails
    (``NshotError``) rather than measure gaps against a weaker reference: a rerun would read
    URS's gap on those variants as smaller than it is."""
    if supports_pyvrp(inst, i):
        return solve_pyvrp(inst, i, seconds, seed)
    try:
        import ortools.constraint_solver.pywrapcp  # noqa: F401
    except ImportError as err:
        from nshot.errors import NshotError

        raise NshotError(
            f"urs: the reference for {inst.variants[i]} (classic backhauls) is OR-Tools, which is "
            "not installed here; it is one of nshot's dependencies: pip install 'ortools==9.15.*'"
        ) from err
    return solve_ortools(inst, i, seconds)
