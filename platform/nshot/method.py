"""The Method contract and the method registry.

Every paper is one :class:`Method` subclass living in ``methods/<name>/`` (imported as
``nshot.methods.<name>``). The platform only talks to methods through this contract:

* ``Config``: a :class:`MethodConfig` subclass (pydantic) with named presets
  ``smoke`` / ``small`` / ``paper``.
* ``data(cfg)``: the data splits as Arrow tables.
* ``train_loop(cfg)``: the per-worker function Ray Train runs; every built-in method's is
  ``nshot.train.trainer.train(<its Recipe>(cfg))``, the one training loop.
* ``evaluate(checkpoint, cfg)``: the paper's metrics as a flat ``dict[str, float]``.
* ``predictor(checkpoint)``: a :class:`Predictor` with typed Request/Response schemas.
* ``experiments(cfg, workdir)``: the paper's comparison as a :class:`ResultsTable`.
* ``claims``: the paper's claims (:class:`nshot.claims.Claim`) over that table's rows.
* ``model_budget(cfg)`` (optional): the size of the model a config builds, checked against
  the limits of :mod:`nshot.train.limits` before a checkpoint's model is built.

Methods are found through the ``nshot.methods`` entry-point group (so a third-party package
can add one) and, for a source checkout that was not installed, by scanning the built-in
``nshot.methods`` package.
"""

from __future__ import annotations

import importlib
import importlib.metadata
import importlib.util
import pkgutil
from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar, Generic, Literal, Protocol, Self, TypeVar

from pydantic import BaseModel, ConfigDict, Field, ValidationError

# the error classes live in nshot.errors; methods may keep importing them from here
from nshot.errors import ConfigError as ConfigError
from nshot.errors import NshotError as NshotError
from nshot.errors import UnknownMethodError as UnknownMethodError

if TYPE_CHECKING:
    import pyarrow as pa

    from nshot.claims import Claim
    from nshot.conformal import OneShotEpisode
    from nshot.train.limits import ModelBudget
    from nshot.tune.space import TuneSpec


class LoadedCheckpoint(Protocol):
    """What the contract reads of a verified checkpoint
    (:class:`nshot.train.checkpoint.LoadedCheckpoint` is the one nshot builds); declared here so
    that the contract does not depend on the checkpoint module, which looks methods up."""

    path: Path
    method: str
    method_version: str
    config: dict[str, Any]
    step: int
    metrics: dict[str, float]
    extra: dict[str, Any]

    def weights(self) -> dict[str, Any]: ...

    def optimizer_state(self) -> dict[str, Any] | None: ...


ENTRY_POINT_GROUP = "nshot.methods"
PRESETS = ("smoke", "small", "paper")


def _format_validation_error(model: str, err: ValidationError) -> str:
    lines = []
    for e in err.errors():
        loc = ".".join(str(p) for p in e["loc"])
        msg = e["msg"].removeprefix("Value error, ")
        if e["type"] == "extra_forbidden":
            msg = "unknown field"
        # model-level validators name the field in their own message
        lines.append(f"{model}: field '{loc}': {msg}" if loc else f"{model}: {msg}")
    return "; ".join(lines)


