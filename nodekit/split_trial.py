#!/usr/bin/env python3
"""Binôme split-trial kit: does the second card of the pair pay off for this model?

Runs the same reduced synthetic dataset twice, with the precision and the number of examples held constant:

1. ``single``: one process on one card (cuda:0), global batch B per step;
2. ``pair``: two processes (torch.multiprocessing spawn, rendezvous on a free localhost port), one per card
   (cuda:0, cuda:1), DistributedDataParallel, B/2 examples per rank, so the same global batch B and the same
   examples, in the same order, reach the model in both phases.

Backends: NCCL on NVIDIA and RCCL on ROCm (torch calls both "nccl"), gloo on the CPU. Usage::

    python split_trial.py [--device auto|cuda|cpu] [--examples 512] [--batch 32] [--steps 30] [--warmup 5]
        [--precision fp32|bf16] [--hidden 512] [--layers 4] [--model module:function] [--output report.json]
        [--timeout 900]

``--steps`` counts every step, warm-up included: ``--steps 30 --warmup 5`` times 25 steps. The dataset holds
``--examples`` examples (a multiple of ``--batch``, which must be even); the steps cycle through it. Pick the two
cards with CUDA_VISIBLE_DEVICES (NVIDIA) or HIP_VISIBLE_DEVICES (ROCm): the kit uses the first two it sees.
``--device auto`` is ``cuda`` when torch sees a CUDA or ROCm device, else ``cpu``. With a single visible card the
single phase still runs and the pair phase fails (exit 1).

What is measured, per process:

- step time: wall clock from the start of a step (zero_grad, forward, loss, backward with DDP's all-reduces,
  optimizer step) to its end, with the device synchronised on both sides; the first ``--warmup`` steps are run
  but not timed (``warmup_steps`` and ``steps_measured`` say how many of each). Median and p90 are reported; the
  pair's step time is its slowest rank's.
- communication time (pair): a DDP communication hook wraps DDP's default all-reduce hook (so gradients are
  averaged exactly as without it) and records, for each gradient bucket, when the all-reduce was launched and
  when its result was ready: ``torch.cuda.Event`` on the GPU (the completion event is recorded on a stream that
  waits for the NCCL/RCCL kernel), ``time.perf_counter`` on the CPU (gloo completes the future when the data is
  there). ``comm_time_ms_median`` is the time per step during which at least one all-reduce was in flight
  (union of the bucket intervals, waiting for the other rank included); part of it may overlap the backward pass.
  ``comm_exposed_ms_median`` is the part that did not: from the launch of the last bucket (when the backward
  compute is done) to the completion of the last all-reduce. ``comm_fraction`` = in-flight time / step time.
  The comm hook changes nothing in DDP's bucketing or overlap, unlike timing explicit blocking all-reduces.
- peak memory: ``torch.cuda.max_memory_allocated`` of the process's card on the GPU (the caching allocator's
  reserve and the CUDA context are not counted). On the CPU, the stand-in is the process's peak resident set
  size (``resource.getrusage(RUSAGE_SELF).ru_maxrss``, KiB on Linux), reported as ``peak_rss_mib`` and copied to
  ``peak_memory_mib``; it includes the interpreter and torch itself (a few hundred MiB). ``imbalance.flag`` is
  set when the larger of the two ranks' peaks is at least 1.25 times the smaller and at least 256 MiB above it.

On the CPU the two gloo ranks share the machine's cores (half each; the single phase gets them all): the run
checks the kit and the model, it says nothing about two GPUs.

Precision: ``fp32``, or ``bf16`` = forward and loss under ``torch.autocast(dtype=torch.bfloat16)``, parameters,
gradients, all-reduces and AdamW states in fp32 (mixed precision, as most training runs it). Every model is
trained with ``torch.optim.AdamW(lr=1e-3)``, so the peaks include the optimizer's two moments.

Plugging in your own model (``--model``)::

    # my_model.py, in the current directory (or anywhere on PYTHONPATH; or pass a path: ./lib/my_model.py:build)
    import torch

    def build(precision):                    # "fp32" or "bf16"; the kit applies autocast itself
        model = torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.ReLU(), torch.nn.Linear(256, 10))

        def make_batch(batch_size, generator):          # generator: a seeded CPU torch.Generator
            inputs = torch.randn(batch_size, 64, generator=generator)
            targets = torch.randint(0, 10, (batch_size,), generator=generator)
            return inputs, targets

        return model, make_batch, torch.nn.functional.cross_entropy

    python split_trial.py --model my_model:build --examples 1024 --batch 64

The contract:

- ``build(precision) -> (model, make_batch, loss_fn)`` is called once in every process, right after
  ``torch.manual_seed`` (same initial weights everywhere). Return the model on the CPU in fp32: the kit moves it to
  the card and wraps it in DistributedDataParallel for the pair, so every parameter that requires a gradient
  must get one at every step.
- ``make_batch(batch_size, generator) -> (inputs, targets)`` builds one global batch on the CPU with the first
  dimension of every tensor equal to ``batch_size``; the kit calls it ``examples / batch`` times from one seeded
  generator, keeps each rank's half and moves it to the card before timing starts. ``inputs`` may be a tensor
  (``model(inputs)``), a tuple or list (``model(*inputs)``) or a dict (``model(**inputs)``); ``targets`` (a
  tensor, or a tuple, list or dict of them) goes to ``loss_fn`` as it is.
- ``loss_fn(outputs, targets)`` returns a scalar tensor averaged over the batch, so that DDP's averaged gradient
  of two half batches equals the single card's gradient of the whole batch.
- ``--hidden`` and ``--layers`` shape the default model only.

Output: one JSON report (schema ``binome.split-trial/1``) written to ``--output`` (the conclusion is then printed on
stdout), or printed on stdout; logs go to stderr. Every number in it is finite and non-negative:
``comparison.step_change_percent`` is the size of the change and ``comparison.step_change`` its direction
("shorter", "longer", "unchanged"); ``comparison.speedup`` is single step time / pair step time. Exit status: 0
when both phases ran, 1 when one failed or timed out (the report is still written, with an ``error`` field), 2 on
bad arguments or without torch. ``--timeout`` bounds the whole run: ranks still running then are killed.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import importlib.util
import json
import math
import os
import platform
import re
import signal
import statistics
import sys
import time
import traceback
import warnings

try:
    import resource
except ImportError:  # not Unix: no peak RSS (the kit targets Linux nodes)
    resource = None

from nodekit.common import (
    bounded,
    join_process_group,
    now_utc,
    rank_result,
    run_ranks,
    short_text,
    stderr_logger,
    synchronizer,
    write_atomically,
)

torch = None  # imported by _load_torch(), after the arguments are checked: --help and usage errors need no torch

SCHEMA = "binome.split-trial/1"
SEED = 20240917
LEARNING_RATE = 1e-3
DEFAULT_OUTPUTS = 16
IMBALANCE_RATIO = 1.25
IMBALANCE_MIN_DIFF_MIB = 256.0
UNCHANGED_PERCENT = 1.0  # a change of the step time below this is "unchanged"
ERROR_LIMIT = 1500
_MODEL_RE = re.compile(r"^(?P<module>[^:]+):(?P<function>[A-Za-z_][A-Za-z0-9_]*)$")


def _load_torch() -> str | None:
    """Import torch into this module's globals; returns why it failed, or None."""
    global torch
    if torch is None:
        warnings.filterwarnings("ignore", message="Failed to initialize NumPy")  # torch without numpy: harmless
        try:
            import torch as imported
        except Exception as exc:  # ImportError, or a broken install failing in its own way
            return f"{type(exc).__name__}: {exc}"
        torch = imported
    return None


