"""Memory-fit advice: booking/fit.py's estimates judged for each hardware class, a recommendation among
`fit.RECOMMENDATIONS`, the reasons (translated, see below) and what the researcher's hypothesis suggests.

Pure Python, no Django, like fit.py (docs/fit.md); booking/advisor.py applies it to the catalog. The reasons'
sentences are marked for translation (`_`, which makemessages reads): booking/advisor.py gives this module Django's
gettext (`set_translation`), so the portal writes them in the page's language; used alone, they stay in English.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from booking.fit import (
    DEFAULT_HEAD_DIM,
    HYPOTHESES,
    MAX_DIRECT_GB,
    Advice,
    ClassFit,
    FitInput,
    Mode,
    Optimizer,
    Option,
    Verdict,
    _check_cards,
    _check_number,
    memory_data_parallel,
    memory_sharded,
    memory_single_card,
    verdict,
)

DEFAULT_HARDWARE: tuple[tuple[str, float, int], ...] = (
    ("NVIDIA B200 pair", 180, 2),
    ("NVIDIA H200 pair", 141, 2),
    ("AMD MI300X pair", 192, 2),
)
"""(name, GB per card, cards) of every class; the name must contain B200, H200 or MI300X for the recommendation
codes to find it."""


def class_fit(inp: FitInput, *, hardware: str, card_gb: float, cards: int) -> ClassFit:
    """Every option on one class: single card, and for two cards or more a data-parallel and a sharded pair,
    each judged against one card's `card_gb`."""
    _check_cards(cards)
    _check_number("card_gb", card_gb, low=0.0, high=MAX_DIRECT_GB, low_inclusive=False)
    breakdowns = [("single_card", memory_single_card(inp))]
    if cards >= 2:
        breakdowns.append(("data_parallel_pair", memory_data_parallel(inp, cards=cards)))
        breakdowns.append(("sharded_pair", memory_sharded(inp, cards=cards)))
    options = [
        Option(name=name, breakdown=b, card_gb=card_gb, verdict=verdict(total_gb=b.total_gb, card_gb=card_gb))
        for name, b in breakdowns
    ]
    return ClassFit(hardware=hardware, card_gb=card_gb, cards=cards, options=options)


def _find(fits: list[ClassFit], keyword: str) -> ClassFit | None:
    return next((fit for fit in fits if keyword in fit.hardware.upper()), None)


def _verdict_of(fit: ClassFit | None, option: str) -> Verdict | None:
    found = fit.option(option) if fit else None
    return found.verdict if found else None


_translate: Callable[[str], str] = str


def set_translation(translate: Callable[[str], str]) -> None:
    """The function the reasons' sentences go through (Django's gettext on the portal); English without it."""
    global _translate
    _translate = translate


def _(text: str) -> str:
    return _translate(text)


def _gb_en(value: float) -> str:
    """For `hypothesis_advice`, kept in English (the templates say it from its code, booking/advisor.py)."""
    return f"{value:,.1f} GB"


def _gb(value: float) -> str:
    return _("{value} GB").format(value=f"{value:,.1f}")


def _notes(inp: FitInput) -> list[str]:
    notes = []
    if inp.mode is Mode.INFERENCE:
        if inp.optimizer is not Optimizer.NONE:
            notes.append(
                _("Inference: the optimizer ({optimizer}) is ignored, no optimizer runs.").format(
                    optimizer=inp.optimizer.value
                )
            )
        if inp.checkpointing_factor != 1.0:
            notes.append(_("Inference: the checkpointing factor is ignored, nothing is kept for a backward pass."))
        if inp.activations_gb is None:
            notes.append(
                _(
                    "Inference: no activations are kept for a backward pass; the transient working set of one layer "
                    "is left to the reserve."
                )
            )
        if inp.kv_cache_gb is None and inp.kv_heads is None:
            notes.append(_("No KV cache figure or shape (kv_heads, head_dim) was given: the KV cache counts as 0."))
        if inp.kv_cache_gb is not None and inp.kv_heads is not None:
            notes.append(_("The direct KV cache figure was used; kv_heads and head_dim were not needed."))
    else:
        if inp.kv_cache_gb is not None or inp.kv_heads is not None:
            notes.append(_("Training: the KV cache is ignored, it exists only when generating."))
        if inp.activations_gb is None and not inp.has_shape:
            notes.append(
                _("No activation figure or shape was given: activations count as 0, so the total is a lower bound.")
            )
        if inp.activations_gb is not None and inp.checkpointing_factor != 1.0:
            notes.append(_("The direct activation figure was used as given; the checkpointing factor was not applied."))
        if inp.has_shape and inp.activations_gb is None and inp.head_dim is None:
            notes.append(
                _("Activations assume a head dimension of {head_dim} (head_dim not given).").format(
                    head_dim=DEFAULT_HEAD_DIM
                )
            )
    if inp.activations_gb is not None and inp.has_shape:
        notes.append(
            _("The direct activation figure was used; the activation shape served only for the KV cache.")
            if inp.mode is Mode.INFERENCE
            else _("The direct activation figure was used; the activation shape was not needed.")
        )
    return notes