class MethodConfig(BaseModel):
    """Base class of every method's config.

    Unknown fields and out-of-range values fail with a :class:`ConfigError` naming the field.
    Subclasses declare ``PRESETS``: a mapping from preset name to field overrides.
    """

    model_config = ConfigDict(extra="forbid", validate_assignment=True, frozen=False)

    PRESETS: ClassVar[dict[str, dict[str, Any]]] = {}
    # the fields `nshot tune` sweeps by default, with the objective and curve metrics
    # (nshot.tune.TuneSpec); None: the method declares no search space (pass --space)
    TUNE: ClassVar[TuneSpec | None] = None
    # Fields an evaluation may override (``nshot eval --set``); every other field is fixed by
    # the checkpoint, since it shapes the model's weights. Subclasses add their evaluation
    # knobs by union: ``EVAL_FIELDS = MethodConfig.EVAL_FIELDS | {"eval_episodes"}``.
    EVAL_FIELDS: ClassVar[frozenset[str]] = frozenset({"seed", "torch_threads", "log_every"})

    preset: str = Field("small", description="the preset these values started from")
    seed: int = Field(0, ge=0, description="base random seed; each worker derives its own")
    steps: int = Field(100, ge=1, description="optimizer steps")
    log_every: int = Field(10, ge=1, description="report metrics every N steps")
    checkpoint_every: int = Field(50, ge=1, description="checkpoint every N steps")
    torch_threads: int = Field(1, ge=1, le=256, description="torch threads per worker")
    fail_at_step: int | None = Field(
        None,
        ge=1,
        description="fault injection for tests: worker of rank `fail_rank` dies at this step "
        "on the first attempt (never after a resume)",
    )
    fail_rank: int = Field(0, ge=0, description="rank that dies when fail_at_step is set")
    precision: Literal["fp32", "bf16", "fp16"] = Field(
        "fp32",
        description="autocast dtype of the forward pass on a CUDA worker (nshot.train.trainer); "
        "a CPU worker always trains in fp32",
    )
    grad_accum: int = Field(
        1, ge=1, le=1024, description="micro-batches accumulated per optimizer step"
    )

    @classmethod
    def from_preset(cls, preset: str = "small", **overrides: Any) -> Self:
        """Build the config of a named preset, with field overrides applied and validated."""
        if preset not in cls.PRESETS:
            raise ConfigError(
                f"{cls.__name__}: field 'preset': unknown preset {preset!r}; "
                f"choose one of {sorted(cls.PRESETS)}"
            )
        values = {**cls.PRESETS[preset], **overrides, "preset": preset}
        return cls.validated(values)

    @classmethod
    def validated(cls, values: dict[str, Any]) -> Self:
        try:
            return cls.model_validate(values)
        except ValidationError as err:
            raise ConfigError(_format_validation_error(cls.__name__, err)) from None

    def replace(self, **overrides: Any) -> Self:
        """A copy with overrides, validated like a fresh config."""
        return self.validated({**self.model_dump(), **overrides})


def parse_overrides(pairs: Sequence[str]) -> dict[str, Any]:
    """Parse ``key=value`` strings from the command line; values are read as JSON when they can be."""
    import json

    out: dict[str, Any] = {}
    for pair in pairs:
        if "=" not in pair:
            raise ConfigError(f"override {pair!r}: expected key=value")
        key, raw = pair.split("=", 1)
        try:
            out[key.strip()] = json.loads(raw)
        except json.JSONDecodeError:
            out[key.strip()] = raw
    return out


RequestT = TypeVar("RequestT", bound=BaseModel)
ResponseT = TypeVar("ResponseT", bound=BaseModel)


class Predictor(ABC, Generic[RequestT, ResponseT]):
    """What the Serve app wraps: typed request in, typed response out."""

    Request: ClassVar[type[BaseModel]]
    Response: ClassVar[type[BaseModel]]

    @abstractmethod
    def __call__(self, request: RequestT) -> ResponseT: ...

    def batch(self, requests: list[RequestT]) -> list[ResponseT]:
        """Batched form; methods override it where batching pays."""
        return [self(r) for r in requests]

    def metadata(self) -> dict[str, Any]:
        return {}

    def example_request(self) -> dict[str, Any] | None:
        """A JSON body this predictor answers, as a user would send it to ``/predict``: the
        example of the docs and of the conformance test. None: the method publishes none."""
        return None

    def one_shot_embeddings(self, request: RequestT, kind: str | None = None) -> OneShotEpisode:
        """Frozen per-row features of a few-shot classification request, for prediction sets
        around the classifier (``nshot serve --conformal caos``; see
        :mod:`nshot.serve.conformal`). Only few-shot classifiers implement it."""
        raise NotImplementedError(f"{type(self).__name__} gives no one-shot embeddings")

    @classmethod
    def has_one_shot_embeddings(cls) -> bool:
        return cls.one_shot_embeddings is not Predictor.one_shot_embeddings


