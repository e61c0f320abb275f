"""nodekit/preflight.py, run as the node runs it: the shipped single file (nodekit.bundle) alone in a directory,
a subprocess, one JSON report on stdout, an exit status.

The CI machine has no GPU and no nvidia-smi but has a CPU torch: the run must fail cleanly (no GPU), with the gloo
all-reduce between two CPU processes measured anyway. Fake nvidia-smi / rocm-smi scripts prove the parsers, a
shadowing `torch` package and `python -I -S` prove a missing or broken torch is a FAIL and never a crash, and a
`sitecustomize` that hangs the worker or the all-reduce ranks proves --timeout kills them and still reports.
"""

import ast
import importlib.util
import io
import json
import os
import re
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

from tests.builders.extensions import build_extension, fatbin, offload_bundle
from tests.nodekit.shipped import load_shipped, shipped_script

SCRIPT = shipped_script("preflight")
NODE_ARGS = ["--gpus", "0,1", "--expect-arch", "sm_100", "--expect-vendor", "nvidia"]
SMALL = ["--matmul-size", "256", "--allreduce-mb", "4"]
CHECK_NAMES = [
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
]
TORCH_MISSING = (
    "torch is not importable by {python}: `make test` installs it (torch==2.13.0, the CPU build, from the extra "
    "in pyproject.toml); "
    "these tests exercise the CPU gloo all-reduce and must not be skipped"
)


preflight = load_shipped("preflight")


def _env(path_dir: Path, **extra: str) -> dict:
    """The node's environment, minus what would make the run depend on this machine: no GPU tools on PATH, no
    visible-devices filtering, no PYTHONPATH, unless a test sets them."""
    env = {key: value for key, value in os.environ.items() if key not in (*preflight.ENV_KEYS, "PYTHONPATH")}
    env["PATH"] = str(path_dir)
    env.update(extra)
    return env


