"""A valid split-trial report, as the node kit writes it."""

from booking.split_trial_report import SCHEMA_V1 as SCHEMA


def _rank(rank: int) -> dict:
    return {
        "rank": rank,
        "device": f"cuda:{rank}",
        "device_name": "NVIDIA H200",
        "step_time_ms_median": 7.3,
        "step_time_ms_p90": 7.9,
        "comm_time_ms_median": 0.9,
        "comm_exposed_ms_median": 0.2,
        "comm_fraction": 0.12,
        "peak_memory_mib": 1200.5,
        "memory_total_mib": 143771.0,
        "peak_memory_percent": 0.8,
        "steps_measured": 25,
        "warmup_steps": 5,
    }


VALID = {
    "schema": SCHEMA,
    "started_at": "2025-01-01T00:00:00.000Z",
    "duration_s": 41.2,
    "environment": {
        "torch": "2.13.0+cu130",
        "device_kind": "cuda",
        "backend": "nccl",
        "device_names": ["NVIDIA H200", "NVIDIA H200"],
        "precision": "bf16",
        "examples": 512,
        "global_batch": 32,
        "steps": 30,
        "warmup_steps": 5,
    },
    "single": {
        "step_time_ms_median": 12.4,
        "step_time_ms_p90": 12.9,
        "peak_memory_mib": 2100.0,
        "steps_measured": 25,
        "warmup_steps": 5,
        "global_batch": 32,
        "examples": 512,
    },
    "pair": {
        "ranks": [_rank(0), _rank(1)],
        "step_time_ms_median": 7.3,
        "imbalance": {"flag": False, "max_over_min": 1.0, "detail": "balanced"},
    },
    "comparison": {"speedup": 1.7, "step_change_percent": 41.1, "step_change": "shorter", "comm_cost_percent": 12.0},
    "conclusion": "two cards cut the step by 41 % at 12 % communication cost; memory balanced.",
}
