"""An archcheck report (nodekit/archcheck.py, schema ``binome.archcheck/1``) given at booking: validated with the
report framework (booking/report_schema.py, booking/hostile_json.py), kept with the order, and read against the
catalog: per hardware class, whether the researcher's compiled extensions carry code for its architecture, and for
those that do not, which to rebuild and with which flag.

The report is the researcher's word about their own machine. The portal keeps each extension's name and its
coverage per target as the tool wrote them (bounded, control characters stripped, escaped on output), and draws the
class's verdict and the rebuild flag itself, from the catalog's architecture: nothing of the report's prose is
shown as ours. Pure: standard library only, no database.
"""

from dataclasses import dataclass, field

from booking.hostile_json import load_json
from booking.report_schema import Choice, Cleaner, InvalidReport, Number, ObjectList, Text, TextList

SCHEMA = "binome.archcheck/1"
# With the longest booking form, within the multipart body the portal reads (FILE_UPLOAD_MAX_MEMORY_SIZE).
MAX_BYTES = 100_000
MAX_EXTENSIONS = 2000  # archcheck reads at most nodekit.gpu_arch.EXTENSION_MAX_FILES shared objects
# The report's keys per class, and the architecture each stands for (nodekit/archcheck.py CLASSES).
TARGETS = {"b200": "sm_100", "h200": "sm_90", "mi300x": "gfx942"}
COVERAGE = ("native", "fallback", "missing", "other_vendor", "unreadable")

_EXTENSION = {
    "name": Text(400),
    "vendor": Choice("nvidia", "amd"),
    "archs": TextList(40, 0, 12, required=False),
    **{key: Choice(*COVERAGE) for key in TARGETS},
}
REPORT = {
    "created_at": Text(40, required=False),
    "python": Text(40, required=False),
    "read": Number(0, 1e6, integer=True),
    "stopped": Text(200, required=False),
    "extensions": ObjectList(_EXTENSION, 0, MAX_EXTENSIONS),
    "unreadable": ObjectList({"name": Text(400), "why": Text(200, required=False)}, 0, MAX_EXTENSIONS, required=False),
}


def parse_report(raw: bytes, *, max_bytes: int = MAX_BYTES) -> dict:
    """A cleaned copy of an uploaded archcheck report; raises InvalidReport (a ValueError) with a code. The
    report's own `classes` section is dropped: the verdicts are drawn here (class_verdicts)."""
    data = load_json(raw, max_bytes)
    if not isinstance(data, dict):
        raise InvalidReport("wrong_schema", "the report must be a JSON object")
    if data.get("schema") != SCHEMA:
        raise InvalidReport("wrong_schema", f"this is not an archcheck report (schema must be {SCHEMA})", "schema")
    cleaner = Cleaner()
    cleaned = {"schema": SCHEMA, **cleaner.object(REPORT, {k: v for k, v in data.items() if k != "schema"}, "")}
    cleaned["validation"] = {
        "text_format": "plain",
        "markup_seen": cleaner.markup_seen,
        "dropped_keys": cleaner.dropped,
    }
    return cleaned


@dataclass(frozen=True)
class ClassVerdict:
    """What a report says of one hardware class (`architecture`, `vendor` as the catalog has them)."""

    verdict: str  # ready, fallback, not_ready, nothing_compiled, unknown (no target of the report is this one)
    missing: list[str] = field(default_factory=list)  # to rebuild with `rebuild_with`
    other_vendor: list[str] = field(default_factory=list)  # built for the other vendor only
    fallback: list[str] = field(default_factory=list)  # only PTX (compiled at first launch), or a generic object
    unreadable: list[str] = field(default_factory=list)  # compressed device code: its targets are not listed
    rebuild_with: str = ""

    @property
    def runs(self) -> bool:
        return self.verdict in ("ready", "fallback", "nothing_compiled")


def rebuild_flag(*, architecture: str, vendor: str) -> str:
    """How an extension is rebuilt with code for the architecture: sm_100 → TORCH_CUDA_ARCH_LIST="10.0"."""
    if vendor == "amd":
        return f"PYTORCH_ROCM_ARCH={architecture}"
    digits = architecture.removeprefix("sm_").rstrip("abf")
    if not digits.isdigit() or len(digits) < 2:
        return ""
    return f'TORCH_CUDA_ARCH_LIST="{digits[:-1]}.{digits[-1]}"'


def class_verdict(report: dict, *, architecture: str, vendor: str) -> ClassVerdict:
    """The report's verdict for a class of the catalog, drawn from each extension's coverage of its target."""
    key = next((key for key, target in TARGETS.items() if target == architecture), None)
    if key is None:
        return ClassVerdict(verdict="unknown")
    extensions = report.get("extensions") or []

    def named(coverage: str) -> list[str]:
        return [extension["name"] for extension in extensions if extension.get(key) == coverage]

    missing, other_vendor = named("missing"), named("other_vendor")
    fallback, unreadable = named("fallback"), named("unreadable")
    if missing or other_vendor:
        verdict = "not_ready"
    elif fallback or unreadable:
        verdict = "fallback"
    elif extensions:
        verdict = "ready"
    else:
        verdict = "nothing_compiled"
    return ClassVerdict(
        verdict=verdict,
        missing=missing,
        other_vendor=other_vendor,
        fallback=fallback,
        unreadable=unreadable,
        rebuild_with=rebuild_flag(architecture=architecture, vendor=vendor) if missing else "",
    )


def verdicts_for(report: dict, classes) -> list[tuple]:
    """(class, its verdict) for each hardware class given (anything with `architecture` and `vendor`)."""
    return [
        (hardware_class, class_verdict(report, architecture=hardware_class.architecture, vendor=hardware_class.vendor))
        for hardware_class in classes
    ]
