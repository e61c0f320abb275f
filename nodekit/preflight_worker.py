"""The pre-flight check's torch worker: the checks that import torch, run in a child process of the supervisor
(nodekit/preflight.py, which starts the shipped file again with ``--_worker``), and the all-reduce ranks it spawns.

It reports each check as one JSON line on the pipe the supervisor gave it (``begin``, then ``check``, ``stack``,
``results`` and ``gpu`` events) and stops its own work a little before the supervisor's deadline; the supervisor
kills its whole process group at --timeout whatever it is doing.

Standard library only at module level: torch is imported in check_torch_import and in each rank. nodekit/bundle.py
inlines this module in the shipped preflight.py, which a node runs alone.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import sys
import time
import traceback

from nodekit.common import join_process_group, rank_result, run_ranks, short_text, synchronizer
from nodekit.gpu_arch import _amd_split, arch_coverage, cuda_capability_name
from nodekit.gpu_tools import _same_uuid, _version_tuple
from nodekit.preflight_checks import (
    ALLREDUCE_FLOOR_GBPS,
    ALLREDUCE_FLOOR_MIN_MB,
    CUDA_MIN_DRIVER,
    MATMUL_FLOOR_MIN_SIZE,
    MATMUL_FLOOR_TFLOPS,
    MATMUL_TOLERANCE,
    SDPA_TOLERANCE,
    WORKER_CHECKS,
    _round,
    _zip,
    log,
)
from nodekit.verdicts import FAIL, PASS, SKIP, WARN, _worst


def torch_arch_list(torch) -> list[str]:
    """The archs torch was compiled for. torch.cuda.get_arch_list() answers [] whenever no GPU is usable, so a
    CUDA/ROCm build on a node whose driver is broken falls back to the compile-time flags it reads."""
    arch_list: list[str] = []
    try:
        arch_list = list(torch.cuda.get_arch_list())
    except Exception as exc:
        log(f"torch.cuda.get_arch_list() failed: {exc}")
    if not arch_list:
        flags = getattr(getattr(torch, "_C", None), "_cuda_getArchFlags", None)
        with contextlib.suppress(Exception):
            arch_list = (flags() or "").split() if flags else []
    return arch_list


class Worker:
    def __init__(self, config: dict, channel):
        self.cfg = config
        self.channel = channel
        self.deadline = time.monotonic() + float(config["budget_s"])
        self.vendor = config["vendor"]
        self.gpus = config["gpus"]
        self.logical = config["logical"]
        self.torch = None
        self.gpu_ok = False
        self.no_gpu = "no GPU"
        self.peaks: list[float | None] = [None] * len(self.gpus)

    def emit(self, **event) -> None:
        self.channel.write(json.dumps(event) + "\n")
        self.channel.flush()

    def remaining(self) -> float:
        return self.deadline - time.monotonic()

    def run(self) -> None:
        for name in WORKER_CHECKS:
            self.emit(event="begin", check=name)
            started = time.monotonic()
            try:
                status, reason = getattr(self, f"check_{name}")()
            except Exception as exc:
                traceback.print_exc(file=sys.stderr)
                status, reason = FAIL, f"the check itself failed: {type(exc).__name__}: {short_text(exc)}"
            duration = time.monotonic() - started
            self.emit(
                event="check", check={"name": name, "status": status, "reason": reason, "duration_s": _round(duration)}
            )

    # -- torch_import / accelerator_runtime -------------------------------------------------------------------

    def check_torch_import(self) -> tuple[str, str]:
        try:
            import torch  # the one place torch is imported: lazily, in the worker
        except BaseException as exc:  # a broken install raises anything: ImportError, OSError, SystemExit…
            if isinstance(exc, KeyboardInterrupt):
                raise
            return FAIL, f"cannot import torch: {type(exc).__name__}: {short_text(exc)} (install torch for the node)"
        self.torch = torch
        self.emit(
            event="stack",
            stack={
                "torch": getattr(torch, "__version__", "unknown"),
                "cuda": getattr(torch.version, "cuda", None),
                "hip": getattr(torch.version, "hip", None),
            },
        )
        return PASS, f"torch {torch.__version__} from {os.path.dirname(getattr(torch, '__file__', '') or '?')}"

    def check_accelerator_runtime(self) -> tuple[str, str]:
        torch = self.torch
        if torch is None:
            self.no_gpu = "no GPU: torch is not importable"
            return SKIP, "torch is not importable (see torch_import)"
        import warnings

        cuda, hip = getattr(torch.version, "cuda", None), getattr(torch.version, "hip", None)
        problems, notes = [], []
        if self.vendor == "nvidia" and not cuda:
            kind = f"a ROCm build (HIP {hip})" if hip else "a CPU-only build"
            problems.append(f"torch {torch.__version__} is {kind}: torch.version.cuda is None")
        if self.vendor == "amd" and not hip:
            kind = f"a CUDA build (CUDA {cuda})" if cuda else "a CPU-only build"
            problems.append(f"torch {torch.__version__} is {kind}: torch.version.hip is None")
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            available = bool(torch.cuda.is_available())
            count = torch.cuda.device_count() if available else 0
        if not available:
            said = "; ".join(short_text(w.message, 200) for w in caught)
            problems.append("torch.cuda.is_available() is False" + (f" ({said})" if said else ""))
        driver = _version_tuple(self.cfg.get("driver"))
        cuda_version = _version_tuple(cuda)
        if self.vendor == "nvidia" and driver and cuda_version and cuda_version[0] in CUDA_MIN_DRIVER:
            needed = CUDA_MIN_DRIVER[cuda_version[0]]
            if driver < needed:
                problems.append(
                    f"CUDA {cuda} needs driver >= {'.'.join(map(str, needed))}, node has {self.cfg['driver']}"
                )
        if available:
            for gpu, index, uuid in _zip(self.gpus, self.logical, self.cfg["tool_uuids"]):
                if index is None:
                    problems.append(f"GPU {gpu} is hidden from torch by the visible-devices environment")
                elif index >= count:
                    problems.append(f"GPU {gpu} would be cuda:{index} but torch sees {count} device(s)")
                else:
                    props = torch.cuda.get_device_properties(index)
                    notes.append(f"cuda:{index}={props.name}")
                    torch_uuid = str(getattr(props, "uuid", "") or "")
                    if self.vendor == "nvidia" and uuid and torch_uuid and not _same_uuid(torch_uuid, uuid):
                        notes.append(
                            f"cuda:{index} is {torch_uuid}, nvidia-smi GPU {gpu} is {uuid}: check CUDA_DEVICE_ORDER"
                        )
        if problems:
            self.no_gpu = "no GPU: torch cannot use one (see accelerator_runtime)"
            return FAIL, "; ".join(problems)
        self.gpu_ok = True
        runtime = f"CUDA {cuda}" if cuda else f"HIP {hip}"
        status = WARN if any("check CUDA_DEVICE_ORDER" in note for note in notes) else PASS
        return status, f"{runtime}, torch sees {count} device(s): {', '.join(notes)}"

    # -- arch_supported ---------------------------------------------------------------------------------------

    def device_archs(self) -> list[str | None]:
        torch = self.torch
        archs: list[str | None] = []
        for index, tool_arch in _zip(self.logical, self.cfg["tool_archs"]):
            arch = tool_arch
            if self.gpu_ok and index is not None:
                with contextlib.suppress(Exception):
                    if self.vendor == "amd":
                        arch = torch.cuda.get_device_properties(index).gcnArchName or tool_arch
                    else:
                        arch = cuda_capability_name(torch.cuda.get_device_capability(index))
            archs.append(arch)
        return archs

    def check_arch_supported(self) -> tuple[str, str]:
        expected = self.cfg["expect_arch"]
        archs = self.device_archs() if self.torch is not None else list(self.cfg["tool_archs"])
        self.emit(event="stack", stack={"device_capabilities": archs})
        mismatched = [
            f"GPU {gpu} is {arch}" for gpu, arch in _zip(self.gpus, archs) if arch and _amd_split(arch)[0] != expected
        ]
        if self.torch is None:
            if mismatched:
                return FAIL, f"expected {expected}: {'; '.join(mismatched)} (torch not importable)"
            return SKIP, "torch is not importable (see torch_import): no arch list to check"
        arch_list = torch_arch_list(self.torch)
        self.emit(event="stack", stack={"arch_list": arch_list})
        torch_version = self.torch.version
        cpu_only = not getattr(torch_version, "cuda", None) and not getattr(torch_version, "hip", None)
        build = f"torch {self.torch.__version__}" + (" (a CPU-only build)" if cpu_only else "")
        status, reason = arch_coverage(expected, arch_list)
        reasons = [f"{build}: {reason}"]
        if mismatched:
            status = FAIL
            reasons.append(f"expected {expected} hardware: {'; '.join(mismatched)}")
        for arch in sorted({arch for arch in archs if arch and _amd_split(arch)[0] != expected}):
            device_status, device_reason = arch_coverage(arch, arch_list)
            if device_status != PASS:
                status = _worst(status, device_status)
                reasons.append(device_reason)
        if not any(archs):
            reasons.append("device arch unknown (no GPU answered)")
        return status, "; ".join(reasons)

    # -- bf16_matmul ------------------------------------------------------------------------------------------

    def matmul(self, device, size: int, target_s: float) -> dict:
        """Warm up, then time torch.matmul on bf16 size×size; also check the result against fp32 on a few rows."""
        torch = self.torch
        sync = synchronizer(torch, device)
        generator = torch.Generator(device=device).manual_seed(1234)
        a = torch.randn(size, size, device=device, dtype=torch.bfloat16, generator=generator)
        b = torch.randn(size, size, device=device, dtype=torch.bfloat16, generator=generator)
        c = torch.matmul(a, b)
        sync()
        for _ in range(2):
            torch.matmul(a, b, out=c)
        sync()
        started = time.perf_counter()
        torch.matmul(a, b, out=c)
        sync()
        one = max(time.perf_counter() - started, 1e-6)
        budget = max(min(target_s, self.remaining() * 0.25), one)
        iterations = int(min(max(budget / one, 3), 1000))
        started = time.perf_counter()
        for _ in range(iterations):
            torch.matmul(a, b, out=c)
        sync()
        seconds = time.perf_counter() - started
        rows = min(8, size)
        reference = a[:rows].float() @ b.float()
        got = c[:rows].float()
        error = ((got - reference).abs().max() / reference.abs().max().clamp_min(1e-6)).item()
        finite = bool(torch.isfinite(c).all().item())
        del a, b, c, reference, got
        return {
            "tflops": 2 * size**3 * iterations / seconds / 1e12,
            "iterations": iterations,
            "seconds": seconds,
            "rel_error": error,
            "finite": finite,
        }

    def check_bf16_matmul(self) -> tuple[str, str]:
        torch = self.torch
        if torch is None:
            return SKIP, "torch is not importable (see torch_import)"
        size = self.cfg["matmul_size"]
        if not self.gpu_ok:
            cpu_size = min(size, 512)
            figure = ""
            try:
                cpu = self.matmul(torch.device("cpu"), cpu_size, target_s=0.5)
                self.emit(
                    event="results",
                    results={"cpu_bf16_matmul_tflops": _round(cpu["tflops"], 4), "cpu_bf16_matmul_size": cpu_size},
                )
                figure = f"; for diagnosis, a CPU bf16 {cpu_size}×{cpu_size} matmul ran at {cpu['tflops']:.4f} TFLOP/s"
            except Exception as exc:
                figure = f"; the CPU bf16 matmul failed too: {type(exc).__name__}: {short_text(exc, 120)}"
            return FAIL, f"{self.no_gpu}{figure}"
        figures: list[float | None] = []
        problems, notes = [], []
        for gpu, index in _zip(self.gpus, self.logical):
            if self.remaining() <= 0:
                figures.append(None)
                problems.append(f"GPU {gpu}: out of time")
                continue
            device = torch.device("cuda", index)
            try:
                torch.cuda.reset_peak_memory_stats(device)
                run = self.matmul(device, size, target_s=1.0)
                self.peaks[self.gpus.index(gpu)] = torch.cuda.max_memory_allocated(device) / 2**20
                torch.cuda.empty_cache()
            except Exception as exc:
                traceback.print_exc(file=sys.stderr)
                figures.append(None)
                problems.append(f"GPU {gpu}: {type(exc).__name__}: {short_text(exc, 200)}")
                continue
            figures.append(_round(run["tflops"], 1))
            seconds = run["seconds"]
            notes.append(f"GPU {gpu} {run['tflops']:.1f} TFLOP/s ({run['iterations']} × {size}³ in {seconds:.2f} s)")
            if not run["finite"] or run["rel_error"] > MATMUL_TOLERANCE:
                problems.append(
                    f"GPU {gpu} computes wrong results (non-finite: {not run['finite']}, "
                    f"max error {run['rel_error']:.3g} vs fp32 > {MATMUL_TOLERANCE})"
                )
        self.emit(event="results", results={"bf16_matmul_tflops": figures})
        if problems:
            return FAIL, "; ".join(problems + notes)
        warnings_ = []
        floor = MATMUL_FLOOR_TFLOPS.get(self.cfg["expect_arch"])
        measured = [value for value in figures if value is not None]
        if floor and size >= MATMUL_FLOOR_MIN_SIZE:
            warnings_ += [
                f"GPU {gpu} below {floor:g} TFLOP/s"
                for gpu, value in _zip(self.gpus, figures)
                if value is not None and value < floor
            ]
        if len(measured) > 1 and min(measured) < 0.8 * max(measured):
            warnings_.append("GPUs differ by more than 20%: throttling or clocks?")
        if warnings_:
            return WARN, "; ".join(warnings_ + notes)
        return PASS, "; ".join(notes)

    # -- sdpa_attention ---------------------------------------------------------------------------------------

    def devices_to_test(self) -> list[tuple[str, object, int | None]]:
        """(label, torch device, position) for each requested GPU torch can use, or the CPU (for diagnosis)."""
        torch = self.torch
        if not self.gpu_ok:
            return [("CPU", torch.device("cpu"), None)]
        return [
            (f"GPU {gpu}", torch.device("cuda", index), position)
            for position, (gpu, index) in enumerate(_zip(self.gpus, self.logical))
        ]

    def sdpa_compare(self, device, dtype, *, causal: bool) -> dict:
        """scaled_dot_product_attention forward and backward against the explicit math, computed in fp32 from the
        same inputs: the largest error relative to the reference's magnitude, for the output and each gradient."""
        torch = self.torch
        generator = torch.Generator(device=device).manual_seed(4321)
        batch, heads, length, dim = 2, 4, 128, 64
        shape = (batch, heads, length, dim)
        q, k, v = (torch.randn(shape, device=device, dtype=dtype, generator=generator) for _ in range(3))
        upstream = torch.randn(shape, device=device, dtype=dtype, generator=generator)
        inputs = [tensor.clone().requires_grad_(True) for tensor in (q, k, v)]
        out = torch.nn.functional.scaled_dot_product_attention(*inputs, is_causal=causal)
        out.backward(upstream)
        reference_inputs = [tensor.float().clone().requires_grad_(True) for tensor in (q, k, v)]
        rq, rk, rv = reference_inputs
        scores = rq @ rk.transpose(-2, -1) / math.sqrt(dim)
        if causal:
            mask = torch.ones(length, length, dtype=torch.bool, device=device).tril()
            scores = scores.masked_fill(~mask, float("-inf"))
        reference = torch.softmax(scores, dim=-1) @ rv
        reference.backward(upstream.float())

        def error(got, want) -> float:
            if not bool(torch.isfinite(got).all().item()):
                return float("inf")
            return ((got.float() - want).abs().max() / want.abs().max().clamp_min(1e-6)).item()

        errors = {"out": error(out.detach(), reference.detach())}
        for name, tensor, ref in zip(("dq", "dk", "dv"), inputs, reference_inputs):  # noqa: B905 - three each
            errors[name] = float("inf") if tensor.grad is None else error(tensor.grad, ref.grad)
        return errors

    def check_sdpa_attention(self) -> tuple[str, str]:
        torch = self.torch
        if torch is None:
            return SKIP, "torch is not importable (see torch_import)"
        if not hasattr(torch.nn.functional, "scaled_dot_product_attention"):
            return FAIL, f"torch {torch.__version__} has no torch.nn.functional.scaled_dot_product_attention"
        dtypes = ["float32"] if not self.gpu_ok else ["bfloat16", "float16", "float32"]
        problems, notes, worst = [], [], {}
        for label, device, position in self.devices_to_test():
            if self.remaining() <= 0:
                problems.append(f"{label}: out of time")
                continue
            for dtype_name in dtypes:
                for causal in (False, True):
                    variant = f"{label} {dtype_name}{' causal' if causal else ''}"
                    try:
                        errors = self.sdpa_compare(device, getattr(torch, dtype_name), causal=causal)
                    except Exception as exc:
                        traceback.print_exc(file=sys.stderr)
                        problems.append(f"{variant}: {type(exc).__name__}: {short_text(exc, 200)}")
                        continue
                    tolerance = SDPA_TOLERANCE[dtype_name]
                    largest = max(errors.values())
                    worst[dtype_name] = max(worst.get(dtype_name, 0.0), largest)
                    wrong = [f"{name} {value:.3g}" for name, value in errors.items() if not value <= tolerance]
                    if wrong:
                        wrong_list = ", ".join(wrong)
                        problems.append(f"{variant}: differs from the math reference ({wrong_list} > {tolerance:g})")
            if position is not None:
                with contextlib.suppress(Exception):
                    peak = torch.cuda.max_memory_allocated(device) / 2**20
                    self.peaks[position] = max(self.peaks[position] or 0.0, peak)
        self.emit(event="results", results={"sdpa_max_rel_error": {k: float(f"{v:.3g}") for k, v in worst.items()}})
        notes.append(
            "forward and backward (dq, dk, dv) match softmax(QK^T/sqrt(d))V, largest relative error "
            + ", ".join(f"{name} {value:.2g}" for name, value in worst.items())
        )
        if problems:
            return FAIL, "; ".join(problems)
        if not self.gpu_ok:
            return WARN, f"CPU only: {self.no_gpu}; on the CPU, {notes[0]}"
        return PASS, notes[0]

    # -- checkpoint_roundtrip ---------------------------------------------------------------------------------

    def checkpoint_roundtrip(self, device, directory: str) -> dict:
        """Train a small model two steps, save model + optimizer, load both into fresh objects: the reloaded model
        answers exactly the same, and one more step from either copy gives exactly the same parameters."""
        torch = self.torch
        torch.manual_seed(99)

        def fresh():
            model = torch.nn.Sequential(
                torch.nn.Linear(256, 512), torch.nn.GELU(), torch.nn.LayerNorm(512), torch.nn.Linear(512, 64)
            ).to(device)
            return model, torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.01)

        model, optimizer = fresh()
        batch = torch.randn(32, 256, device=device)
        for _ in range(2):
            optimizer.zero_grad()
            model(batch).square().mean().backward()
            optimizer.step()
        path = os.path.join(directory, "checkpoint.pt")
        started = time.perf_counter()
        torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict()}, path)
        size = os.path.getsize(path)
        state = torch.load(path, map_location=device, weights_only=True)
        seconds = time.perf_counter() - started
        copy, copy_optimizer = fresh()
        copy.load_state_dict(state["model"])
        copy_optimizer.load_state_dict(state["optimizer"])
        with torch.no_grad():
            same_output = bool(torch.equal(model(batch), copy(batch)))
        for net, opt in ((model, optimizer), (copy, copy_optimizer)):
            opt.zero_grad()
            net(batch).square().mean().backward()
            opt.step()
        same_step = all(torch.equal(a, b) for a, b in zip(model.parameters(), copy.parameters()))  # noqa: B905
        return {"bytes": size, "seconds": seconds, "same_output": same_output, "same_step": same_step}

    def check_checkpoint_roundtrip(self) -> tuple[str, str]:
        import tempfile

        if self.torch is None:
            return SKIP, "torch is not importable (see torch_import)"
        home = os.path.expanduser("~")
        parent = home if os.path.isdir(home) and os.access(home, os.W_OK) else None  # the user's space, else /tmp
        problems, notes = [], []
        with tempfile.TemporaryDirectory(prefix=".binome-preflight-", dir=parent) as directory:
            for label, device, _position in self.devices_to_test():
                try:
                    run = self.checkpoint_roundtrip(device, directory)
                except Exception as exc:
                    traceback.print_exc(file=sys.stderr)
                    problems.append(f"{label}: {type(exc).__name__}: {short_text(exc, 200)}")
                    continue
                if not run["same_output"]:
                    problems.append(f"{label}: the reloaded model answers differently")
                if not run["same_step"]:
                    problems.append(f"{label}: the reloaded optimizer takes a different step")
                notes.append(f"{label} {run['bytes'] / 2**20:.1f} MiB saved and reloaded in {run['seconds']:.2f} s")
                self.emit(event="results", results={"checkpoint_bytes": run["bytes"]})
        where = f"in {parent or tempfile.gettempdir()}"
        if problems:
            return FAIL, "; ".join(problems) + f" ({where})"
        detail = f"model + AdamW state {where}: " + "; ".join(notes) + ", outputs and next step identical"
        if not self.gpu_ok:
            return WARN, f"CPU only: {self.no_gpu}; {detail}"
        return PASS, detail

    # -- allreduce --------------------------------------------------------------------------------------------

    def check_allreduce(self) -> tuple[str, str]:
        torch = self.torch
        if torch is None:
            return SKIP, "torch is not importable (see torch_import)"
        world = len(self.gpus)
        if world < 2:
            return SKIP, "one GPU requested: nothing to all-reduce between"
        try:
            import torch.distributed as dist
            import torch.multiprocessing as torch_mp
        except Exception as exc:
            return FAIL, f"torch.distributed unavailable: {type(exc).__name__}: {short_text(exc)}"
        if not dist.is_available():
            return FAIL, "torch.distributed is not available in this torch build"
        if self.gpu_ok:
            if not dist.is_nccl_available():
                return FAIL, f"{'RCCL' if self.vendor == 'amd' else 'NCCL'} is not available in this torch build"
            backend, label, device_type = "nccl", ("rccl" if self.vendor == "amd" else "nccl"), "cuda"
        else:
            if not dist.is_gloo_available():
                return FAIL, f"{self.no_gpu}; gloo is not available either"
            backend, label, device_type = "gloo", "gloo", "cpu"
        nbytes = self.cfg["allreduce_mb"] * 2**20
        budget = self.remaining() - 1.0  # room to kill the ranks and run peak_memory
        if budget < 2:
            return FAIL, f"timed out: {budget:.1f} s left of --timeout for the all-reduce"
        job = {
            "backend": backend,
            "device_type": device_type,
            "devices": list(self.logical),
            "nbytes": nbytes,
            "warmup": 5 if device_type == "cuda" else 1,
            "iterations": 20 if device_type == "cuda" else 5,
            "timeout_s": max(budget, 1.0),
        }
        log(f"all-reduce: {world} ranks, {backend}, {self.cfg['allreduce_mb']} MiB, {budget:.0f} s budget")
        deadline = time.monotonic() + budget
        ranks, timed_out, error = run_ranks(torch_mp, _allreduce_rank, job, world=world, deadline=deadline, grace_s=5.0)
        failure = None
        if timed_out:
            failure = f"timed out after {budget:.0f} s: all-reduce ranks killed"
        elif error is not None:
            failure = f"a rank failed: {type(error).__name__}: {short_text(error, 300)}"
        self.emit(event="results", results={"allreduce_backend": label})
        errors = [f"rank {r.get('rank')}: {r['error']}" for r in ranks if r.get("error")]
        if failure or errors or len(ranks) != world:
            return FAIL, "; ".join([failure or f"{len(ranks)} of {world} ranks reported", *errors])
        for rank in ranks:
            if rank.get("peak_mib") is not None and rank.get("device") is not None:
                position = self.logical.index(rank["device"])
                self.peaks[position] = max(self.peaks[position] or 0.0, rank["peak_mib"])
        lead = ranks[0]
        busbw = lead["busbw_gbps"]
        self.emit(
            event="results",
            results={"allreduce_busbw_gbps": _round(busbw, 2), "allreduce_algbw_gbps": _round(lead["algbw_gbps"], 2)},
        )
        detail = (
            f"{label} all-reduce of {self.cfg['allreduce_mb']} MiB fp32 over {world} ranks: "
            f"busbw {busbw:.2f} GB/s (algbw {lead['algbw_gbps']:.2f} GB/s, {lead['iterations']} iterations, "
            f"{lead['seconds'] / lead['iterations'] * 1e3:.2f} ms each)"
        )
        if not all(rank.get("correct") for rank in ranks):
            return FAIL, f"wrong all-reduce result on some rank; {detail}"
        if busbw <= 0:
            return FAIL, f"no bandwidth measured; {detail}"
        if not self.gpu_ok:
            return WARN, f"CPU gloo only: no GPU; {detail}"
        floor = ALLREDUCE_FLOOR_GBPS.get(self.cfg["expect_arch"])
        if floor and self.cfg["allreduce_mb"] >= ALLREDUCE_FLOOR_MIN_MB and busbw < floor:
            return WARN, f"busbw under {floor:g} GB/s: no NVLink/xGMI peer-to-peer?; {detail}"
        return PASS, detail

    # -- peak_memory ------------------------------------------------------------------------------------------

    def check_peak_memory(self) -> tuple[str, str]:
        if self.torch is None:
            return SKIP, "torch is not importable (see torch_import)"
        if not self.gpu_ok:
            return SKIP, f"{self.no_gpu}: nothing was allocated on a GPU"
        peaks = []
        for position, index in enumerate(self.logical):
            peak = self.peaks[position]
            with contextlib.suppress(Exception):
                peak = max(peak or 0.0, self.torch.cuda.max_memory_allocated(index) / 2**20)
            peaks.append(_round(peak, 1))
        self.emit(event="results", results={"peak_memory_mib": peaks})
        totals = self.cfg.get("tool_memory_mib") or [None] * len(peaks)
        parts = [
            f"GPU {gpu} {peak:.0f} MiB" + (f" of {total} MiB" if total else "")
            for gpu, peak, total in _zip(self.gpus, peaks, totals)
            if peak is not None
        ]
        if len(parts) != len(peaks):
            return WARN, "no peak for some GPU: " + "; ".join(parts)
        return PASS, "torch.cuda.max_memory_allocated: " + "; ".join(parts)


