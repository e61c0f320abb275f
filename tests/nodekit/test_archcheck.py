"""archcheck.py, the tool a researcher runs before booking: downloaded from the portal as the guide says, run alone
with `python3` on a site-packages of compiled extensions (real shared objects, device code laid out as nvcc and
clang lay it out), a wheel holding them and this machine's PyTorch; its verdict for each class agrees with the
pre-flight check's for each extension, and no extension is ever loaded."""

import json
import subprocess
import sys
import time
import zipfile
from pathlib import Path

import pytest
from django.urls import reverse

from tests.builders.extensions import build_extension, fatbin, offload_bundle
from tests.nodekit.shipped import load_shipped

TARGETS = {"b200": ("sm_100", "nvidia"), "h200": ("sm_90", "nvidia"), "mi300x": ("gfx942", "amd")}


@pytest.fixture
def archcheck(client, tmp_path) -> Path:
    """The file the guide links to, as a researcher downloads it, alone in a directory of its own."""
    response = client.get(reverse("customer:archcheck"))
    assert response.status_code == 200 and response["Content-Disposition"] == 'attachment; filename="archcheck.py"'
    path = tmp_path / "download" / "archcheck.py"
    path.parent.mkdir()
    path.write_bytes(response.content)
    return path


@pytest.fixture
def environment(tmp_path):
    """A researcher's site-packages: Hopper-only kernels, PTX only, an old build, a ROCm build, NVIDIA's own runtime
    library (left out, as the pre-flight leaves it) and an extension without device code."""
    root, marker = tmp_path / "site-packages", tmp_path / "loaded"
    build_extension(root / "flash_attn", "flash_attn_cuda", ".nv_fatbin", fatbin(("sm", 90), ("sm", 100)), marker)
    build_extension(root / "hopper_only", "_kernels", ".nv_fatbin", fatbin(("sm", 90, "a")), marker)
    build_extension(root / "ptx_only", "_C", ".nv_fatbin", fatbin(("compute", 90)), marker)
    build_extension(
        root / "rocm_ext", "_hip", ".hip_fatbin", offload_bundle("gfx90a", "gfx942:sramecc+:xnack-"), marker
    )
    build_extension(root / "nvidia" / "cu13" / "lib", "libcufft", ".nv_fatbin", fatbin(("sm", 75)), marker)
    build_extension(root / "plain", "_speedups", ".text.extra", b"no device code here", marker)
    return root, marker