def run_preflight(tmp_path: Path, *args: str, flags=(), env=None, timeout=180) -> subprocess.CompletedProcess:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    return subprocess.run(
        [sys.executable, *flags, str(SCRIPT), *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=env if env is not None else _env(bin_dir),
        cwd=tmp_path,
        check=False,
    )


def parse_report(result: subprocess.CompletedProcess) -> dict:
    """stdout is exactly one JSON document with the binome.preflight/1 shape."""
    try:
        report = json.loads(result.stdout)
    except ValueError:
        pytest.fail(f"stdout is not one JSON document:\n{result.stdout}\n--- stderr:\n{result.stderr}")
    assert report["schema"] == "binome.preflight/1"
    for key in (
        "started_at",
        "duration_s",
        "hostname",
        "python",
        "requested",
        "environment",
        "gpu",
        "stack",
        "results",
        "checks",
        "summary",
    ):
        assert key in report, key
    assert report["started_at"].endswith("Z")
    assert set(report["environment"]) >= {"CUDA_VISIBLE_DEVICES", "ROCR_VISIBLE_DEVICES", "HIP_VISIBLE_DEVICES"}
    assert set(report["gpu"]) >= {"tool", "count", "models", "driver", "memory_total_mib"}
    assert set(report["stack"]) >= {"torch", "cuda", "hip", "arch_list", "device_capabilities"}
    assert set(report["results"]) >= {
        "bf16_matmul_tflops",
        "allreduce_busbw_gbps",
        "allreduce_backend",
        "peak_memory_mib",
    }
    assert [check["name"] for check in report["checks"]] == CHECK_NAMES
    for check in report["checks"]:
        assert check["status"] in ("PASS", "FAIL", "SKIP", "WARN")
        assert check["reason"], check
        assert isinstance(check["duration_s"], int | float)
    statuses = [check["status"] for check in report["checks"]]
    summary = report["summary"]
    assert summary["status"] == ("FAIL" if "FAIL" in statuses else "PASS")
    assert (summary["passed"], summary["failed"], summary["skipped"], summary["warnings"]) == (
        statuses.count("PASS"),
        statuses.count("FAIL"),
        statuses.count("SKIP"),
        statuses.count("WARN"),
    )
    assert result.returncode == (1 if summary["status"] == "FAIL" else 0)
    return report


def checks_of(report: dict) -> dict:
    return {check["name"]: check for check in report["checks"]}


def fake_tool(bin_dir: Path, name: str, output: str) -> Path:
    """An executable `name` on PATH that logs its arguments and prints `output`."""
    bin_dir.mkdir(exist_ok=True)
    log = bin_dir / f"{name}.log"
    tool = bin_dir / name
    # shell builtins only: PATH holds nothing but the fakes
    tool.write_text(
        f'#!/bin/sh\necho "$*" >> "{log}"\nwhile IFS= read -r line; do printf "%s\\n" "$line"; done <<\'EOF\'\n'
        f"{output}\nEOF\n"
    )
    tool.chmod(0o755)
    return log


B200_ROWS = (
    "0, GPU-11111111-2222-3333-4444-555555555555, NVIDIA B200, 570.124.06, 183359, 0, 10.0\n"
    "1, GPU-66666666-7777-8888-9999-000000000000, NVIDIA B200, 570.124.06, 183359, 0, 10.0"
)


# ----------------------------------------------------------------------------------------------------------------
# The CI path: no GPU, no nvidia-smi, a CPU torch
# ----------------------------------------------------------------------------------------------------------------


def require_torch() -> None:
    """Fail (never skip) without torch: CI must run the CPU path."""
    if importlib.util.find_spec("torch") is None:
        pytest.fail(TORCH_MISSING.format(python=sys.executable))


@pytest.fixture(scope="module")
def ci_run(tmp_path_factory):
    if importlib.util.find_spec("torch") is None:
        return None  # each test fails on its own, with the message (an error in a fixture reads as an error)
    tmp_path = tmp_path_factory.mktemp("ci")
    result = run_preflight(tmp_path, *NODE_ARGS, *SMALL)
    return result, parse_report(result)


def test_ci_path_fails_cleanly_without_a_gpu(ci_run):
    require_torch()
    result, report = ci_run
    assert result.returncode == 1
    assert report["summary"]["status"] == "FAIL"
    assert report["requested"]["gpus"] == [0, 1]
    assert report["requested"]["expect_arch"] == "sm_100"
    assert report["requested"]["expect_vendor"] == "nvidia"
    assert report["environment"]["CUDA_VISIBLE_DEVICES"] is None
    checks = checks_of(report)
    assert checks["gpu_visible"]["status"] == "FAIL"
    assert "nvidia-smi not found" in checks["gpu_visible"]["reason"]
    assert report["gpu"]["tool"] is None and report["gpu"]["count"] == 0
    assert checks["torch_import"]["status"] == "PASS"
    assert report["stack"]["torch"] and report["stack"]["cuda"] is None
    assert checks["accelerator_runtime"]["status"] == "FAIL"
    assert checks["arch_supported"]["status"] in ("FAIL", "SKIP")
    assert "sm_100" in checks["arch_supported"]["reason"]
    assert checks["bf16_matmul"]["status"] == "FAIL"
    assert checks["bf16_matmul"]["reason"].startswith("no GPU")
    assert report["results"]["bf16_matmul_tflops"] == [None, None]
    assert report["results"]["cpu_bf16_matmul_tflops"] > 0  # the diagnosis figure
    assert checks["peak_memory"]["status"] == "SKIP"


def test_ci_path_runs_the_gloo_allreduce_between_two_cpu_processes(ci_run):
    require_torch()
    _, report = ci_run
    allreduce = checks_of(report)["allreduce"]
    assert allreduce["status"] == "WARN"
    assert allreduce["reason"].startswith("CPU gloo only: no GPU")
    assert report["results"]["allreduce_backend"] == "gloo"
    assert report["results"]["allreduce_busbw_gbps"] > 0
    assert "2 ranks" in allreduce["reason"]


def test_ci_path_prints_only_json_on_stdout_and_logs_on_stderr(ci_run):
    require_torch()
    result, report = ci_run
    assert result.stdout.lstrip().startswith("{") and result.stdout.rstrip().endswith("}")
    assert "gpu_visible: FAIL" in result.stderr
    # The run's duration covers its checks, which run one after another (each rounded to the millisecond).
    checks = report["checks"]
    assert sum(check["duration_s"] for check in checks) <= report["duration_s"] + 0.001 * len(checks)


# ----------------------------------------------------------------------------------------------------------------
# nvidia-smi / rocm-smi parsing through fake tools (torch hidden with -I -S: fast, and stdlib-only proven)
# ----------------------------------------------------------------------------------------------------------------


def test_fake_nvidia_smi_with_two_gpus_passes_gpu_visible(tmp_path):
    log = fake_tool(tmp_path / "bin", "nvidia-smi", B200_ROWS)
    result = run_preflight(tmp_path, *NODE_ARGS, *SMALL, flags=("-I", "-S"))
    report = parse_report(result)
    checks = checks_of(report)
    assert checks["gpu_visible"]["status"] == "PASS", checks["gpu_visible"]
    assert report["gpu"] == {
        "tool": "nvidia-smi",
        "count": 2,
        "models": ["NVIDIA B200", "NVIDIA B200"],
        "driver": "570.124.06",
        "memory_total_mib": [183359, 183359],
    }
    assert checks["driver"]["status"] == "PASS" and "570.124.06" in checks["driver"]["reason"]
    # nvidia-smi ignores CUDA_VISIBLE_DEVICES: the script asks for the requested GPUs by index
    called = log.read_text()
    assert "-i 0,1" in called
    assert "--query-gpu=index,uuid,name,driver_version,memory.total,memory.used,compute_cap" in called
    # without torch the arch still comes from nvidia-smi's compute_cap, and matches
    assert report["stack"]["device_capabilities"] == ["sm_100", "sm_100"]
    assert checks["torch_import"]["status"] == "FAIL"
    assert checks["arch_supported"]["status"] == "SKIP"
    assert result.returncode == 1


@pytest.mark.parametrize(
    ("visible", "status", "needle"),
    [
        ("1", "FAIL", "GPU 0 hidden by CUDA_VISIBLE_DEVICES=1"),
        ("", "FAIL", "GPU 0,1 hidden by CUDA_VISIBLE_DEVICES="),
        ("1,0", "PASS", "0→cuda:1, 1→cuda:0"),
        ("GPU-66666666,GPU-11111111", "PASS", "0→cuda:1, 1→cuda:0"),  # UUID prefixes, as CUDA accepts them
        ("0,nonsense,1", "FAIL", "GPU 1 hidden"),  # CUDA stops reading the list at the first bad entry
    ],
)
def test_cuda_visible_devices_filters_what_torch_will_see(tmp_path, visible, status, needle):
    fake_tool(tmp_path / "bin", "nvidia-smi", B200_ROWS)
    env = _env(tmp_path / "bin", CUDA_VISIBLE_DEVICES=visible)
    report = parse_report(run_preflight(tmp_path, *NODE_ARGS, flags=("-I", "-S"), env=env))
    gpu_visible = checks_of(report)["gpu_visible"]
    assert gpu_visible["status"] == status
    assert needle in gpu_visible["reason"]
    assert report["environment"]["CUDA_VISIBLE_DEVICES"] == visible


def test_wrong_hardware_fails_arch_supported_even_without_torch(tmp_path):
    fake_tool(tmp_path / "bin", "nvidia-smi", B200_ROWS.replace("NVIDIA B200", "NVIDIA H200").replace("10.0", "9.0"))
    report = parse_report(run_preflight(tmp_path, *NODE_ARGS, flags=("-I", "-S")))
    arch = checks_of(report)["arch_supported"]
    assert arch["status"] == "FAIL"
    assert "GPU 0 is sm_90" in arch["reason"]


def test_fake_rocm_smi_for_an_mi300x_pair(tmp_path):
    card = {
        "Card Series": "AMD Instinct MI300X",
        "GFX Version": "gfx942",
        "VRAM Total Memory (B)": "206141652992",
        "VRAM Total Used Memory (B)": "301989888",
        "Unique ID": "0x1a2b",
    }
    document = {"card0": card, "card1": dict(card, **{"Unique ID": "0x3c4d"}), "system": {"Driver version": "6.10.5"}}
    log = fake_tool(
        tmp_path / "bin", "rocm-smi", "WARNING: AMD GPU device(s) is/are in a low-power state\n" + json.dumps(document)
    )
    args = ["--gpus", "0,1", "--expect-arch", "gfx942", "--expect-vendor", "amd"]
    report = parse_report(run_preflight(tmp_path, *args, flags=("-I", "-S")))
    checks = checks_of(report)
    assert checks["gpu_visible"]["status"] == "PASS", checks["gpu_visible"]
    assert report["gpu"]["tool"] == "rocm-smi"
    assert report["gpu"]["models"] == ["AMD Instinct MI300X"] * 2
    assert report["gpu"]["driver"] == "6.10.5"
    assert report["gpu"]["memory_total_mib"] == [196592, 196592]
    assert report["stack"]["device_capabilities"] == ["gfx942", "gfx942"]
    assert "--json" in log.read_text()


# ----------------------------------------------------------------------------------------------------------------
# torch missing or broken: a FAIL with the reason, never a crash
# ----------------------------------------------------------------------------------------------------------------


def test_python_isolated_without_site_packages_reports_torch_missing(tmp_path):
    """`python -I -S`: no site-packages, so no torch; the script must still run on the standard library alone."""
    result = run_preflight(tmp_path, *NODE_ARGS, *SMALL, flags=("-I", "-S"))
    report = parse_report(result)
    checks = checks_of(report)
    assert result.returncode == 1
    assert checks["torch_import"]["status"] == "FAIL"
    assert "ModuleNotFoundError" in checks["torch_import"]["reason"]
    for name in ("accelerator_runtime", "arch_supported", "bf16_matmul", "allreduce", "peak_memory"):
        assert checks[name]["status"] == "SKIP", checks[name]
        assert "torch" in checks[name]["reason"]
    assert report["stack"]["torch"] is None
    assert "Traceback" not in result.stderr


@pytest.mark.parametrize(
    ("body", "needle"),
    [
        ("raise ImportError('simulated: libtorch_cuda.so is missing')", "ImportError: simulated"),
        ("raise OSError('libcudart.so.12: cannot open shared object file')", "OSError: libcudart.so.12"),
        ("raise SystemExit(3)", "SystemExit"),
        ("import os, signal\nos.kill(os.getpid(), signal.SIGSEGV)", "died of SIGSEGV"),
    ],
)
def test_a_broken_torch_is_a_torch_import_failure(tmp_path, body, needle):
    shadow = tmp_path / "shadow" / "torch"
    shadow.mkdir(parents=True)
    (shadow / "__init__.py").write_text(body + "\n")
    env = _env(tmp_path / "bin", PYTHONPATH=str(shadow.parent))
    (tmp_path / "bin").mkdir()
    result = run_preflight(tmp_path, *NODE_ARGS, *SMALL, env=env)
    report = parse_report(result)
    checks = checks_of(report)
    assert result.returncode == 1
    assert checks["torch_import"]["status"] == "FAIL"
    assert needle in checks["torch_import"]["reason"]
    assert all(checks[name]["status"] == "SKIP" for name in CHECK_NAMES[3:])


def test_the_module_imports_only_the_standard_library():
    tree = ast.parse(SCRIPT.read_text(encoding="utf-8"))
    top_level = set()
    for node in tree.body:
        if isinstance(node, ast.Import):
            top_level |= {alias.name.split(".")[0] for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            top_level.add((node.module or "").split(".")[0])
    assert top_level - {"__future__"} <= set(sys.stdlib_module_names), top_level - set(sys.stdlib_module_names)


# ----------------------------------------------------------------------------------------------------------------
# Bad arguments: exit 2, a message on stderr, nothing on stdout
# ----------------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--expect-arch", "sm_100", "--expect-vendor", "nvidia"], "--gpus"),
        (["--gpus", "0,a", "--expect-arch", "sm_100", "--expect-vendor", "nvidia"], "GPU indices"),
        (["--gpus", "0,0", "--expect-arch", "sm_100", "--expect-vendor", "nvidia"], "repeat"),
        (["--gpus", "0,1", "--expect-arch", "hopper", "--expect-vendor", "nvidia"], "--expect-arch"),
        (["--gpus", "0,1", "--expect-arch", "sm_100", "--expect-vendor", "amd"], "nvidia arch"),
        (["--gpus", "0,1", "--expect-arch", "gfx942", "--expect-vendor", "intel"], "invalid choice"),
        ([*NODE_ARGS, "--matmul-size", "0"], "outside"),
        ([*NODE_ARGS, "--allreduce-mb", "lots"], "expected a number"),
        ([*NODE_ARGS, "--timeout", "-5"], "outside"),
    ],
)
def test_bad_arguments_exit_2_with_a_message(tmp_path, args, message):
    result = run_preflight(tmp_path, *args, flags=("-I", "-S"))
    assert result.returncode == 2
    assert message in result.stderr
    assert result.stdout == ""


