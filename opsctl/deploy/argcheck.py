"""Pre-flight of flag values: the host's own server parses the release's flags, as it would at start, without
starting. `--help` (preflight.py) proves the flag names exist; a bad value (`--port 0`, an unknown dtype, a
draft path without an algorithm) would otherwise only show as a crash loop after the switch.

- reference engine: its own parser and validation (`ddtree.serve.args.parse_args`);
- SGLang: `prepare_server_args`, which builds and checks `ServerArgs` from an argv (no model load, no port).

Neither parser looks at the disk: `--tokenizer-path /nonexistent` parses, and SGLang would only fail at load
(the reference server ignores the flag). So the same command, on the host, also refuses a path flag whose value
is a local path (absolute, `./`, `../` or `~`) that does not exist there. A value without a leading `/` or `.`
(`Qwen/Qwen3-8B`) is a Hugging Face repo id to SGLang and is left to it. The service's own model paths are
skipped (`managed`): their absence is reported with the command that restores them (`opsctl provision`).

The flags are the masked render (the API key as `***`): a value check never needs the secret, so the command
line carries none.
"""

from __future__ import annotations

import shlex
from collections.abc import Sequence

from opsctl.commands import Cmd
from opsctl.inventory.model import Engine

OK_MARK = "opsctl-args-ok"
TIMEOUT_S = 300.0
_PARSE = {
    Engine.REFERENCE: "from ddtree.serve.args import parse_args as parse",
    # plugins first, as launch_server does: DDTREE is a registered algorithm only once the plugin has run
    Engine.SGLANG: "from sglang.srt.plugins import load_plugins; load_plugins(); "
    "from sglang.srt.server_args import prepare_server_args as parse",
}


# Flags whose value the server reads from the host's disk at start (SGLang 0.5.23's names; the reference
# server's are a subset). Output locations (--download-dir, --spec-trace-dir, ...) are created, so not here.
PATH_FLAGS = frozenset(
    {
        "--model-path", "--tokenizer-path", "--speculative-draft-model-path", "--quantization-param-path",
        "--ssl-keyfile", "--ssl-certfile", "--ssl-ca-certs", "--speculative-token-map",
        "--speculative-ngram-external-corpus-path", "--chat-template", "--completion-template",
        "--lmcache-config-file", "--flexkv-config-file", "--decrypted-config-file", "--decrypted-draft-config-file",
        "--kt-weight-path", "--api-key-file",
    }
)  # fmt: skip
LOCAL_PREFIXES = ("/", "./", "../", "~")

# Runs on the host after the parser accepted the flags: each local path named by a PATH_FLAGS flag must exist.
_PATHS = (
    "import os\n"
    "a, gone = sys.argv[1:], []\n"
    "for i, f in enumerate(a):\n"
    "    k, eq, v = f.partition('=')\n"
    "    v = v if eq else (a[i + 1] if i + 1 < len(a) else '')\n"
    "    if k in PATHS and v.startswith(LOCAL) and v not in MANAGED and not os.path.exists(os.path.expanduser(v)):\n"
    "        gone.append(k + ' ' + v)\n"
    "if gone:\n"
    "    sys.exit('error: not on the host (no such file or directory): ' + ', '.join(gone))\n"
)


def values_cmd(venv: str, engine: Engine, site: str, flags: Sequence[str], managed: Sequence[str] = ()) -> Cmd:
    """The host's python parses `flags` with the server's own parser, then checks their local paths (`managed`:
    paths not checked here, the service's models)."""
    consts = f"PATHS = {sorted(PATH_FLAGS)!r}; LOCAL = {LOCAL_PREFIXES!r}; MANAGED = {sorted(set(managed))!r}\n"
    code = f"import sys; {_PARSE[engine]}; parse(sys.argv[1:])\n{consts}{_PATHS}print({OK_MARK!r})"
    return Cmd.of("env", f"PYTHONPATH={site}", f"{venv}/bin/python", "-c", code, *flags, sudo=True)


def refusal(exit_code: int, stdout: str, stderr: str) -> str | None:
    """None when the server accepted every value; else its own last error line (argparse: `prog: error: ...`)."""
    if exit_code == 0 and OK_MARK in stdout:
        return None
    lines = [ln.strip() for ln in (stderr + "\n" + stdout).splitlines() if ln.strip()]
    errors = [ln for ln in lines if "error" in ln.lower()]
    last = (errors or lines or [f"exit {exit_code}"])[-1]
    return last[:300]


def shown(flags: Sequence[str]) -> str:
    return shlex.join(flags)