@dataclass
class ResultsTable:
    """The paper's comparison: rows are the method and its baselines, columns its metrics.

    ``rows[system][metric]`` is the mean over seeds (``None`` where a system cannot be
    evaluated, e.g. a fixed-slot model asked for more classes than it has slots);
    ``stds[system][metric]`` the standard deviation over seeds (or over episodes when
    there is one seed, documented by the method).
    """

    method: str
    preset: str
    seeds: int
    metrics: dict[str, bool]  # name -> higher_is_better
    rows: dict[str, dict[str, float | None]]
    stds: dict[str, dict[str, float | None]] = field(default_factory=dict)
    runtime_s: float = 0.0
    notes: list[str] = field(default_factory=list)
    extra: dict[str, Any] = field(default_factory=dict)
    # per-seed (or per-episode) values behind a mean, for the claims' paired tests:
    # samples[system][metric] = [v_seed0, v_seed1, ...], paired by position across systems
    samples: dict[str, dict[str, list[float | None]]] = field(default_factory=dict)
    # which of the method's experiments this is, when it has more than its main comparison
    # (``None``: the main one); claims scoped to an experiment (``Claim.experiment``) read only
    # its results, the others only the main comparison's
    experiment: str | None = None

    def to_json(self) -> dict[str, Any]:
        rows: dict[str, dict[str, float | None]] = {}
        for system, vals in self.rows.items():
            out: dict[str, float | None] = {}
            for m in self.metrics:
                out[m] = _clean(vals.get(m))
                out[f"{m}_std"] = _clean(self.stds.get(system, {}).get(m))
            rows[system] = out
        return {
            "method": self.method,
            "preset": self.preset,
            "seeds": self.seeds,
            "metrics": {m: {"higher_is_better": hib} for m, hib in self.metrics.items()},
            "rows": rows,
            "runtime_s": float(self.runtime_s),
            "notes": list(self.notes),
            "extra": self.extra,
            **({"experiment": self.experiment} if self.experiment else {}),
            **(
                {
                    "samples": {
                        system: {m: [_clean(v) for v in vals] for m, vals in per.items()}
                        for system, per in self.samples.items()
                    }
                }
                if self.samples
                else {}
            ),
        }


def _clean(v: Any) -> float | None:
    import math

    if v is None:
        return None
    v = float(v)
    return None if math.isnan(v) or math.isinf(v) else v