log = stderr_logger("split-trial")  # human-readable progress: stdout carries the report (or the conclusion) only


def _num(value: float, digits: int = 3) -> float:
    """A finite, non-negative float for the report (timing noise can make a difference dip below zero)."""
    value = float(value)
    if not math.isfinite(value):
        raise ValueError(f"non-finite measurement: {value!r}")
    return round(max(value, 0.0), digits)


def _median(values: list[float]) -> float:
    return statistics.median(values) if values else 0.0


def _p90(values: list[float]) -> float:
    """Nearest-rank 90th percentile."""
    if not values:
        return 0.0
    ordered = sorted(values)
    return ordered[max(math.ceil(0.9 * len(ordered)) - 1, 0)]


# --------------------------------------------------------------------------------------------------------------
# Arguments
# --------------------------------------------------------------------------------------------------------------


def _model_spec(text: str) -> str:
    if not _MODEL_RE.match(text.strip()):
        raise argparse.ArgumentTypeError(f"expected module:function or path/to/file.py:function, got {text!r}")
    return text.strip()


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="split_trial.py",
        description="Binôme split trial: one card, then two (DDP), same data and precision; JSON report. "
        "Exit 0 done, 1 a phase failed, 2 usage.",
    )
    parser.add_argument("--device", choices=("auto", "cuda", "cpu"), default="auto")
    parser.add_argument("--examples", type=bounded(int, 2, 10_000_000), default=512, help="synthetic dataset size")
    parser.add_argument("--batch", type=bounded(int, 2, 1_000_000), default=32, help="global batch (even)")
    parser.add_argument("--steps", type=bounded(int, 2, 1_000_000), default=30, help="steps, warm-up included")
    parser.add_argument("--warmup", type=bounded(int, 0, 1_000_000), default=5, help="untimed first steps")
    parser.add_argument("--precision", choices=("fp32", "bf16"), default="fp32")
    parser.add_argument("--hidden", type=bounded(int, 1, 65_536), default=512, help="default model width")
    parser.add_argument("--layers", type=bounded(int, 1, 256), default=4, help="default model depth")
    parser.add_argument("--model", type=_model_spec, default=None, help="module:function building your model")
    parser.add_argument("--output", default=None, help="write the JSON report here (default: stdout)")
    parser.add_argument("--timeout", type=bounded(float, 1.0, 86_400.0), default=900.0, help="seconds, whole run")
    return parser


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.batch % 2:
        parser.error(f"--batch {args.batch} must be even: each of the two ranks gets half of it")
    if args.examples % args.batch:
        parser.error(f"--examples {args.examples} must be a multiple of --batch {args.batch}")
    if args.warmup >= args.steps:
        parser.error(f"--warmup {args.warmup} must be smaller than --steps {args.steps} (steps include warm-up)")
    if args.output:
        directory = os.path.dirname(os.path.abspath(args.output))
        if not os.path.isdir(directory):
            parser.error(f"--output: directory {directory} does not exist")
    return args


