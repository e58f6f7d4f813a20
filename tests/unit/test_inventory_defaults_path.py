"""A bad value inherited from `defaults:` is reported under the path where it is written (issue 30:
`defaults.cuda.driver_package`, not `hosts.ct200.cuda.driver_package`, which is not in the file)."""

from __future__ import annotations

from typing import Any

import pytest

from opsctl.errors import InventoryError
from opsctl.inventory.load import parse_inventory

SERVICE = {"gpus": [0], "port": 30000, "mode": "baseline", "model": {"source": "/data/m", "path": "/dev/shm/m"}}
CUDA = {"toolkit_package": "cuda-toolkit-13-0", "home": "/usr/local/cuda-13.0", "driver_package": "nvidia-open"}


def _error(defaults: dict[str, Any], host: dict[str, Any] | None = None, service: dict[str, Any] | None = None) -> str:
    ct200 = {"address": "10.0.0.1", "gpus": 1, **(host or {}), "services": {"gpu0": {**SERVICE, **(service or {})}}}
    data = {"defaults": defaults, "hosts": {"ct200": ct200}}
    with pytest.raises(InventoryError) as err:
        parse_inventory(data)
    return err.value.path


def test_an_inherited_cuda_value_is_blamed_on_defaults() -> None:
    assert _error({"cuda": {**CUDA, "driver_package": "bad;pkg"}}) == "defaults.cuda.driver_package"


def test_a_sub_key_inherited_into_a_merged_mapping_is_blamed_on_defaults() -> None:
    host = {"cuda": {"toolkit_package": "cuda-toolkit-13-0"}}  # merged one level with defaults.cuda
    assert _error({"cuda": {**CUDA, "driver_package": "bad;pkg"}}, host) == "defaults.cuda.driver_package"


def test_the_hosts_own_value_is_still_the_hosts() -> None:
    host = {"cuda": {"driver_package": "bad;pkg"}}
    assert _error({"cuda": CUDA}, host) == "hosts.ct200.cuda.driver_package"


def test_inherited_host_scalars_and_service_defaults() -> None:
    assert _error({"venv": "relative/venv"}) == "defaults.venv"
    assert _error({"service": {"dtype": "fp7"}}) == "defaults.service.dtype"
    assert _error({"service": {"dtype": "fp7"}}, service={"dtype": "fp7"}) == "hosts.ct200.services.gpu0.dtype"


def test_a_missing_required_key_stays_the_hosts() -> None:
    data = {"defaults": {"venv": "/opt/v"}, "hosts": {"ct200": {"gpus": 1}}}
    with pytest.raises(InventoryError) as err:
        parse_inventory(data)
    assert err.value.path.startswith("hosts.ct200")
