"""The container runtime's versions on a host, and the container escapes known in them.

The host check names, for runc (what podman runs each container with here) and podman, each escape or host-reaching
flaw published against it, and whether the host's copy has its fix: upstream, from the version (a fix reaches each
maintained series at its own release: runc 1.2.8 and 1.3.3 for the 2025 ones), or from the distribution, whose
package's changelog names the CVE it backported (Debian's runc 1.1.5+ds1-1+deb12u1 names CVE-2024-21626). An escape
not fixed is a WARNING line with the versions that fix it. The versions and changelogs are the host's word, parsed
and bounded: a version that does not parse is reported as unknown, never as fixed.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from provisioning.drivers.base import Connection

FINAL = 10**6  # a release sorts after its release candidates


@dataclass(frozen=True)
class Escape:
    cve: str
    what: str
    fixed_in: tuple[str, ...]  # the first fixed version of each series that has one


RUNC_ESCAPES = (
    Escape("CVE-2019-5736", "a container overwrites the host's runc binary through /proc/self/exe", ("1.0.0-rc7",)),
    Escape("CVE-2021-30465", "a symlink race in a mount's destination mounts host paths in", ("1.0.0-rc95",)),
    Escape("CVE-2023-27561", "a volume mounted over /proc through a symlink (CVE-2019-19921 again)", ("1.1.5",)),
    Escape("CVE-2024-21626", "a leaked file descriptor leaves a process's working directory in the host", ("1.1.12",)),
    Escape(
        "CVE-2024-45310",
        "a shared-volume race makes runc create files and directories on the host",
        ("1.1.14", "1.2.0-rc.3"),
    ),
    Escape(
        "CVE-2025-31133",
        "a masked path replaced by a symlink makes a host procfs file writable",
        ("1.2.8", "1.3.3", "1.4.0-rc.3"),
    ),
    Escape(
        "CVE-2025-52565",
        "a /dev/console mount race makes a host procfs file writable",
        ("1.2.8", "1.3.3", "1.4.0-rc.3"),
    ),
    Escape(
        "CVE-2025-52881", "writes to procfs redirected past the LSM to host files", ("1.2.8", "1.3.3", "1.4.0-rc.3")
    ),
)
PODMAN_ESCAPES = (
    Escape(
        "CVE-2022-27649",
        "containers start with inheritable capabilities (raised by file capabilities)",
        ("3.4.7", "4.0.3"),
    ),
    Escape("CVE-2023-0778", "a volume's export follows a symlink swapped in to a host file", ("4.4.2",)),
    Escape("CVE-2024-9676", "an image's /etc/passwd or /etc/group symlinked to a host file", ("5.2.5",)),
)


def version_key(text: str) -> tuple[int, int, int, int] | None:
    """(major, minor, patch, release candidate or FINAL) of "1.1.5+ds1", "1.0.0-rc95", "1.4.0-rc.3", "v4.3.1"; None
    when it does not parse."""
    match = re.fullmatch(r"v?(\d{1,4})\.(\d{1,4})(?:\.(\d{1,4}))?(?:-rc\.?(\d{1,4}))?(?:[+~-].*)?", text.strip())
    if not match:
        return None
    major, minor, patch, candidate = match.groups()
    return int(major), int(minor), int(patch or 0), int(candidate) if candidate else FINAL


def is_fixed(version: tuple[int, int, int, int], escape: Escape) -> bool:
    """Whether `version` has the escape's fix: at or above the fixed release of its own series, or above them all."""
    fixes = [key for key in (version_key(text) for text in escape.fixed_in) if key]
    if any(fix[:2] == version[:2] for fix in fixes):
        return any(fix[:2] == version[:2] and version >= fix for fix in fixes)
    return version >= max(fixes)


# Each runtime's version (runc's first line, podman's client version), then the CVEs each distribution package's
# changelog names (Debian and Ubuntu's changelog.Debian.gz, an RPM's --changelog).
_VERSIONS = (
    "echo \"runc $(runc --version 2>/dev/null | head -n 1 | awk '{ print $3 }')\"; "
    "echo \"podman $(podman version --format '{{.Client.Version}}' 2>/dev/null | head -n 1)\"; "
    'for package in runc podman; do echo "--$package $(dpkg-query -W -f \'${Version}\' "$package" 2>/dev/null '
    '|| rpm -q --qf \'%{VERSION}-%{RELEASE}\' "$package" 2>/dev/null)"; '
    '{ zcat "/usr/share/doc/$package/changelog.Debian.gz" 2>/dev/null; rpm -q --changelog "$package" 2>/dev/null; } '
    "| grep -oE 'CVE-[0-9]{4}-[0-9]{4,7}' | sort -u | head -n 500; done"
)


@dataclass(frozen=True)
class RuntimeVersions:
    versions: dict[str, str]  # "runc" → "1.1.5+ds1" ("" unknown)
    packages: dict[str, str]  # "runc" → the distribution package's version
    backported: dict[str, set[str]]  # "runc" → the CVEs its package's changelog names


def runtime_versions(connection: Connection) -> RuntimeVersions:
    answer = connection.run(["sh", "-c", _VERSIONS], check=False, timeout=60)
    versions, packages, backported = {}, {}, {}
    current = ""
    for line in answer.stdout.splitlines()[:2000]:
        words = line.split()
        if not words:
            continue
        if words[0] in ("runc", "podman"):
            versions[words[0]] = words[1][:40] if len(words) > 1 else ""
        elif words[0] in ("--runc", "--podman"):
            current = words[0][2:]
            packages[current] = words[1][:80] if len(words) > 1 else ""
            backported[current] = set()
        elif current and re.fullmatch(r"CVE-\d{4}-\d{4,7}", words[0]):
            backported[current].add(words[0])
    return RuntimeVersions(versions, packages, backported)


def escape_lines(connection: Connection) -> list[str]:
    """The host check's lines: each runtime's version and package, the escapes its copy has the fix of, and a
    WARNING line for each it does not."""
    found = runtime_versions(connection)
    lines = []
    for name, escapes in (("runc", RUNC_ESCAPES), ("podman", PODMAN_ESCAPES)):
        version = found.versions.get(name, "")
        key = version_key(version) if version else None
        package = found.packages.get(name, "")
        said = f"{name} {version or 'version unknown'}" + (f" (package {package})" if package else "")
        if key is None:
            lines.append(f"WARNING {said}: its escapes cannot be told fixed: {', '.join(e.cve for e in escapes)}")
            continue
        fixed = [escape.cve for escape in escapes if is_fixed(key, escape)]
        backport = [
            escape.cve
            for escape in escapes
            if escape.cve not in fixed and escape.cve in found.backported.get(name, set())
        ]
        lines.append(
            f"{said}: known escapes fixed: {', '.join(fixed) or 'none'}"
            + (f"; fixed by the distribution's package: {', '.join(backport)}" if backport else "")
        )
        for escape in escapes:
            if escape.cve not in fixed and escape.cve not in backport:
                lines.append(
                    f"WARNING {name} {version}: {escape.cve} not fixed ({escape.what}); fixed in "
                    f"{', '.join(escape.fixed_in)}: upgrade {name}"
                )
    return lines