# --------------------------------------------------------------------------------------------------------------
# Models
# --------------------------------------------------------------------------------------------------------------


def default_builder(hidden: int, layers: int):
    """The default model: an MLP regressing a fixed random teacher on Gaussian inputs (seeded, reproducible)."""

    def build(precision: str):
        blocks = []
        for _ in range(layers):
            blocks += [torch.nn.Linear(hidden, hidden), torch.nn.GELU()]
        model = torch.nn.Sequential(*blocks, torch.nn.Linear(hidden, DEFAULT_OUTPUTS))
        teacher = torch.randn(hidden, DEFAULT_OUTPUTS, generator=torch.Generator().manual_seed(SEED + 1))
        teacher /= math.sqrt(hidden)

        def make_batch(batch_size: int, generator):
            inputs = torch.randn(batch_size, hidden, generator=generator)
            return inputs, torch.tanh(inputs @ teacher)

        return model, make_batch, torch.nn.functional.mse_loss

    return build


def load_builder(spec: str, cwd: str):
    """The user's build function from ``module:function`` (importable from cwd or sys.path) or ``file.py:function``."""
    match = _MODEL_RE.match(spec)
    if not match:
        raise ValueError(f"--model: expected module:function, got {spec!r}")
    module_part, function = match.group("module"), match.group("function")
    if module_part.endswith(".py") or "/" in module_part or os.sep in module_part:
        path = os.path.abspath(os.path.join(cwd, module_part))
        if not os.path.isfile(path):
            raise ValueError(f"--model: no file {path}")
        name = "binome_split_trial_model_" + re.sub(r"\W", "_", os.path.splitext(os.path.basename(path))[0])
        if os.path.dirname(path) not in sys.path:
            sys.path.insert(0, os.path.dirname(path))  # its sibling modules import as they would next to it
        module_spec = importlib.util.spec_from_file_location(name, path)
        module = importlib.util.module_from_spec(module_spec)
        sys.modules[name] = module
        module_spec.loader.exec_module(module)
    else:
        if cwd not in sys.path:
            sys.path.insert(0, cwd)
        module = importlib.import_module(module_part)
    builder = getattr(module, function, None)
    if not callable(builder):
        raise ValueError(f"--model: {module_part} has no function {function}")
    return builder


def _check_built(built) -> tuple:
    if not isinstance(built, (tuple, list)) or len(built) != 3:
        raise TypeError("build(precision) must return (model, make_batch, loss_fn)")
    model, make_batch, loss_fn = built
    if not isinstance(model, torch.nn.Module):
        raise TypeError(f"build(precision)[0] must be a torch.nn.Module, got {type(model).__name__}")
    if not callable(make_batch) or not callable(loss_fn):
        raise TypeError("build(precision)[1] and [2] must be callables: make_batch(batch_size, generator), loss_fn")
    return model, make_batch, loss_fn


def _take(obj, start: int, stop: int, batch: int, device):
    """Rows [start, stop) of every tensor in a (nested) batch, copied to the device (the full batch is dropped)."""
    if isinstance(obj, torch.Tensor):
        if obj.dim() == 0 or obj.shape[0] != batch:
            raise ValueError(
                f"make_batch returned a tensor of shape {tuple(obj.shape)}: first dimension must be {batch}"
            )
        return obj[start:stop].to(device, copy=True)
    if isinstance(obj, (tuple, list)):
        return type(obj)(_take(item, start, stop, batch, device) for item in obj)
    if isinstance(obj, dict):
        return {key: _take(value, start, stop, batch, device) for key, value in obj.items()}
    return obj


def _call(model, inputs):
    if isinstance(inputs, dict):
        return model(**inputs)
    if isinstance(inputs, (tuple, list)):
        return model(*inputs)
    return model(inputs)


