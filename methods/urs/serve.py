"""URS's predictor: ``solve`` one routing instance per request item.

A request is an instance in the unified representation as JSON arrays (depots first);
omitted attributes take their neutral values (no capacity: TSP; no windows: ``[0, ∞]``; no
limit; closed routes). Coordinates are rescaled to the unit square for the model (times and
limits by the same factor) and the objective is computed on the request's own units by the
independent checker, which also gives the feasibility report. Malformed instances are
rejected by the model validator with a message that starts with the field (HTTP 422).
"""

from __future__ import annotations

import math
from typing import Any, Literal

import numpy as np
import torch
from pydantic import BaseModel, Field, model_validator

from nshot.method import Predictor
from nshot.serve.schema import StrictRequest
from nshot.train.checkpoint import LoadedCheckpoint

from .checker import check
from .config import URSConfig
from .model import RoutingNet, load_model, solve
from .representation import Instances, generate, variant_name

MAX_NODES = 1000


class URSRequest(StrictRequest):
    locations: list[list[float]] = Field(..., description="[[x, y]] per node, depots first")
    num_depots: int = Field(1, ge=1, le=100, description="the first num_depots nodes are depots")
    linehaul: list[float] | None = Field(None, description="delivery demand per node (depots 0)")
    backhaul: list[float] | None = Field(None, description="pickup demand per node")
    capacity: float | None = Field(None, gt=0, description="vehicle capacity; omit for a TSP")
    time_windows: list[list[float]] | None = Field(None, description="[[e, l]] per node")
    service_times: list[float] | None = Field(None, description="service time per node")
    open_route: bool = Field(False, description="vehicles do not return to the depot")
    distance_limit: float | None = Field(None, gt=0, description="maximum route length")
    backhaul_class: Literal["classic", "mixed"] = Field(
        "classic", description="classic: linehauls before backhauls; mixed: any load-feasible order"
    )
    augment: bool = Field(True, description="8 symmetric augmentations (else 1)")

    @model_validator(mode="after")
    def _check(self) -> URSRequest:
        V = len(self.locations)
        M = self.num_depots
        if V - M < 2:
            raise ValueError(f"locations: needs at least 2 customers, got {max(V - M, 0)}")
        if V > MAX_NODES + M:
            raise ValueError(f"locations: {V - M} customers exceed max_nodes={MAX_NODES}")
        for i, p in enumerate(self.locations):
            if len(p) != 2:
                raise ValueError(f"locations[{i}]: expected [x, y], got {len(p)} values")
            if not all(math.isfinite(v) for v in p):
                raise ValueError(f"locations[{i}]: NaN or infinite coordinate")
        for name in ("linehaul", "backhaul", "service_times", "time_windows"):
            arr = getattr(self, name)
            if arr is None:
                continue
            if len(arr) != V:
                raise ValueError(f"{name}: {len(arr)} values for {V} locations")
            for i, v in enumerate(arr):
                vals = v if isinstance(v, list) else [v]
                if name == "time_windows" and len(vals) != 2:
                    raise ValueError(f"time_windows[{i}]: expected [e, l], got {len(vals)} values")
                if not all(math.isfinite(x) for x in vals):
                    raise ValueError(f"{name}[{i}]: NaN or infinite value")
                if any(x < 0 for x in vals):
                    raise ValueError(f"{name}[{i}]: negative value")
        lin = self.linehaul or [0.0] * V
        back = self.backhaul or [0.0] * V
        for name, arr in (("linehaul", lin), ("backhaul", back)):
            for i in range(M):
                if arr[i] != 0:
                    raise ValueError(f"{name}[{i}]: a depot has no demand")
        if self.capacity is None:
            if any(q > 0 for q in lin) or any(q > 0 for q in back):
                raise ValueError("capacity: required when customers have demands (omit for TSP)")
        else:
            for name, arr in (("linehaul", lin), ("backhaul", back)):
                for i, q in enumerate(arr):
                    if q > self.capacity:
                        raise ValueError(
                            f"{name}[{i}]: demand {q:g} exceeds the capacity {self.capacity:g}"
                        )
        if self.backhaul_class == "classic":
            for i in range(M, V):
                if lin[i] > 0 and back[i] > 0:
                    raise ValueError(
                        f"backhaul[{i}]: node {i} has linehaul and backhaul demand; "
                        "classic backhauls need one or the other (use backhaul_class=mixed)"
                    )
        locs = np.asarray(self.locations, dtype=np.float64)
        d_near = np.sqrt(((locs[M:, None, :] - locs[None, :M, :]) ** 2).sum(-1)).min(-1)
        if self.time_windows is not None:
            svc = self.service_times or [0.0] * V
            for i, (e, lv) in enumerate(self.time_windows):
                if e > lv:
                    raise ValueError(f"time_windows[{i}]: start {e:g} is after end {lv:g}")
            l_dep = min(self.time_windows[k][1] for k in range(M))
            for j in range(M, V):
                e, lv = self.time_windows[j]
                d = float(d_near[j - M])
                if d > lv:
                    raise ValueError(
                        f"time_windows[{j}]: customer {j} cannot be reached in time from the "
                        f"depot (distance {d:.4g} > l={lv:g})"
                    )
                if not self.open_route and max(d, e) + svc[j] + d > l_dep:
                    raise ValueError(
                        f"time_windows[{j}]: a vehicle serving customer {j} cannot be back at "
                        f"the depot by its closing time {l_dep:g}"
                    )
        if self.distance_limit is not None:
            factor = 1.0 if self.open_route else 2.0
            for j in range(M, V):
                d = float(d_near[j - M])
                if factor * d > self.distance_limit:
                    raise ValueError(
                        f"distance_limit: customer {j} is {d:.4g} from the depot; "
                        f"{'an open' if self.open_route else 'a closed'} route needs a limit of "
                        f"at least {factor * d:.4g}"
                    )
        return self

    def to_instances(self) -> Instances:
        V, M = len(self.locations), self.num_depots
        tw = np.zeros((1, V, 2))
        tw[..., 1] = np.inf
        if self.time_windows is not None:
            tw[0] = np.asarray(self.time_windows, np.float64)
        inst = Instances(
            locs=np.asarray(self.locations, np.float64)[None],
            linehaul=np.asarray(self.linehaul or [0.0] * V, np.float64)[None],
            backhaul=np.asarray(self.backhaul or [0.0] * V, np.float64)[None],
            capacity=np.asarray([np.inf if self.capacity is None else self.capacity]),
            tw=tw,
            service=np.asarray(self.service_times or [0.0] * V, np.float64)[None],
            open_route=np.asarray([self.open_route]),
            distance_limit=np.asarray(
                [np.inf if self.distance_limit is None else self.distance_limit]
            ),
            backhaul_class=np.asarray([1 if self.backhaul_class == "classic" else 2]),
            num_depots=M,
        )
        inst.variants = [variant_name(inst, 0)]
        return inst


