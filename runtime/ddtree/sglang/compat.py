"""The SGLang release the plugin was checked against, and its signature table: every SGLang name it relies on.

The plugin uses SGLang's extension points (plugin loader, algorithm registry, resolution hooks) and also reaches
into DFLASH's worker: private methods and attributes of `DFlashWorkerV2`, a private helper of its module, and
private state of the mamba pool and the GDN backend. Any release may change those. So:

- `SGLANG_VERSION` is the release this table was checked against (tests/runtime/test_sglang_plugin.py compares
  the table with the installed SGLang's real code);
- another installed version is refused at start-up with one line (`version_refusal`, from the plugin's
  `validate_server_args`; `register()` logs the same line as an ERROR), unless `DDTREE_ALLOW_SGLANG_VERSION`
  names that version (exact strings, comma-separated);
- when SGLang creates the worker, the table is compared with the installed code (`drift`): a missing name, a
  changed parameter list, a missing field is refused, whatever the version and the variable say, because it
  would otherwise fail in the first decode round and take the scheduler down;
- the worker checks `WORKER_ATTRIBUTES` on itself after DFlashWorkerV2's constructor (`missing_attributes`).

Importing this module never imports sglang; `drift` imports the modules it checks.
"""

from __future__ import annotations

import importlib
import inspect
from collections.abc import Mapping
from importlib.metadata import PackageNotFoundError, version
from typing import Any

SGLANG_VERSION = "0.5.23"
ALLOW_VERSION_ENV = "DDTREE_ALLOW_SGLANG_VERSION"

