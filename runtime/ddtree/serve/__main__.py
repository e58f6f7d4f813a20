"""``python -m ddtree.serve`` / ``ddtree-serve``: parse flags, start HTTP at once, load the engine behind it.

/health answers 503 while the engine loads and warms up, then 200. SIGTERM or SIGINT: stop accepting, let
in-flight and queued requests finish, exit 0. A load failure (bad path, hybrid tree refused) exits 1.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import sys
import threading
from collections.abc import AsyncIterator, Generator, Sequence
from types import FrameType

import uvicorn
from fastapi import FastAPI

from ddtree.modes import Mode
from ddtree.serve.args import ServerArgs, parse_args, resolve_device, resolve_dtype, resolve_mode
from ddtree.serve.loader import read_model_info
from ddtree.serve.logs import setup_logging
from ddtree.serve.state import AppState, Phase

log = logging.getLogger("ddtree.serve")


class _Server(uvicorn.Server):
    """uvicorn re-raises a caught SIGTERM after draining, which makes the process die by signal (systemd
    reports 'failed'); here a signal means 'drain and return', so main() can exit 0."""

    state: AppState | None = None

    @contextlib.contextmanager
    def capture_signals(self) -> Generator[None, None, None]:
        if threading.current_thread() is not threading.main_thread():
            yield
            return
        sigs = (signal.SIGINT, signal.SIGTERM)
        for sig in sigs:
            signal.signal(sig, self.handle_exit)
        try:
            yield
        finally:
            # Draining is over and the process is about to exit 0: a repeated SIGTERM (a supervisor
            # retrying) must not turn that into a death by signal, so keep ignoring them until exit.
            for sig in sigs:
                signal.signal(sig, signal.SIG_IGN)

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        if not self.should_exit:
            log.info("Received %s: draining in-flight requests, then exiting.", signal.Signals(sig).name)
        if self.state is not None:
            self.state.begin_shutdown()
        super().handle_exit(sig, frame)


def _resolve(args: ServerArgs) -> tuple[Mode, object | None, str, str]:
    """Mode, DDTree config, device and dtype; ValueError with a one-line message on bad input."""
    ddtree = None
    verify = None
    if args.speculative_algorithm is not None and args.speculative_algorithm.value == "DDTREE":
        from ddtree.config import process_config

        ddtree = process_config()  # this process's one read (the planner's switch reads the same)
        verify = ddtree.verify
    mode = resolve_mode(args.speculative_algorithm, verify)
    paths = (
        ("--model-path", args.model_path),
        ("--speculative-draft-model-path", args.draft_model_path),
        ("--tokenizer-path", args.tokenizer_path),
    )
    for label, path in paths:
        if path is not None and not os.path.isdir(path):
            raise ValueError(f"{label} {path}: not a directory")
    device = resolve_device(args.device, args.device != "cpu" and _cuda_available())
    return mode, ddtree, device, resolve_dtype(args.dtype, device)


def _cuda_available() -> bool:
    import torch  # only when the device is not plainly cpu: HTTP (and its 503s) comes up sooner on CPU hosts

    return bool(torch.cuda.is_available())


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    setup_logging(args.log_level)
    try:
        mode, ddtree, device, dtype = _resolve(args)
    except ValueError as exc:
        print(f"ddtree-serve: error: {exc}", file=sys.stderr)
        return 2
    info = read_model_info(args.model_path, args.draft_model_path, args.context_length)
    # SGLang's shape, server_args=ServerArgs(k='v', ...): quoted values keep "DDTREE " out of this line
    shown = ", ".join(f"{k}={v!r}" for k, v in args.public_dict().items() if v not in (None, False))
    log.info("server_args=ServerArgs(%s)", shown)
    log.info("mode=%s device=%s dtype=%s context_len=%d", mode.value, device, dtype, info.context_len)

    server: _Server | None = None

    def fatal() -> None:  # load failed: stop serving; main() then exits 1
        if server is not None:
            server.should_exit = True

    from ddtree.serve.app import create_app  # torch (~4 s): only once the flags are known good, so refusals are quick

    state = AppState(args, mode, ddtree, info, device, dtype, on_fatal=fatal)
    app = create_app(state)

    @contextlib.asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        state.start_loading()
        yield
        state.begin_shutdown()
        state.close()
        log.info("Shutdown complete.")

    app.router.lifespan_context = lifespan
    config = uvicorn.Config(
        app,
        host=args.host,
        port=args.port,
        log_config=None,  # our root handler formats uvicorn's lines too
        log_level=args.log_level,
        timeout_graceful_shutdown=None,  # finish in-flight requests however long they take (systemd bounds it)
        lifespan="on",
    )
    server = _Server(config)
    server.state = state
    server.run()
    return 1 if state.phase is Phase.FAILED else 0


if __name__ == "__main__":
    sys.exit(main())
