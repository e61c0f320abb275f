"""The pre-flight report explained in the page's language: `{% load preflight %}{% for row in report|preflight_rows %}`.

The report comes from inside the customer's container (provisioning/preflight_report.py): every value read here is
checked for its type and bounded, an unknown check or status is shown as what it is, never explained, never a 500."""

import math

from django import template
from django.utils.translation import gettext_lazy

register = template.Library()

MAX_ROWS = 40
MAX_NAME_CHARS = 64
MAX_REASON_CHARS = 400
MAX_NAMES_SHOWN = 5
STATUSES = ("PASS", "WARN", "FAIL", "SKIP")

LABELS = {
    "gpu_visible": gettext_lazy("GPUs visible"),
    "driver": gettext_lazy("GPU driver"),
    "torch_import": gettext_lazy("PyTorch import"),
    "accelerator_runtime": gettext_lazy("GPU runtime (CUDA or ROCm)"),
    "arch_supported": gettext_lazy("PyTorch built for this card"),
    "compiled_extensions": gettext_lazy("Compiled extensions built for this card"),
    "bf16_matmul": gettext_lazy("bf16 matrix multiply"),
    "sdpa_attention": gettext_lazy("Attention (SDPA), forward and backward"),
    "checkpoint_roundtrip": gettext_lazy("Checkpoint save and reload"),
    "allreduce": gettext_lazy("All-reduce between the cards"),
    "peak_memory": gettext_lazy("Peak memory"),
    "dry_run": gettext_lazy("Dry run"),
    "exit_status": gettext_lazy("The check's exit status"),
}

EXPLANATIONS = {
    ("sdpa_attention", "PASS"): gettext_lazy(
        "scaled_dot_product_attention agrees with the explicit softmax(QKᵀ/√d)·V, forward and backward, on every "
        "card (largest relative error: %(errors)s)."
    ),
    ("sdpa_attention", "WARN"): gettext_lazy(
        "Attention was checked on the processor only, because no card was usable: this says nothing of the GPU kernels."
    ),
    ("sdpa_attention", "FAIL"): gettext_lazy(
        "Attention differs from the math reference or does not run: the fused kernels of this image cannot be "
        "trusted on this card. Do not start training; tell us."
    ),
    ("checkpoint_roundtrip", "PASS"): gettext_lazy(
        "A model and its AdamW optimizer state (%(size)s MiB) were saved in your home directory and reloaded: "
        "the reloaded copy answers and trains exactly as the original."
    ),
    ("checkpoint_roundtrip", "WARN"): gettext_lazy(
        "The checkpoint round trip ran on the processor only, because no card was usable."
    ),
    ("checkpoint_roundtrip", "FAIL"): gettext_lazy(
        "Saving then reloading a checkpoint did not give back the same model or optimizer state, or your home "
        "directory is not writable: a long run could not resume from its checkpoints."
    ),
    ("compiled_extensions", "PASS"): gettext_lazy(
        "Every compiled extension with GPU code in the image (%(count)s) carries code built for %(arch)s."
    ),
    ("compiled_extensions", "WARN"): gettext_lazy(
        "Some extensions carry only portable code (PTX) for %(arch)s, compiled by the driver at first launch "
        "(a slow first step), or could not be read: %(names)s."
    ),
    ("compiled_extensions", "FAIL"): gettext_lazy(
        "These extensions have no code for %(arch)s and will fail when called on this card: %(names)s. Rebuild "
        "them for %(arch)s (TORCH_CUDA_ARCH_LIST or PYTORCH_ROCM_ARCH)."
    ),
    ("exit_status", "FAIL"): gettext_lazy(
        "The check ended in failure although its report said otherwise: the report is not believed."
    ),
    ("compiled_extensions", "SKIP"): gettext_lazy(
        "No compiled extension in the image carries GPU code: nothing to check."
    ),
}


def _text(value, limit: int) -> str:
    text = value if isinstance(value, str) else ""
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _number(value) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value) if math.isfinite(value) else None


def _figures(results: dict) -> dict:
    """The figures the explanations quote, each read defensively from the report's results."""
    errors = results.get("sdpa_max_rel_error")
    errors = errors if isinstance(errors, dict) else {}
    quoted = [
        f"{dtype} {value:.1e}"
        for dtype in ("bfloat16", "float16", "float32")
        if (value := _number(errors.get(dtype))) is not None
    ]
    size = _number(results.get("checkpoint_bytes"))
    extensions = results.get("extensions")
    extensions = extensions if isinstance(extensions, dict) else {}
    names = []
    for key in ("missing", "fallback", "unreadable"):
        listed = extensions.get(key)
        names += [_text(name, 80) for name in listed if isinstance(name, str)] if isinstance(listed, list) else []
    shown = ", ".join(names[:MAX_NAMES_SHOWN]) + (" …" if len(names) > MAX_NAMES_SHOWN else "")
    count = _number(extensions.get("native_count"))
    return {
        "errors": ", ".join(quoted) or "—",
        "size": f"{size / 2**20:.1f}" if size is not None else "—",
        "count": f"{count:.0f}" if count is not None else "—",
        "arch": _text(extensions.get("target"), 16) or "—",
        "names": shown or "—",
    }


@register.filter
def preflight_rows(report) -> list[dict]:
    """One row per check: its label and explanation in the page's language, the status, the node's own words."""
    if not isinstance(report, dict) or not isinstance(report.get("checks"), list):
        return []
    results = report.get("results") if isinstance(report.get("results"), dict) else {}
    figures = _figures(results)
    rows = []
    for check in report["checks"][:MAX_ROWS]:
        if not isinstance(check, dict):
            continue
        name = _text(check.get("name"), MAX_NAME_CHARS)
        status = check.get("status") if check.get("status") in STATUSES else "?"
        label = LABELS.get(name)
        explanation = EXPLANATIONS.get((name, status))
        rows.append(
            {
                "name": name or "?",
                "label": str(label) if label else name or "?",
                "status": status,
                "explanation": (str(explanation) % figures) if explanation else "",
                "reason": _text(check.get("reason"), MAX_REASON_CHARS),
            }
        )
    return rows
