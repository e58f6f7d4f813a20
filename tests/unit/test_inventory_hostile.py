"""Hostile inventories, by hand: each is one error line naming the problem, exit 1, nothing written, no value
shown beyond a short escaped excerpt, and no secret shown at all."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from opsctl.errors import OpsctlError
from opsctl.inventory.load import Override, load_inventory
from opsctl.inventory.model import PolicyMode
from opsctl.inventory.reader import MAX_BYTES
from tests.conftest import run_cli

SERVICE: dict[str, Any] = {
    "gpus": [0],
    "port": 30000,
    "mode": "linear",
    "model": {"source": "/data/m", "source_on": "host", "path": "/dev/shm/m", "hybrid": False},
    "draft_model": {"source": "/data/d", "source_on": "host", "path": "/dev/shm/d"},
}
BASE: dict[str, Any] = {"hosts": {"h1": {"address": "10.0.0.1", "gpus": 2, "services": {"s1": SERVICE}}}}

TOKEN_SK = "sk-proj-4f9A7b2C8d1E6f3G0h5I9j2K7l4M"
TOKEN_HF = "hf_AbCdEfGhIjKlMnOpQrStUvWxYz0123456789"
TOKEN_GH = "ghp_0123456789abcdefABCDEF0123456789abcd"
TOKEN_AWS = "AKIAIOSFODNN7EXAMPLE"
TOKEN_JWT = "eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiIxMjM0NTY3ODkwIn0.dozjgNryP4J3jVmNHl0w5N_XgL0n3I9PlFUP0THsR8U"
PASSWORD = "hunter2-Very-Secret"


def doc(host: dict[str, Any] | None = None, **service: Any) -> str:
    """The base inventory with service keys (None deletes) and host keys changed, as YAML (JSON is YAML)."""
    data = copy.deepcopy(BASE)
    svc = data["hosts"]["h1"]["services"]["s1"]
    for key, value in service.items():
        if value is None:
            svc.pop(key, None)
        else:
            svc[key] = value
    data["hosts"]["h1"].update(host or {})
    return json.dumps(data)


def raw(service_yaml: str, host_yaml: str = "", top: str = "") -> str:
    """Block YAML with literal service keys (for what JSON cannot say: plain scalars, tags, anchors)."""
    svc = "\n".join("        " + line for line in service_yaml.strip("\n").splitlines())
    extra = "\n".join("    " + line for line in host_yaml.strip("\n").splitlines())
    return f"""{top}
