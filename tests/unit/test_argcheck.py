"""The flag-value pre-flight's path check (`--tokenizer-path /nonexistent` must not deploy), run for
real: the command argcheck builds, executed by this machine's python with the reference server's own parser
(the host side of the pre-flight, minus SSH)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from opsctl.deploy import argcheck
from opsctl.inventory.model import Engine

RUNTIME = Path(__file__).resolve().parents[2] / "runtime"


def _check(tmp_path: Path, flags: list[str], managed: tuple[str, ...] = ()) -> str | None:
    venv = tmp_path / "venv"
    (venv / "bin").mkdir(parents=True, exist_ok=True)
    if not (venv / "bin" / "python").exists():
        (venv / "bin" / "python").symlink_to(sys.executable)
    cmd = argcheck.values_cmd(str(venv), Engine.REFERENCE, str(RUNTIME), flags, managed=managed)
    out = subprocess.run([str(a) for a in cmd.argv], capture_output=True, text=True, timeout=120)
    return argcheck.refusal(out.returncode, out.stdout, out.stderr)


@pytest.fixture
def model(tmp_path: Path) -> Path:
    (tmp_path / "model").mkdir()
    return tmp_path / "model"


def test_a_missing_tokenizer_path_is_refused_with_its_flag(tmp_path: Path, model: Path) -> None:
    refused = _check(tmp_path, ["--model-path", str(model), "--tokenizer-path", "/nonexistent"])
    assert refused == "error: not on the host (no such file or directory): --tokenizer-path /nonexistent"
    refused = _check(tmp_path, ["--model-path", str(model), "--tokenizer-path=./nope"])
    assert refused is not None and "--tokenizer-path ./nope" in refused


def test_existing_paths_repo_ids_and_managed_models_pass(tmp_path: Path, model: Path) -> None:
    assert _check(tmp_path, ["--model-path", str(model), "--tokenizer-path", str(model)]) is None
    assert _check(tmp_path, ["--model-path", str(model), "--tokenizer-path", "Qwen/Qwen3-8B"]) is None  # a repo id
    # the service's model: its absence is the missing-model refusal's (with `opsctl provision`), not this one's
    assert _check(tmp_path, ["--model-path", "/dev/shm/gone"], managed=("/dev/shm/gone",)) is None
    assert _check(tmp_path, ["--model-path", "/dev/shm/gone"]) is not None


def test_the_parser_still_speaks_first(tmp_path: Path, model: Path) -> None:
    refused = _check(tmp_path, ["--model-path", str(model), "--port", "0", "--tokenizer-path", "/nonexistent"])
    assert refused is not None and "port" in refused and "not on the host" not in refused


def test_a_path_of_the_wrong_kind_is_refused_with_what_the_flag_needs(tmp_path: Path, model: Path) -> None:
    """`--tokenizer-path` naming a file once passed pre-flight; the service then failed every request."""
    (model / "tokenizer.json").write_text("{}")
    (tmp_path / "template.jinja").write_text("{{ messages }}")
    refused = _check(tmp_path, ["--model-path", str(model), "--tokenizer-path", f"{model}/tokenizer.json"])
    assert refused == (
        f"error: wrong kind of path: --tokenizer-path {model}/tokenizer.json is a file, needs a directory"
    )
    refused = _check(tmp_path, ["--model-path", str(model), "--chat-template", str(model), "--tokenizer-path", "/no"])
    assert refused == (
        "error: not on the host (no such file or directory): --tokenizer-path /no; "
        f"wrong kind of path: --chat-template {model} is a directory, needs a file"
    )
    ok = ["--model-path", str(model), "--tokenizer-path", str(model), "--chat-template", f"{tmp_path}/template.jinja"]
    assert _check(tmp_path, ok) is None


def test_each_engine_says_what_each_path_flag_needs() -> None:
    reference, sglang = argcheck.path_kinds(Engine.REFERENCE), argcheck.path_kinds(Engine.SGLANG)
    assert set(reference) == set(sglang) == argcheck.PATH_FLAGS
    assert argcheck.needs(reference["--tokenizer-path"]) == "a directory"
    assert argcheck.needs(sglang["--tokenizer-path"]) == "a directory or a .json or .gguf file"  # tiktoken, GGUF
    assert argcheck.needs(sglang["--model-path"]) == "a directory or a .gguf file"
    assert argcheck.needs(sglang["--ssl-keyfile"]) == "a file"
    assert argcheck.needs(sglang["--kt-weight-path"]) == "a directory or a file"