# "module:qualname" -> the parameter names, in order. Private names are marked; the rest are SGLang's extension
# points and the public functions and methods the workers call.
SIGNATURES: dict[str, tuple[str, ...]] = {
    # the plugin: loader, registry, argument resolution
    "sglang.srt.plugins:load_plugins": (),
    "sglang.srt.plugins:load_plugins_by_group": ("group", "excluded_dists"),
    "sglang.srt.speculative.spec_info:SpeculativeAlgorithm.register": (
        "cls",
        "name",
        "supports_overlap",
        "validate_server_args",
        "spec_class",
    ),
    "sglang.srt.speculative.spec_info:SpeculativeAlgorithm.from_string": ("cls", "name"),
    "sglang.srt.speculative.spec_registry:get_spec": ("name",),
    "sglang.srt.speculative.spec_registry:CustomSpecAlgo.__init__": (
        "self",
        "name",
        "factory",
        "supports_overlap",
        "validate_server_args",
    ),
    "sglang.srt.speculative.spec_registry:CustomSpecAlgo.create_worker": ("self", "server_args"),
    "sglang.srt.arg_groups.resolution_hooks:register_resolution_hook": ("name",),
    # the top_k guard (ddtree.sglang.sampling_guard): a BEFORE hook on SamplingParams.verify, in every mode
    "sglang.srt.plugins.hook_registry:HookRegistry.register": ("cls", "target", "hook", "hook_type", "source"),
    "sglang.srt.sampling.sampling_params:SamplingParams.verify": ("self", "vocab_size"),
    "sglang.srt.arg_groups.resolution_hooks:run_hook": ("builtin", "server_args"),
    "sglang.srt.arg_groups.speculative_hook:handle_speculative_decoding": ("server_args",),
    "sglang.srt.arg_groups.speculative_hook:_handle_dflash": ("server_args",),  # private
    "sglang.srt.arg_groups.overrides:resolving_view": ("server_args",),
    "sglang.srt.arg_groups.overrides:record_foreign_defaults": ("server_args", "source", "resolve"),
    "sglang.srt.managers.overlap_utils:FutureMap.__init__": (
        "self",
        "device",
        "spec_algo",
        "req_to_token_pool",
        "needs_cpu_seq_lens",
        "needs_confidence_relay",
    ),
    "sglang.srt.configs.hybrid_arch:mambaish_config": ("model_config",),
    # grammar-constrained requests: one vocabulary mask per tree node (`round_verify.TreeVerifier.grammar_mask`)
    "sglang.srt.speculative.spec_utils:GrammarTree.from_device": (
        "cls",
        "retrieve_next_token",
        "retrieve_next_sibling",
        "draft_token",
    ),
    "sglang.srt.speculative.spec_utils:GrammarTree.from_linear_chain": ("cls", "verify_ids_2d"),
    "sglang.srt.speculative.spec_utils:build_grammar_vocab_mask": (
        "reqs",
        "tree",
        "sampling_info",
        "device",
        "barrier",
    ),
    # the workers: DFLASH's worker, subclassed
    "sglang.srt.speculative.dflash_worker_v2:DFlashWorkerV2.__init__": (
        "self",
        "server_args",
        "gpu_id",
        "nccl_port",
        "target_worker",
    ),
    "sglang.srt.speculative.dflash_worker_v2:DFlashWorkerV2.forward_batch_generation": (
        "self",
        "batch",
        "on_publish",
        "grammar_barrier",
        "pp_proxy_tensors",
    ),
    "sglang.srt.speculative.dflash_worker_v2:DFlashWorkerV2.init_cuda_graphs": ("self",),
    "sglang.srt.speculative.dflash_worker_v2:DFlashWorkerV2._greedy_sample_from_vocab_parallel_head": (  # private
        "self",
        "hidden_states",
        "lm_head",
        "chunk_size",
    ),
    "sglang.srt.speculative.dflash_worker_v2:DFlashWorkerV2._draft_write_ids": ("self", "plan"),  # private
    "sglang.srt.speculative.dflash_worker_v2:DFlashWorkerV2._append_target_hidden_to_draft_kv_by_loc": (  # private
        "self",
        "target_hidden",
        "cache_loc",
        "positions",
        "cache_loc_2d",
        "commit_lens",
        "extend_lens",
    ),
    "sglang.srt.speculative.dflash_worker_v2:_resolve_dflash_embedding_module": (  # private
        "draft_model",
        "target_model",
    ),
    "sglang.srt.speculative.dflash_worker_v2:unwrap_lora_layer": ("module",),
    "sglang.srt.speculative.dflash_worker_v2:draft_tp_context": ("layout",),
    "sglang.srt.speculative.dflash_worker_v2:enable_num_token_non_padded": (),
    "sglang.srt.speculative.dflash_worker_v2:make_draft_input_v2": ("bonus_tokens", "new_seq_lens"),
    "sglang.srt.speculative.dflash_info:DFlashVerifyInput.prepare_for_verify": (
        "self",
        "batch",
        "target_worker",
        "defer_metadata_init",
    ),
    "sglang.srt.mem_cache.kv_loc_plan:KVLocPlan.bind": ("self", "batch", "reader", "cols"),
    "sglang.srt.mem_cache.kv_index_translator:KVIndexTranslator.plan": (
        "self",
        "req_pool_indices",
        "seq_lens",
        "seq_lens_cpu",
        "write_virtual",
        "read_extent",
        "write_slots",
        "translated_writes",
    ),
    "sglang.srt.managers.tp_worker:TpModelWorker.forward_batch_generation": (
        "self",
        "batch",
        "forward_batch",
        "pp_proxy_tensors",
        "is_verify",
        "skip_attn_backend_init",
        "capture_hidden_mode",
        "return_kv_loc_plan",
    ),
    # TP > 1: the vocab-parallel head's group gathers each rank's top-k (ddtree.sglang.vocab_parallel)
    "sglang.srt.distributed.parallel_state:GroupCoordinator.all_gather_into_tensor": ("self", "output", "input"),
    "sglang.srt.layers.logits_processor:LogitsProcessor.is_deferred_shard": ("self", "logits"),
    "sglang.srt.layers.logits_processor:LogitsProcessor.deferred_argmax": ("self", "logits"),
    # the tree layout (ddtree.sglang.layout) is written for these; the tree worker calls the last two
    "sglang.srt.speculative.eagle_utils:build_tree_kernel_efficient": (
        "bonus_tokens",
        "parent_list",
        "top_scores_index",
        "draft_tokens",
        "seq_lens",
        "seq_lens_sum",
        "topk",
        "spec_steps",
        "num_verify_tokens",
        "tree_mask_mode",
        "tree_mask_buf",
        "fill_prefix_mask",
    ),
    "sglang.kernels.ops.speculative.spec_tree:verify_tree_greedy_func": (
        "predicts",
        "accept_index",
        "accept_token_num",
        "candidates",
        "retrieve_index",
        "retrieve_next_token",
        "retrieve_next_sibling",
        "target_predict",
        "topk",
    ),
    "sglang.srt.speculative.spec_utils:commit_mamba_states_after_verify": (
        "target_worker",
        "batch",
        "accept_lens",
        "accept_index",
        "draft_token_num",
        "prepared_step_indices",
    ),
    # CUDA graphs (ddtree.sglang.graph_masks): the verify graphs' mask policy, and the triton backend's replay step
    "sglang.srt.speculative.dflash_utils:resolve_dflash_verify_mask_policy": ("attn_backend",),
    "sglang.srt.layers.attention.triton_backend:TritonAttnBackend.init_forward_metadata_out_graph": (
        "self",
        "forward_batch",
        "in_capture",
    ),
    # the hybrid tree path: the GDN backend (hybrid_tree_refusal checks its class name) builds its metadata from
    # the tree links the worker hands it
    "sglang.srt.layers.attention.linear.gdn_backend:GDNAttnBackend.__init__": ("self", "model_runner"),
    "sglang.srt.layers.attention.hybrid_linear_attn_backend:MambaAttnBackendBase._forward_metadata": (  # private
        "self",
        "forward_batch",
    ),
    "sglang.srt.layers.attention.hybrid_linear_attn_backend:MambaAttnBackendBase._translate_mamba_indices": (
        "self",
        "mamba_indices",
    ),  # private
    # the hybrid tree verify under CUDA graphs (ddtree.sglang.hybrid_graphs): the worker's hook before the target's
    # capture, the replay step it wraps, the GDN backend's static links (allocated whatever the top-k) and the
    # replay copy into them (`topk`, `forward_metadata.retrieve_*`: read and raised by name)
    "sglang.srt.speculative.dflash_worker_v2:DFlashWorkerV2.init_attention_backends": ("self",),
    "sglang.srt.layers.attention.hybrid_linear_attn_backend:HybridLinearAttnBackend.init_forward_metadata_out_graph": (
        "self",
        "forward_batch",
        "in_capture",
    ),
    "sglang.srt.layers.attention.hybrid_linear_attn_backend:MambaAttnBackendBase.init_forward_metadata_out_graph": (
        "self",
        "forward_batch",
        "in_capture",
    ),
    "sglang.srt.layers.attention.hybrid_linear_attn_backend:MambaAttnBackendBase.init_cuda_graph_state": (
        "self",
        "max_bs",
        "max_num_tokens",
    ),
    "sglang.srt.layers.attention.hybrid_linear_attn_backend:MambaAttnBackendBase._replay_metadata": (  # private
        "self",
        "bs",
        "req_pool_indices",
        "forward_mode",
        "spec_info",
        "seq_lens_cpu",
        "num_padding",
        "in_capture",
        "mamba_track_indices",
    ),
    # DFLASH's causal verify graphs beside the tree's (ddtree.sglang.causal_graphs): a second backend of the
    # target's kind and a decode graph runner captured on it (the runner's class is the target's own)
    "sglang.srt.model_executor.model_runner:ModelRunner._get_attention_backend": (  # private
        "self",
        "init_new_workspace",
    ),
    "sglang.srt.model_executor.runner.decode_cuda_graph_runner:DecodeCudaGraphRunner.__init__": (
        "self",
        "model_runner",
        "attn_backend",
        "speculative_num_steps",
        "speculative_num_draft_tokens",
        "record_nolora_graph",
    ),
    "sglang.srt.mem_cache.kv_index_translator:KVIndexTranslator.bind_and_verify_backends": ("self", "backends"),
}

