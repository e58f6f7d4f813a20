"""Property: any inventory text either loads into a typed inventory whose rendered files pass the systemd-rules
check, or fails with exactly one OpsctlError whose one line shows no long value and no secret.

Two generators: valid shapes with hostile strings in every field, and random YAML-ish text. Fixed
max_examples and derandomize=True keep CI deterministic and the test under a minute."""

from __future__ import annotations

import json
import tempfile
import time
from pathlib import Path
from typing import Any

import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from opsctl.errors import OpsctlError
from opsctl.inventory.load import load_inventory
from opsctl.render import Secrets, render_service, server_env
from opsctl.systemd import exec_argv, expand_specifiers, parse_env_file, parse_unit

TOKENS = (
    "sk-proj-4f9A7b2C8d1E6f3G0h5I9j2K7l4M",
    "hf_AbCdEfGhIjKlMnOpQrStUvWxYz0123456789",
    "ghp_0123456789abcdefABCDEF0123456789abcd",
    "AKIAIOSFODNN7EXAMPLE",
)
PASSWORD = "pw-Zq8Xv2Lm9Kd4"  # only ever placed where opsctl must recognise it as a secret
SNIPPETS = (
    "\n",
    "\r",
    "\x00",
    "\x1b[31m",
    "\u2028",
    "\x85",
    "\t",
    " ",
    "-",
    "--",
    "-o",
    "%n",
    "%%",
    "$PATH",
    "${X}",
    "$$",
    "`id`",
    "$(reboot)",
    ";",
    "&&",
    "|",
    "'",
    '"',
    "\\",
    "\\n",
    "[bold]",
    "[/]",
    ":smile:",
    "\u202e",
    "ExecStartPre=/bin/sh",
    "\nPATH=/tmp",
    "..",
    "/",
    "~",
    "::",
    "0.0.0.0",
    "030000",
    "yes",
    "é",
    "\U0001f600",
    *TOKENS,
)
# Extra server arguments, valid ones included: quoting must hold for anything the rules let through.
ARGS = st.from_regex(r"[A-Za-z0-9._=:/,+@-]{1,20}", fullmatch=True)
HOSTILE = st.one_of(
    st.sampled_from(("gpu0", "/opt/venv", "10.0.0.1", "python3", "0.5.23", "root", "x")),
    st.lists(st.sampled_from((*SNIPPETS, "a", "b0", "/x", "gpu0")), min_size=1, max_size=5).map("".join),
    st.text(max_size=30),
    st.text(st.characters(codec="ascii"), min_size=81, max_size=200),
)


def _hostile(draw: st.DrawFn) -> bool:
    """Whether to make one field hostile: rarely enough that about a third of the inventories are valid."""
    return draw(st.integers(0, 24)) == 0


def _service(draw: st.DrawFn, index: int) -> dict[str, Any]:
    svc: dict[str, Any] = {
        "gpus": [index] if not _hostile(draw) else draw(st.sampled_from([[0, 0], [], [5], [0, 1]])),
        "port": 30000 + index if not _hostile(draw) else draw(st.sampled_from([1023, 65536, 30000])),
        "mode": draw(st.sampled_from(["baseline", "linear", "shadow", "tree"])),
        "model": {"source": "/data/m", "source_on": "host", "path": "/dev/shm/m", "hybrid": draw(st.booleans())},
        "draft_model": {"source": "/data/d", "source_on": "host", "path": "/dev/shm/d"},
    }
    for key in ("bind", "served_model_name", "attention_backend"):
        if _hostile(draw):
            svc[key] = draw(HOSTILE)
    if _hostile(draw):
        svc["model"]["path"] = "/dev/shm/" + draw(HOSTILE)
    if _hostile(draw):
        svc["model"]["source"] = draw(HOSTILE)
    if draw(st.booleans()):
        svc["extra_args"] = draw(st.lists(HOSTILE if _hostile(draw) else ARGS, max_size=3))
        if _hostile(draw):
            flag = draw(st.sampled_from(["--api-key", "--api_key", "--api-k", "--admin-api-key", "--API-KEY"]))
            svc["extra_args"].append(draw(st.sampled_from([f"{flag}={PASSWORD}", flag])))
            svc["extra_args"].append(PASSWORD + draw(HOSTILE))
    if draw(st.booleans()):
        svc["extra_env"] = {draw(HOSTILE) if _hostile(draw) else "SGLANG_X": draw(st.one_of(HOSTILE, st.text()))}
        if _hostile(draw):
            svc["extra_env"][draw(st.sampled_from(["HF_TOKEN", "MY_API_KEY", "DB_PASSWORD"]))] = PASSWORD
    if _hostile(draw):
        svc["api_key"] = draw(st.sampled_from(["env:OPSCTL_PROP_KEY", PASSWORD, "file:/etc/k"]))
    return svc


