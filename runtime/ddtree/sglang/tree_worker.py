"""The DDTREE `tree` worker for SGLang: DFLASH's drafting, a DDTree tree per request, ONE target forward over
the whole tree (TARGET_VERIFY, ancestor-only custom mask), one choice per node (the request's logit rules and
SGLang's own sampler at the node's position: `ddtree.sglang.request_kinds`), SGLang's `verify_tree_greedy` walk
over those choices, the accepted nodes' KV kept, their hidden states fed back to the drafter. Greedy, sampled and
seeded requests, logit_bias, penalties, min_new_tokens and log-probs; dense and hybrid targets.

One round, per decode batch (prefill and idle batches run DFLASH's own code, unchanged):

1. draft (`_ddtree_draft` -> `DraftBlock`): DFLASH's draft block (bonus token + mask tokens at prefix_len ..
   prefix_len + B - 1, B = block size) through the drafter, in the first B KV slots SGLang's spec-v2 scheduler
   reserved (2 * B per request);
2. plan (`_ddtree_plan` -> `PlannedRound`): the target's LM head on the drafter's hidden states gives B - 1 rows of
   log-probs; `ddtree.sglang.batch_round.plan_batch` builds every request's tree at once on the device
   (DDTREE_BUDGET nodes, DDTREE_TOPK per row; the trees `build_tree_heap` builds) in SGLang's EAGLE tree layout
   (`ddtree.sglang.layout` documents it), padded to S = B slots (2B for a wide tree), with FULL_MASK;
3. verify (`_ddtree_verify` -> `VerifiedRound`): one target forward (TARGET_VERIFY) with the FULL_MASK custom mask and
   positions prefix_len + depth, writing the window req_to_token[prefix_len : prefix_len + S]; each node's
   choice (argmax, or the request's rules and sampler: docs/sglang.md, "Request kinds"), and
   `verify_tree_greedy` walks those choices over the tree links;
4. commit (`_ddtree_commit` -> `KeptRound`, page_size 1): the window's req_to_token entries are permuted so the
   accepted path's slots come first (path order) and the others after: req_to_token[prefix_len : prefix_len +
   tau] = the accepted nodes' KV locations; the unaccepted locations stay in the request's reservation (as
   DFLASH's rejected slots do) and are rewritten next round. The verify's target hidden states of the accepted
   rows, in path order, go to the drafter's KV at positions prefix_len .. prefix_len + tau - 1 (DFLASH's own
   writer). The commit (`commit_batch`) runs on the device too, and the statistics for the DDTREE lines stay
   there until a line needs them (`StatsQueue`). A self-check round keeps a chain re-verify's results instead.

What each step hands the next is written once, in the step dataclasses below. The private SGLang names the
worker uses are in `ddtree.sglang.compat`'s signature table, checked when SGLang creates the worker.

Hybrid targets (Gated DeltaNet + attention, Qwen3.5/3.6): the verify hands SGLang's GDN backend the tree's
links (retrieve_next_token / retrieve_next_sibling), so its tree kernels take each node's conv window from its
ancestors and its recurrent state from its parent (`causal_conv1d_update` and the GDN tree verify kernel with
`retrieve_parent_token`), every node's state kept in the per-step intermediate buffers; the commit installs
the last accepted node's state through SGLang's `commit_mamba_states_after_verify` with the tree's accept
index (what EAGLE's tree verify does). SGLang gates that tree path by the server-wide EAGLE top-k, which
DFLASH leaves at 1, so the worker raises the backend's top-k for its own verify's metadata only.

Wide trees (B - 1 < DDTREE_BUDGET <= 2B - 1, dense targets): the verify takes 2B slots per request, the KV
window DFLASH reserves (committed + 2B), with its own KV-location plan; the drafter still drafts one block, so
a tree is at most B - 1 deep and the accepted path (tau <= B) is the first B slots of the permuted window.

Constraints (checked at start): DDTREE_BUDGET <= 2B - 1 (B - 1 on hybrid targets; no CUDA graphs above B - 1:
they are captured for B tokens per request), for hybrid targets SGLang's GDN backend with its per-step verify
snapshots (not ReplaySSM, not KDA) and no CUDA graphs (the graphs are captured with the chain metadata; unless
DDTREE_ALLOW_HYBRID_UNSAFE=1, which runs the flat, wrong order on purpose), no compact (sliding-window) draft
cache, no selector / LiLiCorr / Domino drafts, CUDA graphs on dense targets only with the triton backend (the
verify graphs are captured reading the tree mask, `ddtree.sglang.graph_masks`; SGLang captures DFLASH's
causal), a dense LM head (vocab-parallel at TP > 1: each rank's top-k is gathered,
`ddtree.sglang.vocab_parallel`, so every rank builds the same trees). A decode batch with a grammar-constrained
request or a custom logit processor (and at TP > 1 one with sampling, rules or log-probs) takes DFLASH's own round
(chain verify) instead of a tree round (`request_kinds.dflash_round_reason`; WARNING once per reason).

The shape policy (DDTREE_POLICY, `ddtree.sglang.policy_glue`): with it on, each greedy decode round first asks
the policy for its shape, from the batch size and what the rounds `RoundLedger.lag` back measured: a tree of the
configured budget, a smaller one (the same best-first tree cut at fewer nodes, padded into the same verify slots,
so the captured CUDA graphs still apply; a wide tree's smaller ones that fit the block take B slots), or
DFLASH's own chain round (`super().forward_batch_generation`). The round's acceptances (what it committed, what
the chain and each smaller tree would have: `round_accepts`) are summed on the device and its cost is two CUDA
events; neither is read before `lag` rounds later, so the round itself gains no sync. At TP > 1 the costs are
the MAX over the ranks (one gloo all-reduce of a few floats per round, on the lagged values), so every rank
decides the same shapes. A change of a bucket's shape is logged (INFO, rank 0), and the DDTREE metrics lines
carry the policy's choice and estimates.

This module imports sglang (SGLang loads it through the plugin, `ddtree.sglang.plugin.worker_factory`);
the pure parts it runs on, tested without SGLang, are in `ddtree.sglang.tree_round`.
"""

from __future__ import annotations

import contextlib
import logging
import os
import time
from collections.abc import Iterator, Sequence
from typing import Any

import sglang.srt.speculative.dflash_utils as dflash_utils
import sglang.srt.speculative.dflash_worker_v2 as dw
import torch
from sglang.kernels.ops.speculative.spec_tree import verify_tree_greedy_func
from sglang.srt.configs.hybrid_arch import mambaish_config
from sglang.srt.layers.logprob_processor import compute_spec_logprobs
from sglang.srt.managers.scheduler import GenerationBatchResult
from sglang.srt.model_executor.forward_batch_info import CaptureHiddenMode, ForwardBatch, ForwardMode
from sglang.srt.speculative.dflash_info import DFlashVerifyInput
from sglang.srt.speculative.dflash_info_v2 import DFlashDraftInputV2
from sglang.srt.speculative.spec_info import SpeculativeAlgorithm
from sglang.srt.speculative.spec_utils import GrammarTree, build_grammar_vocab_mask, commit_mamba_states_after_verify
from torch import Tensor

