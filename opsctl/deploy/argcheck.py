"""Pre-flight of flag values: the host's own server parses the release's flags, as it would at start, without
starting. `--help` (preflight.py) proves the flag names exist; a bad value (`--port 0`, an unknown dtype, a
draft path without an algorithm) would otherwise only show as a crash loop after the switch.

- reference engine: its own parser and validation (`ddtree.serve.args.parse_args`);
- SGLang: `prepare_server_args`, which builds and checks `ServerArgs` from an argv (no model load, no port).

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


def values_cmd(venv: str, engine: Engine, site: str, flags: Sequence[str]) -> Cmd:
    code = f"import sys; {_PARSE[engine]}; parse(sys.argv[1:]); print({OK_MARK!r})"
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