# Dataclass / msgspec fields read or passed by name.
FIELDS: dict[str, tuple[str, ...]] = {
    "sglang.srt.sampling.sampling_params:SamplingParams": ("top_k", "temperature"),
    "sglang.srt.server_args:ServerArgs": (
        "page_size",
        "disable_overlap_schedule",
        "attention_backend",
        "prefill_attention_backend",
        "decode_attention_backend",
        "speculative_algorithm",
        "speculative_draft_model_path",
        "speculative_num_draft_tokens",
        "speculative_dflash_block_size",
        "speculative_use_rejection_sampling",
        "speculative_accept_threshold_single",
        "speculative_accept_threshold_acc",
    ),
    "sglang.srt.speculative.eagle_info:EagleVerifyInput": (
        "draft_token",
        "custom_mask",
        "positions",
        "retrieve_index",
        "retrieve_next_token",
        "retrieve_next_sibling",
        "draft_token_num",
    ),
    "sglang.srt.managers.utils:GenerationBatchResult": (
        "logits_output",
        "next_token_ids",
        "accept_lens",
        "can_run_cuda_graph",
        "next_draft_input",
        "speculative_num_draft_tokens",
        "new_seq_lens",
        "routed_experts_output",
        "indexer_topk_output",
    ),
    "sglang.srt.model_executor.forward_batch_info:ForwardBatch": (
        "forward_mode",
        "batch_size",
        "input_ids",
        "req_pool_indices",
        "seq_lens",
        "out_cache_loc",
        "seq_lens_sum",
        "seq_lens_cpu",
        "positions",
        "input_embeds",
        "spec_algorithm",
        "spec_info",
        "capture_hidden_mode",
        "num_token_non_padded",
        "global_num_token_non_padded_cpu",
        "can_run_decode_cuda_graph",
    ),
    "sglang.srt.layers.vocab_parallel_embedding:VocabParallelEmbeddingShardIndices": (
        "org_vocab_start_index",
        "org_vocab_end_index",
        "added_vocab_start_index",
        "added_vocab_end_index",
    ),
    "sglang.srt.layers.attention.mamba.mamba2_metadata:ForwardMetadata": (
        "retrieve_next_token",
        "retrieve_next_sibling",
        "retrieve_parent_token",
    ),
    "sglang.srt.speculative.dflash_info:DFlashVerifyInput": (
        "draft_token",
        "positions",
        "draft_token_num",
        "custom_mask",
        "capture_hidden_mode",
        "kv_loc_plan",
    ),
}