class URSResponse(BaseModel):
    routes: list[list[int]] = Field(..., description="customer indices per route")
    depots: list[int] = Field(..., description="the start/end depot of each route")
    objective: float = Field(..., description="total distance (open routes: no return arcs)")
    feasible: bool
    violations: list[str] = Field(..., description="the independent checker's report")
    variant: str


def request_body(row: dict[str, Any]) -> dict[str, Any]:
    """The JSON body of ``/urs/predict`` for one instance row (``Instances.to_rows()``)."""
    body: dict[str, Any] = {
        "locations": row["locs"],
        "num_depots": row["num_depots"],
        "linehaul": row["linehaul"],
        "backhaul": row["backhaul"],
        "capacity": row["capacity"],
        "open_route": row["open_route"],
        "distance_limit": row["distance_limit"],
        "backhaul_class": "classic" if row["backhaul_class"] == 1 else "mixed",
    }
    if any(lv is not None for _, lv in row["tw"]):
        body["time_windows"] = row["tw"]
        body["service_times"] = row["service"]
    if not any(body["linehaul"]) and not any(body["backhaul"]):
        body["capacity"] = None  # a TSP
    return {k: v for k, v in body.items() if v is not None}


def to_unit_square(inst: Instances) -> Instances:
    """The same instance with coordinates in [0, 1]² (times and limits scaled alike)."""
    lo = inst.locs.min(axis=1, keepdims=True)
    span = float((inst.locs.max(axis=1, keepdims=True) - lo).max()) or 1.0
    return Instances(
        locs=(inst.locs - lo) / span,
        linehaul=inst.linehaul,
        backhaul=inst.backhaul,
        capacity=inst.capacity,
        tw=inst.tw / span,
        service=inst.service / span,
        open_route=inst.open_route,
        distance_limit=inst.distance_limit / span,
        backhaul_class=inst.backhaul_class,
        num_depots=inst.num_depots,
        variants=list(inst.variants),
    )


class URSPredictor(Predictor[URSRequest, URSResponse]):
    Request = URSRequest
    Response = URSResponse

    def __init__(self, net: RoutingNet, cfg: URSConfig) -> None:
        self.net = net.eval()
        self.cfg = cfg

    @classmethod
    def from_checkpoint(cls, checkpoint: LoadedCheckpoint) -> URSPredictor:
        net, cfg = load_model(checkpoint)
        return cls(net, cfg)

    def metadata(self) -> dict[str, Any]:
        return {
            "seen_variants": self.cfg.seen_variants,
            "max_nodes": MAX_NODES,
            "pomo_starts": self.cfg.eval_starts,
            "arch": self.cfg.arch,
            "mbm": self.cfg.mbm,
            "generator": self.cfg.generator,
        }

    def example_request(self) -> dict[str, Any]:
        """Ten customers of the first variant this checkpoint was trained on (a fixed seed)."""
        inst = generate(self.cfg.seen_variants[0], 10, 1, seed=2026)
        return request_body(inst.to_rows()[0])

    def __call__(self, request: URSRequest) -> URSResponse:
        return self.batch([request])[0]

    def batch(self, requests: list[URSRequest]) -> list[URSResponse]:
        """Requests with the same node and depot counts and augmentation decode together."""
        torch.set_num_threads(max(1, torch.get_num_threads()))
        groups: dict[tuple, list[int]] = {}
        insts = [r.to_instances() for r in requests]
        for i, (r, inst) in enumerate(zip(requests, insts)):
            groups.setdefault((inst.locs.shape[1], inst.num_depots, r.augment), []).append(i)
        out: list[URSResponse | None] = [None] * len(requests)
        for (_, _, augment), idx in groups.items():
            batch = Instances.concat([to_unit_square(insts[i]) for i in idx])
            sols = solve(self.net, batch, self.cfg.eval_starts, 8 if augment else 1)
            for j, i in enumerate(idx):
                rep = check(insts[i], sols[j]["routes"], sols[j]["depots"], 0)
                out[i] = URSResponse(
                    routes=sols[j]["routes"],
                    depots=sols[j]["depots"],
                    objective=rep.cost,
                    feasible=rep.feasible,
                    violations=rep.violations,
                    variant=insts[i].variants[0],
                )
        return out  # type: ignore[return-value]
