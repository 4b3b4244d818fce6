"""A paper's claims as data, evaluated over a reproduction's results.

A method declares its claims (``Method.claims``) as :class:`Claim` objects: an id, one sentence,
where in the paper it comes from, and a comparison over the rows and metrics of the method's
:class:`~nshot.method.ResultsTable`::

    Claim(
        id="beats_no_projection",
        statement="TAIL classifies an unseen modality better than TAIL without its projection.",
        source="Table 2",
        expr="tail.acc_unseen_modality_5w5s > no_projection.acc_unseen_modality_5w5s",
    )

The expression language is small and safe (parsed with :mod:`ast`, never ``eval``):

* ``system.metric``: the mean of ``metric`` for ``system`` (a row of the results);
* ``extra("key", "sub", ...)``: a number stored in the results' ``extra`` under those keys;
* numbers, ``+ - * /``, unary ``-``, ``abs(...)``, ``min(...)``, ``max(...)``;
* one comparison (``<``, ``<=``, ``>``, ``>=``, ``==``), or several joined by ``and``.

A claim may ask for a paired test (``test="paired_t"`` or ``"wilcoxon"``) of a comparison
``A.m OP B.m``: it then also needs ``p < alpha`` over the per-seed (or per-episode) values the
results hold in ``samples[system][metric]``, one-sided in the comparison's direction.

A claim that cannot be evaluated (a row or metric that was not run, a value that is ``null``,
samples missing for its test, results of a preset the claim is not stated for) is ``None``,
never ``True``.

A method with more than one experiment (its main comparison and, say, a measurement of the
platform around it) scopes a claim to one with ``experiment="name"``: the claim is then read on
results whose ``experiment`` field is that name, and counted nowhere else (like a claim stated
for other presets); claims without it read the main comparison (results without the field).
"""

from __future__ import annotations

import ast
import math
import operator
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

TESTS = ("paired_t", "wilcoxon")


class ClaimError(ValueError):
    """A claim's expression is not in the claim language (the message names the claim)."""


@dataclass(frozen=True)
class Claim:
    """One claim of the paper: ``expr`` over the results' rows and metrics."""

    id: str
    statement: str
    source: str
    expr: str
    test: str | None = None
    alpha: float = 0.05
    # the presets whose results the claim speaks of (None: every preset); on the results of
    # another preset (e.g. ``smoke``, too small to show the effect) the claim is not evaluated
    presets: tuple[str, ...] | None = None
    # the experiment whose results the claim speaks of (None: the method's main comparison)
    experiment: str | None = None

    def __post_init__(self) -> None:
        if not self.id or not self.statement or not self.source:
            raise ClaimError(f"claim {self.id!r}: id, statement and source must be non-empty")
        if self.test is not None and self.test not in TESTS:
            raise ClaimError(f"claim {self.id!r}: test must be one of {TESTS}, not {self.test!r}")
        if not 0.0 < self.alpha < 1.0:
            raise ClaimError(f"claim {self.id!r}: alpha must lie in (0, 1)")
        tree = _parse(self)
        if self.test is not None:
            _paired_operands(self, tree)

    def references(self) -> list[tuple[str, str]]:
        """The ``(system, metric)`` pairs the expression reads."""
        out: list[tuple[str, str]] = []
        for node in ast.walk(_parse(self)):
            if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name):
                out.append((node.value.id, node.attr))
        return out

    def evaluate(self, results: dict[str, Any]) -> dict[str, Any]:
        """This claim on a results dict (the schema of ``results.json``)."""
        return evaluate_claim(self, results)


# --------------------------------------------------------------------------- parsing

_BINOPS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul}
_CMPOPS = {
    ast.Lt: operator.lt,
    ast.LtE: operator.le,
    ast.Gt: operator.gt,
    ast.GtE: operator.ge,
    ast.Eq: operator.eq,
}
_FUNCS = {"abs": abs, "min": min, "max": max}


