"""The record every generator of :mod:`.data` and :mod:`.taxonomy` returns: one image's RGB,
its point cloud and its defect mask."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class Sample:
    rgb: np.ndarray  # H × W × 3 uint8
    xyz: np.ndarray  # H × W × 3 float32, zeros off the object
    mask: np.ndarray  # H × W bool, the defect
    defect: str