class Method(ABC):
    """One paper. Subclasses set the class attributes and implement the five functions."""

    name: ClassVar[str]
    paper: ClassVar[str]
    area: ClassVar[str]
    # where the paper can be read (an https URL: its arXiv page, else the authors' code); the
    # method table and the report link the title to it. None: not linked
    paper_url: ClassVar[str | None] = None
    version: ClassVar[str] = "1"
    Config: ClassVar[type[MethodConfig]]
    # the paper's claims as data (nshot.claims.Claim), evaluated over the results of
    # ``experiments()`` by ``nshot reproduce`` and ``nshot claims``; a claim that fails stays
    claims: ClassVar[tuple[Claim, ...]] = ()
    # distributions (PyPI names) beyond the platform's own whose versions can change this
    # method's results, e.g. a reference solver; `nshot reproduce` records their versions in
    # results.json (``run.versions``, next to torch, numpy, ray, ...) and warns when they differ
    # from the versions of the committed results
    packages: ClassVar[tuple[str, ...]] = ()

    def config(self, preset: str = "small", **overrides: Any) -> MethodConfig:
        return self.Config.from_preset(preset, **overrides)

    def config_from_dict(self, values: dict[str, Any]) -> MethodConfig:
        return self.Config.validated(values)

    @abstractmethod
    def data(self, cfg: MethodConfig) -> dict[str, pa.Table]: ...

    @abstractmethod
    def train_loop(self, cfg: MethodConfig) -> None:
        """What each Ray Train worker runs (in-process with ``--workers 0``): hand the
        method's :class:`nshot.train.trainer.Recipe` to :func:`nshot.train.trainer.train`,
        which owns the device, resume, checkpoints, faults, metrics and progress."""

    @abstractmethod
    def evaluate(self, checkpoint: LoadedCheckpoint, cfg: MethodConfig) -> dict[str, float]: ...

    @abstractmethod
    def predictor(self, checkpoint: LoadedCheckpoint) -> Predictor: ...

    @abstractmethod
    def experiments(self, cfg: MethodConfig, workdir: Path) -> ResultsTable:
        """Run the paper's comparison; runs and artifacts go under ``workdir``."""

    def model_budget(
        self, cfg: MethodConfig, extra: dict[str, Any] | None = None
    ) -> ModelBudget | None:
        """What the model built from ``cfg`` costs, estimated without building it.

        ``extra``: the checkpoint's ``extra`` state, for methods that rebuild their model from a
        shape recorded there (``None`` when there is no checkpoint: then ``cfg`` alone).
        :func:`nshot.train.checkpoint.load_checkpoint` calls this before a model is built from
        a checkpoint and refuses a checkpoint whose estimate exceeds the limits of
        :mod:`nshot.train.limits` (parameters, and activations of one predictor call at the
        method's request caps), or whose ``model.safetensors`` does not hold the weights of
        that model (``ModelBudget.weights_numel``). A shape it cannot accept is a
        ``ValueError``. The default, ``None``, means the model's size does not follow the
        config (a fixed pretrained model, a bank of features, a closed-form estimator).
        """
        return None

    def quick_evaluation(self, checkpoint: LoadedCheckpoint, cfg: MethodConfig) -> ResultsTable:
        """A short comparison for ``nshot quickstart`` (seconds to a minute on a laptop): the
        trained checkpoint against the paper's baseline on a few hundred held-out cases. The
        default is one row of :meth:`evaluate`'s metrics."""
        metrics = self.evaluate(checkpoint, cfg)
        return ResultsTable(
            method=self.name,
            preset=cfg.preset,
            seeds=1,
            metrics=dict.fromkeys(metrics, True),
            rows={self.name: dict(metrics)},
        )

    def benchmark(self, *, preset: str = "small", out: str | None = None) -> dict[str, Any] | None:
        """The method's own speed or memory benchmark for ``nshot bench <method>``: ratios
        measured in one run, returned (and written to ``out`` as JSON). None: it has none."""
        return None

    def describe(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "paper": self.paper,
            "area": self.area,
            "version": self.version,
            "presets": sorted(self.Config.PRESETS),
        }


# --------------------------------------------------------------------------- registry

_REGISTRY: dict[str, type[Method]] = {}
_DISCOVERED = False
# methods whose import failed on a module of an extra (nshot.extras), by name: the extra and
# the missing modules; available() lists them and get() raises nshot.extras.MethodExtraError
_UNAVAILABLE: dict[str, tuple[str, list[str]]] = {}


def register(cls: type[Method]) -> type[Method]:
    """Class decorator: register a method under ``cls.name``."""
    if not getattr(cls, "name", None):
        raise TypeError(f"{cls.__qualname__} has no `name`")
    existing = _REGISTRY.get(cls.name)
    if existing is not None and existing is not cls and existing.__qualname__ != cls.__qualname__:
        raise ValueError(f"method name {cls.name!r} is already registered by {existing}")
    _REGISTRY[cls.name] = cls
    return cls


