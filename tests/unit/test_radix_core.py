"""SGLang's radix cache in the rendered services: left on, with SGLang's Rust TreeCore, which is right
only where the venv's torch is the one SGLang's wheel was built against (its `mem_cache` extension links the
venv's libtorch; on the H200 dev host's torch 2.11 it panics at the first prefill, `tch ... UnknownKind(29)`;
docs/sglang.md "The radix cache"). So the lock must pin SGLang's own torch, and a host that cannot have it
selects the Python TreeCore through `extra_env`."""

from __future__ import annotations

import importlib.metadata
import re
from pathlib import Path

import pytest

from opsctl.inventory.load import parse_inventory
from opsctl.kernel.locks import locks_dir
from opsctl.render import render_service

CORE_ENV = "SGLANG_UNIFIED_RADIX_TREE_CORE_BACKEND"


def _pin(lines: list[str], name: str) -> str | None:
    for line in lines:
        m = re.fullmatch(rf"{name}\s*==\s*([\w.+]+)(\s*;.*)?", line.split("#", 1)[0].strip())
        if m:
            return m.group(1)
    return None


def test_the_sglang_lock_pins_the_torch_sglang_was_built_for() -> None:
    try:
        requires = importlib.metadata.requires("sglang") or []
        version = importlib.metadata.version("sglang")
    except importlib.metadata.PackageNotFoundError:
        pytest.skip("sglang's metadata is not installed here")
    lock = (locks_dir() / f"sglang-{version}.txt").read_text().splitlines()
    wanted = _pin([r for r in requires if "extra ==" not in r], "torch")
    assert wanted is not None and _pin(lock, "torch") == wanted, "the Rust TreeCore needs SGLang's own torch"


def _service(extra_env: dict[str, str] | None = None) -> tuple[object, object]:
    svc: dict[str, object] = {
        "gpus": [0],
        "port": 30000,
        "mode": "tree",
        "model": {"source": "/m/t", "source_on": "host", "path": "/dev/shm/t", "hybrid": False},
        "draft_model": {"source": "/m/d", "source_on": "host", "path": "/dev/shm/d"},
    }
    if extra_env:
        svc["extra_env"] = extra_env
    inv = parse_inventory({"hosts": {"h": {"address": "10.0.0.1", "gpus": 1, "services": {"s": svc}}}}, "t", Path("."))
    host = inv.hosts[0]
    return host, host.services[0]


def test_rendered_services_keep_the_radix_cache_and_sglangs_core() -> None:
    host, svc = _service()
    rendered = render_service(host, svc, "r")  # type: ignore[arg-type]
    assert "--disable-radix-cache" not in rendered.flags and CORE_ENV not in rendered.env


def test_a_host_without_sglangs_torch_selects_the_python_core() -> None:
    host, svc = _service({CORE_ENV: "python"})
    assert f"{CORE_ENV}=python\n" in render_service(host, svc, "r").env  # type: ignore[arg-type]
