"""What the host check tells from a host's answers: the runtimes' known escapes, fixed from the version (per series)
or not, and customer accounts whose ranges of subordinate ids overlap (their containers' roots would be one)."""

import pytest

from provisioning import escapes, shares


def test_two_accounts_with_overlapping_ranges_of_ids_are_named():
    lines = [
        "/etc/subuid:bn-alice:100000:65536",
        "/etc/subuid:bn-bob:165536:65536",
        "/etc/subuid:bn-mallory:200000:65536",
        "/etc/subgid:bn-alice:100000:65536",
        "/etc/subgid:junk",
    ]

    assert shares.ranges_overlap(lines) == ["/etc/subuid: accounts bn-bob and bn-mallory share host ids 200000+"]
    assert shares.ranges_overlap(lines[:2] + lines[3:]) == []


@pytest.mark.parametrize(
    ("version", "fixed", "not_fixed"),
    [
        ("1.1.5+ds1", {"CVE-2019-5736", "CVE-2021-30465", "CVE-2023-27561"}, {"CVE-2024-21626", "CVE-2025-31133"}),
        ("1.1.12", {"CVE-2024-21626"}, {"CVE-2024-45310", "CVE-2025-52565"}),
        ("1.2.7", {"CVE-2024-21626", "CVE-2024-45310"}, {"CVE-2025-31133", "CVE-2025-52881"}),
        ("1.2.8", {"CVE-2025-31133", "CVE-2025-52565", "CVE-2025-52881"}, set()),
        ("1.3.2", {"CVE-2024-45310"}, {"CVE-2025-31133"}),
        ("1.3.3", {"CVE-2025-31133"}, set()),
        ("1.4.0-rc.2", {"CVE-2024-21626"}, {"CVE-2025-52881"}),
        ("1.4.0", {"CVE-2025-52881"}, set()),
        ("1.0.0-rc6", set(), {"CVE-2019-5736"}),
        ("1.0.0-rc94", {"CVE-2019-5736"}, {"CVE-2021-30465"}),
    ],
)
def test_runc_s_known_escapes_are_told_fixed_from_its_version(version, fixed, not_fixed):
    key = escapes.version_key(version)
    by_cve = {escape.cve: escapes.is_fixed(key, escape) for escape in escapes.RUNC_ESCAPES}

    assert {cve for cve in fixed if by_cve[cve]} == fixed
    assert {cve for cve in not_fixed if not by_cve[cve]} == not_fixed


def test_a_version_that_does_not_parse_is_never_fixed():
    assert escapes.version_key("version 1.1.5") is None
    assert escapes.version_key("1.1.5; rm -rf /") is None
