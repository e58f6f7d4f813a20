"""The SGLang plugin: `register()` is the `sglang.srt.plugins` entry point (runtime/pyproject.toml).

SGLang 0.5.23 calls every general plugin in every process (launcher, scheduler, detokenizer) through
`sglang.srt.plugins.load_plugins()`, before argument parsing; an exception there is logged and swallowed, so
`register()` only registers (and logs an ERROR on an SGLang version other than the one its signature table,
`ddtree.sglang.compat`, was checked against). Every check that must stop the server runs where SGLang turns a
ValueError into a start-up failure: `validate_server_args` (called by `handle_speculative_decoding` through
`record_foreign_defaults`; the version, then the gates), the worker factory (the signature table against the
installed code) and the worker's constructor.

What `register()` adds, all through SGLang's public extension points:
- `SpeculativeAlgorithm.register("DDTREE", supports_overlap=False, validate_server_args=...,
  spec_class=DDTreeSpecAlgo)`: the algorithm, its gates, its worker factory;
- `register_resolution_hook("handle_speculative_decoding")`: after SGLang's own step, a DDTREE server gets
  DFLASH's argument resolution (`_handle_dflash`: block size, num_steps/topk = 1, draft attention backend),
  because DDTREE drafts exactly like DFLASH.
- a BEFORE hook on `SamplingParams.verify` (`HookRegistry`, applied by `load_plugins`): a request with `top_k`
  beyond int32 gets a 400 instead of ending the server (`ddtree.sglang.sampling_guard`). It is registered in
  every server that loads the plugin, whatever its mode (baseline and DFLASH services included).

sglang is imported inside functions only: `import ddtree.sglang.plugin` works without it.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Mapping
from typing import Any

from ddtree.config import DDTreeConfig, process_config
from ddtree.policy import PolicyMode
from ddtree.prom import install_default
from ddtree.sglang import compat
from ddtree.sglang.gates import ServerFacts, check_server
from ddtree.sglang.prom_glue import sglang_sink
from ddtree.sglang.sampling_guard import VERIFY_TARGET, refuse_wide_top_k

ALGORITHM = "DDTREE"
ENTRY_POINT_GROUP = "sglang.srt.plugins"
ENTRY_POINT_NAME = "ddtree"

logger = logging.getLogger("ddtree")


def server_facts(server_args: Any) -> ServerFacts:
    """Read the gate inputs from a ServerArgs, or from the read-through stand-in SGLang hands validators."""
    return ServerFacts(
        page_size=server_args.page_size,
        disable_overlap_schedule=bool(server_args.disable_overlap_schedule),
        attention_backend=server_args.attention_backend,
        prefill_attention_backend=server_args.prefill_attention_backend,
        decode_attention_backend=server_args.decode_attention_backend,
        use_rejection_sampling=bool(server_args.speculative_use_rejection_sampling),
        accept_threshold_single=float(server_args.speculative_accept_threshold_single),
        accept_threshold_acc=float(server_args.speculative_accept_threshold_acc),
        draft_model_path=server_args.speculative_draft_model_path,
    )


def validate_server_args(server_args: Any, environ: Mapping[str, str] | None = None) -> None:
    """SGLang's `validate_server_args` hook for DDTREE: the SGLang version, the DDTREE_* environment, the gates."""
    env = os.environ if environ is None else environ
    check_args(server_args, DDTreeConfig.from_env(env), env)  # ValueError with a one-line message on a bad value


def check_args(server_args: Any, config: DDTreeConfig, environ: Mapping[str, str]) -> None:
    """The SGLang version, then the gates, for a configuration already read."""
    refusal = compat.version_refusal(compat.installed_version(), environ)
    if refusal:
        raise ValueError(refusal)
    check_server(server_facts(server_args), config, environ)


def _resolve_like_dflash(server_args: Any, previous: Callable[[Any], None]) -> None:
    """Resolution hook around `handle_speculative_decoding`: a DDTREE server also gets DFLASH's resolution."""
    from sglang.srt.arg_groups.overrides import resolving_view
    from sglang.srt.arg_groups.speculative_hook import _handle_dflash

    previous(server_args)
    if str(resolving_view(server_args).speculative_algorithm).upper() == ALGORITHM:
        _handle_dflash(server_args)


def worker_factory(server_args: Any) -> type:
    """The worker class SGLang instantiates as `Cls(server_args, gpu_id, nccl_port, target_worker)`. The
    scheduler process's configuration is read here, once (`process_config`); the worker reads the same."""
    config = process_config()
    check_args(server_args, config, os.environ)  # again, in the scheduler process, on the published arguments
    refusal = compat.drift_refusal(compat.installed_version(), compat.drift())
    if refusal:
        raise ValueError(refusal)
    verifies_tree = config.verify.spec.verifies_tree  # ddtree.modes: the tree worker, else the shadow worker
    if config.policy.mode is not PolicyMode.OFF and not verifies_tree:
        logger.warning("DDTREE_POLICY=%s has no effect: the shape policy picks tree rounds' shapes", config.policy.text)
    if verifies_tree:
        from ddtree.sglang.tree_worker import DDTreeTreeWorker

        return DDTreeTreeWorker
    from ddtree.sglang.shadow_worker import DDTreeShadowWorker

    return DDTreeShadowWorker


def is_registered() -> bool:
    from sglang.srt.speculative.spec_registry import get_spec

    return get_spec(ALGORITHM) is not None


def register() -> None:
    """Entry point. Idempotent: SGLang guards `load_plugins`, but tests and re-imports may call it again."""
    refusal = compat.version_refusal(compat.installed_version(), os.environ)
    if refusal:  # registered anyway: validate_server_args refuses a DDTREE server with this line
        logger.error("%s", refusal)
    install_default(sglang_sink)  # the ddtree_* series of this process's MetricsLog (with --enable-metrics)
    if is_registered():
        return
    from sglang.srt.arg_groups.resolution_hooks import register_resolution_hook
    from sglang.srt.plugins.hook_registry import HookRegistry, HookType

    # every mode: a baseline or DFLASH server dies of a wide top_k as a DDTREE one would
    HookRegistry.register(VERIFY_TARGET, refuse_wide_top_k, HookType.BEFORE)
    from sglang.srt.speculative.spec_info import SpeculativeAlgorithm

    from ddtree.sglang.spec_algo import DDTreeSpecAlgo

    SpeculativeAlgorithm.register(
        ALGORITHM,
        supports_overlap=False,
        validate_server_args=validate_server_args,
        spec_class=DDTreeSpecAlgo,
    )(worker_factory)
    register_resolution_hook("handle_speculative_decoding")(_resolve_like_dflash)
    logger.info("DDTREE registered with SGLang (speculative algorithm %s)", ALGORITHM)