@st.composite
def shaped(draw: st.DrawFn) -> dict[str, Any]:
    host: dict[str, Any] = {"address": "10.0.0.1", "gpus": 2}
    for key in ("address", "venv", "python", "sglang_version"):
        if _hostile(draw):
            host[key] = draw(HOSTILE)
    if _hostile(draw):
        host["ssh"] = {draw(st.sampled_from(["user", "key_file", "known_hosts_file", "jump_host"])): draw(HOSTILE)}
    if _hostile(draw):
        host["cuda"] = {draw(st.sampled_from(["toolkit_package", "driver_package", "home"])): draw(HOSTILE)}
    names = draw(st.lists(HOSTILE if _hostile(draw) else st.sampled_from(["s1", "s2"]), min_size=1, max_size=2))
    host["services"] = {name: _service(draw, i) for i, name in enumerate(dict.fromkeys(names))}
    host_name = draw(HOSTILE) if _hostile(draw) else "h1"
    return {"hosts": {host_name: host}}


YAML_BITS = st.sampled_from(
    (
        "hosts:", "h1:", "services:", "s1:", "address:", "port:", "gpus:", "mode:", "model:", "<<:", "&a", "*a",
        "&b", "*b", "!!str", "!!binary", "!x", "[", "]", "{", "}", ",", "-", "- ", ": ", "'", '"', "? ", "|", ">",
        "#", "\n", "\n  ", "\n    ", "\n      ", " ", "\t", "030000", "0x1F", "1:30", "yes", "on", "~", "null",
        ".inf", "2024-01-01", "\ufeff", "\r\n", "\x00", "\x1b", "é", "\\", "%", "---", "...", "10.0.0.1", "::",
        "tree", "[0]", "30000", *TOKENS,
    )
)  # fmt: skip


def _values(data: Any) -> list[str]:
    """Every string in the generated data, keys included."""
    if isinstance(data, str):
        return [data]
    if isinstance(data, dict):
        return [v for k, item in data.items() for v in _values(k) + _values(item)]
    if isinstance(data, list):
        return [v for item in data for v in _values(item)]
    return []


def _check(text: str | bytes, values: list[str]) -> None:
    """The property, for one inventory text."""
    with tempfile.TemporaryDirectory() as tmp:
        file = Path(tmp) / "inv.yaml"
        file.write_bytes(text if isinstance(text, bytes) else text.encode("utf-8", "surrogatepass"))
        # CPU time, not wall time: a loaded CI machine stretches the wall clock, while a
        # pathological input (quadratic parsing, an alias bomb) shows in the CPU it burns.
        start = time.process_time()
        try:
            inventory = load_inventory(file)
            for host in inventory.hosts:
                for svc in host.services:
                    rendered = render_service(host, svc, "20260101T000000Z-abc123", Secrets.MASK)
                    unit = {d.key: d for d in parse_unit(rendered.unit)}
                    assert exec_argv(expand_specifiers(unit["ExecStart"].raw)) == rendered.exec_start
                    assert parse_env_file(rendered.env) == server_env(host, svc, rendered.release_dir)
                    assert yaml.safe_load(rendered.server_config)["port"] == svc.port
        except OpsctlError as exc:
            line = exc.one_line()
            assert "\n" not in line and all(ch.isprintable() for ch in line), repr(line)
            for value in values:
                for i in range(max(0, len(value) - 80)):
                    assert value[i : i + 81] not in line, "a value longer than 80 characters was echoed"
            for secret in (*TOKENS, PASSWORD):
                assert secret not in line, f"secret echoed: {line!r}"
        assert time.process_time() - start < 2.0


@settings(
    max_examples=400, derandomize=True, deadline=None, suppress_health_check=[HealthCheck.too_slow], database=None
)
@given(shaped(), st.booleans())
def test_shaped_inventories_load_and_render_or_fail_in_one_line(data: dict[str, Any], as_json: bool) -> None:
    text = json.dumps(data) if as_json else yaml.safe_dump(data, allow_unicode=True)
    _check(text, _values(data))


@settings(
    max_examples=600, derandomize=True, deadline=None, suppress_health_check=[HealthCheck.too_slow], database=None
)
@given(st.lists(YAML_BITS, max_size=40).map("".join))
def test_random_yaml_loads_or_fails_in_one_line(text: str) -> None:
    _check(text, [text])
