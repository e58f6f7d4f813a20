"""Pre-flight of flag values: the host's own server parses the release's flags, as it would at start, without
starting. `--help` (preflight.py) proves the flag names exist; a bad value (`--port 0`, an unknown dtype, a
draft path without an algorithm) would otherwise only show as a crash loop after the switch.

- reference engine: its own parser and validation (`ddtree.serve.args.parse_args`);
- SGLang: `prepare_server_args`, which builds and checks `ServerArgs` from an argv (no model load, no port).

Neither parser looks at the disk: `--tokenizer-path /nonexistent` parses, and SGLang would only fail at load
(the reference server ignores the flag). So the same command, on the host, also refuses a path flag whose value
is a local path (absolute, `./`, `../` or `~`) that does not exist there, or is not of the kind the flag needs
(`--tokenizer-path .../tokenizer.json` where the reference engine needs a directory: `path_kinds`). A value
without a leading `/` or `.` (`Qwen/Qwen3-8B`) is a Hugging Face repo id to SGLang and is left to it. The
service's own model paths are skipped (`managed`): their absence is reported with the command that restores
them (`opsctl provision`).

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

# What each path flag needs: (a directory will do, the file names that will do: None none, () any file).
# Model and tokenizer paths are Hugging Face directories; SGLang also loads a .gguf file as either, and a
# tokenizer path ending .json as a tiktoken file (hf_transformers_utils.get_tokenizer). The reference engine
# reads directories only (transformers' from_pretrained). Every other path flag names a file, but
# --kt-weight-path (either).
Kind = tuple[bool, tuple[str, ...] | None]
DIRECTORY: Kind = (True, None)
FILE: Kind = (False, ())
EITHER: Kind = (True, ())
_MODEL_FLAGS = ("--model-path", "--speculative-draft-model-path")


def path_kinds(engine: Engine) -> dict[str, Kind]:
    kinds: dict[str, Kind] = {flag: FILE for flag in PATH_FLAGS}
    kinds["--kt-weight-path"] = EITHER
    if engine is Engine.SGLANG:
        kinds.update({flag: (True, (".gguf",)) for flag in _MODEL_FLAGS})
        kinds["--tokenizer-path"] = (True, (".json", ".gguf"))
    else:
        kinds.update({flag: DIRECTORY for flag in (*_MODEL_FLAGS, "--tokenizer-path")})
    return kinds


def needs(kind: Kind) -> str:
    """`a directory`, `a file`, `a directory or a .gguf file`, ..."""
    directory, files = kind
    if files is None:
        return "a directory"
    what = "a " + " or ".join(files) + " file" if files else "a file"
    return f"a directory or {what}" if directory else what


# Runs on the host after the parser accepted the flags: each local path named by a path flag must exist and be
# of its kind (KINDS: flag -> [directory ok, file suffixes ok (None: no file), what it needs]).
_PATHS = (
    "import os\n"
    "a, gone, wrong = sys.argv[1:], [], []\n"
    "for i, f in enumerate(a):\n"
    "    k, eq, v = f.partition('=')\n"
    "    v = v if eq else (a[i + 1] if i + 1 < len(a) else '')\n"
    "    if k not in KINDS or not v.startswith(LOCAL) or v in MANAGED:\n"
    "        continue\n"
    "    d_ok, files, need = KINDS[k]\n"
    "    p = os.path.expanduser(v)\n"
    "    if not os.path.exists(p):\n"
    "        gone.append(k + ' ' + v)\n"
    "    elif os.path.isdir(p) and not d_ok:\n"
    "        wrong.append(k + ' ' + v + ' is a directory, needs ' + need)\n"
    "    elif not os.path.isdir(p) and (files is None or (files and not p.endswith(tuple(files)))):\n"
    "        wrong.append(k + ' ' + v + ' is a file, needs ' + need)\n"
    "out = ['not on the host (no such file or directory): ' + ', '.join(gone)] if gone else []\n"
    "out += ['wrong kind of path: ' + ', '.join(wrong)] if wrong else []\n"
    "if out:\n"
    "    sys.exit('error: ' + '; '.join(out))\n"
)


def values_cmd(venv: str, engine: Engine, site: str, flags: Sequence[str], managed: Sequence[str] = ()) -> Cmd:
    """The host's python parses `flags` with the server's own parser, then checks their local paths (`managed`:
    paths not checked here, the service's models)."""
    kinds = {
        flag: [d, list(f) if f is not None else None, needs((d, f))] for flag, (d, f) in path_kinds(engine).items()
    }
    consts = f"KINDS = {kinds!r}; LOCAL = {LOCAL_PREFIXES!r}; MANAGED = {sorted(set(managed))!r}\n"
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
