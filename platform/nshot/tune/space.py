"""Search spaces: what a method declares next to its config, and what searchers see.

A method declares its sweepable knobs as a :class:`TuneSpec` on its config class::

    class TailConfig(MethodConfig):
        TUNE: ClassVar[TuneSpec] = TuneSpec(
            space={"lr": Float(1e-4, 3e-3, log=True), "depth": Int(1, 4), ...},
            metric="val_acc", mode="max", curve=("val_acc", "loss"),
        )

:class:`SearchSpace` turns those declarations into Ray Tune domains (``tune.loguniform``,
``tune.randint``, ``tune.choice``), reads Tune domains back (so a searcher built by Tune from a
user's ``param_space`` sees the same thing), and encodes configs to the unit cube
``[0, 1]^D`` that model-based searchers work in: log domains on a log scale, integers rounded on
decoding, categoricals one-hot (decoded by argmax).

Every check fails with a :class:`SearchSpaceError` naming the parameter.
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from pydantic import BaseModel

from nshot.errors import ConfigError


class SearchSpaceError(ConfigError):
    """A search space is invalid; the message names the parameter."""


@dataclass(frozen=True)
class Float:
    """A real-valued parameter in ``[low, high]`` (log scale when ``log``)."""

    low: float
    high: float
    log: bool = False

    @property
    def width(self) -> int:
        return 1


@dataclass(frozen=True)
class Int:
    """An integer parameter in ``[low, high]`` (both included; log scale when ``log``)."""

    low: int
    high: int
    log: bool = False

    @property
    def width(self) -> int:
        return 1


@dataclass(frozen=True)
class Choice:
    """A categorical parameter (one-hot in the unit cube)."""

    values: tuple[Any, ...]

    def __init__(self, values: Any) -> None:  # accept lists
        object.__setattr__(self, "values", tuple(values))

    @property
    def width(self) -> int:
        return len(self.values)


Param = Float | Int | Choice


def _check_param(name: str, p: Any) -> None:
    if isinstance(p, Choice):
        if len(p.values) < 2:
            raise SearchSpaceError(f"search space: parameter '{name}': a choice needs >= 2 values")
        if len({json.dumps(v, sort_keys=True) for v in p.values}) != len(p.values):
            raise SearchSpaceError(f"search space: parameter '{name}': repeated choice values")
        for v in p.values:
            try:
                json.dumps(v)
            except TypeError:
                raise SearchSpaceError(
                    f"search space: parameter '{name}': choice value {v!r} is not JSON-serialisable"
                ) from None
        return
    if not isinstance(p, Float | Int):
        raise SearchSpaceError(
            f"search space: parameter '{name}': expected Float, Int or Choice, got {type(p).__name__}"
        )
    if isinstance(p, Int) and not (float(p.low).is_integer() and float(p.high).is_integer()):
        raise SearchSpaceError(f"search space: parameter '{name}': integer bounds must be integers")
    for bound in (p.low, p.high):
        if not math.isfinite(float(bound)):
            raise SearchSpaceError(f"search space: parameter '{name}': bounds must be finite")
    if not p.low < p.high:
        raise SearchSpaceError(
            f"search space: parameter '{name}': low ({p.low}) must be below high ({p.high})"
        )
    if p.log and p.low <= 0:
        raise SearchSpaceError(
            f"search space: parameter '{name}': a log scale needs low > 0 (got {p.low})"
        )


class SearchSpace:
    """An ordered mapping ``name -> Float | Int | Choice`` with unit-cube encoding."""

    def __init__(self, params: Mapping[str, Param], fixed: Mapping[str, Any] | None = None):
        if not params:
            raise SearchSpaceError("search space: no parameters to search")
        self.params: dict[str, Param] = dict(params)
        self.fixed: dict[str, Any] = dict(fixed or {})
        for name, p in self.params.items():
            if not isinstance(name, str) or not name:
                raise SearchSpaceError(f"search space: parameter name {name!r} must be a string")
            _check_param(name, p)
        clash = set(self.params) & set(self.fixed)
        if clash:
            raise SearchSpaceError(f"search space: {sorted(clash)} are both searched and fixed")

    # ------------------------------------------------------------------ basics
    @property
    def dim(self) -> int:
        """Width of the unit-cube encoding."""
        return sum(p.width for p in self.params.values())

    def __repr__(self) -> str:
        return f"SearchSpace({self.params!r})"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, SearchSpace) and self.to_json() == other.to_json()

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for name, p in self.params.items():
            if isinstance(p, Choice):
                out[name] = {"type": "choice", "values": list(p.values)}
            else:
                kind = "float" if isinstance(p, Float) else "int"
                out[name] = {"type": kind, "low": p.low, "high": p.high, "log": p.log}
        return out

    @classmethod
    def from_json(cls, data: Mapping[str, Any] | str) -> SearchSpace:
        """Parse ``{"lr": {"type": "float", "low": 1e-4, "high": 1e-2, "log": true}, ...}``."""
        if isinstance(data, str):
            try:
                data = json.loads(data)
            except json.JSONDecodeError as err:
                raise SearchSpaceError(f"search space: not valid JSON ({err})") from None
        if not isinstance(data, Mapping):
            raise SearchSpaceError("search space: expected a JSON object of parameters")
        params: dict[str, Param] = {}
        for name, spec in data.items():
            if not isinstance(spec, Mapping) or "type" not in spec:
                raise SearchSpaceError(
                    f"search space: parameter '{name}': expected an object with a 'type' "
                    "(float, int or choice)"
                )
            kind = spec["type"]
            extra = set(spec) - {"type", "low", "high", "log", "values"}
            if extra:
                raise SearchSpaceError(
                    f"search space: parameter '{name}': unknown keys {sorted(extra)}"
                )
            try:
                if kind == "choice":
                    params[name] = Choice(spec["values"])
                elif kind in ("float", "int"):
                    typ = Float if kind == "float" else Int
                    low, high = spec["low"], spec["high"]
                    if kind == "int" and not (float(low).is_integer() and float(high).is_integer()):
                        raise SearchSpaceError(
                            f"search space: parameter '{name}': integer bounds must be integers"
                        )
                    cast = float if kind == "float" else int
                    params[name] = typ(cast(low), cast(high), bool(spec.get("log", False)))
                else:
                    raise SearchSpaceError(
                        f"search space: parameter '{name}': unknown type {kind!r} "
                        "(use float, int or choice)"
                    )
            except KeyError as err:
                raise SearchSpaceError(
                    f"search space: parameter '{name}': missing key {err.args[0]!r}"
                ) from None
            except (TypeError, ValueError) as err:
                if isinstance(err, SearchSpaceError):
                    raise
                raise SearchSpaceError(f"search space: parameter '{name}': {err}") from None
        return cls(params)

    def schema_hash(self) -> str:
        """Identity of the space (names, types, bounds): history tasks match on it."""
        blob = json.dumps(self.to_json(), sort_keys=True).encode()
        return hashlib.sha256(blob).hexdigest()[:16]

    # ------------------------------------------------------------------ validation
    def validate_for(self, config_cls: type[BaseModel], base: Mapping[str, Any]) -> None:
        """Every parameter must be a field of ``config_cls`` and every value it can take (both
        bounds, every choice) must give a valid config on top of ``base``."""
        fields = config_cls.model_fields
        for name, p in self.params.items():
            if name not in fields:
                raise SearchSpaceError(
                    f"search space: parameter '{name}' is not a field of {config_cls.__name__}"
                )
            values = list(p.values) if isinstance(p, Choice) else [p.low, p.high]
            for v in values:
                try:
                    config_cls.validated({**base, name: v})
                except ConfigError as err:
                    raise SearchSpaceError(
                        f"search space: parameter '{name}': value {v!r} is not a valid "
                        f"config ({err})"
                    ) from None

    # ------------------------------------------------------------------ Ray Tune
    def to_tune(self) -> dict[str, Any]:
        """Ray Tune ``param_space`` (fixed values pass through unchanged)."""
        from ray import tune

        out: dict[str, Any] = dict(self.fixed)
        for name, p in self.params.items():
            if isinstance(p, Choice):
                out[name] = tune.choice(list(p.values))
            elif isinstance(p, Float):
                out[name] = (tune.loguniform if p.log else tune.uniform)(p.low, p.high)
            else:  # Tune's integer domains exclude the upper bound
                out[name] = (tune.lograndint if p.log else tune.randint)(p.low, p.high + 1)
        return out

    @classmethod
    def from_tune(cls, param_space: Mapping[str, Any]) -> SearchSpace:
        """Read a flat Tune ``param_space``; constants become :attr:`fixed`."""
        from ray.tune.search.sample import Categorical, Domain, Integer, LogUniform, Quantized
        from ray.tune.search.sample import Float as TFloat

        params: dict[str, Param] = {}
        fixed: dict[str, Any] = {}
        for name, dom in param_space.items():
            if isinstance(dom, Mapping):
                raise SearchSpaceError(
                    f"search space: parameter '{name}': nested spaces are not supported; "
                    "flatten them into top-level config fields"
                )
            if not isinstance(dom, Domain):
                fixed[name] = dom
                continue
            sampler = dom.get_sampler()
            if isinstance(sampler, Quantized):
                raise SearchSpaceError(
                    f"search space: parameter '{name}': quantized domains are not supported; "
                    "use an integer or a choice"
                )
            log = isinstance(sampler, LogUniform)
            if isinstance(dom, Categorical):
                params[name] = Choice(dom.categories)
            elif isinstance(dom, TFloat):
                params[name] = Float(float(dom.lower), float(dom.upper), log)
            elif isinstance(dom, Integer):
                params[name] = Int(int(dom.lower), int(dom.upper) - 1, log)
            else:
                raise SearchSpaceError(
                    f"search space: parameter '{name}': unsupported Tune domain "
                    f"{type(dom).__name__} (functions and grid searches cannot be encoded)"
                )
        return cls(params, fixed)

    # ------------------------------------------------------------------ unit cube
    def encode(self, config: Mapping[str, Any]) -> np.ndarray:
        """``config`` (values of every parameter) → a point of ``[0, 1]^dim``."""
        out: list[float] = []
        for name, p in self.params.items():
            if name not in config:
                raise SearchSpaceError(f"config has no value for search parameter '{name}'")
            v = config[name]
            if isinstance(p, Choice):
                key = json.dumps(v, sort_keys=True)
                keys = [json.dumps(c, sort_keys=True) for c in p.values]
                if key not in keys:
                    raise SearchSpaceError(
                        f"parameter '{name}': {v!r} is not one of {list(p.values)}"
                    )
                out.extend(1.0 if k == key else 0.0 for k in keys)
                continue
            v = float(v)
            lo, hi = float(p.low), float(p.high)
            if p.log:
                if v <= 0:
                    raise SearchSpaceError(f"parameter '{name}': {v} is not > 0 (log scale)")
                u = (math.log(v) - math.log(lo)) / (math.log(hi) - math.log(lo))
            else:
                u = (v - lo) / (hi - lo)
            out.append(min(max(u, 0.0), 1.0))
        return np.asarray(out, dtype=np.float64)

    def decode(self, x: Any) -> dict[str, Any]:
        """A point of ``[0, 1]^dim`` (clipped) → a config (with the fixed values)."""
        x = np.clip(np.asarray(x, dtype=np.float64).reshape(-1), 0.0, 1.0)
        if x.shape[0] != self.dim:
            raise SearchSpaceError(f"point has {x.shape[0]} coordinates; the space has {self.dim}")
        out: dict[str, Any] = dict(self.fixed)
        i = 0
        for name, p in self.params.items():
            if isinstance(p, Choice):
                out[name] = p.values[int(np.argmax(x[i : i + p.width]))]
                i += p.width
                continue
            u = float(x[i])
            i += 1
            lo, hi = float(p.low), float(p.high)
            v = (
                math.exp(math.log(lo) + u * (math.log(hi) - math.log(lo)))
                if p.log
                else lo + u * (hi - lo)
            )
            if isinstance(p, Int):
                v = int(min(max(round(v), p.low), p.high))
            else:
                v = min(max(v, lo), hi)
            out[name] = v
        return out

    def canonical(self, config: Mapping[str, Any]) -> dict[str, Any]:
        """The config a unit-cube round trip gives (integers rounded): used to spot repeats."""
        return self.decode(self.encode(config))

    def sample(self, rng: np.random.Generator, n: int = 1) -> list[dict[str, Any]]:
        """``n`` uniform configs (uniform in the encoded cube; one-hot blocks uniform)."""
        out = []
        for _ in range(n):
            x = rng.random(self.dim)
            out.append(self.decode(x))
        return out


@dataclass(frozen=True)
class TuneSpec:
    """What a method declares for sweeps: the space, the objective and the curve.

    ``metric``: the train-loop metric Tune optimises (reported as ``f``; its last value is the
    trial's objective). ``curve``: the metrics stacked per report into the auxiliary vector
    ``h`` (a ``[reports, len(curve)]`` learning curve); defaults to ``(metric,)``.
    """

    space: dict[str, Param]
    metric: str
    mode: str = "max"
    curve: tuple[str, ...] = field(default_factory=tuple)

    def __post_init__(self) -> None:
        if self.mode not in ("max", "min"):
            raise SearchSpaceError(f"TuneSpec: mode must be 'max' or 'min', got {self.mode!r}")
        if not self.curve:
            object.__setattr__(self, "curve", (self.metric,))

    def search_space(self) -> SearchSpace:
        return SearchSpace(self.space)
