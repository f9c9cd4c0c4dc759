"""The test command's tiers (tests/tiers.py): what runs where, and the slowest tests read from every tier's report."""

from __future__ import annotations

from tests import tiers


def test_paths_run_on_their_tiers_workers_and_options_alone_run_every_tier():
    assert tiers.named_tests(["-x", "-p", "randomly", "--randomly-seed=3"]) == []
    assert tiers.named_tests(["-k", "tests", "-m", "docs"]) == []  # a name to select by, though ROOT/tests exists
    unit = tiers.named_tests(["tests/unit/test_fuzz.py::test_every_setting_is_parsed_or_refused_in_one_line", "-x"])
    assert tiers.tier_holding(unit).name == "unit"
    assert tiers.tier_holding(tiers.named_tests(["tests/maxtext"])).workers == tiers.CORES
    assert tiers.tier_holding(tiers.named_tests(["tests/unit", "tests/host"])) is None  # one plain session


def test_the_slowest_tests_of_all_tiers_come_first_with_their_tier(tmp_path):
    reports = {}
    for tier, cases in (
        ("unit", [("tests.unit.test_a", "test_one", 0.5), ("tests.unit.test_a", "test_two[x]", 9.0)]),
        ("host", [("tests.host.test_b", "test_three", 4.0)]),
    ):
        reports[tier] = tmp_path / f"{tier}.xml"
        reports[tier].write_text(
            "<testsuites><testsuite>"
            + "".join(
                f'<testcase classname="{module}" name="{name}" time="{seconds}"/>' for module, name, seconds in cases
            )
            + "</testsuite></testsuites>"
        )
    reports["maxtext"] = tmp_path / "not-run.xml"  # a tier that did not get as far as its report
    assert tiers.slowest(reports, 2) == [
        (9.0, "unit", "tests/unit/test_a.py::test_two[x]"),
        (4.0, "host", "tests/host/test_b.py::test_three"),
    ]
