"""The conclusion of a split-trial report, written by the portal in the page's language, beside the hypothesis
written at booking.

A version-2 report carries codes and figures only (nodekit/split_trial.py); everything a researcher reads is
written here, with gettext, in the language of the request. `split_trial_conclusion` is pure: it takes a report
already cleaned by booking/split_trial_report.parse_report and the order's hypothesis and sharing choice.
"""

from django.utils.translation import gettext, gettext_lazy

from booking.split_trial_report import SCHEMA, split_trial_findings

SUPPORTED_RATIO = 1.05  # below a 5 % gain, timing noise and the exchanges' cost make "supported" an overstatement

STRATEGY_LABELS = {
    "single": gettext_lazy("one card"),
    "ddp": gettext_lazy("data parallel (DDP)"),
    "fsdp": gettext_lazy("parameters sharded (FSDP)"),
    "pipeline": gettext_lazy("layers split (pipeline)"),
    "ddp_bigger_batch": gettext_lazy("data parallel at twice the global batch"),
}
STATUS_LABELS = {
    "ok": gettext_lazy("measured"),
    "out_of_memory": gettext_lazy("out of memory"),
    "failed": gettext_lazy("failed"),
    "not_applicable": gettext_lazy("not applicable (the model is not a sequence of layers)"),
}
# The run each sharing choice of the booking form is measured by.
SHARING_RUNS = {"full_copy": "ddp", "parameters_sharded": "fsdp", "layers_split": "pipeline"}


def _figure(value: float, digits: int = 1) -> str:
    from django.utils.formats import number_format

    return number_format(round(value, digits), digits)


def _verdict(hypothesis: str, report: dict, found: dict) -> tuple[str, str]:
    """(verdict code, sentence) for the order's hypothesis."""
    best = STRATEGY_LABELS[found["best"]] if found["best"] else ""
    if hypothesis == "shorter_step":
        if found["speedup"] is not None:
            values = {"ratio": _figure(found["speedup"]), "strategy": best}
            if found["speedup"] >= SUPPORTED_RATIO:
                return "supported", gettext(
                    "Shorter step: supported, %(ratio)s× at constant global batch (%(strategy)s)."
                ) % values
            return "not_supported", gettext(
                "Shorter step: not supported, %(ratio)s× at constant global batch with the best way of sharing "
                "(%(strategy)s)."
            ) % values
        if not found["fits_one_card"] and found["two_card_ok"]:
            return "not_measurable", gettext(
                "Shorter step: cannot be compared, the model does not fit one card (possible only on two cards)."
            )
        return "not_measurable", gettext("Shorter step: not measured, no run at constant global batch completed.")
    if hypothesis == "bigger_batch":
        bigger = next((run for run in report.get("runs", []) if run["strategy"] == "ddp_bigger_batch"), None)
        batch = bigger["global_batch"] if bigger else report["environment"]["global_batch"] * 2
        if found["throughput_ratio"] is not None:
            values = {"ratio": _figure(found["throughput_ratio"]), "batch": batch}
            if found["throughput_ratio"] >= SUPPORTED_RATIO:
                return "supported", gettext(
                    "Bigger global batch: supported, %(ratio)s× the examples per second of one card at a global "
                    "batch of %(batch)s."
                ) % values
            return "not_supported", gettext(
                "Bigger global batch: not supported, %(ratio)s× the examples per second of one card at a global "
                "batch of %(batch)s."
            ) % values
        return "not_measurable", gettext(
            "Bigger global batch: not measured, the one-card run or the run at twice the global batch did not complete."
        )
    if hypothesis == "make_possible":
        if found["possible_only_on_two_cards"]:
            names = ", ".join(str(STRATEGY_LABELS[name]) for name in found["two_card_ok"])
            return "supported", gettext("Make the run possible: supported, possible only on two cards (%(ways)s).") % {
                "ways": names
            }
        if found["fits_one_card"]:
            return "not_supported", gettext("Make the run possible: not supported, the model fits one card.")
        return "not_supported", gettext("Make the run possible: not supported, no way of sharing ran on two cards.")
    if hypothesis == "compare_hyperparameters":
        return "not_tested", gettext(
            "Compare hyperparameters: the kit does not test this; two independent runs, one per card, usually "
            "answer it better than one distributed run."
        )
    return "not_tested", gettext(
        "The kit does not test this hypothesis: read the figures against the measure you wrote at booking."
    )


def split_trial_conclusion(*, report: dict, hypothesis: str, sharing: str = "") -> dict:
    """The conclusion of a cleaned report, in the active language: {"verdict", "sentence", "notes"}.

    A version-1 report (the DDP-only kit) keeps the English sentence it carried."""
    if report.get("schema") != SCHEMA:
        return {"verdict": "legacy", "sentence": report.get("conclusion", ""), "notes": []}
    found = split_trial_findings(report)
    verdict, sentence = _verdict(hypothesis, report, found)
    notes = []
    if found["possible_only_on_two_cards"] and hypothesis != "make_possible":
        notes.append(gettext("The model does not fit one card: possible only on two cards."))
    runs = {run["strategy"]: run for run in report.get("runs", [])}
    chosen = runs.get(SHARING_RUNS.get(sharing, ""))
    if chosen is not None:
        values = {"strategy": STRATEGY_LABELS[chosen["strategy"]], "status": STATUS_LABELS[chosen["status"]]}
        if chosen["status"] == "ok":
            values.update(step=_figure(chosen["step_time_ms_median"]), rate=_figure(chosen["examples_per_s"], 0))
            notes.append(
                gettext(
                    "The way of sharing chosen at booking, %(strategy)s: %(step)s ms per step, %(rate)s examples "
                    "per second."
                )
                % values
            )
        else:
            notes.append(gettext("The way of sharing chosen at booking, %(strategy)s: %(status)s.") % values)
    for name, ratio in found["unbalanced"]:
        notes.append(
            gettext(
                "Unbalanced split with %(strategy)s: one card's peak memory is %(ratio)s× the other's (one nearly "
                "empty, the other saturated)."
            )
            % {"strategy": STRATEGY_LABELS[name], "ratio": _figure(ratio)}
        )
    environment = report["environment"]
    notes.append(
        gettext(
            "Held constant: %(precision)s, %(examples)s examples, global batch %(batch)s (twice that for the bigger "
            "batch run); the first %(warmup)s of %(steps)s steps discarded as warm-up."
        )
        % {
            "precision": environment["precision"],
            "examples": environment["examples"],
            "batch": environment["global_batch"],
            "warmup": environment["warmup_steps"],
            "steps": environment["steps"],
        }
    )
    if environment["device_kind"] == "cpu":
        notes.append(gettext("Measured on the CPU (two gloo processes sharing its cores): a check, not a GPU measure."))
    return {"verdict": verdict, "sentence": sentence, "notes": notes}