# DFlashWorkerV2 instance attributes the workers read by name (checked on the worker after its constructor).
WORKER_ATTRIBUTES: tuple[str, ...] = (
    "block_size",
    "draft_model",
    "draft_model_runner",
    "draft_parallel_layout",
    "use_compact_draft_cache",
    "_is_domino",
    "_mask_token_id",
    "_full_embed_gpu",
    "_noise_embed_scale",
    "_draft_block_spec_info",
    "_target_logits_processor",
    "_draft_sampler",
)


def installed_version() -> str | None:
    """The installed SGLang's version (its distribution metadata, else `sglang.__version__`), None if absent."""
    try:
        return version("sglang")
    except PackageNotFoundError:
        pass
    try:
        return str(importlib.import_module("sglang").__version__)
    except (ImportError, AttributeError):
        return None


def allowed_versions(environ: Mapping[str, str]) -> frozenset[str]:
    """The versions DDTREE_ALLOW_SGLANG_VERSION names (comma-separated, blanks ignored)."""
    return frozenset(part.strip() for part in environ.get(ALLOW_VERSION_ENV, "").split(",") if part.strip())


def version_refusal(installed: str | None, environ: Mapping[str, str]) -> str:
    """Why the plugin refuses the installed SGLang version, in one line ("" when it does not)."""
    if installed == SGLANG_VERSION or (installed is not None and installed in allowed_versions(environ)):
        return ""
    if installed is None:
        return f"DDTREE: cannot tell the installed SGLang's version (the plugin was checked against {SGLANG_VERSION})"
    return (
        f"DDTREE: SGLang {installed!r} is installed, but the plugin's signature table was checked against "
        f"{SGLANG_VERSION} only; install sglang=={SGLANG_VERSION}, or set {ALLOW_VERSION_ENV}={installed} to run "
        "on it (the table is still checked when the worker starts)"
    )


