"""Command line: SGLang's flag names, resolved once into a frozen ``ServerArgs``.

Flags that only tune SGLang's GPU scheduler are accepted and recorded (``/server_info``) so the argv that
opsctl renders for SGLang starts this server unchanged; unknown flags fail with argparse's error, as in SGLang.
"""

from __future__ import annotations

import argparse
import enum
import os
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ddtree.modes import Mode, mode_of
from ddtree.serve.configfile import merge_config

API_KEY_ENV = "SGLANG_API_KEY"


class SpecAlgorithm(enum.StrEnum):
    DFLASH = "DFLASH"
    DDTREE = "DDTREE"


DTYPES = {
    "auto": "auto",
    "half": "float16",
    "float16": "float16",
    "bfloat16": "bfloat16",
    "float": "float32",
    "float32": "float32",
}

# SGLang flags accepted for compatibility; they have no effect in the reference engine. (flag, kwargs)
_COMPAT_FLAGS: tuple[tuple[tuple[str, ...], dict[str, Any]], ...] = (
    (("--trust-remote-code",), {"action": "store_true"}),
    (("--mem-fraction-static",), {"type": float}),
    (("--max-running-requests",), {"type": int}),
    (("--max-total-tokens",), {"type": int}),
    (("--chunked-prefill-size",), {"type": int}),
    (("--page-size",), {"type": int}),
    (("--attention-backend",), {"type": str}),
    (("--sampling-backend",), {"type": str}),
    (("--linear-attn-prefill-backend",), {"type": str}),
    (("--linear-attn-decode-backend",), {"type": str}),
    (("--mamba-ssm-dtype",), {"type": str}),
    (("--kv-cache-dtype",), {"type": str}),
    (("--disable-overlap-schedule",), {"action": "store_true"}),
    (("--disable-cuda-graph",), {"action": "store_true"}),
    (("--cuda-graph-max-bs",), {"type": int}),
    (("--disable-radix-cache",), {"action": "store_true"}),
    (("--tensor-parallel-size", "--tp-size"), {"type": int, "dest": "tp_size"}),
    (("--data-parallel-size", "--dp-size"), {"type": int, "dest": "dp_size"}),
    (("--speculative-num-draft-tokens",), {"type": int}),
    (("--speculative-num-steps",), {"type": int}),
    (("--speculative-eagle-topk",), {"type": int}),
    (("--speculative-dflash-block-size",), {"type": int}),
    (("--speculative-dflash-draft-window-size",), {"type": int}),
    (("--speculative-draft-attention-backend",), {"type": str}),
    (("--enable-metrics",), {"action": "store_true"}),
    (("--log-requests",), {"action": "store_true"}),
    (("--tool-call-parser",), {"type": str}),
    (("--chat-template",), {"type": str}),
    (("--watchdog-timeout",), {"type": float}),
)
COMPAT_DESTS: tuple[str, ...] = tuple(
    kw.get("dest", names[0].removeprefix("--").replace("-", "_")) for names, kw in _COMPAT_FLAGS
)


HOLD_LOADING_ENV = "DDTREE_SERVE_HOLD_LOADING_WHILE"  # ServerArgs.hold_loading_while