# ----------------------------------------------------------------------------------------------------------------
# --timeout: hung workers and hung all-reduce ranks are killed, the report still comes
# ----------------------------------------------------------------------------------------------------------------


def _hang(tmp_path: Path, marker: str) -> tuple[dict, Path]:
    """A sitecustomize that makes every process whose argv holds `marker` record its pid and hang."""
    site = tmp_path / "site"
    site.mkdir()
    pids = tmp_path / "pids"
    pids.mkdir()
    (site / "sitecustomize.py").write_text(
        textwrap.dedent(f"""\
        import os, sys, time
        if {marker!r} in sys.argv:
            open(os.path.join({str(pids)!r}, str(os.getpid())), "w").close()
            time.sleep(3600)
    """)
    )
    (tmp_path / "bin").mkdir()
    return _env(tmp_path / "bin", PYTHONPATH=str(site)), pids


def _assert_dead(pids: Path) -> None:
    recorded = [int(path.name) for path in pids.iterdir()]
    assert recorded, "the hang was never injected"
    for pid in recorded:
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)


def test_a_hung_worker_is_killed_at_the_timeout(tmp_path):
    """The worker hangs for an hour: killed when --timeout runs out (run_preflight's own timeout catches a real hang),
    the check that was running says so and names the --timeout given, the checks after it are skipped."""
    env, pids = _hang(tmp_path, "--_worker")
    result = run_preflight(tmp_path, *NODE_ARGS, *SMALL, "--timeout", "3", env=env, timeout=60)
    report = parse_report(result)
    checks = checks_of(report)
    assert result.returncode == 1
    assert checks["torch_import"]["status"] == "FAIL"
    assert checks["torch_import"]["reason"] == "timed out: --timeout 3 s reached during this check"
    assert all(checks[name]["status"] == "SKIP" for name in CHECK_NAMES[3:])
    _assert_dead(pids)