# --------------------------------------------------------------------------------------------------------------
# One process of a phase (a torch.multiprocessing spawn child)
# --------------------------------------------------------------------------------------------------------------


class CommTimer:
    """DDP communication hook state: when each bucket's all-reduce was launched and when its result was ready."""

    def __init__(self, device):
        self.cuda = device.type == "cuda"
        self.intervals: list = []
        self.step_start = None

    def mark(self):
        if self.cuda:
            event = torch.cuda.Event(enable_timing=True)
            event.record()  # on the current stream: compute at launch, a stream waiting for the result at the end
            return event
        return time.perf_counter()

    def begin_step(self) -> None:
        self.intervals = []
        self.step_start = self.mark()

    @staticmethod
    def hook(state: CommTimer, bucket):
        from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

        start = state.mark()
        future = default_hooks.allreduce_hook(None, bucket)  # DDP's own averaging all-reduce, unchanged

        def done(fut):
            state.intervals.append((start, state.mark()))
            return fut.value()

        return future.then(done)

    def measure(self) -> tuple[float, float]:
        """(in-flight ms, exposed ms) of the step that just ended; call after synchronising the device."""
        if not self.intervals:
            return 0.0, 0.0
        if self.cuda:
            spans = [(self.step_start.elapsed_time(a), self.step_start.elapsed_time(b)) for a, b in self.intervals]
        else:
            spans = [((a - self.step_start) * 1e3, (b - self.step_start) * 1e3) for a, b in self.intervals]
        spans.sort()
        in_flight, current_start, current_end = 0.0, *spans[0]
        for start, end in spans[1:]:
            if start > current_end:
                in_flight += current_end - current_start
                current_start, current_end = start, end
            else:
                current_end = max(current_end, end)
        in_flight += current_end - current_start
        exposed = max(end for _, end in spans) - max(start for start, _ in spans)
        return max(in_flight, 0.0), max(exposed, 0.0)


def _cpu_name() -> str:
    with contextlib.suppress(OSError), open("/proc/cpuinfo", encoding="utf-8", errors="replace") as handle:
        for line in handle:
            if line.lower().startswith("model name"):
                return short_text(line.split(":", 1)[1], 120)
    return short_text(platform.processor() or platform.machine() or "CPU", 120)


def _peak_rss_mib() -> float:
    if resource is None:
        return 0.0
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak / 2**20 if sys.platform == "darwin" else peak / 2**10  # bytes on macOS, KiB on Linux


def _host_memory_mib() -> float:
    with contextlib.suppress(ValueError, OSError, AttributeError):
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**20
    return 0.0