@dataclass(frozen=True)
class ServerArgs:
    model_path: str
    draft_model_path: str | None
    tokenizer_path: str | None  # None: the tokenizer in --model-path (SGLang's default)
    speculative_algorithm: SpecAlgorithm | None
    host: str
    port: int
    api_key: str | None = field(repr=False)
    api_key_source: str  # "none" | "flag" | "file" | "env"; never the key itself
    served_model_name: str
    dtype: str  # "auto" | "float16" | "bfloat16" | "float32"
    device: str  # "auto" | "cpu" | "cuda" | "cuda:N"
    context_length: int | None
    log_level: str
    decode_log_interval: int
    random_seed: int | None
    skip_server_warmup: bool
    reasoning_parser: str | None
    compat: Mapping[str, Any]  # accepted-for-compatibility flags, as given
    # A lab test hook, from the environment (HOLD_LOADING_ENV): while this file exists the server stays in its
    # loading phase (/health 503), so a test can look at a server still starting without racing its start-up.
    hold_loading_while: str = ""

    def public_dict(self) -> dict[str, Any]:
        """Everything /server_info shows: the key itself never, only whether and where it came from."""
        return {
            "model_path": self.model_path,
            "speculative_draft_model_path": self.draft_model_path,
            "tokenizer_path": self.tokenizer_path,
            "speculative_algorithm": self.speculative_algorithm.value if self.speculative_algorithm else None,
            "host": self.host,
            "port": self.port,
            "api_key": "***" if self.api_key else None,
            "api_key_source": self.api_key_source,
            "served_model_name": self.served_model_name,
            "dtype": self.dtype,
            "device": self.device,
            "context_length": self.context_length,
            "log_level": self.log_level,
            "decode_log_interval": self.decode_log_interval,
            "random_seed": self.random_seed,
            "skip_server_warmup": self.skip_server_warmup,
            "reasoning_parser": self.reasoning_parser,
            **dict(self.compat),
        }


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="ddtree-serve",
        description="OpenAI-compatible server on the DDTree reference engine (SGLang's flag names).",
        allow_abbrev=False,  # SGLang's parser accepts abbreviations; we refuse them so typos fail loudly
    )
    p.add_argument("--config", metavar="FILE.yaml", help="flags from a YAML file (keys = flag names without --)")
    p.add_argument("--model-path", required=True, help="target model directory (weights + tokenizer)")
    p.add_argument("--speculative-algorithm", choices=[a.value for a in SpecAlgorithm], default=None)
    p.add_argument("--speculative-draft-model-path", default=None, dest="draft_model_path")
    p.add_argument("--tokenizer-path", default=None, help="tokenizer folder (default: --model-path), as in SGLang")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=30000)
    p.add_argument("--api-key", default=None, help=f"prefer --api-key-file or ${API_KEY_ENV}: argv is public")
    p.add_argument("--api-key-file", default=None, help="read the API key from this file (first line)")
    p.add_argument("--served-model-name", default=None, help="defaults to --model-path, as in SGLang")
    p.add_argument("--dtype", choices=sorted(DTYPES), default="auto")
    p.add_argument("--device", default="auto", help="auto | cpu | cuda | cuda:N")
    p.add_argument("--context-length", type=int, default=None)
    p.add_argument(
        "--log-level", default="info", type=str.lower, choices=["debug", "info", "warning", "error", "critical"]
    )
    p.add_argument("--decode-log-interval", type=int, default=40, help="rounds between 'Decode batch' lines")
    p.add_argument("--random-seed", type=int, default=None)
    p.add_argument("--skip-server-warmup", action="store_true")
    p.add_argument("--reasoning-parser", default="qwen3", help="qwen3 (default here) or none")
    compat = p.add_argument_group("accepted for SGLang compatibility (recorded in /server_info, no effect)")
    for names, kwargs in _COMPAT_FLAGS:
        compat.add_argument(*names, **kwargs)
    return p


def switch_flags(parser: argparse.ArgumentParser) -> set[str]:
    """Option strings of the store_true flags (a config file's ``key: true`` becomes just ``--key``)."""
    return {opt for a in parser._actions if isinstance(a, argparse._StoreTrueAction) for opt in a.option_strings}


def parse_args(argv: Sequence[str] | None, environ: Mapping[str, str] | None = None) -> ServerArgs:
    """Parse and validate; any error exits through ``parser.error`` (status 2, one line, like argparse)."""
    parser = build_parser()
    raw = list(sys.argv[1:] if argv is None else argv)
    try:
        raw = merge_config(raw, switch_flags(parser))
    except ValueError as exc:
        parser.error(str(exc))
    ns = parser.parse_args(raw)
    env = os.environ if environ is None else environ
    try:
        return resolve(ns, env)
    except ValueError as exc:
        parser.error(str(exc))
        raise  # unreachable: parser.error exits