def _load(name: str, load: Any) -> Any:
    """``load()``, the import of method ``name``. When it fails on a module of an extra (see
    :mod:`nshot.extras`), the method is recorded as unavailable and None returned; any other
    failure is raised as it is."""
    try:
        obj = load()
    except ImportError as err:
        from nshot.extras import import_error

        missing = import_error(name, err)
        if missing is None:
            raise
        _UNAVAILABLE[name] = (missing.extra, missing.missing)
        return None
    _UNAVAILABLE.pop(name, None)
    return obj


def _discover() -> None:
    global _DISCOVERED
    if _DISCOVERED:
        return
    _DISCOVERED = True
    # Built-in methods (works from a source tree too).
    import nshot.methods as builtin

    for info in pkgutil.iter_modules(builtin.__path__):
        if info.ispkg:
            module = f"nshot.methods.{info.name}"
            _load(info.name, lambda module=module: importlib.import_module(module))
    # Third-party methods.
    for ep in importlib.metadata.entry_points(group=ENTRY_POINT_GROUP):
        if ep.name in _REGISTRY or ep.name in _UNAVAILABLE:
            continue
        obj = _load(ep.name, ep.load)
        if isinstance(obj, type) and issubclass(obj, Method):
            register(obj)


def available() -> list[str]:
    """Every registered method's name, those whose extra is missing included (:func:`get`
    refuses them; :func:`describe` says which extra each needs)."""
    _discover()
    return sorted({*_REGISTRY, *_UNAVAILABLE})


def _import_builtin(name: str) -> None:
    """Import the built-in method ``name`` alone, if there is one (importing a method package
    registers it). Every process that looks up one method — a Ray Train worker, a Tune trial, a
    Serve replica, a CLI command — then pays for that method's imports only, not for every
    method's (about 4 s of CPU per process on a 2-core machine)."""
    if not name.isidentifier():
        return
    try:
        spec = importlib.util.find_spec(f"nshot.methods.{name}")
    except (ImportError, ValueError):
        spec = None
    if spec is not None:
        _load(name, lambda: importlib.import_module(f"nshot.methods.{name}"))


def method_class(name: str) -> type[Method] | None:
    """The class registered as ``name``, whether or not its extra is installed (None: its
    import failed on a module of a missing extra). Raises :class:`UnknownMethodError` for a
    name no method has. For listings; :func:`get` is the lookup that runs a method."""
    if name not in _REGISTRY:
        _import_builtin(name)
    if name not in _REGISTRY and name not in _UNAVAILABLE:
        _discover()
    if name in _REGISTRY:
        return _REGISTRY[name]
    if name in _UNAVAILABLE:
        return None
    raise UnknownMethodError(
        f"unknown method {name!r}; available: {', '.join(available()) or 'none'}"
    )


def describe(name: str) -> dict[str, Any]:
    """:meth:`Method.describe` of method ``name`` whether or not its extra is installed, with
    ``extra`` (the extra it needs, None for the core) and ``missing`` (the modules of that
    extra not installed here; empty: the method runs here). A method whose import failed is
    titled by its name."""
    from nshot import extras

    cls = method_class(name)
    if cls is None:
        extra, missing = _UNAVAILABLE[name]
        info: dict[str, Any] = {
            "name": name, "paper": name, "area": "—", "version": None, "presets": []
        }  # fmt: skip
        return {**info, "extra": extra, "missing": list(missing)}
    need = extras.needs(name)
    return {
        **cls().describe(),
        "extra": need.extra if need else None,
        "missing": extras.missing(name),
    }


def get(name: str) -> Method:
    """The method registered as ``name`` (an instance). A built-in method is imported alone;
    any other name discovers every method (third-party ones through entry points).

    Raises :class:`UnknownMethodError` for a name no method has, and
    :class:`nshot.extras.MethodExtraError` (one line naming the extra to install) for a method
    whose extra is not installed here."""
    from nshot.extras import MethodExtraError, check

    cls = method_class(name)
    if cls is None:
        extra, missing = _UNAVAILABLE[name]
        raise MethodExtraError(name, extra, missing)
    check(name)
    return cls()