def _parse(claim: Claim) -> ast.Expression:
    try:
        tree = ast.parse(claim.expr, mode="eval")
    except SyntaxError as err:
        raise ClaimError(f"claim {claim.id!r}: cannot parse {claim.expr!r}: {err.msg}") from None
    body = tree.body
    parts = body.values if isinstance(body, ast.BoolOp) and isinstance(body.op, ast.And) else [body]
    for part in parts:
        if not isinstance(part, ast.Compare):
            raise ClaimError(
                f"claim {claim.id!r}: {claim.expr!r} must be a comparison (or several joined by "
                "'and')"
            )
    for node in ast.walk(body):
        if isinstance(node, ast.BoolOp | ast.And | ast.Load | ast.Compare | ast.Expression):
            continue
        if isinstance(node, ast.Attribute):
            if not isinstance(node.value, ast.Name):
                raise ClaimError(f"claim {claim.id!r}: operands are system.metric")
            continue
        if isinstance(node, ast.Name):
            continue  # a system name (checked by its Attribute) or a function name (below)
        if isinstance(node, ast.Constant):
            if isinstance(node.value, bool) or not isinstance(node.value, int | float | str):
                raise ClaimError(f"claim {claim.id!r}: constant {node.value!r} is not allowed")
            continue
        if isinstance(node, ast.BinOp) and type(node.op) in (*_BINOPS, ast.Div):
            continue
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
            continue
        if isinstance(node, ast.Call):
            fname = node.func.id if isinstance(node.func, ast.Name) else None
            if fname not in (*_FUNCS, "extra") or node.keywords:
                raise ClaimError(
                    f"claim {claim.id!r}: only abs(), min(), max() and extra(...) may be called"
                )
            if fname == "extra":
                if not node.args or not all(
                    isinstance(a, ast.Constant) and isinstance(a.value, str) for a in node.args
                ):
                    raise ClaimError(f"claim {claim.id!r}: extra(...) takes string keys")
            continue
        if type(node) in (*_BINOPS, ast.Div, ast.USub, *_CMPOPS):
            continue
        raise ClaimError(
            f"claim {claim.id!r}: {type(node).__name__} is not allowed in {claim.expr!r}"
        )
    for node in ast.walk(body):
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            parent_ok = any(
                isinstance(c, ast.Call) and node in c.args and getattr(c.func, "id", "") == "extra"
                for c in ast.walk(body)
            )
            if not parent_ok:
                raise ClaimError(f"claim {claim.id!r}: strings appear only inside extra(...)")
        if isinstance(node, ast.Compare):
            for op in node.ops:
                if type(op) not in _CMPOPS:
                    raise ClaimError(f"claim {claim.id!r}: comparison {type(op).__name__}")
    return tree


def _paired_operands(claim: Claim, tree: ast.Expression) -> tuple[tuple[str, str], ...]:
    body = tree.body
    if (
        not isinstance(body, ast.Compare)
        or len(body.ops) != 1
        or type(body.ops[0]) not in (ast.Lt, ast.LtE, ast.Gt, ast.GtE)
        or not all(
            isinstance(n, ast.Attribute) and isinstance(n.value, ast.Name)
            for n in (body.left, body.comparators[0])
        )
    ):
        raise ClaimError(
            f"claim {claim.id!r}: a paired test needs one comparison 'A.metric < B.metric' "
            f"(or >, <=, >=), not {claim.expr!r}"
        )
    a, b = body.left, body.comparators[0]
    return ((a.value.id, a.attr), (b.value.id, b.attr))  # type: ignore[union-attr]


# --------------------------------------------------------------------------- evaluation


class _Missing(Exception):
    """An operand has no value in these results."""


def _number(v: Any) -> float:
    if v is None or isinstance(v, bool) or not isinstance(v, int | float):
        raise _Missing
    v = float(v)
    if math.isnan(v):
        raise _Missing
    return v


