"""`routers.<name>.canary`: defaults a careful operator would pick, each error one line naming its key path,
hostile blocks (hypothesis) load or fail in one line."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from opsctl.errors import InventoryError
from opsctl.inventory.load import parse_inventory
from opsctl.inventory.model import CanaryConfig
from tests.unit.router_fleet import fleet_data
from tests.unit.test_router_inventory import VALUES


def inv(canary: Any, **router: Any) -> dict[str, Any]:
    data = fleet_data(**router)
    data["routers"]["front"]["canary"] = canary  # None too: an explicit null
    return data


def test_defaults_and_given_values() -> None:
    (router,) = parse_inventory(inv({})).routers
    assert router.canary == CanaryConfig()
    c = router.canary
    assert (c.workers, c.window, c.min_requests, c.max_ttft_ratio, c.min_tok_s_ratio, c.replay) == (
        1, 300.0, 20, 1.5, 0.8, 3,
    )  # fmt: skip
    (router,) = parse_inventory(inv({"workers": 2, "window": 5, "max_itl_ratio": 2})).routers
    assert router.canary is not None and (router.canary.workers, router.canary.window) == (2, 5.0)
    assert router.canary.max_itl_ratio == 2.0
    assert router.canary.max_window == 15.0  # three windows unless given
    assert CanaryConfig().max_window == 3 * CanaryConfig().window
    assert parse_inventory(fleet_data()).routers[0].canary is None


@pytest.mark.parametrize(
    ("canary", "router", "expected"),
    [
        ({"workers": 3}, {}, "routers.front.canary.workers: 3 of the router's 3 workers leaves none on the old"),
        ({"workers": 0}, {}, "routers.front.canary.workers: 0 is out of range (1..1024)"),
        ({"window": "5m"}, {}, "routers.front.canary.window: expected a number, got a string"),
        ({"max_ttft_ratio": 0.5}, {}, "routers.front.canary.max_ttft_ratio: 0.5 is out of range (1..100)"),
        ({"min_tok_s_ratio": float("nan")}, {}, "routers.front.canary.min_tok_s_ratio: nan is out of range"),
        ({"replay": True}, {}, "routers.front.canary.replay: expected an integer, got a boolean"),
        ({"window": 60, "max_window": 30}, {}, "routers.front.canary.max_window: 30 is shorter than window (60)"),
        ({"max_window": "1h"}, {}, "routers.front.canary.max_window: expected a number, got a string"),
        ({"windw": 5}, {}, "routers.front.canary.windw: unknown key (did you mean `window`?)"),
        ([1], {}, "routers.front.canary: expected a mapping, got a list"),
        ({}, {"services": ["h1/a"]}, "routers.front.canary: a canary needs a router with at least 2 workers"),
    ],
)
def test_errors_name_the_key(canary: Any, router: dict[str, Any], expected: str) -> None:
    with pytest.raises(InventoryError) as info:
        parse_inventory(inv(canary, **router))
    assert info.value.one_line().startswith(expected), info.value.one_line()


KEYS = st.sampled_from([*CanaryConfig.__dataclass_fields__, "weird"])


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.dictionaries(KEYS, VALUES, max_size=6) | VALUES)
def test_hostile_canary_blocks_load_or_fail_in_one_line(canary: Any) -> None:
    try:
        (router,) = parse_inventory(inv(canary)).routers
    except InventoryError as exc:
        line = exc.one_line()
        assert "\n" not in line and line.startswith("routers.front.canary"), line
        return
    c = router.canary
    assert c is not None and 1 <= c.workers < len(router.workers) and 1 <= c.window <= c.max_window
    assert 0 <= c.min_tok_s_ratio <= 1 and c.max_ttft_ratio >= 1