def _rank_main(rank: int, job: dict) -> None:
    """Entry point of one process: writes rank<N>.json in job["out_dir"], raises on failure."""
    with rank_result(job, rank, error_limit=ERROR_LIMIT) as result:
        problem = _load_torch()
        if problem:
            raise ImportError(problem)
        result.update(_run_rank(rank, job))
    # The work is done and its report is on disk: leave without the interpreter's teardown, where a gloo thread
    # still being destroyed sometimes aborts the process ("terminate called without an active exception") and
    # turns a successful rank into a failed phase.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def _run_rank(rank: int, job: dict) -> dict:
    import torch.distributed as dist

    world, cuda = job["world"], job["device_type"] == "cuda"
    if cuda:
        torch.cuda.set_device(rank)
        device = torch.device("cuda", rank)
        torch.cuda.reset_peak_memory_stats(device)
        if job["precision"] == "bf16" and not torch.cuda.is_bf16_supported():
            raise RuntimeError(f"{torch.cuda.get_device_name(device)} does not support bf16")
        name = torch.cuda.get_device_name(device)
        total_mib = torch.cuda.get_device_properties(device).total_memory / 2**20
    else:
        device = torch.device("cpu")
        torch.set_num_threads(job["threads"])
        if sys.platform.startswith("linux"):
            os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")  # both ranks are on this host
        name, total_mib = _cpu_name(), _host_memory_mib()
    if world > 1:
        join_process_group(dist, job, rank, device, timeout_s=max(job["timeout_s"], 10.0))
    try:
        builder = (
            load_builder(job["model"], job["cwd"]) if job["model"] else default_builder(job["hidden"], job["layers"])
        )
        torch.manual_seed(job["seed"])
        model, make_batch, loss_fn = _check_built(builder(job["precision"]))
        model = model.to(device)
        parameters = sum(p.numel() for p in model.parameters() if p.requires_grad)

        batch, per_rank = job["batch"], job["batch"] // world
        generator = torch.Generator().manual_seed(job["seed"])
        batches = []
        for _ in range(job["examples"] // batch):
            built = make_batch(batch, generator)
            if not isinstance(built, (tuple, list)) or len(built) != 2:
                raise TypeError("make_batch(batch_size, generator) must return (inputs, targets)")
            start = rank * per_rank
            batches.append(tuple(_take(part, start, start + per_rank, batch, device) for part in built))
            del built

        net, timer = model, None
        if world > 1:
            from torch.nn.parallel import DistributedDataParallel

            net = DistributedDataParallel(model, device_ids=[rank] if cuda else None)
            timer = CommTimer(device)
            net.register_comm_hook(timer, CommTimer.hook)
        optimizer = torch.optim.AdamW(model.parameters(), lr=LEARNING_RATE)
        autocast = (
            (lambda: torch.autocast(device_type=device.type, dtype=torch.bfloat16))
            if job["precision"] == "bf16"
            else contextlib.nullcontext
        )

        sync = synchronizer(torch, device)
        step_ms, comm_ms, exposed_ms = [], [], []
        for step in range(job["steps"]):
            inputs, targets = batches[step % len(batches)]
            sync()
            started = time.perf_counter()
            if timer is not None:
                timer.begin_step()
            optimizer.zero_grad(set_to_none=True)
            with autocast():
                loss = loss_fn(_call(net, inputs), targets)
            if step == 0 and (not isinstance(loss, torch.Tensor) or loss.numel() != 1):
                raise TypeError("loss_fn(outputs, targets) must return a scalar tensor")
            loss.backward()
            optimizer.step()
            sync()
            elapsed = (time.perf_counter() - started) * 1e3
            if step >= job["warmup"]:
                step_ms.append(elapsed)
                if timer is not None:
                    in_flight, exposed = timer.measure()
                    comm_ms.append(min(in_flight, elapsed))
                    exposed_ms.append(min(exposed, in_flight, elapsed))
        final_loss = float(loss.detach().float().item())

        peak_rss = _peak_rss_mib()
        peak = torch.cuda.max_memory_allocated(device) / 2**20 if cuda else peak_rss
        return {
            "device": f"cuda:{rank}" if cuda else "cpu",
            "device_name": name,
            "memory_total_mib": total_mib,
            "peak_memory_mib": peak,
            "peak_rss_mib": peak_rss,
            "parameters": parameters,
            "threads": torch.get_num_threads(),
            "step_ms": step_ms,
            "comm_ms": comm_ms,
            "exposed_ms": exposed_ms,
            "loss_finite": math.isfinite(final_loss),
        }
    finally:
        if world > 1 and dist.is_initialized():
            with contextlib.suppress(Exception):
                dist.destroy_process_group()


# --------------------------------------------------------------------------------------------------------------
# The supervisor (this process): spawns each phase, enforces --timeout, writes the report
# --------------------------------------------------------------------------------------------------------------


class Interrupted(Exception):
    pass


def _usable_cpus() -> int:
    with contextlib.suppress(AttributeError, OSError):
        return max(len(os.sched_getaffinity(0)), 1)
    return max(os.cpu_count() or 1, 1)


def run_phase(base_job: dict, world: int, deadline: float) -> tuple[list[dict], str | None]:
    """Spawn `world` ranks, wait for them until `deadline`; returns (rank results, error or None)."""
    import torch.multiprocessing as torch_mp

    budget = deadline - time.monotonic()
    if budget < 1.0:
        return [], "timed out before it could start (--timeout spent)"
    job = dict(base_job, timeout_s=budget)
    ranks, timed_out, error = run_ranks(
        torch_mp, _rank_main, job, world=world, deadline=deadline, grace_s=10.0, reraise=(Interrupted,)
    )
    failure = None
    if timed_out:
        failure = f"timed out after {budget:.0f} s (--timeout): ranks killed"
    elif error is not None:  # a rank raised or died: torch has stopped the others
        lines = [line for line in str(error).splitlines() if line.strip()]
        failure = short_text(lines[-1] if lines else error, ERROR_LIMIT)
    errors = [f"rank {r['rank']}: {r['error']}" for r in ranks if r.get("error")]
    if errors:  # the rank's own message says more than the exception torch relays
        failure = "; ".join(errors) if not failure or "timed out" not in failure else f"{failure}; {errors[0]}"
    elif failure is None and len(ranks) != world:
        failure = f"{len(ranks)} of {world} ranks reported"
    return ranks, short_text(failure, ERROR_LIMIT) if failure else None


def _phase_summary(rank: dict, args: argparse.Namespace, world: int) -> dict:
    measured = len(rank["step_ms"])
    summary = {
        "device": rank["device"],
        "device_name": short_text(rank["device_name"], 120),
        "step_time_ms_median": _num(_median(rank["step_ms"])),
        "step_time_ms_p90": _num(_p90(rank["step_ms"])),
        "peak_memory_mib": _num(rank["peak_memory_mib"], 1),
        "peak_rss_mib": _num(rank["peak_rss_mib"], 1),
        "memory_total_mib": _num(rank["memory_total_mib"], 1),
        "peak_memory_percent": _num(100 * rank["peak_memory_mib"] / rank["memory_total_mib"], 1)
        if rank["memory_total_mib"] > 0
        else 0.0,
        "steps_measured": measured,
        "warmup_steps": args.warmup,
        "global_batch": args.batch,
        "per_rank_batch": args.batch // world,
        "examples": args.examples,
        "examples_processed": args.steps * args.batch,
        "loss_finite": bool(rank.get("loss_finite", True)),
    }
    if rank.get("threads") and rank["device"] == "cpu":
        summary["cpu_threads"] = int(rank["threads"])
    return summary


def _single_section(ranks: list[dict], args) -> dict:
    section = _phase_summary(ranks[0], args, 1)
    section["rank"] = 0
    return section


def _pair_section(ranks: list[dict], args, unit: str) -> dict:
    rows = []
    for rank in sorted(ranks, key=lambda r: r["rank"]):
        row = {"rank": int(rank["rank"]), **_phase_summary(rank, args, 2)}
        step = _median(rank["step_ms"])
        comm = _median(rank["comm_ms"])
        row["comm_time_ms_median"] = _num(comm)
        row["comm_exposed_ms_median"] = _num(_median(rank["exposed_ms"]))
        row["comm_fraction"] = _num(min(comm / step, 1.0), 4) if step > 0 else 0.0
        rows.append(row)
    peaks = [row["peak_memory_mib"] for row in rows]
    low, high = min(peaks), max(peaks)
    ratio = high / low if low > 0 else (1.0 if high == 0 else 1e6)
    flag = ratio >= IMBALANCE_RATIO and high - low >= IMBALANCE_MIN_DIFF_MIB
    sides = ", ".join(
        f"{unit} {row['rank']} {row['peak_memory_mib']:.0f} MiB ({row['peak_memory_percent']:.0f} % of "
        f"{row['memory_total_mib'] / 1024:.0f} GiB)"
        for row in rows
    )
    verdict = "unbalanced" if flag else "balanced"
    detail = (
        f"{verdict}: {sides}; flagged when the larger peak is ≥ {IMBALANCE_RATIO:g}× the smaller "
        f"and ≥ {IMBALANCE_MIN_DIFF_MIB:.0f} MiB above it"
    )
    slowest = max(rows, key=lambda row: row["step_time_ms_median"])
    return {
        "ranks": rows,
        "step_time_ms_median": slowest["step_time_ms_median"],
        "step_time_ms_p90": max(row["step_time_ms_p90"] for row in rows),
        "slowest_rank": slowest["rank"],
        "comm_time_ms_median": max(row["comm_time_ms_median"] for row in rows),
        "steps_measured": min(row["steps_measured"] for row in rows),
        "warmup_steps": args.warmup,
        "global_batch": args.batch,
        "per_rank_batch": args.batch // 2,
        "examples": args.examples,
        "examples_processed": args.steps * args.batch,
        "imbalance": {"flag": flag, "max_over_min": _num(ratio, 3), "detail": short_text(detail, 600)},
    }


def _comparison(single: dict, pair: dict) -> dict:
    before, after = single["step_time_ms_median"], pair["step_time_ms_median"]
    change = abs(after - before) / before * 100 if before > 0 else 0.0
    direction = "unchanged" if change < UNCHANGED_PERCENT else ("shorter" if after < before else "longer")
    step = pair["step_time_ms_median"]
    exposed = max(row["comm_exposed_ms_median"] for row in pair["ranks"])
    return {
        "speedup": _num(before / after, 3) if after > 0 else 0.0,
        "step_change_percent": _num(change, 1),
        "step_change": direction,
        "comm_cost_percent": _num(100 * max(row["comm_fraction"] for row in pair["ranks"]), 1),
        "comm_exposed_percent": _num(min(100 * exposed / step, 100.0), 1) if step > 0 else 0.0,
        "same_global_batch": single["global_batch"] == pair["global_batch"],
        "same_examples": single["examples"] == pair["examples"]
        and single["examples_processed"] == pair["examples_processed"],
    }


def conclude(report: dict) -> str:
    """One sentence (or two) a researcher can act on."""
    cpu = report["environment"]["device_kind"] == "cpu"
    unit = "rank" if cpu else "card"
    prefix = "CPU stand-in (two gloo ranks sharing the cores, not two GPUs): " if cpu else ""
    single, pair, comparison = report.get("single"), report.get("pair"), report.get("comparison")
    if single is None:
        return f"{prefix}single-{unit} phase failed ({report.get('error', 'unknown error')}); nothing to compare."
    if pair is None or comparison is None:
        return (
            f"{prefix}two-{unit} phase failed ({report.get('error', 'unknown error')}); one {unit} alone: "
            f"{single['step_time_ms_median']:.1f} ms per step, {single['peak_memory_mib']:.0f} MiB peak."
        )
    two = f"two {unit}s"
    times = f"{single['step_time_ms_median']:.1f} → {pair['step_time_ms_median']:.1f} ms"
    times += f" per step of {pair['global_batch']}"
    comm = f"{comparison['comm_cost_percent']:.0f} % communication cost"
    if comparison["comm_cost_percent"] > 0:
        comm += f" ({comparison['comm_exposed_percent']:.0f} % of the step not hidden behind compute)"
    if comparison["step_change"] == "shorter":
        head = f"{two} cut the step by {comparison['step_change_percent']:.0f} % ({times}) at {comm}"
    elif comparison["step_change"] == "longer":
        head = (
            f"{two} made the step {comparison['step_change_percent']:.0f} % longer ({times}) at {comm}: "
            "the second one does not pay off at this batch"
        )
    else:
        head = f"{two} left the step unchanged ({times}) at {comm}"
    imbalance = pair["imbalance"]
    if imbalance["flag"]:
        rows = sorted(pair["ranks"], key=lambda row: -row["peak_memory_mib"])
        memory = "unbalanced split: " + ", ".join(
            f"{unit} {row['rank']} at {row['peak_memory_percent']:.0f} % ({row['peak_memory_mib']:.0f} MiB)"
            for row in rows
        )
    else:
        memory = "memory balanced (" + ", ".join(f"{row['peak_memory_mib']:.0f}" for row in pair["ranks"])
        memory += " MiB peak" + (" RSS)" if cpu else ")")
    sentence = f"{prefix}{head}; {memory}."
    if not (single["loss_finite"] and all(row["loss_finite"] for row in pair["ranks"])):
        sentence += " Warning: the loss was not finite (timings stand, the training did not)."
    return sentence


def resolve_device(requested: str) -> tuple[str, str, str, str]:
    """(device_type, device_kind, torch backend, backend label) for --device."""
    gpus = torch.cuda.is_available() and torch.cuda.device_count() > 0  # neither creates a CUDA context
    if requested == "cuda" and not gpus:
        raise ValueError("--device cuda: torch sees no CUDA or ROCm device (CUDA_VISIBLE_DEVICES? a CPU build?)")
    if requested == "cpu" or not gpus:
        return "cpu", "cpu", "gloo", "gloo"
    rocm = getattr(torch.version, "hip", None) is not None
    return "cuda", ("rocm" if rocm else "cuda"), "nccl", ("rccl" if rocm else "nccl")


def _environment(args: argparse.Namespace, device: tuple[str, str, str, str]) -> dict:
    """What was held constant and how it was measured: the report's `environment`."""
    device_type, device_kind, torch_backend, backend = device
    cpus = _usable_cpus()
    model_label = (
        f"{args.model} (--hidden/--layers unused)"
        if args.model
        else f"default MLP: {args.layers} × Linear({args.hidden}, {args.hidden}) + GELU, "
        f"Linear({args.hidden}, {DEFAULT_OUTPUTS}), MSE on a seeded synthetic regression"
    )
    environment = {
        "torch": torch.__version__,
        "python": platform.python_version(),
        "device_kind": device_kind,
        "backend": backend,
        "torch_backend": torch_backend,
        "device_names": [],
        "precision": args.precision,
        "precision_detail": "fp32 throughout"
        if args.precision == "fp32"
        else "autocast bf16 forward and loss; fp32 parameters, gradients, all-reduces and optimizer states",
        "examples": args.examples,
        "global_batch": args.batch,
        "per_rank_batch": args.batch // 2,
        "steps": args.steps,
        "warmup_steps": args.warmup,
        "steps_measured": args.steps - args.warmup,
        "examples_processed": args.steps * args.batch,
        "model": short_text(model_label),
        "optimizer": f"AdamW(lr={LEARNING_RATE:g})",
        "seed": SEED,
        "peak_memory_source": "peak RSS (getrusage ru_maxrss) per process: CPU stand-in for card memory"
        if device_type == "cpu"
        else "torch.cuda.max_memory_allocated per card",
        "comm_timing": "DDP comm hook around the default all-reduce: per-step time with an all-reduce in flight "
        "(union of bucket launch-to-completion intervals, "
        + ("CUDA events" if device_type == "cuda" else "perf_counter")
        + "); exposed = last launch to last completion",
        "same_data": "both phases see the same examples in the same order, global batch "
        f"{args.batch} ({args.batch // 2} per rank in the pair)",
    }
    if device_type == "cpu":
        environment["cpu_threads_single"] = cpus
        environment["cpu_threads_per_rank"] = max(cpus // 2, 1)
    return environment


def run(args: argparse.Namespace) -> dict:
    started, started_at = time.monotonic(), now_utc()
    deadline = started + args.timeout
    device_type, device_kind, torch_backend, backend = resolve_device(args.device)
    cpus = _usable_cpus()
    environment = _environment(args, (device_type, device_kind, torch_backend, backend))
    report: dict = {
        "schema": SCHEMA,
        "started_at": started_at,
        "duration_s": 0.0,
        "environment": environment,
        "single": None,
        "pair": None,
        "comparison": None,
        "conclusion": "",
    }
    base_job = {
        "device_type": device_type,
        "backend": torch_backend,
        "precision": args.precision,
        "examples": args.examples,
        "batch": args.batch,
        "steps": args.steps,
        "warmup": args.warmup,
        "hidden": args.hidden,
        "layers": args.layers,
        "model": args.model,
        "cwd": os.getcwd(),
        "seed": SEED,
    }
    errors = []
    unit = "rank" if device_type == "cpu" else "card"
    try:
        log(f"single {unit}: {device_kind}, {args.precision}, batch {args.batch}, {args.steps} steps")
        phase_started = time.monotonic()
        ranks, error = run_phase(dict(base_job, threads=cpus), 1, deadline)
        if error:
            errors.append(f"single-{unit} phase: {error}")
        else:
            report["single"] = _single_section(ranks, args)
            report["single"]["wall_s"] = _num(time.monotonic() - phase_started, 2)
            environment["device_names"] = [report["single"]["device_name"]]
            environment["parameters"] = int(ranks[0]["parameters"])
        if report["single"] is not None:
            if device_type == "cuda" and torch.cuda.device_count() < 2:
                errors.append(f"two-card phase: needs two cards, torch sees {torch.cuda.device_count()}")
            else:
                log(f"two {unit}s: {backend}, {args.batch // 2} per rank, {args.steps} steps")
                phase_started = time.monotonic()
                pair_job = dict(base_job, threads=max(cpus // 2, 1))
                ranks, error = run_phase(pair_job, 2, deadline)
                if error and "address already in use" in error.lower():  # the free port was taken meanwhile
                    ranks, error = run_phase(pair_job, 2, deadline)
                if error:
                    errors.append(f"two-{unit} phase: {error}")
                else:
                    report["pair"] = _pair_section(ranks, args, unit)
                    report["pair"]["wall_s"] = _num(time.monotonic() - phase_started, 2)
                    environment["device_names"] = [row["device_name"] for row in report["pair"]["ranks"]]
                    report["comparison"] = _comparison(report["single"], report["pair"])
    except Interrupted as exc:
        errors.append(str(exc))
    if errors:
        report["error"] = short_text("; ".join(errors), ERROR_LIMIT)
    report["conclusion"] = short_text(conclude(report), 1000)
    report["duration_s"] = _num(time.monotonic() - started, 2)
    return report


def write_report(report: dict, output: str | None) -> None:
    text = json.dumps(report, indent=2, ensure_ascii=False, allow_nan=False) + "\n"
    if not output:
        sys.stdout.write(text)
        sys.stdout.flush()
        return
    write_atomically(output, text)
    sys.stdout.write(report["conclusion"] + "\n")
    sys.stdout.flush()


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)  # exits 2 with a message on stderr
    problem = _load_torch()
    if problem:
        sys.stderr.write(
            f"split_trial.py needs PyTorch, which {sys.executable} cannot import ({short_text(problem)}).\n"
            "Install the torch build that matches the node (CUDA or ROCm), e.g. `pip install torch`, or run the "
            "kit with the Python of your training environment. Nothing was run.\n"
        )
        return 2
    try:
        resolve_device(args.device)
        if args.model:
            load_builder(args.model, os.getcwd())
    except Exception as exc:
        sys.stderr.write(f"split_trial.py: error: {short_text(f'{type(exc).__name__}: {exc}', ERROR_LIMIT)}\n")
        return 2

    def stop(signum, _frame):
        raise Interrupted(f"interrupted by signal {signal.Signals(signum).name}: ranks killed")

    for signum in (signal.SIGTERM, signal.SIGINT):
        with contextlib.suppress(ValueError, OSError):
            signal.signal(signum, stop)
    try:
        report = run(args)
    except Exception as exc:  # a bug of ours: still a report that says so
        traceback.print_exc(file=sys.stderr)
        environment = {"torch": torch.__version__, "precision": args.precision, "examples": args.examples}
        with contextlib.suppress(Exception):
            environment = _environment(args, resolve_device(args.device))
        report = {
            "schema": SCHEMA,
            "started_at": now_utc(),
            "environment": environment,
            "single": None,
            "pair": None,
            "comparison": None,
            "error": short_text(f"split_trial.py internal error: {type(exc).__name__}: {exc}", ERROR_LIMIT),
        }
        report["conclusion"] = f"the trial did not complete: {report['error']}"
    write_report(report, args.output)
    return 1 if report.get("error") else 0


if __name__ == "__main__":
    sys.exit(main())