def _run(archcheck: Path, *paths: str, cwd: Path) -> tuple[dict, str]:
    result = subprocess.run(
        ["python3", "-I", str(archcheck), *paths, "--json", "report.json"],
        cwd=cwd, capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    return json.loads((cwd / "report.json").read_text()), result.stdout


def _preflight_coverage(root: Path) -> dict[str, dict[str, str]]:
    """What the pre-flight check (the shipped file, as a container runs it) says of each extension, per class."""
    preflight = load_shipped("preflight")
    coverage: dict[str, dict[str, str]] = {}
    for key, (target, vendor) in TARGETS.items():
        scan = preflight.scan_extensions([str(root)], target, vendor, time.monotonic() + 60)
        for verdict in ("native", "fallback", "missing"):
            for item in scan[verdict]:
                coverage.setdefault(item["name"], {})[key] = verdict
    return coverage


def test_the_downloaded_tool_says_per_class_what_to_rebuild_and_agrees_with_the_pre_flight(
    archcheck, environment, tmp_path
):
    root, marker = environment

    report, said = _run(archcheck, str(root), cwd=tmp_path)

    # then: each extension's verdict per class is the pre-flight's (a build for the other vendor: none at all)
    found = {item["name"]: {key: item[key] for key in TARGETS} for item in report["extensions"]}
    expected = _preflight_coverage(root)
    assert set(found) == {
        "flash_attn/flash_attn_cuda.so", "hopper_only/_kernels.so", "ptx_only/_C.so", "rocm_ext/_hip.so"
    }  # fmt: skip
    for name, verdicts in found.items():
        for key, verdict in verdicts.items():
            assert verdict == expected[name].get(key, "other_vendor"), (name, key, verdict)
    assert found["flash_attn/flash_attn_cuda.so"] == {"b200": "native", "h200": "native", "mi300x": "other_vendor"}
    assert found["ptx_only/_C.so"]["b200"] == "fallback"
    # and: the classes' verdicts, with the extension to rebuild and the flag
    classes = report["classes"]
    assert classes["b200"]["verdict"] == "not_ready" and classes["b200"]["missing"] == ["hopper_only/_kernels.so"]
    assert 'TORCH_CUDA_ARCH_LIST="10.0"' in classes["b200"]["rebuild_with"]
    assert classes["h200"]["verdict"] == "not_ready" and classes["h200"]["other_vendor"] == ["rocm_ext/_hip.so"]
    assert classes["mi300x"]["verdict"] == "not_ready" and "rocm_ext/_hip.so" not in classes["mi300x"]["missing"]
    assert "NVIDIA B200 (sm_100): NOT READY: no code for sm_100 in hopper_only/_kernels.so" in said
    assert report["read"] == 5  # NVIDIA's runtime library is not one of the researcher's extensions
    assert not marker.exists()  # read, never loaded


def test_a_wheel_is_read_as_its_installed_files_would_be(archcheck, environment, tmp_path):
    root, marker = environment
    wheel = tmp_path / "my_kernels-1.0-cp311-cp311-linux_x86_64.whl"
    with zipfile.ZipFile(wheel, "w") as archive:
        for path in sorted(root.rglob("*.so")):
            archive.write(path, path.relative_to(root).as_posix())

    from_wheel, _said = _run(archcheck, str(wheel), cwd=tmp_path)
    installed, _said = _run(archcheck, str(root), cwd=tmp_path)

    strip = lambda items: [{**item, "name": item["name"].split(":", 1)[1]} for item in items]  # noqa: E731
    assert strip(from_wheel["extensions"]) == installed["extensions"]
    assert from_wheel["classes"]["b200"]["missing"] == [f"{wheel.name}:hopper_only/_kernels.so"]
    assert not marker.exists()


def test_this_machine_s_pytorch_is_read_as_the_pre_flight_reads_it(archcheck, tmp_path):
    import torch

    installed = Path(torch.__file__).parent
    report, said = _run(archcheck, str(installed), cwd=tmp_path)

    expected = _preflight_coverage(installed)
    assert {item["name"] for item in report["extensions"]} == set(expected)
    assert report["read"] > 0
    if not expected:  # a CPU build (this machine's): nothing carries device code, and the tool says so
        assert "nothing to check: no extension carries device code" in said


def test_a_path_that_does_not_exist_is_a_usage_error_in_one_line(archcheck, tmp_path):
    result = subprocess.run(
        [sys.executable, "-I", str(archcheck), str(tmp_path / "nowhere")], capture_output=True, text=True, check=False
    )
    assert result.returncode == 2 and result.stderr.startswith("archcheck.py: error: no such file or directory")
    assert result.stderr.count("\n") == 1


@pytest.mark.django_db
def test_the_guide_s_commands_run_as_written(archcheck, client):
    """The guide (both languages) and the booking page tell the researcher what to type where they saved the file;
    typed as written, with the Python at hand, each reads that Python's site-packages and says so."""
    import html
    import re

    commands = set()
    for language in ("en", "fr"):
        client.cookies["django_language"] = language
        for url in (reverse("customer:guide"), reverse("customer:book")):
            page = client.get(url).content.decode()
            commands |= {html.unescape(code) for code in re.findall(r"<code>(python3 archcheck\.py[^<]*)</code>", page)}
    assert commands == {"python3 archcheck.py", "python3 archcheck.py --json report.json"}
    for command in sorted(commands):
        # the page's own command line, typed as written in a shell
        ran = subprocess.run(
            ["sh", "-c", command], cwd=archcheck.parent, capture_output=True, text=True, timeout=300, check=False
        )
        assert ran.returncode == 0, (command, ran.stderr)
        assert ran.stdout.startswith("archcheck: ") and "NVIDIA B200 (sm_100): " in ran.stdout, command
    report = json.loads((archcheck.parent / "report.json").read_text())
    assert report["schema"] == "binome.archcheck/1" and report["paths"]  # this Python's site-packages
