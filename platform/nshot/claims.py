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
never ``True``. A claim may name its premise with ``requires=``, an expression in the same
language (the reference is above the floor, the oracle beats the agnostic row, a precondition
row clears its bar): when the premise does not hold, or cannot be evaluated, the claim is not
evaluable (``holds: None``, ``premise: False``), never true.

Every claim has a ``kind`` (:data:`KINDS`):

* ``headline``: the paper's central comparison, in the paper's direction, against the strongest
  of the paper's baselines that nshot runs, with a paired test over per-seed values;
* ``ablation``: a component the paper says matters;
* ``control``: a negative or positive control; its statement says which result would fail it,
  and it must be able to fail on the data;
* ``check``: a unit, exactness or sanity check (not a claim of the paper).

Scoreboards count the *paper claims* (headline, ablation, control) apart from the checks, and
show the headline verdict first (:func:`summary`, :func:`summary_line`). A tested claim also
records the paired effect (mean difference, in the comparison's direction of ``lhs - rhs``), its
95 % t interval and the number of pairs.

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
KINDS = ("headline", "ablation", "control", "check")
PAPER_KINDS = ("headline", "ablation", "control")


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
    # headline / ablation / control / check (see the module's docstring); every declared claim
    # names one (the conformance test checks it)
    kind: str | None = None
    # the claim's premise, an expression in the same language: when it does not hold (or cannot
    # be evaluated), the claim is not evaluable
    requires: str | None = None

    def __post_init__(self) -> None:
        if not self.id or not self.statement or not self.source:
            raise ClaimError(f"claim {self.id!r}: id, statement and source must be non-empty")
        if self.kind is not None and self.kind not in KINDS:
            raise ClaimError(f"claim {self.id!r}: kind must be one of {KINDS}, not {self.kind!r}")
        if self.requires is not None:
            _parse(self, self.requires)
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


def _parse(claim: Claim, text: str | None = None) -> ast.Expression:
    """``text`` (default: the claim's ``expr``) parsed and checked against the claim language."""
    expr = claim.expr if text is None else text
    try:
        tree = ast.parse(expr, mode="eval")
    except SyntaxError as err:
        raise ClaimError(f"claim {claim.id!r}: cannot parse {expr!r}: {err.msg}") from None
    body = tree.body
    parts = body.values if isinstance(body, ast.BoolOp) and isinstance(body.op, ast.And) else [body]
    for part in parts:
        if not isinstance(part, ast.Compare):
            raise ClaimError(
                f"claim {claim.id!r}: {expr!r} must be a comparison (or several joined by 'and')"
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
        raise ClaimError(f"claim {claim.id!r}: {type(node).__name__} is not allowed in {expr!r}")
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


def paired_effect(a: Sequence[float], b: Sequence[float]) -> dict[str, Any] | None:
    """The paired effect of ``a`` over ``b``: ``{"mean_diff", "ci95": [lo, hi], "n", "dz"}``
    (mean of ``a - b``, its two-sided 95 % t interval, the number of pairs and Cohen's d_z,
    ``None`` when the spread is zero); ``None`` with fewer than two pairs."""
    import numpy as np
    from scipy import stats

    if len(a) != len(b) or len(a) < 2:
        return None
    d = np.asarray(a, dtype=float) - np.asarray(b, dtype=float)
    n = len(d)
    mean = float(d.mean())
    sd = float(d.std(ddof=1))
    half = float(stats.t.ppf(0.975, n - 1) * sd / math.sqrt(n))
    return {
        "mean_diff": mean,
        "ci95": [mean - half, mean + half],
        "n": n,
        "dz": mean / sd if sd > 0 else None,
    }


def _all_hold(tree: ast.Expression, results: dict[str, Any]) -> tuple[bool, list[tuple]]:
    body = tree.body
    parts = body.values if isinstance(body, ast.BoolOp) else [body]
    compared = [_compare(part, results) for part in parts]  # type: ignore[arg-type]
    return all(ok for ok, _, _ in compared), compared


def evaluate_claim(claim: Claim, results: dict[str, Any]) -> dict[str, Any]:
    """``{"id", "kind", "statement", "source", "expr", "holds", "lhs", "rhs", "p"}`` for one
    claim (and ``requires``/``premise`` for a claim with a premise; ``test``, ``alpha`` and
    ``effect`` for a tested one).

    ``lhs``/``rhs`` are the two sides of the (first) comparison; ``holds`` is ``None`` when any
    operand (or, for a tested claim, its samples) is missing, or when the premise does not
    hold."""
    tree = _parse(claim)
    out: dict[str, Any] = {
        "id": claim.id,
        "kind": claim.kind,
        "statement": claim.statement,
        "source": claim.source,
        "expr": claim.expr,
        "holds": None,
        "lhs": None,
        "rhs": None,
        "p": None,
    }
    if claim.requires is not None:
        out["requires"] = claim.requires
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
    try:
        holds, compared = _all_hold(tree, results)
    except _Missing:
        compared = None
    if compared is not None:
        out["lhs"], out["rhs"] = compared[0][1], compared[0][2]
    if claim.test is not None:
        (sa, ma), (sb, mb) = _paired_operands(claim, tree)
        a, b = _samples(results, sa, ma), _samples(results, sb, mb)
        if a is not None and b is not None:
            out["effect"] = paired_effect(a, b)
            if compared is not None:
                op = type(tree.body.ops[0])  # type: ignore[attr-defined]
                alternative = "greater" if op in (ast.Gt, ast.GtE) else "less"
                out["p"] = paired_p(claim.test, a, b, alternative)
    if claim.requires is not None:
        try:
            premise, _ = _all_hold(_parse(claim, claim.requires), results)
        except _Missing:
            premise = False
        out["premise"] = bool(premise)
        if not premise:
            out["note"] = f"premise does not hold: {claim.requires}"
            return out
    if compared is None:
        return out
    if claim.test is not None:
        if out["p"] is None:
            return out
        holds = holds and out["p"] < claim.alpha
    out["holds"] = bool(holds)
    return out


def evaluate(claims: Iterable[Claim], results: dict[str, Any]) -> list[dict[str, Any]]:
    """Every claim on ``results``, in declaration order."""
    return [evaluate_claim(c, results) for c in claims]


def _counts(claims: Sequence[dict[str, Any]]) -> dict[str, int]:
    held = sum(1 for c in claims if c["holds"] is True)
    failed = sum(1 for c in claims if c["holds"] is False)
    return {
        "held": held,
        "failed": failed,
        "unevaluated": len(claims) - held - failed,
        "total": len(claims),
    }


def headline_verdict(evaluated: Sequence[dict[str, Any]]) -> bool | None:
    """The headline verdict over the claims that apply: ``True`` when every headline claim
    holds, ``False`` when one fails, ``None`` when none is declared or one is not evaluable
    (and none fails)."""
    heads = [c for c in evaluated if c.get("applies", True) and c.get("kind") == "headline"]
    if not heads:
        return None
    if any(c["holds"] is False for c in heads):
        return False
    if all(c["holds"] is True for c in heads):
        return True
    return None


def summary(evaluated: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """Counts over the claims that speak of these results' preset and experiment: ``{"held",
    "failed", "unevaluated", "total"}`` over every kind, ``"paper"`` and ``"checks"``: the same
    counts over the paper claims (headline, ablation, control: :data:`PAPER_KINDS`) and over the
    checks (and claims of no kind), ``"headline"``: the same over the headline claims with
    ``"verdict"`` (:func:`headline_verdict`); ``"other_presets"``: claims stated for other
    presets or other experiments only (not counted in ``total``), and ``"other_experiments"``:
    those of them stated for another experiment."""
    applying = [c for c in evaluated if c.get("applies", True)]
    out: dict[str, Any] = dict(_counts(applying))
    out["paper"] = _counts([c for c in applying if c.get("kind") in PAPER_KINDS])
    out["checks"] = _counts([c for c in applying if c.get("kind") not in PAPER_KINDS])
    out["headline"] = {
        **_counts([c for c in applying if c.get("kind") == "headline"]),
        "verdict": headline_verdict(evaluated),
    }
    out["other_presets"] = len(evaluated) - len(applying)
    out["other_experiments"] = sum(
        1 for c in evaluated if not c.get("applies", True) and c.get("other") == "experiment"
    )
    return out


VERDICT_WORDS = {True: "holds", False: "fails", None: "not evaluable"}


def summary_line(evaluated: Sequence[dict[str, Any]]) -> str:
    """``headline holds; 5 of 8 paper claims hold (2 fail, 1 not evaluable); 4 of 4 checks
    hold`` (and what is stated for other presets or experiments)."""
    s = summary(evaluated)
    parts = []
    if s["headline"]["total"]:
        parts.append(f"headline {VERDICT_WORDS[s['headline']['verdict']]}")
    else:
        parts.append("no headline claim")

    def counted(c: dict[str, int], what: str) -> str:
        line = f"{c['held']} of {c['total']} {what} hold"
        if c["failed"] or c["unevaluated"]:
            line += f" ({c['failed']} fail, {c['unevaluated']} not evaluable)"
        return line

    parts.append(counted(s["paper"], "paper claims"))
    if s["checks"]["total"]:
        parts.append(counted(s["checks"], "checks"))
    line = "claims: " + "; ".join(parts)
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
        "| claim | kind | holds | lhs | rhs | p | effect (95 % CI) | source | statement | "
        "expression |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    mark = {True: "yes", False: "**no**", None: "n/a"}
    order = {k: i for i, k in enumerate(KINDS)}
    for c in sorted(evaluated, key=lambda c: order.get(c.get("kind") or "", len(KINDS))):
        expr = c["expr"].replace("|", "\\|")
        if c.get("test"):
            expr += f" ({c['test']}, p < {c['alpha']})"
        if c.get("requires"):
            expr += " if " + c["requires"].replace("|", "\\|")
        eff = c.get("effect")
        effect = (
            f"{_fmt(eff['mean_diff'])} [{_fmt(eff['ci95'][0])}, {_fmt(eff['ci95'][1])}], "
            f"n={eff['n']}"
            if eff
            else ""
        )
        lines.append(
            f"| {c['id']} | {c.get('kind') or ''} | {mark[c['holds']]} | {_fmt(c['lhs'])} | "
            f"{_fmt(c['rhs'])} | {_fmt(c['p'])} | {effect} | {c['source']} | {c['statement']} "
            f"| `{expr}` |"
        )
    return "\n".join(lines) + "\n"
