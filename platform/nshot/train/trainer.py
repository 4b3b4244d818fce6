"""nshot's training loop, written once for every method.

A method describes its training as a :class:`Recipe`: what is its own (the model, optimisers and
data built from the config; the loss of one step, or the whole step when its update is not one
optimiser step; hooks at report time). :func:`train` runs it, and owns what every loop repeats:

* the worker's device (the recipe reads :attr:`Recipe.device`, it never names one), DDP
  wrapping when the worker group has more than one worker (:attr:`Recipe.forward`);
* restore and resume from the run's newest checkpoint, checkpoint cadence
  (``checkpoint_every`` and the last step), fault injection (``fail_at_step``/``fail_rank``);
* windowed metrics (the mean of each step's numbers since the last report, every ``log_every``
  steps and at each checkpoint), progress lines and throughput (``samples_per_s``), and
  ``ray.train.report`` with an nshot checkpoint (safetensors + JSON);
* the optimiser step of :meth:`Recipe.loss`: gradients zeroed, mixed precision where the device
  supports it (``precision``: bf16 or fp16 autocast on a CUDA worker; a CPU worker stays in
  fp32, which keeps CPU runs bit-identical), gradient accumulation (``grad_accum``
  micro-batches per step, for recipes that draw a micro-batch per index), clipping
  (:attr:`Recipe.clip_grad_norm`).

The same loop runs without Ray (``session=False``): a method's experiments train their rows
in-process with the recipe a worker runs, nothing reported and nothing checkpointed.

Every rank of a worker group runs the same steps and reports at the same steps; a recipe draws
its step's data from ``(seed, step, rank)`` so a resumed run sees what an uninterrupted one
would have seen.
"""

from __future__ import annotations

import contextlib
from typing import Any

import torch

from nshot.train import session as _session
from nshot.train.session import Restored, WorkerContext

Stats = dict[str, float]


class Recipe:
    """A method's training, as :func:`train` runs it.

    Subclasses set :attr:`model` (and usually :attr:`optimizer`) in :meth:`build`, and
    implement :meth:`loss` (one forward pass; the trainer does the backward pass and the
    optimiser step) or :meth:`step` (the whole update, for a closed-form fit, several
    optimisers or an inner loop). Everything else has a default.
    """

    #: what the checkpoint holds: a module's state dict (default: :attr:`model`), or a plain
    #: state dict for a method that checkpoints only what it changed (:meth:`state`)
    model: torch.nn.Module | None = None
    optimizer: torch.optim.Optimizer | None = None
    #: the model as the step calls it: DDP-wrapped on a worker group, else :attr:`model`
    forward: Any = None
    #: a DeepSpeed engine (:func:`nshot.train.deepspeed.build_engine`) built in :meth:`build`
    #: instead of :attr:`optimizer`: the trainer's step then calls ``engine.backward`` and
    #: ``engine.step`` (ZeRO, precision and accumulation are the engine's), and the checkpoint
    #: gathers the engine's full weights
    engine: Any = None
    #: samples one step processes on this worker (the throughput the progress line shows)
    samples_per_step: int | None = None
    #: clip the gradients' global norm to this before the optimiser step (``None``: no clip)
    clip_grad_norm: float | None = None
    #: whether :meth:`loss` draws a different micro-batch for each ``micro`` index, so the
    #: trainer may accumulate ``grad_accum`` of them per step
    accumulates: bool = False
    #: set by the trainer before :meth:`build`
    device: torch.device = torch.device("cpu")
    rank: int = 0
    world_size: int = 1
    #: the checkpoint this run resumed from (``None`` on a fresh start)
    restored: Restored | None = None
    #: whether the run reports and checkpoints (a worker's run), or trains in this process only
    #: (a row of a method's experiments: ``train(recipe, session=False)``)
    session: bool = True

    def __init__(self, cfg: Any) -> None:
        self.cfg = cfg

    # -- what a method supplies -----------------------------------------------------------
    def build(self) -> None:
        """Build :attr:`model` (on :attr:`device`) and :attr:`optimizer` from ``self.cfg``."""
        raise NotImplementedError

    def loss(self, step: int, micro: int = 0) -> tuple[torch.Tensor, Stats]:
        """The loss of step ``step`` (micro-batch ``micro``) and the numbers to report for it."""
        raise NotImplementedError(f"{type(self).__name__} implements neither loss() nor step()")

    def step(self, step: int) -> Stats:
        """One training step; the default is one optimiser step on :meth:`loss`."""
        return optimizer_step(self, step)

    def on_report(self, step: int, metrics: Stats) -> Stats:
        """The metrics reported at ``step`` (the window's means); add to them here (a
        validation score, the learning rate) or keep a history in :meth:`extra`."""
        return metrics

    def extra(self) -> dict[str, Any] | None:
        """JSON state the checkpoint carries beside the weights."""
        return None

    def state(self) -> torch.nn.Module | dict[str, torch.Tensor]:
        """What the checkpoint's weights are (default: :attr:`model`)."""
        if self.model is None:
            raise NotImplementedError(f"{type(self).__name__}: no model to checkpoint")
        return self.model

    def on_restore(self, restored: Restored) -> None:
        """Called after the newest checkpoint's weights and optimiser state are loaded."""

    def schedule(self) -> tuple[int, int, int]:
        """``(steps, log_every, checkpoint_every)``: the config's, unless the recipe trains a
        stage of its own (an inner fine-tuning run) on another schedule."""
        cfg = self.cfg
        return int(cfg.steps), int(cfg.log_every), int(cfg.checkpoint_every)

    def is_checkpoint(self, step: int) -> bool:
        """Whether the trainer checkpoints at ``step``: every ``checkpoint_every`` steps of the
        schedule and at its last step. A recipe that assembles what a checkpoint holds only
        when one is written asks here; one with checkpoints of its own (at the end of each
        stage) overrides it."""
        last, _, every = self.schedule()
        return step % every == 0 or step == last

    def is_report(self, step: int) -> bool:
        """Whether the trainer reports at ``step`` (it also reports at every checkpoint):
        every ``log_every`` steps of the schedule. A recipe that reports at steps of its own
        (a selection, a stage's end) or not at all over some (steps a run skips) overrides it."""
        return step % self.schedule()[1] == 0

    def restores_weights(self) -> bool:
        """Whether a resume loads weights into :attr:`model` (a step redone from scratch on a
        resume, such as a closed-form fit, restores only the step and extra state)."""
        return self.model is not None


