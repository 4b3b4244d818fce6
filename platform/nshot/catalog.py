"""The nineteen papers nshot covers, in the order of its method table.

A registered method describes itself (``Method.paper``, ``Method.area``); this catalog adds the
papers that have no method yet, so that ``nshot report`` and the README's method table can list
all nineteen, marking those as planned.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Paper:
    number: int
    name: str
    title: str
    area: str


PAPERS: tuple[Paper, ...] = (
    Paper(1, "zerounlearn", "ZeroUnlearn: few-shot LLM unlearning as knowledge re-mapping", "LLM (DeepSpeed)"),
    Paper(2, "keystone", "Keystone neurons: probing and keystone-only fine-tuning", "LLM (DeepSpeed)"),
    Paper(3, "tail", "TAIL: universal algorithm-implicit meta-learner", "few-shot classification"),
    Paper(4, "urs", "URS: unified neural routing solver for 110 VRP variants", "combinatorial optimization"),
    Paper(5, "auxbo", "Few-shot Bayesian optimization with auxiliary information", "Tune + BoTorch searcher"),
    Paper(6, "recog", "ReCoG: relational and compact context graph for few-shot molecular property prediction", "graphs / chemistry"),
    Paper(7, "modhnn", "Modulation-based meta-learning of Hamiltonian dynamics", "physics / dynamics"),
    Paper(8, "tgdt", "TG-DT: text-guided decision transformer for zero-shot offline meta-RL", "reinforcement learning"),
    Paper(9, "iclft", "Fine-tuning versus in-context learning in linear attention", "LLM theory"),
    Paper(10, "timemode", "TimeMoDE: diffusion transformer with mixture of experts for few-shot time series generation", "time series"),
    Paper(11, "scgfm", "SCGFM: structure-centric graph foundation model", "graphs"),
    Paper(12, "bsr", "BSR: brain signal rendering of EEG into spectrum videos for VideoMAE", "EEG / video"),
    Paper(13, "caos", "CAOS: conformal aggregation of one-shot predictors", "uncertainty"),
    Paper(14, "front", "FRONT: frequency-domain knowledge transfer (DCT learngene)", "weight transfer"),
    Paper(15, "unpaired_iv", "Unpaired IV: causal effects from unpaired data across many environments", "causal inference"),
    Paper(16, "weightspace", "Expressivity of permutation-equivariant weight-space networks", "weight-space learning"),
    Paper(17, "atha", "ATHA: adaptive tail-head alignment for CLIP cross-domain few-shot", "vision-language"),
    Paper(18, "dirclip", "Dirichlet adversarial fine-tuning of CLIP for calibrated robustness", "vision-language"),
    Paper(19, "cfr", "CFR: crossmodal feature replacer for RGB+3D few-shot anomaly detection", "anomaly detection"),
)  # fmt: skip
