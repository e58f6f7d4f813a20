"""The `monitoring:` section: defaults, every key checked whole with its path, hostile input (hypothesis) loads
or fails in one line; what loads renders into rules exactly as given."""

from __future__ import annotations

import math
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from opsctl.errors import InventoryError
from opsctl.inventory.monitoring import _NUMBERS, _SECONDS, KEYS, MonitoringConfig
from opsctl.monitor.rules import RUNBOOK_ANCHORS, alert_rules
from tests.unit.monitor_fleet import monitor_fleet


def error(monitoring: Any) -> str:
    with pytest.raises(InventoryError) as info:
        monitor_fleet(monitoring)
    return info.value.one_line()


def test_defaults_and_an_empty_section() -> None:
    assert monitor_fleet().monitoring == MonitoringConfig() == monitor_fleet({}).monitoring
    assert MonitoringConfig().runbook == "docs/runbook.md"  # relative only when neither runbook key is set
    assert {*_SECONDS, *_NUMBERS, "runbook_url", "runbook_base_url"} == KEYS


def test_values_are_taken_as_given() -> None:
    m = monitor_fleet(
        {
            "scrape_interval": 5,
            "ttft_p95": 0.75,
            "tau_ratio": 1,
            "runbook_url": "https://git.example.com/o/r/runbook.md",
        }
    ).monitoring
    assert (m.scrape_interval, m.ttft_p95, m.tau_ratio) == (5, 0.75, 1.0)
    assert m.runbook_url == m.runbook == "https://git.example.com/o/r/runbook.md"


@pytest.mark.parametrize(
    ("base", "page"),
    [
        ("https://git.example.com/ops/opsctl/blob/main/docs", "https://git.example.com/ops/opsctl/blob/main/docs/runbook.md"),
        ("https://git.example.com/ops/opsctl/blob/main/docs/", "https://git.example.com/ops/opsctl/blob/main/docs/runbook.md"),
        ("http://wiki:8080", "http://wiki:8080/runbook.md"),
    ],
)  # fmt: skip
def test_a_base_url_links_every_alert_to_its_runbook_md(base: str, page: str) -> None:
    inv = monitor_fleet({"runbook_base_url": base})
    assert inv.monitoring.runbook_base_url == base and inv.monitoring.runbook == page
    rules = alert_rules(inv)["groups"][0]["rules"]
    assert {r["annotations"]["runbook_url"] for r in rules} == {f"{page}#{RUNBOOK_ANCHORS[r['alert']]}" for r in rules}


@pytest.mark.parametrize(
    ("monitoring", "message"),
    [
        ({"scrape_intervall": 5}, "monitoring.scrape_intervall: unknown key (did you mean `scrape_interval`?)"),
        ({"scrape_interval": 0}, "monitoring.scrape_interval: 0 is out of range (1..300)"),
        ({"scrape_interval": 1.5}, "monitoring.scrape_interval: expected an integer, got a number"),
        ({"service_down_for": True}, "monitoring.service_down_for: expected an integer, got a boolean"),
        ({"tau_trailing": 60}, "monitoring.tau_trailing: 60 is out of range (3600..2592000)"),
        ({"tau_ratio": 0}, "monitoring.tau_ratio: 0 is out of range (0.01..1)"),
        ({"fallback_share": "0.5"}, "monitoring.fallback_share: expected a number, got a string"),
        ({"ttft_p95": float("nan")}, "monitoring.ttft_p95: nan is out of range (0.001..3600)"),
        ({"ttft_p95": float("inf")}, "monitoring.ttft_p95: inf is out of range (0.001..3600)"),
        ({"runbook_url": "https://x/{{ $labels.host }}"}, "monitoring.runbook_url: 'https://x/{{ $labels.host }}' is"),
        ({"runbook_url": "https://x/runbook.md#top"}, "monitoring.runbook_url: 'https://x/runbook.md#top' is not an"),
        (
            {"runbook_url": "docs/runbook.md"},
            "monitoring.runbook_url: 'docs/runbook.md' is not an absolute http(s) URL",
        ),
        ({"runbook_url": ""}, "monitoring.runbook_url: '' is not an absolute http(s) URL"),
        ({"runbook_url": 7}, "monitoring.runbook_url: expected a string, got an integer"),
        (
            {"runbook_base_url": "https://x/docs\n"},
            "monitoring.runbook_base_url: 'https://x/docs\\n' is not an absolute",
        ),
        ({"runbook_base_url": "https://x/d\x1bocs"}, "monitoring.runbook_base_url: 'https://x/d\\x1bocs' is not an"),
        ({"runbook_base_url": "https://x/d ocs"}, "monitoring.runbook_base_url: 'https://x/d ocs' is not an absolute"),
        ({"runbook_base_url": "https://x/docs?a=1"}, "monitoring.runbook_base_url: 'https://x/docs?a=1' is not an"),
        ({"runbook_base_url": "https://x:0/docs"}, "monitoring.runbook_base_url: 'https://x:0/docs' is not an"),
        ({"runbook_base_url": "ftp://x/docs"}, "monitoring.runbook_base_url: 'ftp://x/docs' is not an absolute"),
        ({"runbook_base_url": "https:///docs"}, "monitoring.runbook_base_url: 'https:///docs' is not an absolute"),
        (
            {"runbook_base_url": "https://x/docs/runbook.md"},
            "monitoring.runbook_base_url: 'https://x/docs/runbook.md' names a page, not the docs folder",
        ),
        ({"runbook_base_url": "https://x/" + "a" * 500}, "monitoring.runbook_base_url: 'https://x/aaaa"),
        ({"runbook_base_url": None}, "monitoring.runbook_base_url: expected a string, got nothing"),
        (
            {"runbook_url": "https://x/r.md", "runbook_base_url": "https://x/docs"},
            "monitoring.runbook_url: runbook_url and runbook_base_url are both set",
        ),
        ([1], "monitoring: expected a mapping, got a list"),
    ],
)
def test_each_error_is_one_line_naming_the_key(monitoring: Any, message: str) -> None:
    assert error(monitoring).startswith(message)


