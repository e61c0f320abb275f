"""What the pre-flight check's supervisor (nodekit/preflight.py) and its torch worker (nodekit/preflight_worker.py)
share: the report's schema, the checks' names and who runs each, the thresholds of their verdicts, the stderr log
and two small helpers.

Standard library only: nodekit/bundle.py inlines this module in the shipped preflight.py, which a node runs alone.
"""

from __future__ import annotations

from nodekit.common import stderr_logger

SCHEMA = "binome.preflight/1"
CHECKS = (
    "gpu_visible",
    "driver",
    "torch_import",
    "accelerator_runtime",
    "arch_supported",
    "compiled_extensions",
    "bf16_matmul",
    "sdpa_attention",
    "checkpoint_roundtrip",
    "allreduce",
    "peak_memory",
)
# compiled_extensions runs in the supervisor: it reads files only, needs no torch, and a torch crash cannot stop it
SUPERVISOR_CHECKS = ("gpu_visible", "driver", "compiled_extensions")
WORKER_CHECKS = tuple(name for name in CHECKS if name not in SUPERVISOR_CHECKS)
ENV_KEYS = ("CUDA_VISIBLE_DEVICES", "ROCR_VISIBLE_DEVICES", "HIP_VISIBLE_DEVICES", "CUDA_DEVICE_ORDER")

NVIDIA_SMI_FIELDS = "index,uuid,name,driver_version,memory.total,memory.used,compute_cap"
# Older drivers do not know compute_cap: the query falls back to the fields every nvidia-smi has.
NVIDIA_SMI_FIELDS_OLD = "index,uuid,name,driver_version,memory.total,memory.used"

# Below these a result is a WARN, never a FAIL. They are deliberately low (roughly a third of the datasheet dense
# bf16 rate; NVLink/xGMI rates far above PCIe fallback) and still uncalibrated: tune them from real runs.
MATMUL_FLOOR_TFLOPS = {"sm_100": 750.0, "sm_90": 350.0, "gfx942": 400.0}
MATMUL_FLOOR_MIN_SIZE = 4096  # smaller matrices do not fill the GPU: no floor
ALLREDUCE_FLOOR_GBPS = {"sm_100": 200.0, "sm_90": 100.0, "gfx942": 20.0}
ALLREDUCE_FLOOR_MIN_MB = 64
BUSY_MEMORY_MIB = 2048  # memory already used on a GPU before the check starts: someone else is on it
MATMUL_TOLERANCE = 5e-2  # bf16 inputs, bf16 output, possibly bf16 split-K reductions; garbage is O(1)

# Minimum NVIDIA driver for a CUDA runtime major version under minor-version compatibility.
CUDA_MIN_DRIVER = {11: (450, 80, 2), 12: (525, 60, 13), 13: (580, 65, 6)}

# SDPA against softmax(QK^T/sqrt(d))V computed in fp32: max |difference| / max |reference|, by input dtype.
SDPA_TOLERANCE = {"float32": 5e-4, "float16": 1e-2, "bfloat16": 5e-2}  # garbage is O(1)

log = stderr_logger("preflight")  # everything human-readable goes to stderr: stdout carries the JSON report only


def _round(value: float | None, digits: int = 3) -> float | None:
    return None if value is None else round(float(value), digits)


def _zip(*lists):
    """zip(strict=True) for Python 3.9, which nodes may still run."""
    if len({len(items) for items in lists}) > 1:
        raise ValueError(f"per-GPU lists of different lengths: {[len(items) for items in lists]}")
    return zip(*lists)  # noqa: B905 - lengths checked above