def _value(node: ast.AST, results: dict[str, Any]) -> float:
    if isinstance(node, ast.Constant):
        return float(node.value)
    if isinstance(node, ast.Attribute):
        row = results.get("rows", {}).get(node.value.id)  # type: ignore[union-attr]
        if not isinstance(row, dict):
            raise _Missing
        return _number(row.get(node.attr))
    if isinstance(node, ast.UnaryOp):
        return -_value(node.operand, results)
    if isinstance(node, ast.BinOp):
        left, right = _value(node.left, results), _value(node.right, results)
        if isinstance(node.op, ast.Div):
            if right == 0:
                raise _Missing
            return left / right
        return _BINOPS[type(node.op)](left, right)
    if isinstance(node, ast.Call):
        fname = node.func.id  # type: ignore[union-attr]
        if fname == "extra":
            cur: Any = results.get("extra", {})
            for key in node.args:
                if not isinstance(cur, dict) or key.value not in cur:  # type: ignore[attr-defined]
                    raise _Missing
                cur = cur[key.value]  # type: ignore[attr-defined]
            return _number(cur)
        return float(_FUNCS[fname](*(_value(a, results) for a in node.args)))
    raise _Missing  # pragma: no cover - the parser admits nothing else


def _compare(node: ast.Compare, results: dict[str, Any]) -> tuple[bool, float, float]:
    left = _value(node.left, results)
    first_lhs, first_rhs = left, None
    ok = True
    for op, comp in zip(node.ops, node.comparators):
        right = _value(comp, results)
        if first_rhs is None:
            first_rhs = right
        ok = ok and bool(_CMPOPS[type(op)](left, right))
        left = right
    return ok, first_lhs, float(first_rhs)  # type: ignore[arg-type]


def _samples(results: dict[str, Any], system: str, metric: str) -> list[float] | None:
    vals = results.get("samples", {}).get(system, {}).get(metric)
    if not isinstance(vals, list) or not vals:
        return None
    try:
        return [_number(v) for v in vals]
    except _Missing:
        return None


def paired_p(test: str, a: Sequence[float], b: Sequence[float], alternative: str) -> float | None:
    """One-sided p of ``a`` against ``b`` (paired): ``alternative`` 'greater' or 'less'."""
    import numpy as np
    from scipy import stats

    if len(a) != len(b) or len(a) < 2:
        return None
    d = np.asarray(a, dtype=float) - np.asarray(b, dtype=float)
    if np.all(d == 0):
        return 1.0
    if test == "paired_t":
        if np.std(d) == 0:  # a constant non-zero difference: as certain as the data allow
            return 0.0 if (d[0] > 0) == (alternative == "greater") else 1.0
        p = stats.ttest_rel(a, b, alternative=alternative).pvalue
    else:
        p = stats.wilcoxon(a, b, alternative=alternative).pvalue
    return None if p is None or math.isnan(p) else float(p)