hosts:
  h1:
    address: 10.0.0.1
    gpus: 2
{extra}
    services:
      s1:
        gpus: [0]
        port: 30000
        mode: linear
        model: {{source: /data/m, source_on: host, path: /dev/shm/m, hybrid: false}}
        draft_model: {{source: /data/d, source_on: host, path: /dev/shm/d}}
{svc}
"""


def bomb(levels: int = 9) -> str:
    lines = ['a0: &a0 ["lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol"]']
    lines += [f"a{i}: &a{i} [{', '.join([f'*a{i - 1}'] * 10)}]" for i in range(1, levels)]
    return "\n".join(lines) + "\nhosts: {h1: {address: 10.0.0.1, x: *a" + str(levels - 1) + "}}\n"


LONG = "/opt/" + "a" * 5000

# (id, inventory text or bytes, fragment the one error line must contain, strings it must not contain)
CASES: list[tuple[str, str | bytes, str, tuple[str, ...]]] = [
    # --- a trailing newline or control character in every kind of value -------------------------------------
    ("nl-venv", doc({"venv": "/opt/venv\n"}), "hosts.h1.venv: '/opt/venv\\n' is not a safe absolute path", ()),
    ("nl-python", doc({"python": "python3\n"}), "hosts.h1.python: 'python3\\n' is not a safe command", ()),
    ("nl-address", doc({"address": "10.0.0.1\n"}), "hosts.h1.address: '10.0.0.1\\n' is not a valid IP", ()),
    ("nl-version", doc({"sglang_version": "0.5.23\n"}), "sglang_version: '0.5.23\\n' is not an exact version", ()),
    ("nl-user", doc({"ssh": {"user": "root\n"}}), "hosts.h1.ssh.user: 'root\\n' is not a valid user name", ()),
    ("nl-bind", doc(bind="0.0.0.0\n"), "services.s1.bind: '0.0.0.0\\n' is not a valid IP address", ()),
    ("nl-served-name", doc(served_model_name="qwen\n"), "served_model_name: 'qwen\\n' is not a safe word", ()),
    ("nl-backend", doc(attention_backend="triton\n"), "attention_backend: 'triton\\n' is not a safe word", ()),
    ("nl-smoke-prompt", doc(smoke_prompt="hi\nthere"), "smoke_prompt: 'hi\\nthere' is not a prompt", ()),
    ("long-smoke-prompt", doc(smoke_prompt="x" * 501), "smoke_prompt: is 501 characters; a prompt may have at", ()),
    (
        "nl-extra-arg-execstartpre",
        doc(extra_args=["--x\nExecStartPre=/bin/sh"]),
        "extra_args[0]: '--x\\nExecStartPre=/bin/sh' is not a safe argument",
        ("\nExecStartPre",),
    ),
    ("nl-env-value-path", doc(extra_env={"FOO": "1\nPATH=/tmp"}), "extra_env.FOO: '1\\nPATH=/tmp' is not a safe", ()),
    ("cr-env-value", doc(extra_env={"FOO": "1\rX=2"}), "extra_env.FOO: '1\\rX=2' is not a safe environment value", ()),
    ("nel-env-value", doc(extra_env={"FOO": "a\x85b"}), "extra_env.FOO: 'a\\x85b' is not a safe environment", ()),
    ("ls-env-value", doc(extra_env={"FOO": "a\u2028b"}), "extra_env.FOO: 'a\\u2028b' is not a safe", ()),
    ("nul-env-value", doc(extra_env={"FOO": "a\x00b"}), "extra_env.FOO: 'a\\x00b' is not a safe environment", ()),
    (
        "nul-raw",
        b"hosts: {h1: {address: a\x00}}\n",
        "YAML syntax error at position 23: character U+0000 is not allowed",
        (),
    ),
    ("nl-env-name", doc(extra_env={"FOO\n": "1"}), "extra_env['FOO\\n']: 'FOO\\n' is not a valid environment", ()),
    ("nl-model-path", doc(model={**SERVICE["model"], "path": "/dev/shm/m\n"}), "model.path: '/dev/shm/m\\n'", ()),
    ("nl-service-key", doc(), "", ()),  # replaced below: JSON key with a newline
    (
        "nl-package",
        doc({"cuda": {"toolkit_package": "cuda\n"}}),
        "toolkit_package: 'cuda\\n' is not a valid package",
        (),
    ),
    ("esc-in-value", doc(served_model_name="\x1b[31mred"), "served_model_name: '\\x1b[31mred' is not a safe", ()),
    ("tab-in-path", doc({"venv": "/opt/v\tx"}), "hosts.h1.venv: '/opt/v\\tx' is not a safe absolute path", ()),
    ("percent-in-path", doc({"venv": "/opt/%n"}), "'/opt/%n' is not a safe absolute path", ()),
    ("dollar-in-arg", doc(extra_args=["--x=${PATH}"]), "'--x=${PATH}' is not a safe argument", ()),
    # --- option injection: nothing starting with - where apt, pip, ssh or a shell reads options --------------
    ("dash-package", doc({"cuda": {"driver_package": "--allow-unauthenticated"}}), "is not a valid package name", ()),
    ("dash-package-o", doc({"cuda": {"toolkit_package": "-oAPT::Get::x=1"}}), "is not a valid package name", ()),
    ("dash-python", doc({"python": "-c"}), "hosts.h1.python: '-c' is not a safe command", ()),
    (
        "dash-key-file",
        doc({"ssh": {"key_file": "-oProxyCommand=sh"}}),
        "key_file: '-oProxyCommand=sh' is not a safe",
        (),
    ),
    ("dash-address", doc({"address": "-oProxyCommand=x"}), "is not a valid IP address or hostname", ()),
    ("dash-served-name", doc(served_model_name="--model-path"), "'--model-path' is not a safe word", ()),
    ("space-known-hosts", doc({"ssh": {"known_hosts_file": "~/a b"}}), "known_hosts_file: '~/a b' is not a safe", ()),
    ("jump-host-cmd", doc({"ssh": {"jump_host": "u@h -W x"}}), "jump_host: 'u@h -W x' is not a valid jump host", ()),
    ("wheelhouse-dash", doc({"wheelhouse": "-rf"}), "hosts.h1.wheelhouse: '-rf' is not a safe path", ()),
    # --- secret flags, the way SGLang's argparse resolves them; the value is never shown ----------------------
    (
        "flag-api-key-eq",
        doc(extra_args=[f"--api-key={PASSWORD}"]),
        "'--api-key': secrets must not be passed",
        (PASSWORD,),
    ),
    ("flag-api-key-sep", doc(extra_args=["--api-key", PASSWORD]), "extra_args[0]: '--api-key': secrets", (PASSWORD,)),
    ("flag-underscore", doc(extra_args=[f"--api_key={PASSWORD}"]), "'--api_key': secrets must not", (PASSWORD,)),
    ("flag-prefix", doc(extra_args=[f"--api-k={PASSWORD}"]), "'--api-k': secrets must not be passed", (PASSWORD,)),
    ("flag-short-prefix", doc(extra_args=["--api", PASSWORD]), "'--api': secrets must not be passed", (PASSWORD,)),
    ("flag-admin", doc(extra_args=[f"--admin-api-key={PASSWORD}"]), "'--admin-api-key': secrets", (PASSWORD,)),
    ("flag-admin-prefix", doc(extra_args=[f"--admin={PASSWORD}"]), "'--admin': secrets must not", (PASSWORD,)),
    ("flag-upper", doc(extra_args=[f"--API-KEY={PASSWORD}"]), "'--API-KEY': secrets must not", (PASSWORD,)),
    ("flag-ssl-password", doc(extra_args=[f"--ssl-keyfile-password={PASSWORD}"]), "secrets must not", (PASSWORD,)),
    (
        "flag-unsafe-value",
        doc(extra_args=[f"--api-key={PASSWORD} $(reboot)"]),
        "'--api-key': secrets must not be passed",
        (PASSWORD,),
    ),
    ("secret-env-name", doc(extra_env={"MY_API_TOKEN": PASSWORD}), "MY_API_TOKEN: looks like a secret", (PASSWORD,)),
    ("literal-api-key", doc(api_key=PASSWORD), "api_key: literal secrets are not allowed", (PASSWORD,)),
    ("api-key-file-newline", doc(api_key="file:/x\n"), "api_key: literal secrets are not allowed", ()),
    # --- token-shaped literals anywhere, with the secret-reference hint ------------------------------------
    (
        "token-env-value",
        doc(extra_env={"FOO": TOKEN_SK}),
        "extra_env.FOO: looks like a literal secret",
        (TOKEN_SK[:12],),
    ),
    (
        "token-served",
        doc(served_model_name=TOKEN_HF),
        "served_model_name: looks like a literal secret",
        (TOKEN_HF[:12],),
    ),
    (
        "token-arg",
        doc(extra_args=["--x", f"Bearer-{TOKEN_GH}"]),
        "extra_args[1]: looks like a literal",
        (TOKEN_GH[:12],),
    ),
    ("token-path", doc({"venv": f"/opt/{TOKEN_AWS}"}), "hosts.h1.venv: looks like a literal secret", (TOKEN_AWS,)),
    ("token-jwt", doc(extra_env={"X": TOKEN_JWT}), "looks like a literal secret", (TOKEN_JWT[:12],)),
    ("token-key", doc({"services": {TOKEN_SK: SERVICE}}), "a key at line", (TOKEN_SK[:12],)),
    ("token-unknown-key", doc({TOKEN_HF: 1}), "looks like a literal secret", (TOKEN_HF[:12],)),
    ("token-private-key", doc(extra_env={"X": "-----BEGIN OPENSSH PRIVATE KEY-----"}), "a private key", ("OPENSSH",)),
    ("token-hint", doc(extra_env={"FOO": TOKEN_SK}), "write the secret as the service's api_key: env:NAME", ()),
    # --- bounded input -----------------------------------------------------------------------------------
    ("too-big", "# " + "x" * MAX_BYTES + "\n", "larger than 1024 KiB, the inventory size limit", ()),
    ("alias-bomb", bomb(), "expands to more than 100000 values", ("lol" * 30,)),
    ("alias-recursive", "a: &a [*a]\nhosts: {h1: {address: 10.0.0.1, x: *a}}\n", "refers to a mapping or list", ()),
    ("alias-merge-recursive", "a: &a {<<: *a}\nhosts: {}\n", "refers to a mapping or list", ()),
    ("too-many-aliases", "a: &a 1\nb: [" + ", ".join(["*a"] * 1001) + "]\n", "more than 1000 aliases", ()),
    ("deep-nesting", "hosts: " + "[" * 200 + "]" * 200 + "\n", "nested deeper than 32 levels", ()),
    (
        "deep-by-alias",
        "".join(f"a{i}: &a{i} [[[[*a{i - 1}]]]]\n" if i else "a0: &a0 [1]\n" for i in range(12)),
        "deeper",
        (),
    ),
    (b"not-utf8".decode(), b"hosts:\n  h1: {address: \xff\xfe}\n", "is not valid UTF-8 (byte 23, line 2)", ()),
    ("utf16", "hosts: {}\n".encode("utf-16"), "is UTF-16 (or UTF-32) encoded", ()),
    ("long-value-excerpt", doc({"venv": LONG}), "is 5005 characters; a safe absolute path may have at most 1024", ()),
    ("long-name-excerpt", doc({"python": "p" * 300}), "is 300 characters; a safe command may have at most 256", ()),
    ("long-unknown-key", doc({"k" * 300: 1}), "unknown key", ("k" * 81,)),
    ("huge-number", raw("health_timeout: " + "9" * 5000), "a number of 5000 characters is too long", ()),
    # --- terminal markup and escapes in keys are shown escaped, never interpreted ---------------------------
    ("markup-key", doc({"[bold red]x[/]": 1}), "hosts.h1['[bold red]x[/]']: unknown key", ()),
    ("markup-close", doc({"[/nope]": 1}), "hosts.h1['[/nope]']: unknown key", ()),
    ("escape-key", doc({"\x1b]0;pwned\x07": 1}), "hosts.h1['\\x1b]0;pwned\\x07']: unknown key", ("\x1b",)),
    ("emoji-key", doc({":smile:": 1}), "hosts.h1[':smile:']: unknown key", ("\U0001f604",)),
    ("bidi-key", doc({"a\u202eb": 1}), "hosts.h1['a\\u202eb']: unknown key", ("\u202e",)),
    # --- keys as text: collisions refused; merge keys supported ---------------------------------------------
    ("key-collision", 'hosts:\n  h1:\n    address: x\n    services: {7: {}, "7": {}}\n', "duplicate key '7'", ()),
    ("key-collision-float", "hosts: {1.0: {}, '1.0': {}}\n", "duplicate key '1.0'", ()),
    ("key-collision-bool", "hosts: {yes: {}, 'yes': {}}\n", "duplicate key 'yes'", ()),
    ("key-list", "hosts:\n  ? [a, b]\n  : {}\n", "a key must be a plain word", ()),
    ("merge-scalar", "hosts:\n  <<: 5\n", "a merge key takes a mapping or a list of mappings", ()),
    ("merge-duplicate", "d: &d {a: 1}\nhosts:\n  <<: *d\n  <<: *d\n", "duplicate key '<<'", ()),
    # --- YAML 1.1 surprises, refused with a hint to quote ---------------------------------------------------
    (
        "octal-port",
        raw("port: 030000").replace("        port: 30000\n", ""),
        "'030000' is read as the number 12288",
        (),
    ),
    ("hex-port", raw("port: 0x7530").replace("        port: 30000\n", ""), "'0x7530' is read as the number 30000", ()),
    ("underscore-port", raw("port: 30_000").replace("        port: 30000\n", ""), "'30_000' is read as the number", ()),
    ("sexagesimal", raw("health_timeout: 1:30"), "'1:30' is read as the number 90 by YAML 1.1", ()),
    ("bool-yes", raw("ddtree: {allow_hybrid_unsafe: yes}"), "'yes' is a YAML 1.1 boolean (write true or false", ()),
    ("bool-off", raw("served_model_name: off"), "served_model_name: 'off' is a YAML 1.1 boolean", ()),
    ("bool-on-arg", raw("extra_args: [--enable-x, on]"), "extra_args[1]: 'on' is a YAML 1.1 boolean", ()),
    ("octal-arg", raw("extra_args: [--mode, 0755]"), "extra_args[1]: '0755' is read as the number 493", ()),
    ("date-version", raw("", "sglang_version: 2024-01-01"), "'2024-01-01' is read as a date by YAML", ()),
    ("inf", raw("health_timeout: .inf"), "'.inf' is read as the number inf", ()),
    ("nan", raw("readiness_delay: .nan"), "'.nan' is read as the number nan", ()),
    ("tag-binary", raw("served_model_name: !!binary aGVsbG8="), "the YAML tag", ()),
    ("tag-python", raw("served_model_name: !!python/object:os.system x"), "the YAML tag", ()),
    ("tag-custom", raw("served_model_name: !vault x"), "served_model_name: the YAML tag !vault is not supported", ()),
    ("tag-set", raw("extra_env: !!set {A, B}"), "the YAML tag", ()),
    ("float-in-int", raw("ddtree: {budget: 1.5}"), "ddtree.budget: expected an integer, got a number", ()),
    # --- addresses and GPUs ---------------------------------------------------------------------------
    ("ipv6-zone", doc({"address": "fe80::1%eth0"}), "is not a valid IP address or hostname", ()),
    ("ipv4-bad", doc({"address": "999.1.1.1"}), "'999.1.1.1' is not a valid IP address", ()),
    ("ipv6-bad", doc(bind="1::2::3"), "'1::2::3' is not a valid IP address", ()),
    ("gpu-twice", doc(gpus=[0, 0]), "services.s1.gpus: GPU 0 is listed twice", ()),
    # --- ddtree.policy: off | auto | chain | tree<N>, N <= budget ------------------------------------------
    ("policy-word", doc(ddtree={"policy": "fastest"}), "s1.ddtree.policy: expected off, auto, chain or tree<N>", ()),
    ("policy-nl", doc(ddtree={"policy": "auto\nX=1"}), "ddtree.policy: expected off, auto, chain or tree<N> (1 <=", ()),
    ("policy-big", doc(ddtree={"budget": 16, "policy": "tree32"}), "ddtree.policy: tree32 is larger than ddtree", ()),
    ("policy-zero", doc(ddtree={"policy": "tree0"}), "ddtree.policy: expected off, auto, chain or tree<N>", ()),
    ("policy-int", doc(ddtree={"policy": 16}), "ddtree.policy: expected off, auto, chain or tree<N> (1 <= N <= b", ()),
    ("policy-bool", raw("ddtree: {policy: off}"), "ddtree.policy: 'off' is a YAML 1.1 boolean", ()),
    ("policy-list", doc(ddtree={"policy": ["auto"]}), "ddtree.policy: expected off, auto, chain or tree<N>", ()),
    ("policy-upper", doc(ddtree={"policy": "AUTO"}), "ddtree.policy: expected off, auto, chain or tree<N>", ()),
]
CASES = [c for c in CASES if c[0] != "nl-service-key"] + [
    (
        "nl-service-key",
        json.dumps({"hosts": {"h1": {"address": "10.0.0.1", "services": {"s1\nExecStartPre=x": SERVICE}}}}),
        "hosts.h1.services: 's1\\nExecStartPre=x' is not a safe name",
        ("\nExecStartPre",),
    )
]


@pytest.mark.parametrize(("case", "text", "expected", "hidden"), CASES, ids=[c[0] for c in CASES])
def test_hostile_inventory_is_one_line_and_writes_nothing(
    tmp_path: Path, case: str, text: str | bytes, expected: str, hidden: tuple[str, ...]
) -> None:
    file = tmp_path / "inv.yaml"
    file.write_bytes(text if isinstance(text, bytes) else text.encode())
    out = tmp_path / "out"
    result = run_cli("render", "-i", str(file), "--out", str(out))
    lines = [ln for ln in result.stderr.splitlines() if ln.strip()]
    assert result.exit_code == 1, result.stderr
    assert len(lines) == 1, lines
    assert lines[0].startswith("error: "), lines
    assert expected in lines[0]
    assert "Traceback" not in result.stderr + result.stdout and result.stdout == ""
    assert not out.exists()  # nothing written
    assert all(ch.isprintable() for ch in lines[0]), repr(lines[0])
    assert len(lines[0]) < 400, len(lines[0])
    for secret in hidden:
        assert secret not in result.stderr


def test_table_has_at_least_60_hostile_cases() -> None:
    assert len(CASES) >= 60 and len({c[0] for c in CASES}) == len(CASES)


# --- what must be accepted --------------------------------------------------------------------------------


def _load(tmp_path: Path, text: str, overrides: list[Override] | None = None):  # type: ignore[no-untyped-def]
    file = tmp_path / "inv.yaml"
    file.write_text(text)
    return load_inventory(file, overrides or [])


def test_ipv6_listen_and_host_addresses_are_accepted(tmp_path: Path) -> None:
    inv = _load(tmp_path, doc({"address": "fd00::10"}, bind="::"))
    assert inv.hosts[0].address == "fd00::10"
    assert inv.hosts[0].services[0].bind == "::"
    assert _load(tmp_path, raw("bind: '::'")).hosts[0].services[0].bind == "::"


def test_merge_keys_work_and_own_keys_win(tmp_path: Path) -> None:
    text = """
