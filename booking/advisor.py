"""The memory-fit advisor on the portal: booking/fit_advice.py's advice applied to the catalog's classes, as a small
serialisable verdict kept with the order. Reads only."""

from django.utils.translation import gettext

from booking import fit, fit_advice
from inventory.models import HardwareClass

# The reasons in the language of the request (or of the task) that asks for the advice.
fit_advice.set_translation(gettext)


def hypothesis_advice_code(advice: fit.Advice, hypothesis: str | None) -> str:
    """What the hypothesis suggests, as a code the templates translate."""
    single_fits = any(
        option.name == "single_card" and option.verdict == fit.Verdict.FITS
        for class_fit in advice.fits
        for option in class_fit.options
    )
    if hypothesis == "compare_hyperparameters":
        return "two_experiments" if single_fits else "shard"
    if hypothesis == "make_possible":
        return "shard"
    if hypothesis in ("bigger_batch", "shorter_step"):
        return "data_parallel" if single_fits else "shard"
    return ""


# What each hypothesis advice suggests the two cards share (booking.models.Sharing codes).
SUGGESTED_SHARING = {"two_experiments": "independent_runs", "data_parallel": "full_copy", "shard": "parameters_sharded"}


def advise(
    *, inputs: fit.FitInput, classes: list[HardwareClass], hypothesis: str | None, rocm_ready: bool = False
) -> dict:
    hardware = [(c.name, float(c.memory_per_card_gb), c.cards_per_lot) for c in classes] or list(
        fit_advice.DEFAULT_HARDWARE
    )
    advice = fit_advice.advise(
        inputs,
        hardware=hardware,
        hypothesis=hypothesis if hypothesis in fit.HYPOTHESES else None,
        rocm_ready=rocm_ready,
    )
    hypothesis_advice = hypothesis_advice_code(advice, hypothesis)
    return {
        "recommendation": advice.recommendation,
        "rocm_ready": rocm_ready,
        "hypothesis": hypothesis or "",
        "hypothesis_advice": hypothesis_advice,
        "suggested_sharing": SUGGESTED_SHARING.get(hypothesis_advice, ""),
        "reasons": advice.reasons,
        "classes": [
            {
                "hardware": class_fit.hardware,
                "card_gb": class_fit.card_gb,
                "options": [
                    {
                        "name": option.name,
                        "total_gb": round(option.breakdown.total_gb, 1),
                        "verdict": str(option.verdict),
                    }
                    for option in class_fit.options
                ],
            }
            for class_fit in advice.fits
        ],
    }