def evaluate_claim(claim: Claim, results: dict[str, Any]) -> dict[str, Any]:
    """``{"id", "statement", "source", "expr", "holds", "lhs", "rhs", "p"}`` for one claim.

    ``lhs``/``rhs`` are the two sides of the (first) comparison; ``holds`` is ``None`` when any
    operand (or, for a tested claim, its samples) is missing."""
    tree = _parse(claim)
    out: dict[str, Any] = {
        "id": claim.id,
        "statement": claim.statement,
        "source": claim.source,
        "expr": claim.expr,
        "holds": None,
        "lhs": None,
        "rhs": None,
        "p": None,
    }
    if claim.test is not None:
        out["test"] = claim.test
        out["alpha"] = claim.alpha
    if results.get("experiment") != claim.experiment:
        out["applies"] = False  # not counted: it speaks of another experiment's results
        out["other"] = "experiment"
        out["note"] = (
            f"stated for the {claim.experiment} experiment"
            if claim.experiment
            else "stated for the main comparison"
        )
        return out
    if claim.presets is not None and results.get("preset") not in claim.presets:
        out["applies"] = False  # not counted: it speaks of other presets
        out["other"] = "preset"
        out["note"] = f"stated for the {'/'.join(claim.presets)} preset(s)"
        return out
    body = tree.body
    parts = body.values if isinstance(body, ast.BoolOp) else [body]
    try:
        results_of = [_compare(part, results) for part in parts]  # type: ignore[arg-type]
    except _Missing:
        return out
    holds = all(ok for ok, _, _ in results_of)
    out["lhs"], out["rhs"] = results_of[0][1], results_of[0][2]
    if claim.test is not None:
        (sa, ma), (sb, mb) = _paired_operands(claim, tree)
        a, b = _samples(results, sa, ma), _samples(results, sb, mb)
        if a is None or b is None:
            return out
        op = type(body.ops[0])  # type: ignore[union-attr]
        alternative = "greater" if op in (ast.Gt, ast.GtE) else "less"
        p = paired_p(claim.test, a, b, alternative)
        out["p"] = p
        if p is None:
            return out
        holds = holds and p < claim.alpha
    out["holds"] = bool(holds)
    return out


def evaluate(claims: Iterable[Claim], results: dict[str, Any]) -> list[dict[str, Any]]:
    """Every claim on ``results``, in declaration order."""
    return [evaluate_claim(c, results) for c in claims]


def summary(evaluated: Sequence[dict[str, Any]]) -> dict[str, int]:
    """Counts over the claims that speak of these results' preset and experiment: ``{"held",
    "failed", "unevaluated", "total"}``, ``"other_presets"``: claims stated for other presets or
    other experiments only (not counted in ``total``), and ``"other_experiments"``: those of them
    stated for another experiment."""
    applying = [c for c in evaluated if c.get("applies", True)]
    held = sum(1 for c in applying if c["holds"] is True)
    failed = sum(1 for c in applying if c["holds"] is False)
    return {
        "held": held,
        "failed": failed,
        "unevaluated": len(applying) - held - failed,
        "total": len(applying),
        "other_presets": len(evaluated) - len(applying),
        "other_experiments": sum(
            1 for c in evaluated if not c.get("applies", True) and c.get("other") == "experiment"
        ),
    }


def summary_line(evaluated: Sequence[dict[str, Any]]) -> str:
    s = summary(evaluated)
    line = f"claims: {s['held']} of {s['total']} hold"
    if s["failed"] or s["unevaluated"]:
        line += f" ({s['failed']} fail, {s['unevaluated']} not evaluable)"
    by_preset = s["other_presets"] - s["other_experiments"]
    if by_preset:
        line += f"; {by_preset} stated for other presets"
    if s["other_experiments"]:
        line += f"; {s['other_experiments']} for another experiment"
    return line


def _fmt(v: Any) -> str:
    if v is None:
        return "n/a"
    return f"{v:.4g}" if isinstance(v, float) else str(v)


def to_markdown(evaluated: Sequence[dict[str, Any]]) -> str:
    """The claims table of ``results.md``."""
    lines = [
        "## Claims",
        "",
        summary_line(evaluated),
        "",
        "| claim | holds | lhs | rhs | p | source | statement | expression |",
        "|---|---|---|---|---|---|---|---|",
    ]
    mark = {True: "yes", False: "**no**", None: "n/a"}
    for c in evaluated:
        expr = c["expr"].replace("|", "\\|")
        if c.get("test"):
            expr += f" ({c['test']}, p < {c['alpha']})"
        lines.append(
            f"| {c['id']} | {mark[c['holds']]} | {_fmt(c['lhs'])} | {_fmt(c['rhs'])} | "
            f"{_fmt(c['p'])} | {c['source']} | {c['statement']} | `{expr}` |"
        )
    return "\n".join(lines) + "\n"