defaults:
  service: &tuned {dtype: float16, served_model_name: first}
hosts:
  h1:
    address: 10.0.0.1
    gpus: 2
    services:
      s1: &base
        gpus: [0]
        port: 30000
        mode: linear
        dtype: bfloat16
        model: {source: /data/m, source_on: host, path: /dev/shm/m, hybrid: false}
        draft_model: {source: /data/d, source_on: host, path: /dev/shm/d}
      s2:
        <<: [*tuned, *base]
        gpus: [1]
        port: 30001
"""
    s1, s2 = _load(tmp_path, text).hosts[0].services
    assert (s1.dtype, s1.port, s1.gpus) == ("bfloat16", 30000, (0,))
    assert (s2.dtype, s2.served_model_name, s2.port, s2.gpus) == ("float16", "first", 30001, (1,))
    assert s2.model == s1.model and s2.mode is s1.mode


def test_bom_crlf_and_numbers_as_written(tmp_path: Path) -> None:
    text = raw('extra_args: ["--mem-fraction-static", 0.80, --tp, 2]\nextra_env: {X: 1.10}')
    file = tmp_path / "inv.yaml"
    file.write_bytes(b"\xef\xbb\xbf" + text.replace("\n", "\r\n").encode())
    svc = load_inventory(file).hosts[0].services[0]
    assert svc.extra_args == ("--mem-fraction-static", "0.80", "--tp", "2")
    assert svc.extra_env == (("X", "1.10"),)


def test_ssl_keyfile_is_not_a_secret_flag(tmp_path: Path) -> None:
    svc = _load(tmp_path, doc(extra_args=["--ssl-keyfile", "/etc/ssl/k.pem"])).hosts[0].services[0]
    assert svc.extra_args == ("--ssl-keyfile", "/etc/ssl/k.pem")


def test_mode_override_goes_through_the_same_rules_and_warnings(tmp_path: Path) -> None:
    text = doc(**{k: v for k, v in copy.deepcopy(SERVICE).items()}, ddtree={"budget": 24})
    inv = _load(tmp_path, text, [Override("mode", "tree", "--mode tree")])
    assert inv.hosts[0].services[0].mode.value == "tree"
    assert any("2 * block window without CUDA graphs" in w for w in inv.warnings)
    assert not _load(tmp_path, text).warnings  # the same file in its own mode warns of nothing


def test_mode_override_is_refused_like_the_file(tmp_path: Path) -> None:
    file = tmp_path / "inv.yaml"
    file.write_text(doc(mode="baseline", draft_model=None))
    result = run_cli("deploy", "-i", str(file), "--mode", "linear", "--plan")
    assert result.exit_code == 1, result.stderr
    assert (
        "error: hosts.h1.services.s1.draft_model: mode linear needs a draft model (the DFlash drafter) "
        "(with --mode linear)" in result.stderr
    )
    result = run_cli("deploy", "-i", str(file), "--health-timeout", "0", "--plan")
    assert "hosts.h1.services.s1.health_timeout: 0.0 is out of range (1..7200) (with --health-timeout 0)" in (
        result.stderr
    )


def test_smoke_prompt_default_and_given(tmp_path: Path) -> None:
    from opsctl.inventory.model import SMOKE_PROMPT

    assert _load(tmp_path, doc()).hosts[0].services[0].smoke_prompt == SMOKE_PROMPT
    given = _load(tmp_path, doc(smoke_prompt='write add for 2 and 3 "quoted" {ok}'))
    assert given.hosts[0].services[0].smoke_prompt == 'write add for 2 and 3 "quoted" {ok}'


# --- ddtree.policy, generated: a typed value or one line naming the key path --------------------------------

POLICY_PATH = "hosts.h1.services.s1.ddtree.policy"


@settings(
    max_examples=150, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    value=st.one_of(
        st.text(max_size=12),
        st.from_regex(r"tree[0-9]{0,5}", fullmatch=True),
        st.sampled_from(["off", "auto", "chain", "tree1", "tree16", "tree17", " auto", "chain\n", "tree٣"]),
        st.integers(-5, 100),
        st.none(),
        st.booleans(),
        st.lists(st.text(max_size=3), max_size=2),
    )
)
def test_ddtree_policy_loads_typed_or_fails_naming_the_key(tmp_path: Path, value: Any) -> None:
    try:
        inv = _load(tmp_path, doc(mode="tree", ddtree={"budget": 16, "policy": value}))
    except OpsctlError as exc:
        line = str(exc)
        assert line.startswith(POLICY_PATH + ":"), line
        assert "\n" not in line and len(line) < 300 and all(ch.isprintable() for ch in line)
        return
    policy = inv.hosts[0].services[0].ddtree.policy
    assert isinstance(value, str) and policy.text == value  # only the exact spellings load
    assert value in ("off", "auto", "chain") or 1 <= int(value[4:]) <= 16
    assert policy.mode is (PolicyMode.PINNED if value not in ("off", "auto") else PolicyMode(value))


def test_ddtree_policy_renders_for_tree_mode_only(tmp_path: Path) -> None:
    from opsctl.render import server_env

    tree = _load(tmp_path, doc(mode="tree", ddtree={"budget": 16, "policy": "chain"}))
    host, svc = tree.hosts[0], tree.hosts[0].services[0]
    assert ("DDTREE_POLICY", "chain") in server_env(host, svc, "/r")
    off = _load(tmp_path, doc(mode="tree"))
    assert all(k != "DDTREE_POLICY" for k, _ in server_env(off.hosts[0], off.hosts[0].services[0], "/r"))
    shadow = _load(tmp_path, doc(mode="shadow", ddtree={"policy": "auto"}))
    assert all(k != "DDTREE_POLICY" for k, _ in server_env(shadow.hosts[0], shadow.hosts[0].services[0], "/r"))
    assert any("ddtree.policy has no effect" in w for w in shadow.warnings)