_values = st.one_of(
    st.none(), st.booleans(), st.integers(-(10**9), 10**9), st.floats(allow_nan=True), st.text(max_size=40),
    st.lists(st.integers(), max_size=2), st.dictionaries(st.text(max_size=5), st.integers(), max_size=2),
)  # fmt: skip


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.dictionaries(st.sampled_from([*sorted(KEYS), "x", "Tau_ratio"]), _values, max_size=4))
def test_hostile_values_load_whole_or_fail_in_one_line(monitoring: dict[str, Any]) -> None:
    try:
        m = monitor_fleet(monitoring).monitoring
    except InventoryError as exc:
        line = exc.one_line()
        assert "\n" not in line and line.startswith("monitoring")
        return
    for key, value in monitoring.items():  # loaded: every value was the right type, in range, taken whole
        got = getattr(m, key)
        assert got == value and not isinstance(value, bool)
        if key in _SECONDS:
            assert isinstance(value, int) and _SECONDS[key][0] <= value <= _SECONDS[key][1]
        elif key in _NUMBERS:
            assert math.isfinite(value) and _NUMBERS[key][0] <= value <= _NUMBERS[key][1]
        else:
            assert isinstance(value, str) and value.startswith(("http://", "https://"))
            assert not set(value) & set("{}$#?'\" \n\\")
    # and the rules carry them as given
    text = repr(alert_rules(monitor_fleet(monitoring)))
    assert f"< {m.tau_ratio!r} * opsctl:ddtree_tau:baseline" in text and f"> {m.ttft_p95!r}" in text
    assert f"'runbook_url': '{m.runbook}#opsctlservicedown'" in text


# URL-shaped strings: a scheme (or not), a host, a path, with the characters a hostile value would slip in
_URL_PARTS = st.sampled_from(
    ["https://", "http://", "ftp://", "git.example.com", ":8080", ":99999", "/docs", "/", "runbook.md", "%20",
     " ", "\n", "\t", "\x00", "\x1b", "{{", "}}", "$", "#", "?", "'", '"', "\\", "é", "..", "-", "@", "_"]
)  # fmt: skip


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.sampled_from(["runbook_url", "runbook_base_url"]), st.lists(_URL_PARTS, min_size=1, max_size=8).map("".join))
def test_hostile_runbook_urls_load_whole_or_fail_in_one_line(key: str, url: str) -> None:
    try:
        m = monitor_fleet({key: url}).monitoring
    except InventoryError as exc:
        line = exc.one_line()
        assert "\n" not in line and line.startswith(f"monitoring.{key}: ") and len(line) < 400
        assert all(" " <= c <= "~" for c in line)  # the value shown escaped, as printable ASCII
        return
    assert getattr(m, key) == url and url.startswith(("http://", "https://"))
    assert all(c.isascii() and c.isprintable() and c not in " {}$#?'\"\\" for c in url)
    page = url if key == "runbook_url" else url.rstrip("/") + "/runbook.md"
    assert m.runbook == page
    annotations = {
        r["annotations"]["runbook_url"] for r in alert_rules(monitor_fleet({key: url}))["groups"][0]["rules"]
    }
    assert annotations == {f"{page}#{anchor}" for anchor in RUNBOOK_ANCHORS.values()}