def autocast(recipe: Recipe) -> contextlib.AbstractContextManager:
    """Mixed precision for the recipe's forward pass: the config's ``precision`` on a CUDA
    device; fp32 elsewhere."""
    precision = getattr(recipe.cfg, "precision", "fp32")
    if precision == "fp32" or recipe.device.type != "cuda":
        return contextlib.nullcontext()
    dtype = torch.bfloat16 if precision == "bf16" else torch.float16
    return torch.autocast("cuda", dtype=dtype)


def optimizer_step(recipe: Recipe, step: int) -> Stats:
    """Zero the gradients, run ``grad_accum`` micro-batches of :meth:`Recipe.loss` (each
    scaled by its share), clip, step the optimiser; return the micro-batches' mean stats."""
    if recipe.engine is not None:
        return _engine_step(recipe, step)
    opt = recipe.optimizer
    if opt is None:
        raise NotImplementedError(f"{type(recipe).__name__}: loss() needs an optimizer")
    accum = int(getattr(recipe.cfg, "grad_accum", 1))
    scaler = getattr(recipe, "_scaler", None)
    opt.zero_grad(set_to_none=True)
    totals: Stats = {}
    for micro in range(accum):
        with autocast(recipe):
            loss, stats = recipe.loss(step, micro)
        if accum > 1:
            loss = loss / accum
        if scaler is not None:
            scaler.scale(loss).backward()
        else:
            loss.backward()
        for k, v in stats.items():
            totals[k] = totals.get(k, 0.0) + float(v) / accum if accum > 1 else float(v)
    if recipe.clip_grad_norm is not None:
        if scaler is not None:
            scaler.unscale_(opt)
        params = [p for g in opt.param_groups for p in g["params"]]
        torch.nn.utils.clip_grad_norm_(params, recipe.clip_grad_norm)
    if scaler is not None:
        scaler.step(opt)
        scaler.update()
    else:
        opt.step()
    return totals


def _engine_step(recipe: Recipe, step: int) -> Stats:
    """One step of a DeepSpeed engine: its forward (under the engine's precision), backward
    and step; the engine accumulates and clips as its config says."""
    loss, stats = recipe.loss(step, 0)
    recipe.engine.backward(loss)
    recipe.engine.step()
    return {k: float(v) for k, v in stats.items()}