def test_hung_allreduce_ranks_are_killed_and_the_check_fails(tmp_path):
    require_torch()
    env, pids = _hang(tmp_path, "--multiprocessing-fork")  # torch.multiprocessing spawn children
    # the SDPA and checkpoint checks run on the CPU before the all-reduce: room for them on a loaded machine
    result = run_preflight(tmp_path, *NODE_ARGS, *SMALL, "--timeout", "25", env=env, timeout=90)
    report = parse_report(result)
    checks = checks_of(report)
    assert result.returncode == 1
    assert checks["allreduce"]["status"] == "FAIL"
    # killed at what --timeout had left for it, never more (run_preflight's own timeout catches a real hang)
    allowed = re.fullmatch(r"timed out after (\d+) s: all-reduce ranks killed", checks["allreduce"]["reason"])
    assert allowed and int(allowed.group(1)) <= 25, checks["allreduce"]["reason"]
    assert checks["peak_memory"]["status"] == "SKIP"
    _assert_dead(pids)


# ----------------------------------------------------------------------------------------------------------------
# Pure functions: arch coverage, tool parsers, visible-devices mapping
# ----------------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("target", "arch_list", "status"),
    [
        ("sm_100", ["sm_80", "sm_90", "sm_100", "sm_120"], "PASS"),
        ("sm_100", ["sm_100a"], "PASS"),  # arch-specific cubin: exactly 10.0
        ("sm_100", ["sm_100f"], "PASS"),  # family cubin: 10.x, x >= 0
        ("sm_100", ["sm_90", "compute_100"], "WARN"),  # PTX only: JIT at first launch
        ("sm_100", ["sm_80", "sm_90", "compute_90"], "WARN"),  # older PTX JITs forward
        ("sm_100", ["sm_80", "sm_86", "sm_90", "sm_90a"], "FAIL"),  # SASS never crosses a major version
        ("sm_100", ["sm_103", "sm_120", "compute_120"], "FAIL"),  # newer code never runs on older GPUs
        ("sm_100", [], "FAIL"),
        ("sm_90", ["sm_80", "sm_86", "sm_90"], "PASS"),
        ("sm_90", ["sm_90a"], "PASS"),
        ("sm_90", ["sm_80", "sm_86", "compute_86"], "WARN"),
        ("sm_90", ["sm_100", "compute_100"], "FAIL"),
        ("gfx942", ["gfx90a", "gfx942", "gfx1100"], "PASS"),
        ("gfx942", ["gfx942:xnack-"], "PASS"),
        ("gfx942:sramecc+:xnack-", ["gfx942:xnack+"], "FAIL"),  # target features must not contradict
        ("gfx942", ["gfx9-4-generic"], "WARN"),
        ("gfx942", ["gfx90a", "gfx9-generic", "gfx950"], "FAIL"),
    ],
)
def test_arch_coverage(target, arch_list, status):
    got, reason = preflight.arch_coverage(target, arch_list)
    assert got == status, reason
    assert target.split(":")[0] in reason


