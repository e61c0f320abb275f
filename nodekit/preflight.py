#!/usr/bin/env python3
"""Binôme pre-flight check: is this node fit to be handed to a researcher?

Shipped to the node on its own and run there, before the booking starts:

    python3 preflight.py --gpus 0,1 --expect-arch sm_100 --expect-vendor nvidia \
        [--matmul-size 8192] [--allreduce-mb 256] [--timeout 600]

It prints one JSON document (schema ``binome.preflight/1``) on stdout and nothing else; logs go to stderr.
Exit status: 0 when every check passed (WARN and SKIP do not fail a node), 1 when any check FAILed, 2 on bad
arguments (a message on stderr, nothing on stdout).

``--gpus`` are physical indices, as nvidia-smi / rocm-smi / amd-smi number the GPUs; the script maps them to the
indices torch sees through CUDA_VISIBLE_DEVICES (NVIDIA, under CUDA_DEVICE_ORDER=PCI_BUS_ID, which it sets when
unset so that torch and nvidia-smi number the GPUs alike) or ROCR_VISIBLE_DEVICES then HIP_VISIBLE_DEVICES (AMD).

Only the standard library is imported at module level: the node may have no torch, or a broken one. Everything that
touches torch runs in a worker process (this same file, ``--_worker``; its checks are in
nodekit/preflight_worker.py, inlined in the shipped file) that the supervisor watches: a torch that segfaults on
import, a GPU that hangs a kernel or a collective that never returns cannot take the report with it. The supervisor
kills the worker's whole process group (the all-reduce ranks included) at --timeout and still prints a complete
report, in which the check that was running says "timed out".
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import re
import selectors
import shutil
import signal
import socket
import subprocess
import sys
import time
import traceback

from nodekit.common import bounded, now_utc, short_text
from nodekit.gpu_arch import EXTENSION_NAMES_LISTED, extensions_verdict, scan_extensions, site_packages_dirs
from nodekit.gpu_tools import _is_index, parse_amd_smi, parse_nvidia_smi, parse_rocm_smi, run_tool, visible_mapping
from nodekit.preflight_checks import (
    BUSY_MEMORY_MIB,
    CHECKS,
    ENV_KEYS,
    NVIDIA_SMI_FIELDS,
    NVIDIA_SMI_FIELDS_OLD,
    SCHEMA,
    WORKER_CHECKS,
    _round,
    log,
)
from nodekit.preflight_worker import _worker_main
from nodekit.verdicts import _SEVERITY, FAIL, PASS, SKIP, WARN

# --------------------------------------------------------------------------------------------------------------
# Arguments
# --------------------------------------------------------------------------------------------------------------

_ARCH_RE = re.compile(r"^(sm_\d{2,3}|gfx[0-9a-f]{3,4})$")


def _gpu_list(text: str) -> list[int]:
    parts = [part.strip() for part in text.split(",")]
    if not parts or any(not _is_index(part) for part in parts):
        raise argparse.ArgumentTypeError(f"expected comma-separated GPU indices like 0,1, got {text!r}")
    gpus = [int(part) for part in parts]
    if len(set(gpus)) != len(gpus):
        raise argparse.ArgumentTypeError(f"GPU indices repeat in {text!r}")
    return gpus


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="preflight.py",
        description="Binôme node pre-flight check: prints one JSON report on stdout; exit 0 pass, 1 fail, 2 usage.",
    )
    parser.add_argument("--gpus", required=True, type=_gpu_list, help="physical GPU indices, e.g. 0,1")
    parser.add_argument("--expect-arch", required=True, help="sm_100 (B200), sm_90 (H200), gfx942 (MI300X), …")
    parser.add_argument("--expect-vendor", required=True, choices=("nvidia", "amd"))
    parser.add_argument("--matmul-size", type=bounded(int, 16, 65536), default=8192, help="N of the bf16 N×N matmul")
    parser.add_argument("--allreduce-mb", type=bounded(int, 1, 65536), default=256, help="all-reduce size in MiB")
    parser.add_argument("--timeout", type=bounded(float, 1.0, 86400.0), default=600.0, help="seconds, whole run")
    parser.add_argument(
        "--site-packages",
        action="append",
        metavar="DIR",
        help="where to look for compiled extensions (repeatable); default: this Python's site-packages",
    )
    return parser


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = build_parser()
    args = parser.parse_args(argv)
    args.expect_arch = args.expect_arch.strip().lower()
    if not _ARCH_RE.match(args.expect_arch):
        parser.error(f"--expect-arch: expected sm_XY[Z] or gfxNNN, got {args.expect_arch!r}")
    arch_vendor = "nvidia" if args.expect_arch.startswith("sm_") else "amd"
    if arch_vendor != args.expect_vendor:
        parser.error(f"--expect-arch {args.expect_arch} is an {arch_vendor} arch, not {args.expect_vendor}")
    return args


# --------------------------------------------------------------------------------------------------------------
# Supervisor: stdlib only, owns stdout, the deadline and the report
# --------------------------------------------------------------------------------------------------------------


class _Stop(Exception):
    """SIGTERM/SIGINT: finish the report with what we have."""


class Supervisor:
    def __init__(self, args: argparse.Namespace):
        self.args = args
        self.vendor = args.expect_vendor
        self.t0 = time.monotonic()
        self.deadline = self.t0 + args.timeout
        self.env_seen = {key: os.environ.get(key) for key in ENV_KEYS}
        self.checks: dict[str, dict] = {}
        self.tool_gpus: dict[int, dict] = {}
        self.logical: dict[int, int | None] = {gpu: gpu for gpu in args.gpus}
        self.driver: str | None = None
        self.worker: subprocess.Popen | None = None
        self.report = {
            "schema": SCHEMA,
            "started_at": now_utc(),
            "duration_s": None,
            "hostname": socket.gethostname(),
            "python": platform.python_version(),
            "requested": {
                "gpus": list(args.gpus),
                "expect_arch": args.expect_arch,
                "expect_vendor": args.expect_vendor,
                "matmul_size": args.matmul_size,
                "allreduce_mb": args.allreduce_mb,
                "timeout_s": args.timeout,
                "site_packages": list(args.site_packages or []),
            },
            "environment": dict(self.env_seen),
            "gpu": {
                "tool": None,
                "count": 0,
                "models": [],
                "driver": None,
                "memory_total_mib": [None] * len(args.gpus),
            },
            "stack": {"torch": None, "cuda": None, "hip": None, "arch_list": [], "device_capabilities": []},
            "results": {
                "bf16_matmul_tflops": [None] * len(args.gpus),
                "allreduce_busbw_gbps": None,
                "allreduce_backend": None,
                "peak_memory_mib": [None] * len(args.gpus),
            },
            "checks": [],
            "summary": {},
        }

    def remaining(self) -> float:
        return self.deadline - time.monotonic()

    def tool_timeout(self) -> float:
        return min(60.0, self.remaining() - 0.5)

    def record(self, name: str, status: str, reason: str, duration: float) -> None:
        self.checks[name] = {"name": name, "status": status, "reason": reason, "duration_s": _round(duration)}
        log(f"{name}: {status} {reason}")

    def guarded(self, name: str, check) -> None:
        started = time.monotonic()
        try:
            status, reason = check()
        except _Stop:
            raise
        except Exception as exc:
            traceback.print_exc(file=sys.stderr)
            status, reason = FAIL, f"the check itself failed: {type(exc).__name__}: {short_text(exc)}"
        self.record(name, status, reason, time.monotonic() - started)

    # -- gpu_visible ------------------------------------------------------------------------------------------

    def _query_nvidia(self) -> tuple[list[dict] | None, str]:
        ids = ",".join(str(gpu) for gpu in self.args.gpus)
        error = ""
        for fields in (NVIDIA_SMI_FIELDS, NVIDIA_SMI_FIELDS_OLD):
            # nvidia-smi ignores CUDA_VISIBLE_DEVICES: ask for the requested GPUs by index, not for the node's.
            argv = ["nvidia-smi", f"--query-gpu={fields}", "--format=csv,noheader,nounits", "-i", ids]
            result = run_tool(argv, self.tool_timeout())
            if not result["found"]:
                amd = [tool for tool in ("rocm-smi", "amd-smi") if shutil.which(tool)]
                hint = f" ({amd[0]} is: an AMD node?)" if amd else ""
                return None, f"nvidia-smi not found on PATH{hint}"
            if result["rc"] == 0:
                return parse_nvidia_smi(result["out"]), ""
            error = short_text(result["err"] or result["out"] or f"exit status {result['rc']}")
            if result["rc"] is None:  # hung (killed) or could not run: asking again would not help
                return None, f"nvidia-smi failed: {error}"
            if "compute_cap" not in error:
                break
        # One requested index the node lacks makes `-i` fail as a whole: list the node's GPUs to say which.
        listing = run_tool(
            ["nvidia-smi", f"--query-gpu={NVIDIA_SMI_FIELDS_OLD}", "--format=csv,noheader,nounits"],
            self.tool_timeout(),
        )
        if listing["rc"] == 0:
            return parse_nvidia_smi(listing["out"]), f"nvidia-smi -i {ids} failed ({error})"
        return None, f"nvidia-smi failed: {error}"

    def _query_amd(self) -> tuple[list[dict] | None, str, str | None]:
        problems = []
        attempts = (
            ("amd-smi", ["amd-smi", "static", "--asic", "--vram", "--driver", "--json"], parse_amd_smi),
            (
                "rocm-smi",
                [
                    "rocm-smi",
                    "--showproductname",
                    "--showmeminfo",
                    "vram",
                    "--showdriverversion",
                    "--showuniqueid",
                    "--json",
                ],
                parse_rocm_smi,
            ),
        )
        for tool, argv, parser in attempts:
            result = run_tool(argv, self.tool_timeout())
            if not result["found"]:
                problems.append(f"{tool} not found on PATH")
                continue
            try:
                gpus = parser(result["out"])
            except (ValueError, TypeError, AttributeError) as exc:
                problems.append(
                    f"{tool}: unreadable output ({type(exc).__name__}: {short_text(exc, 120)}; "
                    f"exit {result['rc']}: {short_text(result['err'], 120)})"
                )
                continue
            if gpus:
                return gpus, "", tool
            problems.append(f"{tool} lists no GPU ({short_text(result['err'] or result['out'], 120)})")
        return None, "; ".join(problems), None

    def check_gpu_visible(self) -> tuple[str, str]:
        gpus = self.args.gpus
        if self.vendor == "nvidia":
            rows, problem = self._query_nvidia()
            tool = "nvidia-smi" if rows is not None else None
        else:
            rows, problem, tool = self._query_amd()
        self.tool_gpus = {row["index"]: row for row in rows or []}
        uuids = {gpu: self.tool_gpus.get(gpu, {}).get("uuid") for gpu in gpus}
        self.logical, filtering = visible_mapping(self.vendor, gpus, os.environ, uuids)
        if rows is None:
            return FAIL, f"no GPU: {problem}"
        present = [gpu for gpu in gpus if gpu in self.tool_gpus]
        visible = [gpu for gpu in present if self.logical[gpu] is not None]
        self.driver = next((row["driver"] for row in self.tool_gpus.values() if row.get("driver")), None)
        self.report["gpu"] = {
            "tool": tool,
            "count": len(visible),
            "models": [self.tool_gpus[gpu]["name"] for gpu in present],
            "driver": self.driver,
            "memory_total_mib": [self.tool_gpus.get(gpu, {}).get("memory_total_mib") for gpu in gpus],
        }
        missing = [gpu for gpu in gpus if gpu not in self.tool_gpus]
        hidden = [gpu for gpu in present if self.logical[gpu] is None]
        node = ",".join(str(index) for index in sorted(self.tool_gpus)) or "none"
        problems = []
        if missing:
            problems.append(f"GPU {','.join(map(str, missing))} not on this node ({tool} lists {node}) {problem}")
        if hidden:
            problems.append(f"GPU {','.join(map(str, hidden))} hidden by {filtering}")
        if problems:
            return FAIL, f"{len(visible)} of {len(gpus)} requested GPUs visible: " + "; ".join(problems)
        if problem:  # `-i` failed, yet the node listing has every requested GPU
            return WARN, f"{len(visible)} GPUs visible, but {problem}"
        mapping = ", ".join(f"{gpu}→cuda:{self.logical[gpu]}" for gpu in gpus)
        reason = f"{len(visible)} GPUs via {tool}: {', '.join(self.report['gpu']['models'])} ({filtering}; {mapping})"
        busy = [
            f"GPU {gpu} already uses {self.tool_gpus[gpu]['memory_used_mib']} MiB"
            for gpu in gpus
            if (self.tool_gpus[gpu].get("memory_used_mib") or 0) > BUSY_MEMORY_MIB
        ]
        if busy:
            return WARN, reason + "; another process holds memory: " + "; ".join(busy)
        return PASS, reason

    # -- driver -----------------------------------------------------------------------------------------------

    def check_driver(self) -> tuple[str, str]:
        if self.vendor == "nvidia":
            if self.driver:
                return PASS, f"NVIDIA driver {self.driver}"
            with contextlib.suppress(OSError):
                with open("/proc/driver/nvidia/version", encoding="utf-8", errors="replace") as handle:
                    match = re.search(r"Kernel Module\s+(?:for \S+\s+)?([\d.]+)", handle.read())
                if match:
                    self.driver = match.group(1)
                    self.report["gpu"]["driver"] = self.driver
                    return WARN, f"NVIDIA kernel module {self.driver} (from /proc) but nvidia-smi failed"
            return FAIL, "no NVIDIA driver: no version from nvidia-smi and no /proc/driver/nvidia/version"
        if self.driver:
            return PASS, f"amdgpu driver {self.driver}"
        with contextlib.suppress(OSError):
            with open("/sys/module/amdgpu/version", encoding="utf-8") as handle:
                self.driver = handle.read().strip() or None
            if self.driver:
                self.report["gpu"]["driver"] = self.driver
                return WARN, f"amdgpu {self.driver} (/sys/module/amdgpu/version) but no GPU tool answered"
        if os.path.exists("/dev/kfd"):
            return WARN, "/dev/kfd exists (amdgpu loaded) but its version is unknown"
        return FAIL, "no AMD driver: no version from amd-smi/rocm-smi, no /sys/module/amdgpu, no /dev/kfd"

    # -- compiled_extensions ----------------------------------------------------------------------------------

    def check_compiled_extensions(self) -> tuple[str, str]:
        roots = [os.path.realpath(path) for path in self.args.site_packages or []] or site_packages_dirs()
        if not roots:
            return SKIP, "no site-packages directory found"
        budget = min(120.0, max(self.remaining() * 0.2, 1.0))
        scan = scan_extensions(roots, self.args.expect_arch, self.vendor, time.monotonic() + budget)
        self.report["results"]["extensions"] = {
            "target": self.args.expect_arch,
            "roots": roots[:8],
            "scanned": scan["scanned"],
            "stopped": scan["stopped"],
            **{
                key: [item["name"] for item in scan[key][:EXTENSION_NAMES_LISTED]]
                for key in ("missing", "fallback", "unreadable")
            },
            "native_count": len(scan["native"]),
            "missing_count": len(scan["missing"]),
            "fallback_count": len(scan["fallback"]),
        }
        return extensions_verdict(scan, self.args.expect_arch)

    # -- the worker -------------------------------------------------------------------------------------------

    def worker_config(self) -> dict:
        remaining = self.remaining()
        return {
            "gpus": list(self.args.gpus),
            "logical": [self.logical.get(gpu) for gpu in self.args.gpus],
            "vendor": self.vendor,
            "expect_arch": self.args.expect_arch,
            "matmul_size": self.args.matmul_size,
            "allreduce_mb": self.args.allreduce_mb,
            # the worker stops its own work (and its all-reduce ranks) a little before we would kill it
            "budget_s": max(remaining - min(5.0, max(1.0, 0.1 * remaining)), 0.5),
            "driver": self.driver,
            "tool_archs": [self.tool_gpus.get(gpu, {}).get("arch") for gpu in self.args.gpus],
            "tool_uuids": [self.tool_gpus.get(gpu, {}).get("uuid") for gpu in self.args.gpus],
            "tool_memory_mib": [self.tool_gpus.get(gpu, {}).get("memory_total_mib") for gpu in self.args.gpus],
        }

    def _merge(self, event: dict) -> None:
        kind = event.get("event")
        if kind == "check" and isinstance(event.get("check"), dict) and event["check"].get("name") in WORKER_CHECKS:
            check = event["check"]
            self.record(
                check["name"],
                check.get("status") if check.get("status") in _SEVERITY else FAIL,
                str(check.get("reason", "")),
                float(check.get("duration_s") or 0),
            )
        elif kind in ("stack", "results", "gpu") and isinstance(event.get(kind), dict):
            self.report[kind].update(event[kind])

    def run_worker(self) -> None:
        read_fd, write_fd = os.pipe()
        worker_env = dict(os.environ)
        if self.vendor == "nvidia":
            worker_env.setdefault("CUDA_DEVICE_ORDER", "PCI_BUS_ID")  # torch numbers GPUs as nvidia-smi does
        argv = [
            sys.executable,
            *_interpreter_flags(),
            os.path.abspath(__file__),
            "--_worker",
            json.dumps(self.worker_config()),
            str(write_fd),
        ]
        running, running_since = None, time.monotonic()
        ended = ""
        try:
            self.worker = subprocess.Popen(  # noqa: S603 - this very file, no shell
                argv,
                stdin=subprocess.DEVNULL,
                stdout=sys.stderr.fileno(),  # whatever torch, NCCL or a rank prints lands in our stderr
                pass_fds=(write_fd,),
                start_new_session=True,  # the worker and its all-reduce ranks form one group: one kill
                env=worker_env,
            )
        except OSError as exc:
            os.close(read_fd)
            self._fill(None, FAIL, f"cannot start the torch worker: {exc}", 0.0)
            return
        finally:
            os.close(write_fd)
        buffer = b""
        try:
            with selectors.DefaultSelector() as selector:
                selector.register(read_fd, selectors.EVENT_READ)
                while True:
                    remaining = self.remaining()
                    if remaining <= 0:
                        ended = f"timed out: --timeout {self.args.timeout:g} s reached during this check"
                        break
                    if not selector.select(timeout=min(remaining, 1.0)):
                        continue
                    chunk = os.read(read_fd, 65536)
                    if not chunk:
                        break
                    buffer += chunk
                    while b"\n" in buffer:
                        line, buffer = buffer.split(b"\n", 1)
                        try:
                            event = json.loads(line)
                        except ValueError:
                            continue
                        if event.get("event") == "begin":
                            running, running_since = event.get("check"), time.monotonic()
                        else:
                            self._merge(event)
            if not ended:
                try:
                    code = self.worker.wait(timeout=max(self.remaining(), 0.1))
                except subprocess.TimeoutExpired:
                    ended = f"timed out: --timeout {self.args.timeout:g} s reached during this check"
                else:
                    if code < 0:
                        ended = f"the torch worker died of {signal.Signals(-code).name} during this check"
                    elif code != 0:
                        ended = f"the torch worker exited with status {code} during this check"
                    else:
                        ended = "the torch worker ended before this check"
        except _Stop as stop:
            ended = str(stop)
            raise
        finally:
            os.close(read_fd)
            self._kill_worker()
            self._fill(running, FAIL, ended or "not run", time.monotonic() - running_since)

    def _kill_worker(self) -> None:
        if self.worker is None:
            return
        with contextlib.suppress(OSError):
            os.killpg(self.worker.pid, signal.SIGKILL)  # the worker, its all-reduce ranks, their helpers
        with contextlib.suppress(Exception):
            self.worker.wait(timeout=5)

    def _fill(self, running: str | None, status: str, reason: str, duration: float) -> None:
        """Checks the worker did not report: the one it was running (or the first) fails, the others are skipped."""
        missing = [name for name in WORKER_CHECKS if name not in self.checks]
        if not missing:
            return
        culprit = running if running in missing else missing[0]
        for name in missing:
            if name == culprit:
                self.record(name, status, reason, duration)
            else:
                self.record(name, SKIP, f"not run: {culprit} did not finish", 0.0)

    # -- the whole run ----------------------------------------------------------------------------------------

    def run(self) -> dict:
        def stop(signum, _frame):
            raise _Stop(f"interrupted by {signal.Signals(signum).name}")

        previous = {sig: signal.signal(sig, stop) for sig in (signal.SIGTERM, signal.SIGINT)}
        try:
            self.guarded("gpu_visible", self.check_gpu_visible)
            self.guarded("driver", self.check_driver)
            self.guarded("compiled_extensions", self.check_compiled_extensions)
            self.run_worker()
        except _Stop as interrupted:  # the check that was running fails: an interrupted run never passes
            self._kill_worker()
            missing = [name for name in CHECKS if name not in self.checks]
            for position, name in enumerate(missing):
                self.record(name, SKIP if position else FAIL, str(interrupted), 0.0)
        finally:
            for sig, handler in previous.items():
                with contextlib.suppress(Exception):
                    signal.signal(sig, handler)
        return self.finish()

    def finish(self) -> dict:
        checks = [
            self.checks.get(name) or {"name": name, "status": SKIP, "reason": "not run", "duration_s": 0.0}
            for name in CHECKS
        ]
        counts = {status: sum(1 for check in checks if check["status"] == status) for status in _SEVERITY}
        self.report["checks"] = checks
        self.report["summary"] = {
            "status": FAIL if counts[FAIL] else PASS,
            "passed": counts[PASS],
            "failed": counts[FAIL],
            "skipped": counts[SKIP],
            "warnings": counts[WARN],
        }
        self.report["duration_s"] = _round(time.monotonic() - self.t0)
        return self.report


def _interpreter_flags() -> list[str]:
    """The worker runs under the same isolation as we do (-I, -S, -E, -s): a torch we cannot see, it cannot."""
    flags = []
    if sys.flags.isolated:
        flags.append("-I")
    else:
        if sys.flags.ignore_environment:
            flags.append("-E")
        if sys.flags.no_user_site:
            flags.append("-s")
    if sys.flags.no_site:
        flags.append("-S")
    return flags


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--_worker"]:
        return _worker_main(argv[1:])
    args = parse_args(argv)  # exits 2 with a message on stderr
    supervisor = None
    try:
        supervisor = Supervisor(args)
        report = supervisor.run()
    except Exception as exc:  # a bug of ours: still one valid report, the failure named in it
        traceback.print_exc(file=sys.stderr)
        report = _emergency_report(args, supervisor, exc)
    sys.stdout.write(json.dumps(report, indent=2, default=str) + "\n")
    sys.stdout.flush()
    return 1 if report["summary"]["status"] == FAIL else 0


def _emergency_report(args: argparse.Namespace, supervisor: Supervisor | None, exc: BaseException) -> dict:
    reason = f"preflight internal error: {type(exc).__name__}: {short_text(exc)}"
    if supervisor is not None:
        with contextlib.suppress(Exception):
            supervisor._kill_worker()
            for name in CHECKS:
                if name not in supervisor.checks:
                    supervisor.record(name, FAIL, reason, 0.0)
                    reason = "not run: internal error"
            return supervisor.finish()
    checks = [
        {"name": name, "status": FAIL if i == 0 else SKIP, "reason": reason if i == 0 else "not run", "duration_s": 0.0}
        for i, name in enumerate(CHECKS)
    ]
    return {
        "schema": SCHEMA,
        "started_at": now_utc(),
        "duration_s": None,
        "hostname": platform.node(),
        "python": platform.python_version(),
        "requested": {"gpus": list(args.gpus), "expect_arch": args.expect_arch, "expect_vendor": args.expect_vendor},
        "environment": {key: os.environ.get(key) for key in ENV_KEYS},
        "gpu": {"tool": None, "count": 0, "models": [], "driver": None, "memory_total_mib": []},
        "stack": {"torch": None, "cuda": None, "hip": None, "arch_list": [], "device_capabilities": []},
        "results": {
            "bf16_matmul_tflops": [],
            "allreduce_busbw_gbps": None,
            "allreduce_backend": None,
            "peak_memory_mib": [],
        },
        "checks": checks,
        "summary": {"status": FAIL, "passed": 0, "failed": 1, "skipped": len(CHECKS) - 1, "warnings": 0},
    }


if __name__ == "__main__":
    try:
        code = main()
    except SystemExit:
        raise
    except BaseException:  # last resort: the report could not be built; say why, exit as a failed check
        traceback.print_exc(file=sys.stderr)
        code = 1
    sys.exit(code)
