"""ddtree.sglang.compat without SGLang: the version gate's rule and the table comparison's messages (the same
checks against SGLang's real code: test_sglang_plugin.py)."""

from __future__ import annotations

import pytest
from ddtree.sglang.compat import (
    ALLOW_VERSION_ENV,
    SGLANG_VERSION,
    allowed_versions,
    drift,
    drift_refusal,
    missing_attributes,
    version_refusal,
)
from hypothesis import given
from hypothesis import strategies as st

pytestmark = pytest.mark.runtime

versions = st.text(alphabet="0123456789.rcpostdev+abc", min_size=1, max_size=12)
noise = st.text(alphabet=" ,\t", max_size=3)


def test_the_checked_version_passes_and_another_is_refused_in_one_line() -> None:
    assert version_refusal(SGLANG_VERSION, {}) == ""
    why = version_refusal("0.5.24", {})
    assert why.startswith("DDTREE: SGLang '0.5.24' is installed") and "\n" not in why
    assert f"install sglang=={SGLANG_VERSION}" in why and f"{ALLOW_VERSION_ENV}=0.5.24" in why
    assert version_refusal(None, {ALLOW_VERSION_ENV: "0.5.24"}).startswith("DDTREE: cannot tell")


@given(installed=versions, others=st.lists(versions, max_size=3), sep=noise)
def test_a_version_runs_only_when_it_is_the_checked_one_or_the_variable_names_it(
    installed: str, others: list[str], sep: str
) -> None:
    named = [v for v in others if v != installed]
    without = {ALLOW_VERSION_ENV: f",{sep}".join(named)}
    with_it = {ALLOW_VERSION_ENV: f",{sep}".join([*named, f"{sep}{installed}{sep}"])}
    assert (version_refusal(installed, without) == "") is (installed == SGLANG_VERSION)
    assert version_refusal(installed, with_it) == ""
    if installed + "1" != SGLANG_VERSION:  # a longer version is another version
        assert version_refusal(installed + "1", {ALLOW_VERSION_ENV: installed}) != ""


@given(parts=st.lists(st.tuples(noise, versions, noise), max_size=4))
def test_the_variable_is_a_comma_separated_list_of_exact_versions(parts: list[tuple[str, str, str]]) -> None:
    value = ",".join(f"{a}{v}{b}" for a, v, b in parts)
    assert allowed_versions({ALLOW_VERSION_ENV: value}) == {v.strip() for _, v, _ in parts if v.strip()}


def test_drift_names_each_difference() -> None:
    table = {
        "json:dumps": ("obj",),  # a changed parameter list
        "json:loads": ("s", "cls", "object_hook", "parse_float", "parse_int", "parse_constant", "object_pairs_hook"),
        "json.decoder:JSONDecoder.decode": ("self", "s", "_w"),  # matches (a method, looked up statically)
        "json:no_such_function": (),
        "no_such_module_here:f": (),
    }
    found = drift(table, {"dataclasses:Field": ()})
    assert found[0].startswith("json:dumps takes (obj, skipkeys, ") and found[0].endswith("expected (obj)")
    assert found[1:] == [
        "json:loads takes (s, cls, object_hook, parse_float, parse_int, parse_constant, object_pairs_hook, kw), "
        "expected (s, cls, object_hook, parse_float, parse_int, parse_constant, object_pairs_hook)",
        "json:no_such_function is missing (AttributeError)",
        "no_such_module_here:f is missing (ModuleNotFoundError)",
    ]
    assert drift({"json.decoder:JSONDecoder.decode": ("self", "s", "_w")}, {}) == []
    assert drift_refusal("0.6.0", []) == ""
    line = drift_refusal("0.6.0", found)
    assert line.startswith(f"DDTREE: the installed SGLang 0.6.0 differs from the {SGLANG_VERSION} the plugin")
    assert "json:dumps takes" in line and "(and 3 more)" in line and "\n" not in line


def test_missing_attributes_ignores_a_forwarding_getattr() -> None:
    class Forwards:
        label = "class attribute"

        def __init__(self) -> None:
            self.block_size = 16

        def __getattr__(self, name: str) -> str:  # like DFlashWorkerV2: anything else goes to the target worker
            return "forwarded"

    assert missing_attributes(Forwards(), ("block_size", "label", "_mask_token_id")) == ["_mask_token_id"]