def test_parse_nvidia_smi_tolerates_not_available_fields():
    rows = preflight.parse_nvidia_smi("0, GPU-abc, NVIDIA H200, 550.90.07, 143771, [N/A], 9.0\nNo devices\n")
    assert rows == [
        {
            "index": 0,
            "uuid": "GPU-abc",
            "name": "NVIDIA H200",
            "driver": "550.90.07",
            "memory_total_mib": 143771,
            "memory_used_mib": None,
            "arch": "sm_90",
        }
    ]


@pytest.mark.parametrize(
    "document",
    [
        [
            {
                "gpu": 0,
                "asic": {"market_name": "AMD Instinct MI300X", "target_graphics_version": "gfx942"},
                "vram": {"size": {"value": 196592, "unit": "MB"}},
                "driver": {"name": "amdgpu", "version": "6.10.5"},
            }
        ],
        {
            "gpu_data": [
                {
                    "gpu": 0,
                    "asic": {"market_name": "AMD Instinct MI300X", "target_graphics_version": "gfx942"},
                    "vram": {"size": "196592 MB"},
                    "driver": {"version": "6.10.5"},
                }
            ]
        },
    ],
)
def test_parse_amd_smi_old_and_new_layouts(document):
    (gpu,) = preflight.parse_amd_smi(json.dumps(document))
    assert (gpu["index"], gpu["name"], gpu["arch"], gpu["memory_total_mib"], gpu["driver"]) == (
        0,
        "AMD Instinct MI300X",
        "gfx942",
        196592,
        "6.10.5",
    )


def test_amd_visible_devices_compose_rocr_then_hip():
    mapping, described = preflight.visible_mapping(
        "amd", [2, 3], {"ROCR_VISIBLE_DEVICES": "3,2,5", "HIP_VISIBLE_DEVICES": "1,0"}, {}
    )
    assert mapping == {2: 0, 3: 1}  # ROCr exposes 3,2,5 as 0,1,2; HIP keeps 1 (GPU 2) then 0 (GPU 3)
    assert "ROCR_VISIBLE_DEVICES=3,2,5" in described and "HIP_VISIBLE_DEVICES=1,0" in described
    mapping, _ = preflight.visible_mapping("amd", [0, 1], {"CUDA_VISIBLE_DEVICES": "1"}, {})
    assert mapping == {0: None, 1: 0}  # HIP honours CUDA_VISIBLE_DEVICES when HIP_VISIBLE_DEVICES is unset