from ddtree.acceptance import chain_layout
from ddtree.config import HybridMode, process_config
from ddtree.metrics import MetricsLog
from ddtree.sglang import causal_graphs
from ddtree.sglang.batch_round import (
    BatchCommit,
    BatchPlan,
    StatsQueue,
    commit_batch,
    full_mask_batched,
    full_mask_numel,
    plan_batch,
    plan_batch_topk,
    stats_tensor,
)
from ddtree.sglang.compat import attribute_refusal
from ddtree.sglang.gates import GateError, hybrid_mode
from ddtree.sglang.graph_masks import (
    capture_with_tree_masks,
    captured_with_tree_masks,
    graph_backend_refusal,
    mask_unmasked_verifies,
)
from ddtree.sglang.hybrid_graphs import replay_tree_links, tree_links
from ddtree.sglang.policy_glue import PolicyGlue, RoundLedger, round_accepts
from ddtree.sglang.prom_glue import note_round
from ddtree.sglang.replay import (
    AcceptanceReplay,
    PathRecorder,
    ReplayRound,
    impose_topk,
    path_ranks,
    steer_predictions,
)
from ddtree.sglang.request_kinds import (
    baseline_penalty_order,
    dflash_round_reason,
    node_choices,
    policy_decides,
    rules_of_batch,
)
from ddtree.sglang.round_graphs import RoundGraphs, clone_result
from ddtree.sglang.selfcheck import (
    STATE_TOLERANCE,
    TIE_TOLERANCE,
    AcceptedStates,
    ChainCheck,
    accepted_states,
    chain_accept_index,
    chain_check,
    mismatch_gaps,
    state_gaps,
)
from ddtree.sglang.tree_round import (
    DraftBlock,
    KeptRound,
    KVWindow,
    PlannedRound,
    VerifiedRound,
    cost_max,
    dense_conv_windows,
    folded_draft_head_warning,
    hybrid_tree_refusal,
    reproducible,
    verify_slots,
)
from ddtree.sglang.vocab_parallel import HeadShard, head_shard, head_topk

logger = logging.getLogger("ddtree")