def resolve(ns: argparse.Namespace, environ: Mapping[str, str]) -> ServerArgs:
    algo = SpecAlgorithm(ns.speculative_algorithm) if ns.speculative_algorithm else None
    if algo is not None and not ns.draft_model_path:
        raise ValueError(f"--speculative-algorithm {algo.value} needs --speculative-draft-model-path")
    if algo is None and ns.draft_model_path:
        raise ValueError("--speculative-draft-model-path given without --speculative-algorithm")
    if not 0 < ns.port < 65536:
        raise ValueError(f"--port {ns.port}: must be in 1..65535")
    if ns.decode_log_interval < 1:
        raise ValueError(f"--decode-log-interval {ns.decode_log_interval}: must be >= 1")
    if ns.context_length is not None and ns.context_length < 1:
        raise ValueError(f"--context-length {ns.context_length}: must be >= 1")
    key, source = resolve_api_key(ns.api_key, ns.api_key_file, environ)
    parser_name = None if str(ns.reasoning_parser).lower() in ("", "none") else str(ns.reasoning_parser)
    if parser_name not in (None, "qwen3", "qwen3-thinking"):
        raise ValueError(f"--reasoning-parser {parser_name}: supported here: qwen3, qwen3-thinking, none")
    return ServerArgs(
        model_path=ns.model_path,
        draft_model_path=ns.draft_model_path,
        tokenizer_path=ns.tokenizer_path,
        speculative_algorithm=algo,
        host=ns.host,
        port=ns.port,
        api_key=key,
        api_key_source=source,
        served_model_name=ns.served_model_name or ns.model_path,
        dtype=DTYPES[ns.dtype],
        device=ns.device,
        context_length=ns.context_length,
        log_level=ns.log_level,
        decode_log_interval=ns.decode_log_interval,
        random_seed=ns.random_seed,
        skip_server_warmup=ns.skip_server_warmup,
        reasoning_parser=parser_name,
        compat={dest: getattr(ns, dest) for dest in COMPAT_DESTS},
        hold_loading_while=environ.get(HOLD_LOADING_ENV, "").strip(),
    )


def resolve_api_key(flag: str | None, path: str | None, environ: Mapping[str, str]) -> tuple[str | None, str]:
    """Precedence: --api-key, then --api-key-file, then $SGLANG_API_KEY. Returns (key, source)."""
    if flag is not None and path is not None:
        raise ValueError("--api-key and --api-key-file are mutually exclusive")
    if flag is not None:
        if not flag.strip():
            raise ValueError("--api-key is empty")
        return flag, "flag"
    if path is not None:
        try:
            text = Path(path).read_text(encoding="utf-8")
        except OSError as exc:
            raise ValueError(f"--api-key-file {path}: {exc.strerror or exc}") from None
        lines = text.splitlines()
        key = lines[0].strip() if lines else ""
        if not key:
            raise ValueError(f"--api-key-file {path}: file is empty")
        return key, "file"
    env_key = environ.get(API_KEY_ENV, "").strip()
    if env_key:
        return env_key, "env"
    return None, "none"


def resolve_mode(algo: SpecAlgorithm | None, ddtree_verify: str | None) -> Mode:
    """Mode from flags: the mode table's row for the speculative algorithm (none: baseline, DFLASH: linear), and
    where several rows share it (DDTREE) the one $DDTREE_VERIFY names (`ddtree.modes.mode_of`)."""
    return mode_of(algo.value if algo is not None else "", ddtree_verify)


def resolve_device(device: str, cuda_available: bool) -> str:
    if device == "auto":
        return "cuda" if cuda_available else "cpu"
    if device == "cpu" or device == "cuda" or (device.startswith("cuda:") and device[5:].isdigit()):
        if device.startswith("cuda") and not cuda_available:
            raise ValueError(f"--device {device}: CUDA is not available on this machine")
        return device
    raise ValueError(f"--device {device}: expected auto, cpu, cuda or cuda:N")


def resolve_dtype(dtype: str, device: str) -> str:
    """'auto' = float32 on CPU (bf16 matmuls are slow there), bfloat16 on GPU."""
    if dtype != "auto":
        return dtype
    return "float32" if device == "cpu" else "bfloat16"
