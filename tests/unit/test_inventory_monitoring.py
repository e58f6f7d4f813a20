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
from opsctl.monitor.rules import alert_rules
from tests.unit.monitor_fleet import monitor_fleet


def error(monitoring: Any) -> str:
    with pytest.raises(InventoryError) as info:
        monitor_fleet(monitoring)
    return info.value.one_line()


def test_defaults_and_an_empty_section() -> None:
    assert monitor_fleet().monitoring == MonitoringConfig() == monitor_fleet({}).monitoring
    assert MonitoringConfig().runbook_url == "docs/runbook.md"
    assert {*_SECONDS, *_NUMBERS, "runbook_url"} == KEYS


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
    assert m.runbook_url == "https://git.example.com/o/r/runbook.md"


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
        ({"runbook_url": "docs/runbook.md#top"}, "monitoring.runbook_url: 'docs/runbook.md#top' is not a plain URL"),
        ({"runbook_url": ""}, "monitoring.runbook_url: '' is not a plain URL"),
        ({"runbook_url": 7}, "monitoring.runbook_url: expected a string, got an integer"),
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
            assert isinstance(value, str) and not set(value) & set("{}$#'\" \n\\")
    # and the rules carry them as given
    text = repr(alert_rules(monitor_fleet(monitoring)))
    assert f"< {m.tau_ratio!r} * opsctl:ddtree_tau:baseline" in text and f"> {m.ttft_p95!r}" in text
    assert f"'runbook_url': '{m.runbook_url}#opsctlservicedown'" in text