def _allreduce_rank(rank: int, job: dict) -> None:
    """One all-reduce rank (a torch.multiprocessing spawn child): writes rank<N>.json, raises on failure."""
    with rank_result(job, rank, error_limit=300) as result:
        import torch
        import torch.distributed as dist

        world = job["world"]
        if job["device_type"] == "cuda":
            index = job["devices"][rank]
            torch.cuda.set_device(index)
            device = torch.device("cuda", index)
            result["device"] = index
        else:
            device = torch.device("cpu")
            os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")  # ranks are on this host: no hostname lookups
        sync = synchronizer(torch, device)
        join_process_group(dist, job, rank, device, timeout_s=job["timeout_s"])
        probe = torch.full((1024,), float(rank + 1), device=device)
        dist.all_reduce(probe)
        sync()
        correct = bool((probe == world * (world + 1) / 2).all().item())
        tensor = torch.zeros(max(job["nbytes"] // 4, 1), dtype=torch.float32, device=device)
        for _ in range(job["warmup"]):
            dist.all_reduce(tensor)
        sync()
        dist.all_reduce(probe)  # a barrier that works for every backend
        sync()
        started = time.perf_counter()
        for _ in range(job["iterations"]):
            dist.all_reduce(tensor)
        sync()
        elapsed = torch.tensor([time.perf_counter() - started], dtype=torch.float64, device=device)
        dist.all_reduce(elapsed, op=dist.ReduceOp.MAX)  # the slowest rank sets the pace
        seconds = float(elapsed.item())
        nbytes = tensor.numel() * tensor.element_size()
        algbw = nbytes * job["iterations"] / seconds / 1e9
        result.update(
            correct=correct,
            seconds=seconds,
            iterations=job["iterations"],
            algbw_gbps=algbw,
            busbw_gbps=algbw * 2 * (world - 1) / world,
            peak_mib=(torch.cuda.max_memory_allocated(device) / 2**20) if device.type == "cuda" else None,
        )
        dist.destroy_process_group()


def _worker_main(argv: list[str]) -> int:
    config, fd = json.loads(argv[0]), int(argv[1])
    channel = os.fdopen(fd, "w", encoding="utf-8")
    try:
        Worker(config, channel).run()
    finally:
        with contextlib.suppress(Exception):
            channel.close()
    return 0