def test_a_rank_that_dies_fails_the_allreduce(tmp_path):
    """An all-reduce rank that exits at start (as one that cannot open its GPU would) fails the check at once."""
    require_torch()
    site = tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text(
        "import os, sys\nif '--multiprocessing-fork' in sys.argv:\n    os._exit(7)\n"
    )
    (tmp_path / "bin").mkdir()
    env = _env(tmp_path / "bin", PYTHONPATH=str(site))
    report = parse_report(run_preflight(tmp_path, *NODE_ARGS, *SMALL, env=env))
    allreduce = checks_of(report)["allreduce"]
    assert allreduce["status"] == "FAIL"
    assert "a rank failed" in allreduce["reason"] and "exit code 7" in allreduce["reason"]
    assert report["results"]["allreduce_busbw_gbps"] is None


def test_ci_path_compares_sdpa_with_the_math_reference_on_the_cpu(ci_run):
    require_torch()
    _, report = ci_run
    sdpa = checks_of(report)["sdpa_attention"]
    assert sdpa["status"] == "WARN", sdpa
    assert sdpa["reason"].startswith("CPU only: no GPU")
    assert "dq, dk, dv" in sdpa["reason"]
    assert 0 <= report["results"]["sdpa_max_rel_error"]["float32"] <= preflight.SDPA_TOLERANCE["float32"]


def test_ci_path_saves_and_reloads_a_checkpoint_in_the_users_home(ci_run):
    require_torch()
    _, report = ci_run
    checkpoint = checks_of(report)["checkpoint_roundtrip"]
    assert checkpoint["status"] == "WARN", checkpoint
    assert "outputs and next step identical" in checkpoint["reason"]
    assert f"in {os.path.expanduser('~')}" in checkpoint["reason"]
    assert report["results"]["checkpoint_bytes"] > 100_000


def _cpu_worker():
    require_torch()
    import torch

    worker = _worker(torch)
    worker.no_gpu = "no GPU: test"
    return worker, torch


def test_a_wrong_sdpa_fails_against_the_math_reference(monkeypatch):
    worker, torch = _cpu_worker()
    assert worker.check_sdpa_attention()[0] == "WARN"
    genuine = torch.nn.functional.scaled_dot_product_attention

    def off_scale(q, k, v, **kwargs):  # a kernel that forgets 1/sqrt(d)
        return genuine(q, k, v, scale=1.0, **kwargs)

    monkeypatch.setattr(torch.nn.functional, "scaled_dot_product_attention", off_scale)
    status, reason = worker.check_sdpa_attention()
    assert status == "FAIL", reason
    assert "CPU float32: differs from the math reference (out" in reason

    def wrong_backward(q, k, v, **kwargs):  # right forward, a gradient that stops at v
        out = genuine(q.detach(), k.detach(), v, **kwargs)
        return out + 0 * (q.sum() + k.sum())

    monkeypatch.setattr(torch.nn.functional, "scaled_dot_product_attention", wrong_backward)
    status, reason = worker.check_sdpa_attention()
    assert status == "FAIL" and "(dq 1, dk 1 > 0.0005)" in reason and "dv" not in reason, reason


def test_a_checkpoint_that_loses_the_optimizer_state_fails(monkeypatch, tmp_path):
    worker, torch = _cpu_worker()
    monkeypatch.setenv("HOME", str(tmp_path))
    status, reason = worker.check_checkpoint_roundtrip()
    assert status == "WARN" and f"in {tmp_path}" in reason, reason
    assert list(tmp_path.iterdir()) == []  # the temporary directory is gone
    monkeypatch.setattr(torch.optim.AdamW, "load_state_dict", lambda self, state: None)
    status, reason = worker.check_checkpoint_roundtrip()
    assert status == "FAIL" and "the reloaded optimizer takes a different step" in reason, reason


# ----------------------------------------------------------------------------------------------------------------
# Compiled extensions: real shared objects built here, with device-code sections laid out as nvcc / clang do
# ----------------------------------------------------------------------------------------------------------------


@pytest.fixture
def site_packages(tmp_path):
    root = tmp_path / "site-packages"
    marker = tmp_path / "executed"
    build_extension(root / "flash_attn", "flash_attn_cuda", ".nv_fatbin", fatbin(("sm", 90), ("compute", 90)), marker)
    build_extension(root / "old_kernels", "_C", ".nv_fatbin", fatbin(("sm", 80)), marker)
    build_extension(root / "plain", "_speedups", ".text.extra", b"no device code here", marker)
    # NVIDIA's CUDA library wheels keep their kernels elsewhere (libcufft.so.12's .nv_fatbin holds one sm_75 cubin)
    build_extension(root / "nvidia" / "cu13" / "lib", "libcufft", ".nv_fatbin", fatbin(("sm", 75)), marker)
    return root, marker