def parameters(path: str) -> tuple[str, ...]:
    """The parameter names of `module:qualname` in the installed SGLang (raises if it is not there)."""
    module, qualname = path.split(":")
    obj: Any = importlib.import_module(module)
    for part in qualname.split("."):
        obj = inspect.getattr_static(obj, part) if inspect.isclass(obj) else getattr(obj, part)
    if isinstance(obj, classmethod | staticmethod):
        obj = obj.__func__
    return tuple(inspect.signature(obj).parameters)


def field_names(path: str) -> frozenset[str]:
    """The fields of a dataclass or msgspec struct `module:Class` in the installed SGLang."""
    module, name = path.split(":")
    cls = getattr(importlib.import_module(module), name)
    return frozenset(getattr(cls, "__struct_fields__", ()) or getattr(cls, "__dataclass_fields__", {}))


def drift(
    signatures: Mapping[str, tuple[str, ...]] = SIGNATURES, fields: Mapping[str, tuple[str, ...]] = FIELDS
) -> list[str]:
    """Where the installed SGLang differs from the table, one short phrase each ([] when it matches)."""
    found: list[str] = []
    for path, expected in signatures.items():
        try:
            got = parameters(path)
        except Exception as err:  # an import error, a missing attribute, a builtin without a signature
            found.append(f"{path} is missing ({type(err).__name__})")
            continue
        if got != expected:
            found.append(f"{path} takes ({', '.join(got)}), expected ({', '.join(expected)})")
    for path, names in fields.items():
        try:
            have = field_names(path)
        except Exception as err:
            found.append(f"{path} is missing ({type(err).__name__})")
            continue
        missing = [name for name in names if name not in have]
        if missing:
            found.append(f"{path} has no field {', '.join(missing)}")
    return found


def drift_refusal(installed: str | None, found: list[str]) -> str:
    """The one-line start-up error for a table that does not match ("" when `found` is empty)."""
    if not found:
        return ""
    more = f" (and {len(found) - 1} more)" if len(found) > 1 else ""
    return (
        f"DDTREE: the installed SGLang {installed} differs from the {SGLANG_VERSION} the plugin was checked "
        f"against: {found[0]}{more}; install sglang=={SGLANG_VERSION}"
    )


def missing_attributes(worker: object, names: tuple[str, ...] = WORKER_ATTRIBUTES) -> list[str]:
    """The attributes in `names` that the constructed worker lacks. Looked up on the instance and its classes
    only: DFlashWorkerV2's `__getattr__` forwards any other name to the target worker."""
    classes = type(worker).__mro__
    return [name for name in names if name not in vars(worker) and not any(name in vars(c) for c in classes)]


def attribute_refusal(worker: object) -> str:
    """The one-line start-up error for a constructed DFLASH worker without WORKER_ATTRIBUTES ("" if it has them)."""
    missing = missing_attributes(worker)
    if not missing:
        return ""
    return (
        f"DDTREE: SGLang's DFlashWorkerV2 has no {', '.join(missing)} (the plugin was checked against SGLang "
        f"{SGLANG_VERSION}); install sglang=={SGLANG_VERSION}"
    )