class Window:
    """The mean of each number over the steps since the last report."""

    def __init__(self) -> None:
        self.sums: Stats = {}
        self.counts: dict[str, int] = {}
        self.samples = 0

    def add(self, stats: Stats, samples: int | None) -> None:
        for k, v in stats.items():
            self.sums[k] = self.sums.get(k, 0.0) + float(v)
            self.counts[k] = self.counts.get(k, 0) + 1
        self.samples += samples or 0

    def means(self) -> Stats:
        return {k: self.sums[k] / self.counts[k] for k in self.sums}

    def clear(self) -> None:
        self.sums, self.counts, self.samples = {}, {}, 0


def local_device() -> torch.device:
    """The device this process computes on outside a Ray Train worker (a job of a method's
    comparison, a predictor): the GPU it sees (a Ray task that holds one sees only it), else
    the CPU. Method code takes its device from here or from the trainer, never names one."""
    return torch.device("cuda") if torch.cuda.is_available() else torch.device("cpu")


def _local_context() -> WorkerContext:
    return WorkerContext(0, 1, True, local_device())


def _prepare(recipe: Recipe, ctx: WorkerContext, session: bool) -> None:
    recipe.device, recipe.rank, recipe.world_size = ctx.device, ctx.rank, ctx.world_size
    recipe.session = session
    recipe.build()
    if recipe.engine is not None:  # the engine placed and wrapped the model itself
        recipe.forward = recipe.forward or recipe.engine
        return
    if recipe.model is not None:
        recipe.model.to(ctx.device)
    if recipe.forward is None:
        recipe.forward = recipe.model
    if session and ctx.world_size > 1 and isinstance(recipe.forward, torch.nn.Module):
        recipe.forward = _session.prepare_model(recipe.forward)
    precision = getattr(recipe.cfg, "precision", "fp32")
    if precision == "fp16" and ctx.device.type == "cuda":
        recipe._scaler = torch.amp.GradScaler("cuda")  # type: ignore[attr-defined]
    accum = int(getattr(recipe.cfg, "grad_accum", 1))
    if accum > 1 and not recipe.accumulates:
        from nshot.errors import ConfigError

        raise ConfigError(
            f"grad_accum={accum}: {type(recipe).__name__} draws one batch per step and does "
            "not accumulate micro-batches; use grad_accum=1"
        )


def train(recipe: Recipe, *, session: bool = True, start: int | None = None) -> Recipe:
    """Run ``recipe`` to the config's ``steps`` and return it (its model trained).

    ``session=True`` (inside ``Method.train_loop``, on every Ray Train worker): the worker's
    device and rank, resume, faults, reports and checkpoints. ``session=False``: the same steps
    in this process on its device (the GPU a job holds, else the CPU), nothing reported (a
    method's experiments).

    ``start`` (with ``session=False``): the number of steps already done, for a loop that keeps
    its own resume state outside a Ray run (a cached pre-training, read back in ``build``); the
    steps after it run. Inside a session the run's newest checkpoint says where to start."""
    if start is not None and session:
        raise ValueError("train(start=...) is for session=False; a Ray run resumes itself")
    ctx = _session.context() if session else _local_context()
    _prepare(recipe, ctx, session)
    restored = None
    if session:
        weights = recipe.model if recipe.restores_weights() else None
        restored = _session.restore(weights, recipe.optimizer if weights is not None else None)
        if restored is not None:
            recipe.restored = restored
            recipe.on_restore(restored)
    start = restored.step if restored else (start or 0)
    window = Window()
    if recipe.model is not None:
        recipe.model.train()
    for step in range(start + 1, recipe.schedule()[0] + 1):
        if session:
            _session.maybe_inject_fault(step, restored)
        stats = recipe.step(step)
        window.add(stats, recipe.samples_per_step)
        is_ckpt = recipe.is_checkpoint(step)
        if is_ckpt or recipe.is_report(step):
            metrics = recipe.on_report(step, window.means())
            if session:
                _session.report(
                    metrics,
                    step=step,
                    model=recipe.engine if recipe.engine is not None else recipe.state(),
                    optimizer=recipe.optimizer if recipe.engine is None else None,
                    extra=recipe.extra(),
                    checkpoint=is_ckpt,
                    samples=window.samples if recipe.samples_per_step is not None else None,
                )
            window.clear()
    return recipe