def _class_sentence(fit: ClassFit) -> str:
    labels = {
        "single_card": _("one card"),
        "data_parallel_pair": _("data-parallel pair (a full copy per card)"),
        "sharded_pair": _("sharded pair"),
    }
    verdicts = {Verdict.FITS: _("fits"), Verdict.TIGHT: _("tight"), Verdict.DOES_NOT_FIT: _("does not fit")}
    parts = [f"{labels[o.name]} {_gb(o.breakdown.total_gb)} → {verdicts[o.verdict]}" for o in fit.options]
    head = _("{hardware} ({card} per card)").format(hardware=fit.hardware, card=_gb(fit.card_gb))
    return f"{head}: " + "; ".join(parts) + "."


def _alternatives(fits: list[ClassFit], *, recommendation: str, rocm_ready: bool) -> list[str]:
    """Classes where one card fits although the recommendation, which prefers H200 then B200, needs a pair. An
    MI300X is named only for a project that runs on ROCm."""
    if recommendation in ("one_h200_enough", "b200_single_card"):
        return []
    return [
        _("One card of the {hardware} would also fit ({needed} of {card}).").format(
            hardware=fit.hardware, needed=_gb(single.breakdown.total_gb), card=_gb(fit.card_gb)
        )
        for fit in fits
        if (single := fit.option("single_card")) is not None
        and single.verdict is Verdict.FITS
        and (rocm_ready or "MI300X" not in fit.hardware.upper())
    ]


def _hypothesis_advice(hypothesis: str | None, *, recommendation: str, target: ClassFit | None) -> str | None:
    if hypothesis is None or hypothesis == "other" or target is None:
        return None
    single = target.option("single_card")
    sharded = target.option("sharded_pair")
    single_fits = single is not None and single.verdict is Verdict.FITS
    sharded_fits = sharded is not None and sharded.verdict is not Verdict.DOES_NOT_FIT
    name = target.hardware
    if recommendation == "does_not_fit" or (not single_fits and sharded is None):
        where = (
            f"over the {name}"
            if sharded is None
            else (
                f"over the {name}: {_gb_en(sharded.breakdown.total_gb)} per card sharded, of {_gb_en(target.card_gb)}"
            )
        )
        return (
            f"The model does not fit, not even sharded {where}. Reduce the batch or the sequence, checkpoint "
            "activations, or use a lower precision or a lighter optimizer."
        )
    if hypothesis == "compare_hyperparameters":
        if single_fits:
            return (
                f"Run two independent single-card experiments on the {name}, one configuration per card, rather "
                f"than one distributed run: each needs {_gb_en(single.breakdown.total_gb)} of a "
                f"{_gb_en(target.card_gb)} card, nothing is exchanged between the cards, and each window gives two "
                "comparable results."
            )
        return (
            f"One configuration already needs both cards of the {name} (sharded, "
            f"{_gb_en(sharded.breakdown.total_gb)} per card), so two configurations cannot run side by side: "
            "compare them one after the other, or rent a second pair."
        )
    if hypothesis == "make_possible":
        if single_fits:
            return (
                f"The model already fits one card of the {name} ({_gb_en(single.breakdown.total_gb)} of "
                f"{_gb_en(target.card_gb)}): the pair is not needed to make the run possible; the second card can run "
                "another experiment or shorten this one with data parallelism."
            )
        return (
            f"Shard the weights, gradients and optimizer states over both cards of the {name} (FSDP or ZeRO "
            f"stage 3): {_gb_en(sharded.breakdown.total_gb)} per card instead of {_gb_en(single.breakdown.total_gb)} "
            "on one card. Activations are not divided by sharding."
        )
    gain = "a global batch twice as big" if hypothesis == "bigger_batch" else "a shorter step at the same batch"
    if single_fits:
        return (
            f"Use data parallelism on the {name}: each card holds a full copy "
            f"({_gb_en(single.breakdown.total_gb)} per card, as on one card), which gives {gain}, not more memory."
        )
    if sharded_fits:
        return (
            f"One card is not enough, so shard over both cards of the {name} (FSDP or ZeRO stage 3, "
            f"{_gb_en(sharded.breakdown.total_gb)} per card); sharding also gives {gain}, at the cost of gathering the "
            "weights at every layer."
        )
    return None


