"""A reader of the ``.ts`` time-series format (the UCR/UEA archive files that aeon and sktime
ship), written from the format's description so that nshot never imports those packages.

A ``.ts`` file is a header of ``@key value`` lines (``#`` starts a comment), then ``@data`` and
one case per line: the dimensions of the case separated by ``:``, the values of a dimension by
``,`` (``?`` is a missing value), and, when ``@classLabel true`` (or ``@targetLabel true``),
the label as the last ``:`` field. Dimensions of one case may differ in length
(``@equalLength false``).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from nshot.data.cache import DataError

__all__ = ["TsFile", "parse_ts"]


@dataclass
class TsFile:
    """The cases of a ``.ts`` file: ``series[i][d]`` is dimension ``d`` of case ``i`` (float64,
    NaN where missing); ``labels[i]`` its label (``None`` for an unlabelled file)."""

    series: list[list[np.ndarray]]
    labels: list[str | None]
    header: dict[str, str] = field(default_factory=dict)

    def univariate(self) -> list[np.ndarray]:
        """Every dimension of every case as its own series, missing values dropped."""
        out = []
        for case in self.series:
            for dim in case:
                out.append(dim[~np.isnan(dim)])
        return out


def _values(text: str, where: str) -> np.ndarray:
    if not text.strip():
        return np.zeros(0)
    try:
        return np.array([np.nan if v.strip() == "?" else float(v) for v in text.split(",")])
    except ValueError as err:
        raise DataError(f"{where}: {err}") from None


def parse_ts(text: str, *, name: str = "<ts>") -> TsFile:
    """Parse the text of a ``.ts`` file (:class:`DataError` naming ``name`` and the line)."""
    header: dict[str, str] = {}
    series: list[list[np.ndarray]] = []
    labels: list[str | None] = []
    in_data = False
    for no, raw in enumerate(text.splitlines(), 1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        if not in_data:
            if not line.startswith("@"):
                raise DataError(f"{name}:{no}: expected a @header line before @data")
            key, _, value = line[1:].partition(" ")
            if key.lower() == "data":
                in_data = True
            else:
                header[key.lower()] = value.strip()
            continue
        labelled = any(
            header.get(k, "").split(" ")[0].lower() == "true" for k in ("classlabel", "targetlabel")
        )
        parts = line.split(":")
        label = parts.pop().strip() if labelled else None
        if not parts:
            raise DataError(f"{name}:{no}: a case with no values")
        series.append([_values(p, f"{name}:{no}") for p in parts])
        labels.append(label)
    if not in_data:
        raise DataError(f"{name}: no @data section")
    dims = header.get("dimensions")
    if dims is not None and series and any(len(c) != int(dims) for c in series):
        raise DataError(f"{name}: a case does not have the {dims} dimensions of the header")
    return TsFile(series, labels, header)
