"""Memory-fit advisor: will a model fit one card, a data-parallel pair or a sharded pair of a hardware class?

Pure Python, no Django: an *estimate* for the booking page, not a guarantee. Every figure is per card, in
GB = 10^9 bytes (decimal gigabytes, the unit of the card capacities 180 / 141 / 192 GB used here).

The two cards of a pair are never treated as one allocation: 2 × 180 GB is not a 360 GB card. Every option is
judged on what *one* card must hold (data parallel: a full copy each; sharded: a share of the model states each,
plus the activations of its own micro-batch, which sharding does not divide).

Sources (see docs/fit.md for the formulas written out and the worked examples):

* ZeRO, Rajbhandari et al. 2020, arXiv:1910.02054, section 3.1: mixed-precision Adam keeps 16 bytes per
  parameter: 2 (fp16/bf16 weights) + 2 (fp16/bf16 gradients) + 12 (fp32 master weights 4, momentum 4, variance 4);
  stage 3 (section 5.3, figure 1) partitions all three over the N_d data-parallel ranks: 16·Ψ/N_d per rank.
* Korthikanti et al. 2022, "Reducing Activation Recomputation in Large Transformer Models", arXiv:2205.05198,
  section 4.1, equation (1): activations of one transformer layer, 16-bit, no recomputation, no parallelism:
  s·b·h·(34 + 5·a·s/h) bytes.
* Hugging Face transformers docs, "Model training anatomy" (model_memory_anatomy) and "Efficient training on a
  single GPU" (perf_train_gpu_one): weights, gradients, optimizer states (AdamW 8 bytes, SGD momentum 4 bytes per
  parameter in fp32), forward activations, temporary buffers.
* KV cache of autoregressive decoding: 2 (K and V) · layers · kv_heads · head_dim · sequence · batch · bytes
  (with grouped-query attention kv_heads < attention heads: Ainslie et al. 2023, arXiv:2305.13245).
* Adafactor: Shazeer & Stern 2018, arXiv:1804.04235 (factored second moment, O(rows + columns) per matrix).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from enum import StrEnum

GB = 10**9
"""Bytes in one GB. Decimal, like the card capacities (an H200 has 141 GB = 141·10^9 bytes)."""

FITS_PERCENT = 85
"""At most this percentage of a card: "fits". Above it and up to the whole card: "tight". Beyond: "does not fit"."""

DEFAULT_HEAD_DIM = 128
"""Head dimension assumed for the attention term of the activation formula when `head_dim` is not given
(Llama 2/3, Mistral, Qwen 2 and GPT-3 175B all use 128)."""

ADAFACTOR_STATE_EQUIVALENTS = 0.5
"""Full-size optimizer states counted for Adafactor (AdamW counts 2, SGD with momentum 1).

