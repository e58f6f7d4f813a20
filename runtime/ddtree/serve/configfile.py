"""``--config FILE.yaml`` with SGLang's semantics (ConfigArgumentMerger): the file's keys are flag names without
``--``; its flags go first and the command line after, so a flag given on the command line wins.

Booleans: a switch (store_true) flag is added for ``true`` and left out for ``false``; other booleans become
``--key true|false``. Lists become ``--key a b``. Unknown keys reach argparse and fail like unknown flags.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from pathlib import Path
from typing import Any

import yaml


def merge_config(argv: Sequence[str], switches: Collection[str]) -> list[str]:
    """``argv`` with ``--config PATH`` replaced by the file's flags in front. ValueError on a bad file."""
    args = list(argv)
    idx = [i for i, a in enumerate(args) if a == "--config" or a.startswith("--config=")]
    if not idx:
        return args
    if len(idx) > 1:
        raise ValueError("--config given more than once; only one config file is allowed")
    i = idx[0]
    if args[i].startswith("--config="):
        path, rest = args[i].split("=", 1)[1], args[:i] + args[i + 1 :]
    else:
        if i == len(args) - 1:
            raise ValueError("--config needs a file path")
        path, rest = args[i + 1], args[:i] + args[i + 2 :]
    return config_args(path, switches) + rest


def config_args(path: str, switches: Collection[str]) -> list[str]:
    p = Path(path)
    if p.suffix.lower() not in (".yaml", ".yml"):
        raise ValueError(f"--config {path}: must be a .yaml or .yml file")
    try:
        data = yaml.safe_load(p.read_text(encoding="utf-8"))
    except OSError as exc:
        raise ValueError(f"--config {path}: {exc.strerror or exc}") from None
    except yaml.YAMLError as exc:
        raise ValueError(f"--config {path}: not valid YAML ({str(exc).splitlines()[0]})") from None
    if data is None:
        return []
    if not isinstance(data, dict):
        raise ValueError(f"--config {path}: the top level must be a mapping of flag names to values")
    out: list[str] = []
    for key, value in data.items():
        out += _flag(str(key), value, switches)
    return out


def _flag(key: str, value: Any, switches: Collection[str]) -> list[str]:
    flag = "--" + key.replace("_", "-")
    if isinstance(value, bool):
        if flag in switches:
            return [flag] if value else []
        return [flag, str(value).lower()]
    if isinstance(value, list):
        return [flag, *(str(v) for v in value)] if value else []
    if value is None:
        return []
    return [flag, str(value)]
