"""The DDTREE `tree` worker for SGLang: DFLASH's drafting, a DDTree tree per request, ONE target forward over
the whole tree (TARGET_VERIFY, ancestor-only custom mask), one choice per node (the request's logit rules and
SGLang's own sampler at the node's position: `ddtree.sglang.request_kinds`), SGLang's `verify_tree_greedy` walk
over those choices, the accepted nodes' KV kept, their hidden states fed back to the drafter. Greedy, sampled and
seeded requests, logit_bias, penalties, min_new_tokens and log-probs; dense and hybrid targets.

One round, per decode batch (prefill and idle batches run DFLASH's own code, unchanged):

1. draft (`RoundRunner.draft` -> `DraftBlock`): DFLASH's draft block (bonus token + mask tokens at prefix_len ..
   prefix_len + B - 1, B = block size) through the drafter, in the first B KV slots SGLang's spec-v2 scheduler
   reserved (2 * B per request);
2. plan (`RoundRunner.plan` -> `PlannedRound`): the target's LM head on the drafter's hidden states gives B - 1 rows of
   log-probs; `ddtree.sglang.batch_round.plan_batch` builds every request's tree at once on the device
   (DDTREE_BUDGET nodes, DDTREE_TOPK per row; the trees `build_tree_heap` builds) in SGLang's EAGLE tree layout
   (`ddtree.sglang.layout` documents it), padded to S = B slots (2B for a wide tree), with FULL_MASK;
3. verify (`TreeVerifier.verify` -> `VerifiedRound`): one target forward (TARGET_VERIFY) with the FULL_MASK custom
   mask and positions prefix_len + depth, writing the window req_to_token[prefix_len : prefix_len + S]; each node's
   choice (argmax, or the request's rules and sampler: docs/sglang.md, "Request kinds"), and
   `verify_tree_greedy` walks those choices over the tree links;
4. commit (`RoundRunner.commit` -> `KeptRound`, page_size 1): the window's req_to_token entries are permuted so the
   accepted path's slots come first (path order) and the others after: req_to_token[prefix_len : prefix_len +
   tau] = the accepted nodes' KV locations; the unaccepted locations stay in the request's reservation (as
   DFLASH's rejected slots do) and are rewritten next round. The verify's target hidden states of the accepted
   rows, in path order, go to the drafter's KV at positions prefix_len .. prefix_len + tau - 1 (DFLASH's own
   writer). The commit (`commit_batch`) runs on the device too, and the statistics for the DDTREE lines stay
   there until a line needs them (`StatsQueue`). A self-check round keeps a chain re-verify's results instead
   (`SelfCheck.keep_chain`).

The worker keeps SGLang's overrides and the dispatch (which round a batch takes); the round is a collaborator built
once, `ddtree.sglang.round_runner.RoundRunner`, with its verify step (`ddtree.sglang.round_verify.TreeVerifier`),
its self-check (`ddtree.sglang.selfcheck.SelfCheck`) and its benchmark hooks (`ddtree.sglang.bench_hooks`: none
in production). What each step hands the next is written once, in the step dataclasses of
`ddtree.sglang.tree_round`. The private SGLang names the
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
import time
from typing import Any

import sglang.srt.speculative.dflash_utils as dflash_utils
import sglang.srt.speculative.dflash_worker_v2 as dw
import torch
from sglang.srt.configs.hybrid_arch import mambaish_config
from torch import Tensor

from ddtree.config import HybridMode, process_config
from ddtree.metrics import MetricsLog
from ddtree.sglang import causal_graphs
from ddtree.sglang.batch_round import StatsQueue
from ddtree.sglang.bench_hooks import RoundHooks
from ddtree.sglang.compat import attribute_refusal
from ddtree.sglang.gates import GateError, hybrid_mode
from ddtree.sglang.graph_masks import (
    capture_with_tree_masks,
    captured_with_tree_masks,
    graph_backend_refusal,
    mask_unmasked_verifies,
)
from ddtree.sglang.hybrid_graphs import replay_tree_links, tree_links
from ddtree.sglang.policy_glue import PolicyGlue, RoundLedger
from ddtree.sglang.prom_glue import note_round
from ddtree.sglang.request_kinds import dflash_round_reason, policy_decides
from ddtree.sglang.round_runner import RoundRunner, lm_head
from ddtree.sglang.round_verify import TreeVerifier
from ddtree.sglang.selfcheck import SelfCheck
from ddtree.sglang.tree_round import (
    cost_max,
    dense_conv_windows,
    folded_draft_head_warning,
    hybrid_tree_refusal,
    verify_slots,
)

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
        head = lm_head(self)  # refused here, not in the first decode round
        self._ddtree_rank = head.rank  # rank 0 of a tensor-parallel group writes the DDTREE lines
        # benchmark hooks (opsctl refuses them): replay recorded paths / record this run's paths; none in production
        hooks = RoundHooks.build(config, block, int(target_worker.model_runner.model_config.vocab_size))
        self._ddtree_verifier = TreeVerifier(self, config.topk, self._ddtree_hybrid, hooks)
        self._ddtree_check = SelfCheck(config.selfcheck_every, head.rank)  # its fallback: DFLASH's rounds from then on
        self._ddtree_runner = RoundRunner(self, config, self._ddtree_verifier, self._ddtree_check, hooks)
        self._ddtree_log: MetricsLog | None = None
        self._ddtree_dflash_reasons: set[str] = set()  # each logged once (WARNING)
        self._ddtree_overlap = not server_args.disable_overlap_schedule
        self._ddtree_glue = PolicyGlue.from_config(config)  # DDTREE_POLICY (off: the configured tree)
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
        linear = getattr(target_runner.attn_backend, "linear_attn_backend", None)
        self._ddtree_verifier.linear = linear
        mamba_pool = getattr(target_runner.req_to_token_pool, "mamba_pool", None)
        self._ddtree_hybrid_why = hybrid_tree_refusal(linear, mamba_pool)
        if self._ddtree_hybrid_why:
            return
        self._ddtree_dense_conv_windows(mamba_pool)
        if self._ddtree_graphs_requested:
            replay_tree_links(target_runner.attn_backend, linear)

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
        self._ddtree_verifier.exact_hybrid = hybrid is HybridMode.EXACT
        glue = self._ddtree_glue
        shapes = glue.policy.config.shapes if glue.enabled else ()
        self._ddtree_runner.warm({s.budget for s in shapes if not s.is_chain} | {self._ddtree_config.budget})
        policy = glue.policy if glue.enabled else None
        self._ddtree_log = MetricsLog(self._ddtree_config, int(self.block_size), hybrid, policy=policy)
        if self._ddtree_rank == 0:
            self._ddtree_log.start()
        self._ddtree_runner.stats = StatsQueue(self._ddtree_log)

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
        fallback = self._ddtree_check.fallback  # a failed self-check's text: DFLASH's rounds from then on
        if dflash_round or why or fallback:
            self._ddtree_ledger.interrupt()  # not a policy round: the policy's gap skips this forward
        # the shape policy decides greedy rounds whose rules do not read the output (request_kinds.policy_decides);
        # PolicyGlue counts its own rounds
        glue = self._ddtree_glue
        policy_round = glue.enabled and policy_decides(batch)
        note_round(dflash_round, why, fallback, policy_round)  # ddtree_decode_rounds_total
        if dflash_round:  # prefill, idle: the target's own graphs and backend
            return super().forward_batch_generation(batch, **dflash_args)
        if why or fallback:
            return self._ddtree_dflash_round(batch, **dflash_args)
        if not policy_round:  # the configured tree, no policy row
            if glue.enabled:
                self._ddtree_ledger.interrupt()
            return self._ddtree_runner.run(
                batch, on_publish, self._ddtree_config.budget, grammar_barrier=grammar_barrier
            )[0]
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
            result, accepts = self._ddtree_runner.run(batch, on_publish, shape.budget, smaller, grammar_barrier)
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
        stats = self._ddtree_runner.stats
        if stats is None:
            raise RuntimeError("DDTREE: a decode round before init_cuda_graphs (SGLang's start-up order changed)")
        if self._ddtree_rank == 0:
            chain = torch.full_like(committed, int(self.block_size) - 1)
            zeros, ones = torch.zeros_like(committed), torch.ones_like(committed)
            rows = torch.stack([committed, chain, chain, zeros, ones, zeros], dim=1)
            stats.push(rows, {"verify": (time.perf_counter() - t0) * 1e3})
        return result, torch.stack([committed, committed], dim=1)

    def _ddtree_needs_dflash_round(self, batch: Any) -> str:
        """Why this decode batch cannot take a tree round; "" if it can (ddtree.sglang.request_kinds)."""
        return dflash_round_reason(batch, lm_head(self).tp_size, self._ddtree_overlap)
