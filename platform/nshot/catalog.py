"""The papers nshot covers, in the order of its method table, read from the method registry.

A registered method declares its paper's title and its area (``Method.paper``,
``Method.area``); this catalog holds the one thing a method does not declare: where its paper
stands in the table (:data:`ORDER`, the numbering of the nineteen papers), and where each of them
can be read (:data:`LINKS`). ``nshot list``,
``nshot report`` and the README's method table all read titles and areas through here, so a
title is written once, on the method. A third-party method (registered through the
``nshot.methods`` entry points) follows the nineteen, by name; a name of :data:`ORDER` whose
method is not registered is listed as planned, titled by its name.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

#: the nineteen papers' methods, in the order (and with the numbers) of the method table
ORDER: tuple[str, ...] = (
    "zerounlearn", "keystone", "tail", "urs", "auxbo", "recog", "modhnn", "tgdt", "iclft",
    "timemode", "scgfm", "bsr", "caos", "front", "unpaired_iv", "weightspace", "atha",
    "dirclip", "cfr",
)  # fmt: skip


#: where each of the nineteen papers can be read: its arXiv page where one is known, else the
#: authors' reference code (a third-party method declares ``Method.paper_url`` instead)
LINKS: dict[str, str] = {
    "zerounlearn": "https://github.com/XMUDeepLIT/ZeroUnlearn",
    "urs": "https://github.com/CIAM-Group/URS",
    "timemode": "https://arxiv.org/abs/2606.15172",
    "scgfm": "https://arxiv.org/abs/2605.08689",
    "bsr": "https://github.com/yanweifu-sii/BSR-VideoMAE",
    "caos": "https://arxiv.org/abs/2601.05219",
    "front": "https://github.com/LUcy0505/FRONT",
    "unpaired_iv": "https://arxiv.org/abs/2601.15254",
    "weightspace": "https://arxiv.org/abs/2602.01083",
    "atha": "https://github.com/shuaiyi308/ATHA",
    "dirclip": "https://arxiv.org/abs/2512.12997",
    "cfr": "https://github.com/Yuan-Honoka-Guo/CFR",
}


@dataclass(frozen=True)
class Paper:
    """One row of the method table: ``title`` and ``area`` are the method's own; ``url`` where
    the paper (or its reference code) can be read, if known."""

    number: int
    name: str
    title: str
    area: str
    registered: bool = True
    url: str | None = None


def papers() -> list[Paper]:
    """Every paper: those of :data:`ORDER`, then the third-party methods (sorted by name)."""
    from nshot.method import available, method_class

    registered = available()
    names = [*ORDER, *sorted(set(registered) - set(ORDER))]
    out = []
    for number, name in enumerate(names, start=1):
        # the class, whether or not its extra is installed here (the table lists every method)
        method = method_class(name) if name in registered else None
        if method is not None:
            url = getattr(method, "paper_url", None) or LINKS.get(name)
            out.append(Paper(number, name, method.paper, method.area, url=url))
        elif name in registered:  # its import failed on a missing extra: titled by its name
            out.append(Paper(number, name, name, "—", url=LINKS.get(name)))
        else:
            out.append(Paper(number, name, name, "—", registered=False, url=LINKS.get(name)))
    return out


def __getattr__(name: str) -> Any:
    # ``PAPERS``, the tuple this module once declared, built from the registry when asked for
    if name == "PAPERS":
        return tuple(papers())
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