def advise(
    inp: FitInput,
    *,
    hardware: Sequence[tuple[str, float, int]] = DEFAULT_HARDWARE,
    hypothesis: str | None = None,
    rocm_ready: bool = False,
) -> Advice:
    """Every option on every class, and a recommendation, tried in this order:

    1. "one_h200_enough": one H200 card fits (not tight): a cheaper single-card run, no communication;
    2. "b200_single_card": one B200 card fits (not tight);
    3. "b200_pair_sharded": sharded over the B200 pair, each card fits or is tight;
    4. "mi300x_pair_sharded": sharded over the MI300X pair (192 GB per card, more than a B200), fits or tight;
    5. "does_not_fit": not even sharded.

    `hypothesis` (a booking.models.Hypothesis code) adds `hypothesis_advice`: compare_hyperparameters → two
    independent single-card experiments when one card fits; make_possible → sharding; bigger_batch and
    shorter_step → data parallelism when one card fits, else sharding; other → none.

    The MI300X is recommended only when `rocm_ready` (the researcher says the project runs on ROCm): an NVIDIA
    project does not move to AMD for memory alone. Otherwise a fit there is said as a note, not recommended.
    """
    if hypothesis is not None and hypothesis not in HYPOTHESES:
        raise ValueError(f"hypothesis must be one of {', '.join(sorted(HYPOTHESES))}; got {hypothesis!r}.")
    if not hardware:
        raise ValueError("hardware must list at least one class.")
    fits = [class_fit(inp, hardware=name, card_gb=card_gb, cards=cards) for name, card_gb, cards in hardware]
    h200, b200, mi300x = _find(fits, "H200"), _find(fits, "B200"), _find(fits, "MI300X")
    usable = (Verdict.FITS, Verdict.TIGHT)
    if _verdict_of(h200, "single_card") is Verdict.FITS:
        recommendation, target = "one_h200_enough", h200
        why = _("One H200 card is enough: a cheaper single-card run, with no communication between cards.")
    elif _verdict_of(b200, "single_card") is Verdict.FITS:
        recommendation, target = "b200_single_card", b200
        why = _("One B200 card is enough; one H200 card is not comfortably so.")
    elif _verdict_of(b200, "sharded_pair") in usable:
        recommendation, target = "b200_pair_sharded", b200
        why = _(
            "Neither one H200 nor one B200 card is comfortably enough: shard the model states over both cards of "
            "the B200 pair."
        )
    elif rocm_ready and _verdict_of(mi300x, "sharded_pair") in usable:
        recommendation, target = "mi300x_pair_sharded", mi300x
        why = _("Only the MI300X pair, with 192 GB per card, holds the model sharded over both cards.")
    elif _verdict_of(mi300x, "sharded_pair") in usable:
        recommendation, target = "does_not_fit", b200 or fits[0]
        why = _(
            "The model does not fit an NVIDIA class, not even sharded over a pair. The MI300X pair, with 192 GB per "
            "card, would hold it sharded, for a project that already runs on ROCm."
        )
    else:
        recommendation, target = "does_not_fit", b200 or fits[0]
        why = _("The model does not fit any class, not even sharded over a pair.")
    single = memory_single_card(inp)
    reasons = [
        _(
            "Estimate per card, in GB of 10^9 bytes: weights {weights}, gradients {gradients}, optimizer states "
            "{optimizer}, activations {activations}, KV cache {kv_cache}, reserve {reserve} ({reserve_percent} for "
            "the CUDA context and fragmentation): {total} on one card."
        ).format(
            weights=_gb(single.weights_gb),
            gradients=_gb(single.gradients_gb),
            optimizer=_gb(single.optimizer_gb),
            activations=_gb(single.activations_gb),
            kv_cache=_gb(single.kv_cache_gb),
            reserve=_gb(single.reserve_gb),
            reserve_percent=f"{inp.reserve_fraction:.0%}",
            total=_gb(single.total_gb),
        ),
        *_notes(inp),
        *(_class_sentence(fit) for fit in fits),
        _(
            "A pair is two separate cards, never one allocation of twice the memory: every option must fit on each "
            "card. Data parallelism keeps a full copy per card; only sharding divides the model states, and it never "
            "divides the activations."
        ),
        why,
        *_alternatives(fits, recommendation=recommendation, rocm_ready=rocm_ready),
    ]
    return Advice(
        fits=fits,
        recommendation=recommendation,
        reasons=reasons,
        hypothesis_advice=_hypothesis_advice(hypothesis, recommendation=recommendation, target=target),
    )