class DDTreeTreeWorker(dw.DFlashWorkerV2):  # type: ignore[misc]
    def __init__(self, server_args: Any, gpu_id: int, nccl_port: int, target_worker: Any) -> None:
        super().__init__(server_args, gpu_id, nccl_port, target_worker)
        refusal = attribute_refusal(self)
        if refusal:
            raise ValueError(refusal)
        config = process_config()
        block = int(self.block_size)
        self._ddtree_hybrid = mambaish_config(target_worker.model_runner.model_config) is not None
        self._ddtree_linear: Any = None
        self._ddtree_slots = verify_slots(config.budget, block)
        if self._ddtree_slots > block and self._ddtree_hybrid:
            raise ValueError(
                f"DDTREE: DDTREE_BUDGET={config.budget} on a hybrid target: SGLang keeps recurrent states for "
                f"block_size={block} verify steps (DDTREE_BUDGET <= {block - 1})"
            )
        for name in ("selector", "lilicorr"):
            if getattr(self, name, None) is not None:
                raise ValueError(f"DDTREE: DFLASH drafts with a {name} head are not supported")
        if getattr(self, "_is_domino", False):
            raise ValueError("DDTREE: Domino DFLASH drafts are not supported")
        if self.use_compact_draft_cache:
            raise ValueError("DDTREE: tree verify does not support a windowed (compact) DFLASH draft cache")
        self._ddtree_config = config
        # benchmark hooks (opsctl refuses them): replay recorded paths / record this run's paths
        replay = config.replay_acceptance
        self._ddtree_replay = AcceptanceReplay.from_file(replay) if replay else None
        if self._ddtree_replay is not None:
            self._ddtree_replay.check_drafter(block - 1, config.topk)
        self._ddtree_paths = PathRecorder(config.record_paths) if config.record_paths else None
        head = self._ddtree_head()  # refused here, not in the first decode round
        self._ddtree_rank = head.rank  # rank 0 of a tensor-parallel group writes the DDTREE lines
        self._ddtree_exact_hybrid = False
        self._ddtree_log: MetricsLog | None = None
        self._ddtree_stats: StatsQueue | None = None
        self._ddtree_dflash_reasons: set[str] = set()  # each logged once (WARNING)
        self._ddtree_overlap = not server_args.disable_overlap_schedule
        self._ddtree_penalty_order = baseline_penalty_order()  # the penalties' order the baseline applies
        self._ddtree_rounds = 0
        self._ddtree_fallback = ""  # set by a failed self-check: DFLASH's rounds from then on
        self._ddtree_graphs: dict[int, RoundGraphs] = {}  # budget -> its plan / commit graphs
        self._ddtree_glue = PolicyGlue.from_env(config, os.environ)  # DDTREE_POLICY (off: the configured tree)
        self._ddtree_ledger = RoundLedger(torch.device(self.device), reduce_max=cost_max(head))
        # SGLang captures the target's verify graphs after this constructor: have them read the tree mask
        # (graph_masks; a policy only, inert without graphs)
        self._ddtree_backend = server_args.decode_attention_backend or server_args.attention_backend
        self._ddtree_graphs_requested = not server_args.disable_cuda_graph
        self._ddtree_hybrid_why: str | None = None  # why the exact hybrid tree path is out; "" when it is not
        self._ddtree_causal_backend: Any = None  # DFLASH's own verify graphs' backend (causal_graphs)
        self._ddtree_causal: causal_graphs.CausalVerifyGraphs | None = None
        self._ddtree_causal_skip: frozenset[str] = frozenset()
        if not graph_backend_refusal(self._ddtree_backend):
            # None only from the dev stand-in that keeps SGLang's policy (standin/sitecustomize.py)
            self._ddtree_causal_skip = capture_with_tree_masks(dflash_utils, self._ddtree_backend) or frozenset()

    def init_attention_backends(self) -> None:
        """After the target's memory pools and attention backend exist, before SGLang captures the target's
        CUDA graphs: on a hybrid target with the exact tree path, the dense per-step conv windows, and (with
        graphs) the GDN backend's verify metadata captured on the tree path, its static links filled before
        every replay (ddtree.sglang.hybrid_graphs). A graph keeps the buffers it was captured with."""
        super().init_attention_backends()
        if not self._ddtree_hybrid:
            if self._ddtree_graphs_requested and self._ddtree_causal_skip:
                try:
                    self._ddtree_causal_backend = causal_graphs.build_backend(self.target_worker.model_runner)
                except Exception as exc:  # the masked graphs still serve every round, a little slower
                    logger.warning("DDTREE: no second attention backend for DFLASH's causal graphs (%s)", exc)
            return
        target_runner = self.target_worker.model_runner
        self._ddtree_linear = getattr(target_runner.attn_backend, "linear_attn_backend", None)
        mamba_pool = getattr(target_runner.req_to_token_pool, "mamba_pool", None)
        self._ddtree_hybrid_why = hybrid_tree_refusal(self._ddtree_linear, mamba_pool)
        if self._ddtree_hybrid_why:
            return
        self._ddtree_dense_conv_windows(mamba_pool)
        if self._ddtree_graphs_requested:
            replay_tree_links(target_runner.attn_backend, self._ddtree_linear)

    def init_cuda_graphs(self) -> None:
        """After the target's attention backend and CUDA graphs exist (SGLang initializes the target's before
        the draft worker's): decide how a hybrid target is verified, then log the DDTREE init line."""
        super().init_cuda_graphs()
        folded = folded_draft_head_warning(self._draft_sampler, self._ddtree_glue.runs_chain_rounds)
        if folded and self._ddtree_rank == 0:
            logger.warning(folded)
        graphs = getattr(self.target_worker.model_runner, "decode_cuda_graph_runner", None) is not None
        if self._ddtree_slots > int(self.block_size) and graphs:
            raise ValueError(
                f"DDTREE: DDTREE_BUDGET={self._ddtree_config.budget} verifies {self._ddtree_slots} tokens per "
                f"request, more than the {int(self.block_size)} SGLang's verify CUDA graphs are captured for; "
                "pass --disable-cuda-graph, or DDTREE_BUDGET <= block size - 1"
            )
        if graphs:
            target_backend = self.target_worker.model_runner.attn_backend
            if not captured_with_tree_masks(dflash_utils, target_backend):
                why = graph_backend_refusal(self._ddtree_backend) or "pass --disable-cuda-graph"
                raise ValueError(
                    "DDTREE: SGLang captured the target's verify CUDA graphs without the tree mask (they would "
                    f"verify every tree causally): {why}"
                )
            mask_unmasked_verifies(target_backend)
            if self._ddtree_rank == 0:
                logger.info("DDTREE: the target's verify CUDA graphs read the tree mask; chain verifies get "
                            "the causal one")  # fmt: skip
            self._ddtree_capture_causal_graphs()
        hybrid = HybridMode.NONE
        if self._ddtree_hybrid:
            hybrid_why = self._ddtree_hybrid_why
            if hybrid_why is None:
                raise ValueError("DDTREE: CUDA graphs before attention backends (SGLang's start-up order changed)")
            try:
                hybrid = hybrid_mode(self._ddtree_config, is_hybrid=True, exact_tree_path=not hybrid_why)
            except GateError as exc:
                raise ValueError(f"DDTREE: {exc} ({hybrid_why})") from None
            if hybrid is HybridMode.EXACT and graphs:
                target_backend = self.target_worker.model_runner.attn_backend
                links = tree_links(target_backend)
                if links is None or links.captures == 0:
                    raise ValueError(
                        "DDTREE: SGLang captured the hybrid target's verify CUDA graphs without the tree links; "
                        "pass --disable-cuda-graph"
                    )
                if self._ddtree_rank == 0:
                    logger.info(
                        "DDTREE: the hybrid target's verify CUDA graphs (%d capture steps) run SGLang's GDN tree "
                        "kernels; their links are filled before every replay (chains for DFLASH's own verifies)",
                        links.captures,
                    )
            if hybrid is HybridMode.UNSAFE:
                logger.warning("DDTREE HYBRID UNSAFE: tree verify in flat order (%s); outputs may differ", hybrid_why)
        self._ddtree_exact_hybrid = hybrid is HybridMode.EXACT
        self._ddtree_warm_planner()
        policy = self._ddtree_glue.policy if self._ddtree_glue.enabled else None
        self._ddtree_log = MetricsLog(self._ddtree_config, int(self.block_size), hybrid, policy=policy)
        if self._ddtree_rank == 0:
            self._ddtree_log.start()
        self._ddtree_stats = StatsQueue(self._ddtree_log)

    def _ddtree_capture_causal_graphs(self) -> None:
        """DFLASH's own causal verify graphs on the second backend, for the rounds that run DFLASH's code
        (causal_graphs); a failed capture leaves those rounds on the tree's masked graphs (a WARNING)."""
        if self._ddtree_causal_backend is None:
            return
        started = time.perf_counter()
        try:
            self._ddtree_causal = causal_graphs.capture(
                self.target_worker.model_runner, self._ddtree_causal_backend, dflash_utils, self._ddtree_causal_skip
            )
        except Exception as exc:  # the masked graphs still serve every round, a little slower
            logger.warning("DDTREE: DFLASH's causal verify CUDA graphs not captured (%s): its rounds replay "
                           "the tree's masked graphs", exc)  # fmt: skip
            return
        if self._ddtree_rank == 0:
            logger.info("DDTREE: causal verify CUDA graphs captured for DFLASH's rounds (chain, sampling) in "
                        "%.1f s", time.perf_counter() - started)  # fmt: skip

    def _ddtree_dflash_round(self, batch: Any, **kwargs: Any) -> Any:
        """DFLASH's own decode round, through its causal verify graphs when the worker captured them."""
        causal = self._ddtree_causal
        model_runner = self.target_worker.model_runner
        with causal.bound(model_runner) if causal is not None else contextlib.nullcontext():
            return super().forward_batch_generation(batch, **kwargs)

    def _ddtree_warm_planner(self) -> None:
        """Every budget the worker can run (the policy's smaller ones too) planned and committed once on the
        GPU before the first request (RoundGraphs.warm): no Triton compile or graph capture mid-request."""
        head = self._ddtree_head()
        if torch.device(self.device).type != "cuda" or head.tp_size > 1:
            return  # the CPU path compiles nothing; a vocab-parallel head plans from gathered top-k
        glue = self._ddtree_glue
        shapes = glue.policy.config.shapes if glue.enabled else ()
        budgets = sorted({s.budget for s in shapes if not s.is_chain} | {self._ddtree_config.budget})
        started = time.perf_counter()
        try:
            for budget in budgets:
                graphs = self._ddtree_round_graphs(budget)
                sizes = [*range(1, graphs.max_batch + 1), graphs.max_batch + 1]  # the graphed ones, one eager
                graphs.warm(sizes, int(self.block_size) - 1, int(head.weight.shape[0]), torch.device(self.device))
        except Exception as exc:  # a slower first round is better than a server that will not start
            self._ddtree_graphs.clear()
            logger.warning("DDTREE: planner warm-up failed (%s): each budget compiles on first use", exc)
            return
        if self._ddtree_rank == 0:
            logger.info(
                "DDTREE: planner warmed for budgets %s in %.2f s", ",".join(map(str, budgets)),
                time.perf_counter() - started,
            )  # fmt: skip

    @staticmethod
    def _ddtree_dense_conv_windows(mamba_pool: Any) -> None:
        """Tree nodes need independent per-step conv windows (dense_conv_windows)."""
        state = dense_conv_windows(mamba_pool.mamba_cache)
        if state is None:
            return
        mamba_pool.mamba_cache = state
        mamba_pool._intermediate_conv_window_phys = list(state.intermediate_conv_window)  # memory accounting
        size = sum(w.numel() * w.element_size() for w in state.intermediate_conv_window)
        logger.info(
            "DDTREE: verify conv windows re-allocated dense (%.1f MiB): SGLang's chain layout shares them "
            "between steps, a tree's nodes cannot",
            size / 2**20,
        )

    def forward_batch_generation(
        self, batch: Any, on_publish: Any = None, grammar_barrier: Any = None, pp_proxy_tensors: Any = None
    ) -> Any:
        dflash_round = batch.forward_mode.is_extend() or batch.is_extend_in_batch or batch.forward_mode.is_idle()
        why = "" if dflash_round else self._ddtree_needs_dflash_round(batch)
        if why and why not in self._ddtree_dflash_reasons:
            # a scheduler-side exception would take the whole server down: DFLASH's exact chain round instead
            logger.warning("DDTREE tree verify: batches with %s take DFLASH's chain verify", why)
            self._ddtree_dflash_reasons.add(why)
        dflash_args = {
            "on_publish": on_publish,
            "grammar_barrier": grammar_barrier,
            "pp_proxy_tensors": pp_proxy_tensors,
        }
        if dflash_round or why or self._ddtree_fallback:
            self._ddtree_ledger.interrupt()  # not a policy round: the policy's gap skips this forward
        # the shape policy decides greedy rounds whose rules do not read the output (request_kinds.policy_decides);
        # PolicyGlue counts its own rounds
        glue = self._ddtree_glue
        policy_round = glue.enabled and policy_decides(batch)
        note_round(dflash_round, why, self._ddtree_fallback, policy_round)  # ddtree_decode_rounds_total
        if dflash_round:  # prefill, idle: the target's own graphs and backend
            return super().forward_batch_generation(batch, **dflash_args)
        if why or self._ddtree_fallback:
            return self._ddtree_dflash_round(batch, **dflash_args)
        if not policy_round:  # the configured tree, no policy row
            if glue.enabled:
                self._ddtree_ledger.interrupt()
            return self._ddtree_round(batch, on_publish, self._ddtree_config.budget, grammar_barrier=grammar_barrier)[0]
        bs = len(batch.seq_lens)
        shape = glue.next_shape(bs, self._ddtree_ledger.due())  # the rounds `lag` back: host memory only
        note = glue.switch_note(bs)
        if note and self._ddtree_rank == 0:
            logger.info("DDTREE policy %s", note)
        self._ddtree_ledger.open()
        smaller = glue.smaller(shape.shape)
        accepts: Tensor | None
        if shape.is_chain:
            result, accepts = self._ddtree_chain_round(batch, on_publish, grammar_barrier, pp_proxy_tensors)
        else:
            result, accepts = self._ddtree_round(batch, on_publish, shape.budget, smaller, grammar_barrier)
        if accepts is None:
            raise RuntimeError("DDTREE: a policy round without its acceptance row")
        self._ddtree_ledger.close(shape.round_id, bs, accepts, smaller)
        return result

    def _ddtree_chain_round(
        self, batch: Any, on_publish: Any, grammar_barrier: Any, pp_proxy_tensors: Any
    ) -> tuple[Any, Tensor]:
        """The policy chose the chain: DFLASH's own decode round, unchanged. Its statistics join the DDTREE
        lines (a chain of B - 1 nodes) so the lines keep coming while the chain is chosen. -> (SGLang's result,
        [bs, 2] what it committed, twice: the chain's own acceptance)."""
        t0 = time.perf_counter()
        result = self._ddtree_dflash_round(
            batch, on_publish=on_publish, grammar_barrier=grammar_barrier, pp_proxy_tensors=pp_proxy_tensors
        )
        committed = result.accept_lens.to(torch.int64)  # [bs], bonus included
        if self._ddtree_stats is None:
            raise RuntimeError("DDTREE: a decode round before init_cuda_graphs (SGLang's start-up order changed)")
        if self._ddtree_rank == 0:
            chain = torch.full_like(committed, int(self.block_size) - 1)
            zeros, ones = torch.zeros_like(committed), torch.ones_like(committed)
            stats = torch.stack([committed, chain, chain, zeros, ones, zeros], dim=1)
            self._ddtree_stats.push(stats, {"verify": (time.perf_counter() - t0) * 1e3})
        return result, torch.stack([committed, committed], dim=1)

    def _ddtree_needs_dflash_round(self, batch: Any) -> str:
        """Why this decode batch cannot take a tree round; "" if it can (ddtree.sglang.request_kinds)."""
        return dflash_round_reason(batch, self._ddtree_head().tp_size, self._ddtree_overlap)

    def _ddtree_choices(
        self, batch: Any, logits: Tensor, tokens: Tensor, tree_mask: Tensor, depths: Tensor, positions: Tensor
    ) -> Tensor | None:
        """[bs, S] each node's choice under the batch's sampling and logit rules (request_kinds.node_choices);
        None for a plain greedy batch (the caller's argmax)."""
        info = batch.sampling_info
        rules = rules_of_batch(batch, int(logits.shape[-1]), logits.device)  # None: no request has a rule
        if (info is None or info.is_all_greedy) and rules is None:
            return None
        sampler = self.target_worker.model_runner.sampler
        order = self._ddtree_penalty_order
        choices, rows = node_choices(batch, logits, tokens, tree_mask, depths, positions, sampler, rules, order)
        if batch.return_logprob and rules is not None:  # the log-probs read the rows the choices came from
            logits.copy_(rows.reshape(logits.shape))
        return choices

    @staticmethod
    def _ddtree_grammar_mask(batch: Any, tree: Any, logits: Tensor, barrier: Any) -> None:
        """Mask `logits` [bs * S, V] in place with each grammar-constrained request's vocabulary mask per node
        (SGLang's own walk, `build_grammar_vocab_mask`: a node whose token its grammar accepts gets the mask of
        its path, the rows of a rejected node's subtree stay open, since the walk can never reach them). The
        baseline masks after the penalties and before logit_bias; a mask only sets -inf, which both leave at
        -inf, so masking first gives the same rows. `barrier` first advances the FSMs over the previous
        round's tokens (the overlap scheduler's)."""
        mask = build_grammar_vocab_mask(
            reqs=batch.reqs, tree=tree, sampling_info=batch.sampling_info, device=logits.device, barrier=barrier
        )
        if mask is not None:
            mask.apply(logits)

    def _ddtree_tree_verify(self, verify_input: Any, plan: BatchPlan, batch: Any) -> Any:
        """Prepare and run the verify forward. On an exact hybrid target SGLang's GDN backend reads the tree
        links whenever it builds its metadata (in prepare_for_verify, and again inside the forward), so its
        top-k is raised for this verify only: DFLASH's own rounds (prefill, sampling batches) stay chains."""
        if not self._ddtree_exact_hybrid:
            verify_batch, _ = verify_input.prepare_for_verify(batch, self.target_worker)
            return self._ddtree_target_forward(verify_batch)
        verify_input.retrieve_next_token = plan.retrieve_next_token
        verify_input.retrieve_next_sibling = plan.retrieve_next_sibling
        linear, topk = self._ddtree_linear, self._ddtree_linear.topk
        linear.topk = max(2, int(topk))
        try:
            verify_batch, _ = verify_input.prepare_for_verify(batch, self.target_worker)
            target_out = self._ddtree_target_forward(verify_batch)
        finally:
            linear.topk = topk
        if getattr(linear.forward_metadata, "retrieve_parent_token", None) is None:
            raise RuntimeError("DDTREE: SGLang's GDN backend did not take its tree path for the verify")
        return target_out

    @contextlib.contextmanager
    def _ddtree_verify_seq_lens(self, batch: Any, draft_input: Any, width: int) -> Iterator[None]:
        """The batch's host-side sequence lengths as a verify of `width` tokens per request sees them."""
        cpu_backup, sum_backup = batch.seq_lens_cpu, batch.seq_lens_sum
        if cpu_backup is not None:
            batch.seq_lens_cpu = cpu_backup + width
            batch.seq_lens_sum = int(batch.seq_lens_cpu.sum())
        elif draft_input.nxt_kv_lens_cpu is not None:
            batch.seq_lens_cpu = draft_input.nxt_kv_lens_cpu
            batch.seq_lens_sum = int(draft_input.nxt_kv_lens_sum)
        try:
            yield
        finally:
            batch.seq_lens_cpu, batch.seq_lens_sum = cpu_backup, sum_backup

    def _ddtree_chain_verify(
        self, batch: Any, draft_input: Any, tokens: Tensor, window: KVWindow
    ) -> tuple[Any, Tensor, Tensor]:
        """DFLASH's own verify (causal, chain metadata) of `tokens` [bs, B] in the draft window; returns the
        logits output, the target's logits [bs, B, V] and its argmax [bs, B]."""
        bs, width = tokens.shape
        verify_input = DFlashVerifyInput(
            draft_token=tokens.reshape(-1),
            positions=window.positions.reshape(-1),
            draft_token_num=width,
            custom_mask=None,
            capture_hidden_mode=CaptureHiddenMode.FULL,
            kv_loc_plan=window.plan,
        )
        batch.out_cache_loc = window.locs.reshape(-1)
        with self._ddtree_verify_seq_lens(batch, draft_input, width):
            verify_batch, _ = verify_input.prepare_for_verify(batch, self.target_worker)
            out = self._ddtree_target_forward(verify_batch).logits_output
        if batch.has_grammar:  # the FSMs were advanced before the tree's masks: no barrier here
            self._ddtree_grammar_mask(batch, GrammarTree.from_linear_chain(tokens), out.next_token_logits, None)
        logits = out.next_token_logits.view(bs, width, -1)
        mask, depths = chain_layout(width, bs, tokens.device)
        flat = out.next_token_logits.view(bs * width, -1)
        choices = self._ddtree_choices(batch, flat, tokens, mask, depths, window.positions.reshape(-1))
        return out, logits, torch.argmax(logits, dim=-1) if choices is None else choices

    def _ddtree_snapshot_conv_states(self, batch: Any) -> list[tuple[Tensor, Tensor, Tensor]]:
        """(conv state tensor [L, slots, ...], the batch's rows, a copy of them) per conv type."""
        pool = self.target_worker.model_runner.req_to_token_pool
        rows = self._ddtree_linear._translate_mamba_indices(pool.get_mamba_indices(batch.req_pool_indices))
        rows = rows.to(torch.int64)
        return [(conv, rows, conv[:, rows].clone()) for conv in pool.mamba_pool.mamba_cache.conv]

    def _ddtree_self_check_due(self) -> bool:
        self._ddtree_rounds += 1
        every = self._ddtree_config.selfcheck_every
        return bool(every) and self._ddtree_rounds % every == 0

    def _ddtree_verify_states(self, steps: Tensor) -> AcceptedStates:
        """The verify's per-step conv windows and recurrent-state norms at `steps` [bs] (hybrid targets)."""
        caches = self.target_worker.model_runner.req_to_token_pool.mamba_pool.mamba_cache
        return accepted_states(list(caches.intermediate_conv_window), caches.intermediate_ssm, steps)

    def _ddtree_report_self_check(
        self,
        check: ChainCheck,
        tree_tokens: Tensor,
        chain_logits: Tensor,
        chain_predict: Tensor,
        state_gap: Tensor | None = None,
        compared: list[bool] | None = None,
    ) -> None:
        """One host read per check round. A token mismatch at a near-tie of the chain's logits is rounding
        (INFO); any other, or a hybrid state the tree would commit that differs from the chain's by more than
        STATE_TOLERANCE, is an ERROR, and DFLASH's rounds from now on. `compared`: the rows whose choices are
        reproducible (greedy or seeded); an unseeded sampled row's chain draws differently, by design."""
        if state_gap is not None:
            worst = int(state_gap.argmax())
            gap = float(state_gap[worst])
            if gap >= STATE_TOLERANCE:
                self._ddtree_fail_self_check(
                    f"request {worst}: the recurrent state the tree would commit differs from the chain's by "
                    f"{gap:.3g} (relative)"
                )
                return
        gaps = mismatch_gaps(chain_logits, check, tree_tokens)
        tolerance = TIE_TOLERANCE.get(chain_logits.dtype, TIE_TOLERANCE[torch.bfloat16])
        differs = (check.mismatch >= 0).tolist()
        if compared is not None:
            differs = [d and c for d, c in zip(differs, compared, strict=True)]
        gap_list = gaps.tolist()
        bad = [b for b, d in enumerate(differs) if d and gap_list[b] >= tolerance]
        ties = [b for b, d in enumerate(differs) if d and gap_list[b] < tolerance]
        if not bad:
            near = ""
            if ties:
                near = f" (near-ties in {len(ties)} requests, max gap {max(gap_list[b] for b in ties):.3g})"
            if self._ddtree_rank == 0:  # every tensor-parallel rank checks the same data
                logger.info(
                    "DDTREE self-check round %d: the tree verify equals the chain verify%s",
                    self._ddtree_rounds,
                    near,
                )
            return
        b = bad[0]
        at = int(check.mismatch[b])
        self._ddtree_fail_self_check(
            f"request {b} path position {at}: tree verify {int(tree_tokens[b, at])}, chain verify "
            f"{int(chain_predict[b, at])}, logit gap {gap_list[b]:.3g}; {len(bad)} of {tree_tokens.shape[0]} "
            "requests differ"
        )

    def _ddtree_fail_self_check(self, what: str) -> None:
        """One ERROR line, and DFLASH's rounds for the rest of this process."""
        self._ddtree_fallback = f"self-check round {self._ddtree_rounds}: {what}"
        logger.error(
            "DDTREE self-check FAILED (%s): the tree verify is not exact on this setup; this process runs "
            "DFLASH's rounds from now on",
            self._ddtree_fallback,
        )

    def _ddtree_target_forward(self, verify_batch: Any) -> Any:
        return self.target_worker.forward_batch_generation(
            batch=None, forward_batch=verify_batch, is_verify=True, skip_attn_backend_init=True
        )

    # -- one decode round: draft -> plan -> verify -> commit (contracts: the step dataclasses above) --

    def _ddtree_round(
        self,
        batch: Any,
        on_publish: Any,
        budget: int,
        smaller: Sequence[int] | None = None,
        grammar_barrier: Any = None,
    ) -> tuple[Any, Tensor | None]:
        """One tree round of `budget` nodes of a greedy decode batch. Device-to-host syncs of the round's own
        code (SGLang's forwards may add theirs), at most 2: in `_ddtree_plan`, the prefix-length sum that sizes
        FULL_MASK when the batch has no host copy of seq_lens; in `StatsQueue.push`, the statistics read on a
        round that completes a DDTREE log line (the first round, then once per DDTREE_LOG_INTERVAL
        request-rounds). -> (SGLang's result, [bs, 2 + len(smaller)] `round_accepts` on the device, None
        without `smaller`: the policy is off)."""
        draft_input = batch.spec_info
        if not isinstance(draft_input, DFlashDraftInputV2):
            raise RuntimeError("DDTREE expected DFlashDraftInputV2 state on the running batch")
        replayed = None
        if self._ddtree_replay is not None:  # DDTREE_REPLAY_ACCEPTANCE: the recorded trees' shapes and paths
            replayed = self._ddtree_replay.next_round([req.rid for req in batch.reqs], int(self.block_size) - 1)
        t0 = time.perf_counter()
        draft = self._ddtree_draft(batch, draft_input)
        t1 = time.perf_counter()
        planned = self._ddtree_plan(batch, draft_input, draft, budget, replayed)
        t2 = time.perf_counter()
        check = self._ddtree_self_check_due()
        verified = self._ddtree_verify(batch, draft_input, planned, check, grammar_barrier, replayed)
        t3 = time.perf_counter()
        commit, kept, new_seq_lens = self._ddtree_commit(batch, draft_input, draft, planned, verified, on_publish)
        if self._ddtree_paths is not None:  # DDTREE_RECORD_PATHS: a recording run (reads the paths to the host)
            links = (planned.plan.retrieve_next_token, planned.plan.retrieve_next_sibling)
            self._ddtree_paths.add([req.rid for req in batch.reqs], path_ranks(*links, commit.path))
        t4 = time.perf_counter()

        ms = {"draft": (t1 - t0) * 1e3, "build": (t2 - t1) * 1e3, "verify": (t3 - t2) * 1e3}
        ms["commit"] = (t4 - t3) * 1e3
        if self._ddtree_stats is None:
            raise RuntimeError("DDTREE: a decode round before init_cuda_graphs (SGLang's start-up order changed)")
        if batch.return_logprob:  # the committed tokens' log-probs, from the rows of the path that chose them
            compute_spec_logprobs(batch, kept.logits_output, kept.predict, accept_index=kept.state_index)
        if self._ddtree_rank == 0:  # sync 2, on a round that completes a line
            self._ddtree_stats.push(stats_tensor(planned.plan, commit), ms)
        block = int(self.block_size)
        accepts = None if smaller is None else round_accepts(planned.plan, commit, smaller, block - 1)  # no sync
        result = GenerationBatchResult(
            logits_output=kept.logits_output,
            next_token_ids=kept.out_tokens[:, :block].reshape(-1),
            accept_lens=kept.commit_lens,
            can_run_cuda_graph=verified.output.can_run_cuda_graph,
            next_draft_input=dw.make_draft_input_v2(bonus_tokens=kept.bonus, new_seq_lens=new_seq_lens),
            speculative_num_draft_tokens=block,
            new_seq_lens=new_seq_lens,
            routed_experts_output=verified.output.routed_experts_output,
            indexer_topk_output=verified.output.indexer_topk_output,
        )
        return result, accepts

    def _ddtree_head(self) -> HeadShard:
        """The target's LM head rows on this rank (all of them at TP 1), or a start-up error."""
        head = head_shard(dw.unwrap_lora_layer(getattr(self.target_worker.model_runner.model, "lm_head", None)))
        if isinstance(head, str):
            raise ValueError(f"DDTREE: tree verify needs a dense LM head: {head}")
        return head

    def _ddtree_kv_window(self, batch: Any, draft_input: Any, prefix_lens: Tensor, width: int) -> KVWindow:
        """The first `width` KV slots SGLang reserved after each request's prefix, and their KV-location plan."""
        positions = prefix_lens.to(torch.int64).unsqueeze(1) + torch.arange(
            width, device=self.device, dtype=torch.int64
        )  # [bs, W]
        req_to_token = self.model_runner.req_to_token_pool.req_to_token
        locs = req_to_token[batch.req_pool_indices.to(torch.int64).unsqueeze(1), positions].to(torch.int64)
        plan = self.target_worker.model_runner.kv_index_translator.plan(
            req_pool_indices=batch.req_pool_indices,
            seq_lens=prefix_lens,
            seq_lens_cpu=batch.seq_lens_cpu if batch.seq_lens_cpu is not None else draft_input.nxt_kv_lens_cpu,
            write_virtual=locs.reshape(-1),
            read_extent=width,
        )
        return KVWindow(positions=positions, locs=locs, plan=plan)

    def _ddtree_draft(self, batch: Any, draft_input: Any) -> DraftBlock:
        """Step 1. DFLASH's draft block (the bonus token, then B - 1 mask tokens) through the drafter in the
        first B reserved slots, as DFLASH's eager path runs it; the drafter's hidden states at depths 1..B-1."""
        bs, block, device = len(batch.seq_lens), int(self.block_size), self.device
        prefix_lens = batch.seq_lens
        window = self._ddtree_kv_window(batch, draft_input, prefix_lens, block)
        block_ids = torch.full((bs, block), int(self._mask_token_id), dtype=torch.int64, device=device)
        block_ids[:, 0].copy_(draft_input.bonus_tokens)
        target_model = self.target_worker.model_runner.model
        embed_module = dw.unwrap_lora_layer(dw._resolve_dflash_embedding_module(self.draft_model, target_model))
        if self._full_embed_gpu is not None:
            noise = torch.nn.functional.embedding(block_ids, self._full_embed_gpu)
        else:
            noise = embed_module(block_ids)
        if self._noise_embed_scale != 1.0:
            noise = noise * self._noise_embed_scale
        if batch.seq_lens_cpu is not None:
            seq_lens_cpu = batch.seq_lens_cpu.clone() + block
        elif draft_input.nxt_kv_lens_cpu is not None:
            seq_lens_cpu = draft_input.nxt_kv_lens_cpu.clone()
        else:
            seq_lens_cpu = torch.tensor([req.kv.kv_allocated_len for req in batch.reqs], dtype=torch.int64)
        draft_batch = ForwardBatch(
            forward_mode=ForwardMode.TARGET_VERIFY,
            batch_size=bs,
            input_ids=block_ids.flatten(),
            req_pool_indices=batch.req_pool_indices,
            seq_lens=prefix_lens,
            out_cache_loc=window.locs.reshape(-1),
            seq_lens_sum=int(seq_lens_cpu.sum()),
            seq_lens_cpu=seq_lens_cpu,
            positions=window.positions.reshape(-1),
            input_embeds=noise.view(-1, noise.shape[-1]),
            spec_algorithm=SpeculativeAlgorithm.DFLASH,
            spec_info=self._draft_block_spec_info,
            capture_hidden_mode=CaptureHiddenMode.NULL,
            num_token_non_padded=(
                torch.full((), bs * block, dtype=torch.int32, device=device)
                if dw.enable_num_token_non_padded()
                else None
            ),
            global_num_token_non_padded_cpu=bs * block,
            can_run_decode_cuda_graph=batch.can_run_decode_cuda_graph,
        )
        window.plan.bind(draft_batch, self.draft_model_runner.kv_index_translator)
        with torch.inference_mode(), dw.draft_tp_context(self.draft_parallel_layout):
            draft_out = self.draft_model_runner.forward(draft_batch)
        hidden = draft_out.logits_output.hidden_states
        if hidden is None:
            raise RuntimeError("DFLASH draft model returned no hidden states")
        return DraftBlock(prefix_lens=prefix_lens, window=window, hidden=hidden.view(bs, block, -1)[:, 1:, :])

    def _ddtree_plan(
        self, batch: Any, draft_input: Any, draft: DraftBlock, budget: int, replayed: ReplayRound | None = None
    ) -> PlannedRound:
        """Step 2. The target's LM head on the drafter's hidden states gives log-probs [bs, B - 1, V]; every
        request's tree of `budget` nodes (the configured one, or the policy's smaller one: the same best-first
        tree cut, padded), in SGLang's layout and S slots, with FULL_MASK and the verify's KV window. `replayed`
        (a benchmark's acceptance replay) puts its recorded top-k values in place of the drafter's."""
        head, config = self._ddtree_head(), self._ddtree_config
        slots, prefix_lens = verify_slots(budget, int(self.block_size)), draft.prefix_lens
        bs = int(prefix_lens.shape[0])
        window = draft.window  # a tree that fits the draft block's window, or twice as wide
        if slots != int(self.block_size):
            window = self._ddtree_kv_window(batch, draft_input, prefix_lens, slots)
        graphed = False
        if head.tp_size > 1:  # a vocab-parallel head: each rank's top-k, gathered (the same trees everywhere)
            vals, ids = head_topk(draft.hidden, head, config.topk)  # [bs, B - 1, k]
            if replayed is not None and replayed.topk is not None:  # the recorded shapes, rank for rank
                vals = replayed.topk.to(vals.device, non_blocking=True)
            if self._ddtree_paths is not None:  # a recording run: the values the trees are planned from
                self._ddtree_paths.draft_topk(vals)
            plan = plan_batch_topk(vals, ids, draft_input.bonus_tokens, prefix_lens, slots, budget)
        else:
            with torch.inference_mode():
                # one [bs * (B - 1), H] GEMM: draft.hidden is a strided view, and a 3-D matmul on it becomes a
                # batched GEMM that reads the whole head once per request (H200, 27B shape, bs 32: 20.6 ms
                # instead of ~2; dev/sglang_gpu/cost_bench.py)
                flat = draft.hidden.reshape(-1, draft.hidden.shape[-1]).to(head.weight.dtype)
                logits = (flat @ head.weight.T).view(bs, draft.hidden.shape[1], -1)  # [bs, B - 1, V]
                logprobs = torch.log_softmax(logits.float(), dim=-1)
                if replayed is not None and replayed.topk is not None:  # the recorded shapes (replay.impose_topk)
                    impose_topk(logprobs, replayed.topk)
                if self._ddtree_paths is not None:  # a recording run: the values the trees are planned from
                    self._ddtree_paths.draft_topk(logprobs.topk(config.topk, dim=-1).values)
            graphs = self._ddtree_round_graphs(budget)
            graphed = graphs.applies(bs, logprobs.device)  # small batches: replayed from graphs
            if graphed:
                plan = graphs.plan(logprobs, draft_input.bonus_tokens, prefix_lens)
            else:
                plan = plan_batch(
                    logprobs, draft_input.bonus_tokens, prefix_lens, slots, budget, config.topk, config.fused_build
                )
        host_lens = batch.seq_lens_cpu  # None: sync 1, the sum of the device's prefix lengths
        prefix_sum = int((host_lens if host_lens is not None else prefix_lens).sum())
        numel = full_mask_numel(prefix_sum, bs, slots)
        custom_mask = full_mask_batched(plan.tree_mask, prefix_lens, numel, config.fused_build)
        return PlannedRound(plan=plan, custom_mask=custom_mask, window=window, graphed=graphed, budget=budget)

    def _ddtree_round_graphs(self, budget: int) -> RoundGraphs:
        """The plan / commit graphs of trees of `budget` nodes (one set per budget the policy runs)."""
        graphs = self._ddtree_graphs.get(budget)
        if graphs is None:
            slots, most = verify_slots(budget, int(self.block_size)), self._ddtree_config.round_graphs_max_bs
            config = self._ddtree_config
            graphs = RoundGraphs(slots, budget, config.topk, most, fused=config.fused_build)
            self._ddtree_graphs[budget] = graphs
        return graphs

    def _ddtree_verify(
        self,
        batch: Any,
        draft_input: Any,
        planned: PlannedRound,
        check: bool,
        grammar_barrier: Any = None,
        replayed: ReplayRound | None = None,
    ) -> VerifiedRound:
        """Step 3. One target forward (TARGET_VERIFY) over every tree, writing the verify window's KV; SGLang's
        verify_tree_greedy walks the target's choices (argmax, or each request's rules and sampler) over the tree
        links. A grammar-constrained request's nodes are masked first, each by its grammar after its path.
        `replayed` (a benchmark's acceptance replay) steers the choices along its recorded paths."""
        plan = planned.plan
        # the tree's links and tokens start their copy to the host now, so the masks' host walk overlaps the forward
        grammar_tree = (
            GrammarTree.from_device(plan.retrieve_next_token, plan.retrieve_next_sibling, plan.tokens)
            if batch.has_grammar
            else None
        )
        bs, slots = (int(n) for n in plan.tokens.shape)
        # a verify forward slides each request's conv state in place (the commit overwrites it from the
        # accepted step's window); a self-check's chain re-verify must start from the committed one
        conv_snapshot = self._ddtree_snapshot_conv_states(batch) if check and self._ddtree_hybrid else None
        verify_input = DFlashVerifyInput(
            draft_token=plan.tokens.reshape(-1),
            positions=plan.positions,
            draft_token_num=slots,
            custom_mask=planned.custom_mask,
            capture_hidden_mode=CaptureHiddenMode.FULL,
            kv_loc_plan=planned.window.plan,
        )
        batch.out_cache_loc = planned.window.locs.reshape(-1)
        with self._ddtree_verify_seq_lens(batch, draft_input, slots):
            output = self._ddtree_tree_verify(verify_input, plan, batch)
        logits_output, target_lp = output.logits_output, self._target_logits_processor
        if target_lp is not None and target_lp.is_deferred_shard(logits_output.next_token_logits):
            target_predict = target_lp.deferred_argmax(logits_output.next_token_logits)
            logits_output.next_token_logits = None
        else:
            logits = logits_output.next_token_logits
            if grammar_tree is not None:
                self._ddtree_grammar_mask(batch, grammar_tree, logits, grammar_barrier)
            choices = self._ddtree_choices(batch, logits, plan.tokens, plan.tree_mask, plan.depths, plan.positions)
            target_predict = torch.argmax(logits, dim=-1) if choices is None else choices
        target_predict = target_predict.view(bs, slots)
        if replayed is not None:  # DDTREE_REPLAY_ACCEPTANCE: the walk commits the recorded paths
            target_predict, _ = steer_predictions(
                plan.tokens, plan.retrieve_next_token, plan.retrieve_next_sibling, target_predict,
                replayed.ranks,
                int(self.target_worker.model_runner.model_config.vocab_size),
            )  # fmt: skip
        predicts = torch.full((bs * slots,), -1, dtype=torch.int32, device=self.device)
        accept_index = torch.full((bs, slots), -1, dtype=torch.int32, device=self.device)
        accept_num = torch.zeros((bs,), dtype=torch.int32, device=self.device)
        predicts, accept_index, accept_num = verify_tree_greedy_func(
            predicts=predicts,
            accept_index=accept_index,
            accept_token_num=accept_num,
            candidates=plan.tokens,
            retrieve_index=plan.retrieve_index,
            retrieve_next_token=plan.retrieve_next_token,
            retrieve_next_sibling=plan.retrieve_next_sibling,
            target_predict=target_predict,
            topk=self._ddtree_config.topk,
        )
        return VerifiedRound(output, target_predict, accept_index, accept_num, check, conv_snapshot)

    def _ddtree_commit(
        self,
        batch: Any,
        draft_input: Any,
        draft: DraftBlock,
        planned: PlannedRound,
        verified: VerifiedRound,
        on_publish: Any,
    ) -> tuple[BatchCommit, KeptRound, Tensor]:
        """Step 4. What the round commits (commit_batch, or its graph), kept: the accepted slots first in the
        request's window, on a hybrid target the last accepted node's conv window and recurrent state
        (batch.seq_lens is still the pre-verify length, which SGLang's radix-cache tracking needs), the new
        lengths published, the accepted rows' hidden states to the drafter. Returns the tree's commit (for
        the statistics), what was kept, and the new sequence lengths."""
        args = (planned.plan, verified.accept_index, verified.accept_num, verified.target_predict)
        # a graph's results are copied out of its buffers: they outlive the round
        if planned.graphed:  # the graphs `_ddtree_plan` replayed
            commit = clone_result(self._ddtree_round_graphs(planned.budget).commit(*args))
        else:
            commit = commit_batch(*args)
        if verified.check:
            kept = self._ddtree_keep_chain(batch, draft_input, draft, planned, verified, commit)
        else:
            kept = self._ddtree_keep_tree(batch, planned, verified, commit)
        if self._ddtree_hybrid:
            commit_mamba_states_after_verify(
                self.target_worker, batch, accept_lens=kept.commit_lens, accept_index=kept.state_index,
                draft_token_num=kept.state_width,
            )  # fmt: skip
        new_seq_lens = draft.prefix_lens + kept.commit_lens.to(draft.prefix_lens.dtype)
        if on_publish is not None:
            on_publish(new_seq_lens)
        self._ddtree_hidden_to_drafter(draft, kept)
        return commit, kept, new_seq_lens

    def _ddtree_keep_tree(
        self, batch: Any, planned: PlannedRound, verified: VerifiedRound, commit: BatchCommit
    ) -> KeptRound:
        """The tree's accepted path: req_to_token over the verify window permuted, accepted slots first."""
        bs, slots = commit.perm.shape
        window, req_to_token = planned.window, self.model_runner.req_to_token_pool.req_to_token
        rows = batch.req_pool_indices.to(torch.int64).unsqueeze(1).expand(bs, slots)
        req_to_token[rows, window.positions] = window.locs.gather(1, commit.perm).to(req_to_token.dtype)
        hidden_loc = self._draft_write_ids(window.plan).view(bs, slots).to(torch.int64).gather(1, commit.perm)
        return KeptRound(
            commit_lens=commit.commit_lens,
            out_tokens=commit.out_tokens,
            bonus=commit.bonus,
            state_index=verified.accept_index,
            state_width=slots,
            predict=verified.target_predict.reshape(-1),
            hidden_rows=commit.perm,
            hidden_loc=hidden_loc,
            logits_output=verified.output.logits_output,
        )

    def _ddtree_keep_chain(
        self,
        batch: Any,
        draft_input: Any,
        draft: DraftBlock,
        planned: PlannedRound,
        verified: VerifiedRound,
        commit: BatchCommit,
    ) -> KeptRound:
        """A self-check round: the accepted paths re-verified as chains in the draft window (path order:
        nothing to permute), compared with the tree's verdict; the chain's results are kept, so the round is
        exact whatever the check finds."""
        bs, slots = commit.perm.shape
        block, device = int(self.block_size), self.device
        path_tokens = planned.plan.tokens.gather(1, commit.perm)[:, :block]  # [bs, B]: the path, then filler
        tree_states = None
        if verified.conv_snapshot is not None:  # hybrid: what the tree would commit, before it is overwritten
            lens = commit.commit_lens.to(torch.int64)
            last = verified.accept_index.to(torch.int64).gather(1, (lens - 1).unsqueeze(1)).squeeze(1)
            tree_states = self._ddtree_verify_states(last - torch.arange(bs, device=device) * slots)
            for conv, rows, saved in verified.conv_snapshot:
                conv[:, rows] = saved
        logits_output, chain_logits, chain_predict = self._ddtree_chain_verify(
            batch, draft_input, path_tokens, draft.window
        )
        check = chain_check(commit.out_tokens, commit.commit_lens, chain_predict)
        gaps = None
        if tree_states is not None:
            chain_states = self._ddtree_verify_states(commit.commit_lens.to(torch.int64) - 1)
            gaps = state_gaps(tree_states, chain_states, check.mismatch < 0)
        self._ddtree_report_self_check(check, commit.out_tokens, chain_logits, chain_predict, gaps, reproducible(batch))
        return KeptRound(
            commit_lens=check.commit_lens,
            out_tokens=check.out_tokens,
            bonus=check.bonus,
            state_index=chain_accept_index(bs, block, device),
            state_width=block,
            predict=chain_predict.reshape(-1),
            hidden_rows=None,
            hidden_loc=self._draft_write_ids(draft.window.plan).view(bs, block).to(torch.int64),
            logits_output=logits_output,
        )

    def _ddtree_hidden_to_drafter(self, draft: DraftBlock, kept: KeptRound) -> None:
        """The kept rows' target hidden states, in path order, into the drafter's KV at prefix_len ..
        prefix_len + tau - 1 (DFLASH's own writer). tau <= B: a tree is at most B - 1 deep."""
        block = int(self.block_size)
        hidden = kept.logits_output.hidden_states
        if hidden is None:
            raise RuntimeError("DDTREE verify requires the target's hidden states, got None")
        bs = int(kept.commit_lens.shape[0])
        hidden = hidden.view(bs, -1, hidden.shape[-1])
        if kept.hidden_rows is not None:
            rows = kept.hidden_rows
            hidden = hidden.gather(1, rows.unsqueeze(-1).expand(bs, rows.shape[1], hidden.shape[-1]))
        hidden = hidden[:, :block].contiguous()
        draft_loc = kept.hidden_loc[:, :block].contiguous()
        self._append_target_hidden_to_draft_kv_by_loc(
            target_hidden=hidden.reshape(-1, hidden.shape[-1]),
            cache_loc=draft_loc.reshape(-1),
            cache_loc_2d=draft_loc,
            positions=draft.window.positions.reshape(-1),
            commit_lens=kept.commit_lens,
        )
        kept.logits_output.hidden_states = None