def test_extensions_for_the_hopper_card_pass_and_fail_for_blackwell(site_packages):
    root, marker = site_packages
    scan = preflight.scan_extensions([str(root)], "sm_90", "nvidia", time.monotonic() + 30)
    assert [item["name"] for item in scan["native"]] == ["flash_attn/flash_attn_cuda.so"]
    assert [item["name"] for item in scan["missing"]] == ["old_kernels/_C.so"]
    assert scan["scanned"] == 3
    (root / "old_kernels" / "_C.so").unlink()
    status, reason = preflight.extensions_verdict(
        preflight.scan_extensions([str(root)], "sm_90", "nvidia", time.monotonic() + 30), "sm_90"
    )
    assert status == "PASS" and "flash_attn/flash_attn_cuda.so" in reason, reason
    # sm_90 cubins do not run on sm_100; the compute_90 PTX can be JIT-compiled there
    status, reason = preflight.extensions_verdict(
        preflight.scan_extensions([str(root)], "sm_100", "nvidia", time.monotonic() + 30), "sm_100"
    )
    assert status == "WARN" and "only PTX" in reason and "flash_attn_cuda.so (compute_90, sm_90)" in reason, reason
    assert not marker.exists()  # read, never loaded


def test_a_run_fails_naming_the_extension_without_code_for_the_card(tmp_path, site_packages):
    root, marker = site_packages
    result = run_preflight(tmp_path, *NODE_ARGS, *SMALL, "--site-packages", str(root))
    report = parse_report(result)
    check = checks_of(report)["compiled_extensions"]
    assert check["status"] == "FAIL", check
    assert "no code for sm_100 in old_kernels/_C.so (sm_80)" in check["reason"]
    assert "flash_attn/flash_attn_cuda.so (compute_90, sm_90)" in check["reason"]
    extensions = report["results"]["extensions"]
    assert extensions["missing"] == ["old_kernels/_C.so"] and extensions["fallback"] == [
        "flash_attn/flash_attn_cuda.so"
    ]
    assert extensions["scanned"] == 3
    assert not marker.exists()


def test_arch_specific_cubins_run_on_their_exact_arch_only(tmp_path):
    root, marker = tmp_path / "site-packages", tmp_path / "executed"
    build_extension(root, "blackwell_only", ".nv_fatbin", fatbin(("sm", 100, "a"), ("sm", 90)), marker)
    scan = preflight.scan_extensions([str(root)], "sm_100", "nvidia", time.monotonic() + 30)
    assert scan["native"] == [{"name": "blackwell_only.so", "archs": ["sm_100a", "sm_90"]}]
    # a B300 (sm_103) cannot run sm_100a code, though it runs sm_100 code
    status, reason = preflight.extensions_verdict(
        preflight.scan_extensions([str(root)], "sm_103", "nvidia", time.monotonic() + 30), "sm_103"
    )
    assert status == "FAIL" and "no code for sm_103 in blackwell_only.so (sm_100a, sm_90)" in reason, reason


def test_rocm_extensions_are_checked_by_their_offload_bundle_targets(tmp_path):
    root, marker = tmp_path / "site-packages", tmp_path / "executed"
    build_extension(root, "rocm_ext", ".hip_fatbin", offload_bundle("gfx90a", "gfx942:sramecc+:xnack-"), marker)
    scan = preflight.scan_extensions([str(root)], "gfx942", "amd", time.monotonic() + 30)
    assert preflight.extensions_verdict(scan, "gfx942")[0] == "PASS"
    status, reason = preflight.extensions_verdict(
        preflight.scan_extensions([str(root)], "gfx1100", "amd", time.monotonic() + 30), "gfx1100"
    )
    assert status == "FAIL" and "rocm_ext.so (gfx90a, gfx942:sramecc+:xnack-)" in reason, reason
    assert not marker.exists()


def test_hostile_shared_objects_are_bounded(tmp_path, monkeypatch):
    root = tmp_path / "site-packages"
    marker = tmp_path / "executed"
    # a fatbin whose header claims a size far past the section, then garbage
    build_extension(root, "liar", ".nv_fatbin", fatbin(("sm", 100))[:16] + b"\xff" * 40, marker)
    (root / "not_elf.so").write_bytes(b"MZ" + b"\0" * 100)
    (root / "link.so").symlink_to("/etc/passwd")
    scan = preflight.scan_extensions([str(root)], "sm_100", "nvidia", time.monotonic() + 30)
    assert scan["scanned"] == 2  # the link is not followed
    assert [item["name"] for item in scan["unreadable"]] == ["liar.so"]
    assert preflight.extensions_verdict(scan, "sm_100")[0] == "WARN"
    for index in range(3):
        build_extension(root / f"many{index}", "ext", ".nv_fatbin", fatbin(("sm", 100)), marker)
    monkeypatch.setattr(preflight, "EXTENSION_MAX_FILES", 2)
    scan = preflight.scan_extensions([str(root)], "sm_100", "nvidia", time.monotonic() + 30)
    assert scan["scanned"] == 2 and scan["stopped"] == "stopped after 2 shared objects"
    status, reason = preflight.extensions_verdict(scan, "sm_100")
    assert status == "WARN" and "stopped after 2 shared objects" in reason


