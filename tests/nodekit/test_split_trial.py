"""nodekit/split_trial.py run as CI runs it (CPU, gloo ranks); its reports pass the portal's validator.

The kit is the shipped single file (nodekit.bundle), alone in a directory, run as a subprocess under `python3 -I`,
exactly as a researcher would run it on the node, but on the CPU with tiny models and few steps: one run of every
way of sharing feeds most tests (module-scoped); a memory cap on the card proves the does-not-fit path; a plug-in
file written to tmp_path proves the researcher's own model and data, and hostile plug-ins are refused before any
run with a code. The portal's reading of the reports is tested in tests/booking/test_split_trial_report.py.
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from booking.split_trial_conclusion import split_trial_conclusion
from booking.split_trial_report import parse_report
from tests.nodekit.shipped import load_shipped, shipped_script

SCRIPT = shipped_script("split_trial")
TINY = ["--device", "cpu", "--examples", "64", "--batch", "16", "--steps", "4", "--warmup", "1"]
TINY_MODEL = ["--hidden", "32", "--layers", "2"]
TORCH_MISSING = (
    "torch is not importable by {python}: `make test` installs it (torch==2.13.0, the CPU build, from the extra "
    "in pyproject.toml); these tests run the split trial on the CPU and must not be skipped"
)


def _env(**extra: str) -> dict:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "CUDA_VISIBLE_DEVICES")}
    env.update(extra)
    return env


def run_kit(*args: str, cwd: Path = SCRIPT.parent, env: dict | None = None, flags=("-I",), timeout: float = 240):
    return subprocess.run(
        [sys.executable, *flags, str(SCRIPT), *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=cwd,
        env=env if env is not None else _env(),
        check=False,
    )


def _runs(report: dict) -> dict:
    return {run["strategy"]: run for run in report["runs"]}


@pytest.fixture(scope="module")
def every_way(tmp_path_factory):
    """One run of the kit with every way of sharing and the bigger-batch variant, on a tiny MLP."""
    if importlib.util.find_spec("torch") is None:
        pytest.fail(TORCH_MISSING.format(python=sys.executable), pytrace=False)
    out = tmp_path_factory.mktemp("split-trial") / "r.json"
    result = run_kit(*TINY, *TINY_MODEL, "--output", str(out))
    assert result.returncode == 0, f"stdout:\n{result.stdout}\nstderr:\n{result.stderr}"
    raw = out.read_bytes()
    return {"result": result, "raw": raw, "report": json.loads(raw)}


# --------------------------------------------------------------------------------------------------------------
# Every way of sharing, on the CPU
# --------------------------------------------------------------------------------------------------------------


def test_the_three_ways_of_sharing_and_the_bigger_batch_are_measured(every_way):
    report = every_way["report"]
    assert report["schema"] == "binome.split-trial/2"
    runs = _runs(report)
    assert list(runs) == ["single", "ddp", "fsdp", "pipeline", "ddp_bigger_batch"]
    for name, run in runs.items():
        assert run["status"] == "ok", (name, run)
        assert run["steps_measured"] == 3  # 4 steps, the first discarded as warm-up
        assert run["step_time_ms_median"] > 0 and run["examples_per_s"] > 0
        assert len(run["per_card"]) == run["cards"] == (1 if name == "single" else 2)
        assert all(card["peak_memory_mib"] > 50 for card in run["per_card"])  # RSS of a process with torch
    assert runs["ddp"]["comm_time_ms_median"] > 0  # the all-reduces, timed by the DDP hook
    assert runs["pipeline"]["comm_time_ms_median"] > 0  # the activations sent and their gradient returned
    assert "comm_time_ms_median" not in runs["fsdp"]  # its collectives are inside the step: not claimed
    for name in ("ddp", "fsdp", "pipeline", "ddp_bigger_batch"):
        assert set(runs[name]["imbalance"]) == {"flag", "max_over_min"}


def test_what_each_card_holds_follows_the_way_of_sharing(every_way):
    runs = _runs(every_way["report"])
    whole = runs["single"]["per_card"][0]["model_state_mib"]
    assert whole == pytest.approx(2640 * 16 / 2**20, abs=1e-3)  # 2 × Linear(32, 32) + Linear(32, 16), AdamW fp32
    assert [card["model_state_mib"] for card in runs["ddp"]["per_card"]] == [whole, whole]  # a full copy each
    assert [card["model_state_mib"] for card in runs["fsdp"]["per_card"]] == pytest.approx([whole / 2] * 2, abs=1e-3)
    first, second = (card["model_state_mib"] for card in runs["pipeline"]["per_card"])
    assert first == pytest.approx(1056 * 16 / 2**20, abs=1e-3)  # Linear(32, 32) + GELU on card 0
    assert second == pytest.approx(1584 * 16 / 2**20, abs=1e-3)  # the rest on card 1
    assert first + second == pytest.approx(whole, abs=2e-3)


def test_the_bigger_batch_keeps_the_per_card_batch_and_doubles_the_global_one(every_way):
    runs = _runs(every_way["report"])
    single, ddp, bigger = runs["single"], runs["ddp"], runs["ddp_bigger_batch"]
    assert (single["global_batch"], single["per_card_batch"]) == (16, 16)
    assert (ddp["global_batch"], ddp["per_card_batch"]) == (16, 8)  # constant global batch
    assert (bigger["global_batch"], bigger["per_card_batch"]) == (32, 16)  # same per-card batch, twice the global
    assert runs["pipeline"]["global_batch"] == runs["fsdp"]["global_batch"] == 16
    assert bigger["examples_per_s"] == pytest.approx(32 / (bigger["step_time_ms_median"] / 1e3), rel=0.01)


def test_precision_and_example_count_are_constant_and_stated(every_way):
    environment = every_way["report"]["environment"]
    assert environment["precision"] == "fp32"
    assert (environment["examples"], environment["global_batch"]) == (64, 16)
    assert (environment["steps"], environment["warmup_steps"], environment["steps_measured"]) == (4, 1, 3)
    assert environment["backend"] == "gloo" and environment["device_kind"] == "cpu"
    assert environment["parameters"] == 2640


def test_the_report_carries_codes_and_figures_only_and_passes_the_portal(every_way):
    report = every_way["report"]
    assert "conclusion" not in report  # the portal writes it, in the page's language
    assert report["findings"] == {"fits_one_card": True, "possible_only_on_two_cards": False}
    cleaned = parse_report(every_way["raw"])
    assert cleaned["validation"]["dropped_keys"] == 0
    assert [run["strategy"] for run in cleaned["runs"]] == [run["strategy"] for run in report["runs"]]
    stdout = every_way["result"].stdout
    assert "fsdp (2 cards): ok" in stdout and "pipeline (2 cards): ok" in stdout


def test_default_warm_up_is_in_the_guide_range():
    args = kit.parse_args(["--device", "cpu"])
    assert 20 <= args.warmup <= 50 and args.warmup < args.steps
    assert args.strategies == ("ddp", "fsdp", "pipeline") and not args.no_bigger_batch


# --------------------------------------------------------------------------------------------------------------
# A model that does not fit one card: out of memory is a result
# --------------------------------------------------------------------------------------------------------------


def test_a_model_over_the_card_size_still_gets_its_two_card_runs(tmp_path):
    # given a card of 0.03 MiB: the whole model state (0.040 MiB) does not fit, half of it does
    out = tmp_path / "big.json"
    args = [*TINY, *TINY_MODEL, "--card-memory-mib", "0.03", "--output", str(out)]
    # when
    result = run_kit(*args)
    # then
    assert result.returncode == 0, result.stderr  # out of memory is a result, not a failure
    report = json.loads(out.read_bytes())
    runs = _runs(report)
    assert runs["single"]["status"] == "out_of_memory"
    assert runs["single"]["code"] == "model_state_over_card_memory"
    assert runs["ddp"]["status"] == runs["ddp_bigger_batch"]["status"] == "out_of_memory"  # a full copy each
    assert runs["fsdp"]["status"] == "ok" and runs["pipeline"]["status"] == "ok"
    assert report["environment"]["card_memory_mib"] == 0.03
    assert report["findings"] == {"fits_one_card": False, "possible_only_on_two_cards": True}
    assert "possible only on two cards" in result.stdout
    conclusion = split_trial_conclusion(report=parse_report(out.read_bytes()), hypothesis="make_possible")
    assert conclusion["verdict"] == "supported"
    assert "possible only on two cards" in conclusion["sentence"]


# --------------------------------------------------------------------------------------------------------------
# The researcher's own model and data
# --------------------------------------------------------------------------------------------------------------

PLUGIN = '''
import torch


class TwoHeads(torch.nn.Module):
    """Not an nn.Sequential: the pipeline cannot split it."""

    def __init__(self):
        super().__init__()
        self.body = torch.nn.Linear(8, 12)
        self.head = torch.nn.Linear(12, 3)

    def forward(self, inputs):
        return self.head(torch.relu(self.body(inputs)))


def build_model():
    return TwoHeads()


def dataset():
    generator = torch.Generator().manual_seed(7)
    inputs = torch.randn(80, 8, generator=generator)
    return inputs, torch.randint(0, 3, (80,), generator=generator)
'''


def test_a_plugged_in_model_and_dataset_are_trained(tmp_path):
    plugin = tmp_path / "my_model.py"
    plugin.write_text(PLUGIN)
    out = tmp_path / "mine.json"
    args = [*TINY, "--strategies", "ddp,pipeline", "--no-bigger-batch", "--precision", "bf16"]
    result = run_kit(*args, "--plugin", str(plugin), "--output", str(out))
    assert result.returncode == 0, result.stderr
    report = json.loads(out.read_bytes())
    assert report["environment"]["model"] == "plugin"
    assert report["environment"]["parameters"] == (8 * 12 + 12) + (12 * 3 + 3)
    assert report["environment"]["precision"] == "bf16"
    runs = _runs(report)
    assert list(runs) == ["single", "ddp", "pipeline"]
    assert runs["single"]["status"] == runs["ddp"]["status"] == "ok"
    assert runs["pipeline"]["status"] == "not_applicable"
    assert runs["pipeline"]["code"] == "pipeline_needs_sequential"
    parse_report(out.read_bytes())


@pytest.mark.parametrize(
    ("source", "code"),
    [
        ("import torch\ndef build_model():\n    return torch.nn.Linear(2, 2)\n", "plugin_missing_function"),
        (
            "import torch\ndef build_model():\n    return 'a model'\n"
            "def dataset():\n    return torch.zeros(64, 2), torch.zeros(64, 2)\n",
            "plugin_bad_model",
        ),
        (
            "import torch\ndef build_model():\n    return torch.nn.Linear(2, 2)\n"
            "def dataset():\n    return [[0.0, 1.0]] * 64\n",
            "plugin_bad_dataset",
        ),
        (
            "import torch\ndef build_model():\n    return torch.nn.Linear(2, 2)\n"
            "def dataset():\n    return torch.zeros(10, 2), torch.zeros(10, 2)\n",
            "plugin_dataset_too_small",
        ),
        ("def build_model(:\n", "plugin_import_failed"),
    ],
    ids=["no-dataset", "model-is-a-string", "dataset-not-tensors", "too-few-rows", "syntax-error"],
)
def test_a_bad_plug_in_is_refused_before_the_run_with_a_code(tmp_path, source, code):
    plugin = tmp_path / "bad.py"
    plugin.write_text(source)
    out = tmp_path / "never.json"
    result = run_kit(*TINY, "--plugin", str(plugin), "--output", str(out))
    assert result.returncode == 2
    assert f"split_trial.py: error [{code}]:" in result.stderr
    assert "Traceback" not in result.stderr
    assert not out.exists() and result.stdout == ""


def test_a_missing_plug_in_file_is_refused(tmp_path):
    result = run_kit(*TINY, "--plugin", str(tmp_path / "nowhere.py"))
    assert result.returncode == 2
    assert "error [plugin_not_found]" in result.stderr and "Traceback" not in result.stderr


# --------------------------------------------------------------------------------------------------------------
# Bad arguments, no torch, the timeout
# --------------------------------------------------------------------------------------------------------------


def test_timeout_kills_the_ranks_and_still_reports(tmp_path):
    """100,000 steps in 4 s: the first run is killed with the budget --timeout left it, and the next one never starts
    (the kit's whole run is bounded by --timeout, not each run by it). run_kit's own timeout catches a real hang."""
    out = tmp_path / "late.json"
    args = [*TINY, "--strategies", "ddp", "--no-bigger-batch", "--steps", "100000", "--timeout", "4"]
    result = run_kit(*args, "--output", str(out))
    assert result.returncode == 1, result.stderr
    report = json.loads(out.read_bytes())
    assert "timed out" in report["error"]
    single, ddp = _runs(report)["single"], _runs(report)["ddp"]
    assert single["code"] == "timed_out"
    allowed = re.fullmatch(r"timed out after (\d+) s \(--timeout\): ranks killed", single["error"])
    assert allowed and int(allowed.group(1)) <= 4, single["error"]
    assert ddp["code"] == "timed_out" and ddp["error"] == "timed out before it could start (--timeout spent)"
    parse_report(out.read_bytes())


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["--batch", "33", "--examples", "66"], "must be even"),
        (["--examples", "8", "--batch", "16"], "at least --batch"),
        (["--steps", "5", "--warmup", "5"], "smaller than --steps"),
        (["--precision", "fp16"], "invalid choice"),
        (["--strategies", "ddp,tensor"], "expected some of ddp,fsdp,pipeline"),
        (["--output", "/nonexistent/dir/r.json"], "does not exist"),
    ],
)
def test_bad_arguments_exit_2(tmp_path, args, needle):
    result = run_kit("--device", "cpu", *args, cwd=tmp_path)
    assert result.returncode == 2, result.stderr
    assert needle in result.stderr
    assert result.stdout == ""


def test_without_torch_exit_2_with_a_clear_message(tmp_path):
    shadow = tmp_path / "shadow" / "torch"
    shadow.mkdir(parents=True)
    (shadow / "__init__.py").write_text("raise ImportError('No module named torch (shadowed by the test)')\n")
    result = run_kit(*TINY, env=_env(PYTHONPATH=str(shadow.parent)), flags=())  # -I would ignore PYTHONPATH
    assert result.returncode == 2
    assert "needs PyTorch" in result.stderr and "Nothing was run" in result.stderr
    assert result.stdout == ""


# --------------------------------------------------------------------------------------------------------------
# The kit's arithmetic (pure functions: no torch needed)
# --------------------------------------------------------------------------------------------------------------


kit = load_shipped("split_trial")


def test_one_card_nearly_empty_and_the_other_saturated_is_flagged():
    assert kit._imbalance([80_000.0, 2_000.0]) == {"flag": True, "max_over_min": 40.0}
    assert kit._imbalance([1_000.0, 1_200.0])["flag"] is False  # 1.2×: under the ratio
    assert kit._imbalance([300.0, 500.0])["flag"] is False  # 1.67× but 200 MiB: noise at this size


def test_the_manual_documents_the_plug_in_and_its_codes():
    # the module docstring is the manual: it documents the plug-in contract and every refusal code
    manual = textwrap.dedent(kit.__doc__)
    for needle in ("build_model()", "dataset()", "plugin_bad_model", "plugin_missing_function", "out_of_memory"):
        assert needle in manual