Adafactor (Shazeer & Stern 2018, arXiv:1804.04235, section 3) keeps, for an r×c weight matrix, only the row and
column sums of the second moment: r + c numbers instead of r·c, i.e. about 2/h of a state per parameter for an h×h
matrix (≈ 0.05 % at h = 4096), and drops the first moment by default (`beta1=None` in transformers and in
`torch.optim.Adafactor`). Vectors (biases, norms) keep a full second moment, `factored=False` or `beta1` set
(which adds a full first moment: ≥ 1 state) are common in practice. 0.5 sits between the pure factored case (≈ 0)
and Adafactor with momentum (≈ 1): a deliberately conservative allowance, documented, not a measurement."""

MAX_PARAMETERS_BILLION = 10_000.0
MAX_SHAPE = 10**7
MAX_DIRECT_GB = 10**6
MAX_CARDS = 1024

HYPOTHESES = frozenset({"bigger_batch", "shorter_step", "make_possible", "compare_hyperparameters", "other"})
"""The codes of booking.models.Hypothesis, repeated here so that this module stays free of Django."""

RECOMMENDATIONS = (
    "one_h200_enough",
    "b200_single_card",
    "b200_pair_sharded",
    "mi300x_pair_sharded",
    "does_not_fit",
)
"""Every recommendation code `advise` can return, in the order it tries them."""


class Mode(StrEnum):
    TRAINING = "training"
    INFERENCE = "inference"


class Precision(StrEnum):
    FP32 = "fp32"
    BF16 = "bf16"
    FP8 = "fp8"

    @property
    def bytes(self) -> int:
        """Bytes per value: fp32 4, bf16 2, fp8 1."""
        return _PRECISION_BYTES[self]


_PRECISION_BYTES = {Precision.FP32: 4, Precision.BF16: 2, Precision.FP8: 1}


class Optimizer(StrEnum):
    ADAMW = "adamw"
    SGD_MOMENTUM = "sgd_momentum"
    ADAFACTOR = "adafactor"
    NONE = "none"

    @property
    def states(self) -> float:
        """Full-size states kept per parameter: AdamW 2 (momentum, variance: ZeRO section 3.1; HF "Model training
        anatomy": 8 bytes in fp32), SGD with momentum 1 (HF: 4 bytes in fp32), Adafactor
        `ADAFACTOR_STATE_EQUIVALENTS` (factored, see there), none 0."""
        return _OPTIMIZER_STATES[self]


_OPTIMIZER_STATES = {
    Optimizer.ADAMW: 2.0,
    Optimizer.SGD_MOMENTUM: 1.0,
    Optimizer.ADAFACTOR: ADAFACTOR_STATE_EQUIVALENTS,
    Optimizer.NONE: 0.0,
}


class Verdict(StrEnum):
    FITS = "fits"
    TIGHT = "tight"
    DOES_NOT_FIT = "does_not_fit"


_SHAPE_FIELDS = ("batch", "sequence", "hidden", "layers")


@dataclass(frozen=True)
class FitInput:
    """What the researcher tells us about the run. Checked on construction (ValueError with an English message).

    Activations: either `activations_gb` (a measured figure, used as given) or the shape `batch`, `sequence`,
    `hidden`, `layers` (all four or none; `head_dim` optional, default `DEFAULT_HEAD_DIM`). When both are given the
    direct figure wins and the shape is still used for the KV cache.

    KV cache (inference only): `kv_cache_gb`, or computed from `kv_heads` and `head_dim` with the shape's
    `layers`, `sequence` and `batch`. The direct figure wins when both are given.

    Inconsistent but harmless combinations are ignored and said so in `Advice.reasons`: an optimizer, master weights
    or checkpointing in inference (nothing is trained), a KV cache in training (nothing is cached).
    """

    parameters_billion: float
    mode: Mode
    weight_precision: Precision
    optimizer_precision: Precision
    optimizer: Optimizer
    activations_gb: float | None = None
    batch: int | None = None
    sequence: int | None = None
    hidden: int | None = None
    layers: int | None = None
    checkpointing_factor: float = 1.0
    kv_cache_gb: float | None = None
    kv_heads: int | None = None
    head_dim: int | None = None
    reserve_fraction: float = 0.10
    master_weights: bool = True

    def __post_init__(self) -> None:
        for name, enum in (
            ("mode", Mode),
            ("weight_precision", Precision),
            ("optimizer_precision", Precision),
            ("optimizer", Optimizer),
        ):
            value = getattr(self, name)
            try:
                object.__setattr__(self, name, enum(value))
            except ValueError:
                allowed = ", ".join(member.value for member in enum)
                raise ValueError(f"{name} must be one of {allowed}; got {value!r}.") from None
        _check_number(
            "parameters_billion", self.parameters_billion, low=0.0, high=MAX_PARAMETERS_BILLION, low_inclusive=False
        )
        for name in (*_SHAPE_FIELDS, "kv_heads", "head_dim"):
            _check_count(name, getattr(self, name))
        for name in ("activations_gb", "kv_cache_gb"):
            if getattr(self, name) is not None:
                _check_number(name, getattr(self, name), low=0.0, high=MAX_DIRECT_GB)
        _check_number("checkpointing_factor", self.checkpointing_factor, low=0.01, high=1.0)
        _check_number("reserve_fraction", self.reserve_fraction, low=0.0, high=0.5)
        if not isinstance(self.master_weights, bool):
            raise ValueError(f"master_weights must be True or False; got {self.master_weights!r}.")
        given = [name for name in _SHAPE_FIELDS if getattr(self, name) is not None]
        if given and len(given) != len(_SHAPE_FIELDS):
            missing = ", ".join(name for name in _SHAPE_FIELDS if name not in given)
            raise ValueError(
                f"The activation shape needs all of batch, sequence, hidden and layers; missing: {missing}. "
                "Give all four, or none and a direct activations_gb figure."
            )
        if self.kv_heads is not None and self.head_dim is None:
            raise ValueError("kv_heads needs head_dim to compute the KV cache; give both, or a direct kv_cache_gb.")
        if self.kv_heads is not None and not given and self.kv_cache_gb is None and self.mode is Mode.INFERENCE:
            raise ValueError(
                "The KV cache from kv_heads and head_dim also needs layers, sequence and batch (the activation "
                "shape: batch, sequence, hidden, layers); give them, or a direct kv_cache_gb."
            )

    @property
    def has_shape(self) -> bool:
        return self.batch is not None


def _check_number(name: str, value: object, *, low: float, high: float, low_inclusive: bool = True) -> None:
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise ValueError(f"{name} must be a finite number; got {value!r}.")
    too_low = value < low if low_inclusive else value <= low
    if too_low or value > high:
        lower = "from" if low_inclusive else "above"
        raise ValueError(f"{name} must be {lower} {low:g} up to {high:g}; got {value!r}.")


def _check_count(name: str, value: object) -> None:
    if value is None:
        return
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"{name} must be a whole number; got {value!r}.")
    if not 1 <= value <= MAX_SHAPE:
        raise ValueError(f"{name} must be from 1 up to {MAX_SHAPE:,}; got {value!r}.")


def _check_cards(cards: object) -> int:
    if isinstance(cards, bool) or not isinstance(cards, int) or not 1 <= cards <= MAX_CARDS:
        raise ValueError(f"cards must be a whole number from 1 up to {MAX_CARDS}; got {cards!r}.")
    return cards


@dataclass(frozen=True)
class Breakdown:
    """Memory one card must hold, in GB (10^9 bytes). `total_gb` is the sum of the other six."""

    weights_gb: float
    gradients_gb: float
    optimizer_gb: float
    activations_gb: float
    kv_cache_gb: float
    reserve_gb: float
    total_gb: float


@dataclass(frozen=True)
class Option:
    """One way of running on a class: "single_card", "data_parallel_pair" or "sharded_pair"."""

    name: str
    breakdown: Breakdown
    card_gb: float
    verdict: Verdict


@dataclass(frozen=True)
class ClassFit:
    hardware: str
    card_gb: float
    cards: int
    options: list[Option]

    def option(self, name: str) -> Option | None:
        return next((option for option in self.options if option.name == name), None)


@dataclass(frozen=True)
class Advice:
    """`recommendation` is one of `RECOMMENDATIONS`; `reasons` in the language fit_advice.set_translation gives (English
    without it); `hypothesis_advice` in English (the templates say it from its code)."""

    fits: list[ClassFit]
    recommendation: str
    reasons: list[str]
    hypothesis_advice: str | None


# --- the parts ------------------------------------------------------------------------------------------------


def weights_gb(inp: FitInput) -> float:
    """Model weights: parameters × bytes of `weight_precision` (HF "Model training anatomy": weights).
    P billion parameters × B bytes = P·B GB, since 10^9 parameters × B bytes / 10^9 bytes per GB = B."""
    return inp.parameters_billion * inp.weight_precision.bytes


def gradients_gb(inp: FitInput) -> float:
    """Training only: one gradient per parameter (ZeRO section 3.1: 2Ψ bytes in fp16/bf16), stored at the weight
    precision but never below 16 bits: FP8 recipes (Micikevicius et al. 2022, arXiv:2209.05433; NVIDIA
    Transformer Engine) compute in fp8 but keep weight gradients in bf16 or fp32. Inference: 0."""
    if inp.mode is Mode.INFERENCE:
        return 0.0
    return inp.parameters_billion * max(inp.weight_precision.bytes, 2)


def optimizer_gb(inp: FitInput) -> float:
    """Training only: optimizer states plus the fp32 master weights of mixed precision.

    states = parameters × `Optimizer.states` × bytes of `optimizer_precision` (AdamW 2 states: momentum and
    variance; SGD momentum 1; Adafactor `ADAFACTOR_STATE_EQUIVALENTS`; none 0).
    master = parameters × 4 bytes, when `master_weights` and the weights are below fp32 (ZeRO section 3.1 counts
    the fp32 master copy among the optimizer states: K = 12 = 4 master + 4 momentum + 4 variance).
    Mixed-precision AdamW thus gives 2 + 2 + 12 = 16 bytes per parameter with the weights and gradients.
    Inference: 0 (no optimizer runs; the `optimizer` field is ignored).
    """
    if inp.mode is Mode.INFERENCE:
        return 0.0
    states = inp.parameters_billion * inp.optimizer.states * inp.optimizer_precision.bytes
    master = inp.parameters_billion * 4 if _keeps_master_weights(inp) else 0.0
    return states + master


def _keeps_master_weights(inp: FitInput) -> bool:
    return inp.mode is Mode.TRAINING and inp.master_weights and inp.weight_precision is not Precision.FP32


def activations_gb(inp: FitInput) -> float:
    """Activations kept for the backward pass, per card, for the per-card micro-batch `batch`.

    Direct figure: `activations_gb` as given (a measurement already includes any checkpointing).
    From the shape, training: Korthikanti et al. 2022 (arXiv:2205.05198) section 4.1, equation (1), bytes per
    layer, 16-bit, no recomputation, no tensor or sequence parallelism:
        s·b·h·(34 + 5·a·s/h)      with a·s/h = s/head_dim, since h = a·head_dim,
    times `layers`, times `checkpointing_factor` (the fraction kept: 1 = nothing recomputed; full recomputation
    keeps only each layer's input, 2·s·b·h of 34·s·b·h + ..., hence the suggested 0.2 and below), times 2 when the
    weights are fp32 (the formula counts 2-byte values and 1-byte dropout masks; fp8 recipes keep 16-bit
    activations, so fp8 counts as bf16). The formula covers the transformer layers only, not the embedding or the
    logits (s·b·vocab), and assumes the attention scores are stored: FlashAttention or selective recomputation drop
    the 5·a·s/h term, so the figure is an upper bound for modern kernels; give a measured `activations_gb` then.
    From the shape, inference: 0. Nothing is kept for a backward pass; the transient working set of one layer at a
    time (FlashAttention, logits of the last token only) is left to the reserve. Give `activations_gb` otherwise.
    """
    if inp.activations_gb is not None:
        return float(inp.activations_gb)
    if not inp.has_shape or inp.mode is Mode.INFERENCE:
        return 0.0
    head_dim = inp.head_dim or DEFAULT_HEAD_DIM
    per_layer = inp.sequence * inp.batch * inp.hidden * (34 + 5 * inp.sequence / head_dim)
    scale = 2 if inp.weight_precision is Precision.FP32 else 1
    return per_layer * inp.layers * inp.checkpointing_factor * scale / GB


def kv_cache_gb(inp: FitInput) -> float:
    """Inference only: keys and values of every layer for every token of the batch.

    2 (K and V) · layers · kv_heads · head_dim · sequence · batch · bytes of `weight_precision` (the cache is kept
    at the compute precision; an fp8 cache stores 1 byte), or the direct `kv_cache_gb`. Training: 0.
    """
    if inp.mode is Mode.TRAINING:
        return 0.0
    if inp.kv_cache_gb is not None:
        return float(inp.kv_cache_gb)
    if inp.kv_heads is None or not inp.has_shape:
        return 0.0
    kv_bytes = 2 * inp.layers * inp.kv_heads * inp.head_dim * inp.sequence * inp.batch * inp.weight_precision.bytes
    return kv_bytes / GB


def _breakdown(inp: FitInput, *, shards: int) -> Breakdown:
    """Model states (weights, gradients, optimizer) divided by `shards`; activations and KV cache never. The
    reserve is `reserve_fraction` of the rest (CUDA context, allocator fragmentation, temporary buffers: HF
    "Model training anatomy")."""
    weights = weights_gb(inp) / shards
    gradients = gradients_gb(inp) / shards
    optimizer = optimizer_gb(inp) / shards
    activations = activations_gb(inp)
    kv_cache = kv_cache_gb(inp)
    subtotal = weights + gradients + optimizer + activations + kv_cache
    reserve = subtotal * inp.reserve_fraction
    return Breakdown(
        weights_gb=weights,
        gradients_gb=gradients,
        optimizer_gb=optimizer,
        activations_gb=activations,
        kv_cache_gb=kv_cache,
        reserve_gb=reserve,
        total_gb=subtotal + reserve,
    )


# --- the three ways to run ------------------------------------------------------------------------------------


def memory_single_card(inp: FitInput) -> Breakdown:
    """Everything on one card: weights + gradients + optimizer (ZeRO section 3.1, 16 bytes per parameter for
    mixed-precision AdamW) + activations (Korthikanti et al. 2022, eq. 1) + KV cache + reserve."""
    return _breakdown(inp, shards=1)


def memory_data_parallel(inp: FitInput, *, cards: int = 2) -> Breakdown:
    """Data parallelism (DDP): every card keeps a full copy of weights, gradients and optimizer states (ZeRO,
    sections 1 and 2: plain data parallelism replicates the whole model states on every device) and runs its own
    micro-batch.

    Per-card memory is therefore the single-card figure, whatever `cards` is: with the same `batch` per card the
    activations are the same too. Data parallelism saves no memory; it buys a `cards`× bigger global batch or,
    at the same global batch, a shorter step. (DDP's gradient buckets are left to the reserve.)"""
    _check_cards(cards)
    return _breakdown(inp, shards=1)


def memory_sharded(inp: FitInput, *, cards: int = 2) -> Breakdown:
    """Fully sharded (FSDP / ZeRO stage 3, Rajbhandari et al. 2020 section 5.3 and figure 1: model states
    (2 + 2 + K)·Ψ/N_d per card): weights, gradients and optimizer states divided by `cards`.

    Not divided: activations (each card runs its own micro-batch `batch` and keeps its activations) and, in
    inference, the KV cache: counted in full on each card, the conservative case (pipeline stages or data-parallel
    replicas each hold the cache of their own sequences; tensor parallelism could split it by KV head, which this
    estimate does not assume). The transient all-gather of one layer's full weights is left to the reserve."""
    return _breakdown(inp, shards=_check_cards(cards))


def verdict(*, total_gb: float, card_gb: float) -> Verdict:
    """fits: total ≤ 85 % of the card (`FITS_PERCENT`); tight: ≤ 100 %; otherwise does not fit.

    The 15 % margin absorbs what the estimate leaves out (allocator peaks, library workspaces, logits)."""
    _check_number("card_gb", card_gb, low=0.0, high=MAX_DIRECT_GB, low_inclusive=False)
    _check_number("total_gb", total_gb, low=0.0, high=math.inf)
    if total_gb * 100 <= card_gb * FITS_PERCENT:
        return Verdict.FITS
    if total_gb <= card_gb:
        return Verdict.TIGHT
    return Verdict.DOES_NOT_FIT