# ----------------------------------------------------------------------------------------------------------------
# The GPU branches of the worker, against a stand-in torch (the real GPU path needs a GPU node)
# ----------------------------------------------------------------------------------------------------------------


def _fake_torch(
    *,
    cuda="12.8",
    hip=None,
    capability=(10, 0),
    arch_list=("sm_90", "sm_100", "sm_120"),
    arch_name=None,
    uuids=("11111111-2222-3333-4444-555555555555", "66666666-7777-8888-9999-000000000000"),
):
    devices = [SimpleNamespace(name="GPU", uuid=uuid, gcnArchName=arch_name) for uuid in uuids]
    return SimpleNamespace(
        __version__="2.13.0+fake",
        __file__="/opt/torch/__init__.py",
        version=SimpleNamespace(cuda=cuda, hip=hip),
        cuda=SimpleNamespace(
            is_available=lambda: True,
            device_count=lambda: len(devices),
            get_device_properties=lambda index: devices[index],
            get_device_capability=lambda index: capability,
            get_arch_list=lambda: list(arch_list),
        ),
    )


def _worker(torch, *, vendor="nvidia", arch="sm_100", driver="570.124.06", tool_arch="sm_100"):
    config = {
        "gpus": [0, 1],
        "logical": [0, 1],
        "vendor": vendor,
        "expect_arch": arch,
        "matmul_size": 256,
        "allreduce_mb": 4,
        "budget_s": 60,
        "driver": driver,
        "tool_archs": [tool_arch, tool_arch],
        "tool_uuids": ["GPU-11111111-2222-3333-4444-555555555555", "GPU-66666666-7777-8888-9999-000000000000"],
        "tool_memory_mib": [183359, 183359],
    }
    worker = preflight.Worker(config, io.StringIO())
    worker.torch = torch
    return worker


def test_worker_gpu_branches_pass_on_a_b200_pair():
    worker = _worker(_fake_torch())
    assert worker.check_accelerator_runtime()[0] == "PASS"
    status, reason = worker.check_arch_supported()
    assert status == "PASS", reason
    events = [json.loads(line) for line in worker.channel.getvalue().splitlines()]
    assert {"event": "stack", "stack": {"device_capabilities": ["sm_100", "sm_100"]}} in events
    assert {"event": "stack", "stack": {"arch_list": ["sm_90", "sm_100", "sm_120"]}} in events


def test_worker_flags_an_old_driver_a_swapped_gpu_and_the_wrong_hardware():
    status, reason = _worker(_fake_torch(), driver="520.61.05").check_accelerator_runtime()
    assert status == "FAIL" and "CUDA 12.8 needs driver >= 525.60.13" in reason
    status, reason = _worker(_fake_torch(uuids=("aaaaaaaa", "bbbbbbbb"))).check_accelerator_runtime()
    assert status == "WARN" and "CUDA_DEVICE_ORDER" in reason
    worker = _worker(_fake_torch(capability=(9, 0), arch_list=("sm_90",)), tool_arch="sm_90")
    worker.check_accelerator_runtime()
    status, reason = worker.check_arch_supported()
    assert status == "FAIL" and "GPU 0 is sm_90" in reason and "no kernels for sm_100" in reason


def test_worker_gpu_branches_on_an_mi300x_pair():
    torch = _fake_torch(cuda=None, hip="6.4.43482", arch_list=("gfx90a", "gfx942"), arch_name="gfx942:sramecc+:xnack-")
    worker = _worker(torch, vendor="amd", arch="gfx942", driver="6.10.5", tool_arch="gfx942")
    assert worker.check_accelerator_runtime()[0] == "PASS"
    status, reason = worker.check_arch_supported()
    assert status == "PASS", reason
    status, reason = _worker(_fake_torch(), vendor="amd", arch="gfx942").check_accelerator_runtime()
    assert status == "FAIL" and "a CUDA build" in reason


def test_a_hung_nvidia_smi_is_killed_within_the_timeout(tmp_path):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    pids = tmp_path / "pids"
    pids.mkdir()
    tool = bin_dir / "nvidia-smi"
    tool.write_text(
        f"#!{sys.executable}\nimport os, time\nopen(os.path.join({str(pids)!r}, str(os.getpid())), 'w')\n"
        "time.sleep(3600)\n"
    )
    tool.chmod(0o755)
    result = run_preflight(tmp_path, *NODE_ARGS, "--timeout", "3", flags=("-I", "-S"), timeout=60)
    report = parse_report(result)
    gpu_visible = checks_of(report)["gpu_visible"]
    assert gpu_visible["status"] == "FAIL"
    # killed at what --timeout left it, never more (run_preflight's own timeout catches a real hang)
    allowed = re.search(r"nvidia-smi timed out after (\d+) s", gpu_visible["reason"])
    assert allowed and int(allowed.group(1)) <= 3, gpu_visible["reason"]
    _assert_dead(pids)
