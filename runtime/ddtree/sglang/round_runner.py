"""One tree round of a greedy decode batch, built once per worker (`DDTreeTreeWorker` calls `RoundRunner.run`):
draft -> plan -> verify -> commit, each step handing the next one of the step dataclasses in
`ddtree.sglang.tree_round` (DraftBlock, PlannedRound, VerifiedRound, KeptRound). The verify step is
`ddtree.sglang.round_verify.TreeVerifier`'s, a self-check round's re-verify `ddtree.sglang.selfcheck.SelfCheck`'s,
and the benchmark hooks (acceptance replay, path recording) `ddtree.sglang.bench_hooks.RoundHooks`' seams.
tree_worker.py's docstring describes the round step by step.

This module imports sglang."""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable, Sequence
from typing import Any

import sglang.srt.speculative.dflash_worker_v2 as dw
import torch
from sglang.srt.layers.logprob_processor import compute_spec_logprobs
from sglang.srt.managers.scheduler import GenerationBatchResult
from sglang.srt.model_executor.forward_batch_info import CaptureHiddenMode, ForwardBatch, ForwardMode
from sglang.srt.speculative.dflash_info_v2 import DFlashDraftInputV2
from sglang.srt.speculative.spec_info import SpeculativeAlgorithm
from sglang.srt.speculative.spec_utils import commit_mamba_states_after_verify
from torch import Tensor

from ddtree.config import DDTreeConfig
from ddtree.sglang.batch_round import (
    BatchCommit,
    StatsQueue,
    commit_batch,
    full_mask_batched,
    full_mask_numel,
    plan_batch,
    plan_batch_topk,
    stats_tensor,
)
from ddtree.sglang.bench_hooks import RoundHooks
from ddtree.sglang.policy_glue import round_accepts
from ddtree.sglang.round_graphs import RoundGraphs, clone_result
from ddtree.sglang.round_verify import TreeVerifier
from ddtree.sglang.selfcheck import SelfCheck
from ddtree.sglang.tree_round import DraftBlock, KeptRound, KVWindow, PlannedRound, VerifiedRound, verify_slots
from ddtree.sglang.vocab_parallel import HeadShard, head_shard, head_topk

logger = logging.getLogger("ddtree")


def lm_head(worker: Any) -> HeadShard:
    """The target's LM head rows on this rank (all of them at TP 1), or a start-up error."""
    head = head_shard(dw.unwrap_lora_layer(getattr(worker.target_worker.model_runner.model, "lm_head", None)))
    if isinstance(head, str):
        raise ValueError(f"DDTREE: tree verify needs a dense LM head: {head}")
    return head


class RoundRunner:
    """The tree rounds of one worker (`worker`: the DFlashWorkerV2 whose drafter, target and pools it uses)."""

    def __init__(
        self, worker: Any, config: DDTreeConfig, verifier: TreeVerifier, check: SelfCheck, hooks: RoundHooks
    ) -> None:
        self.worker, self.config, self.verifier, self.check, self.hooks = worker, config, verifier, check, hooks
        self.block = int(worker.block_size)
        self.device = worker.device
        self.graphs: dict[int, RoundGraphs] = {}  # budget -> its plan / commit graphs
        self.stats: StatsQueue | None = None  # the DDTREE lines' queue (set once the worker's MetricsLog exists)
        self.rank = lm_head(worker).rank  # rank 0 of a tensor-parallel group writes the DDTREE lines

    def run(
        self,
        batch: Any,
        on_publish: Any,
        budget: int,
        smaller: Sequence[int] | None = None,
        grammar_barrier: Any = None,
    ) -> tuple[Any, Tensor | None]:
        """One tree round of `budget` nodes of a greedy decode batch. Device-to-host syncs of the round's own
        code (SGLang's forwards may add theirs), at most 2: in `plan`, the prefix-length sum that sizes
        FULL_MASK when the batch has no host copy of seq_lens; in `StatsQueue.push`, the statistics read on a
        round that completes a DDTREE log line (the first round, then once per DDTREE_LOG_INTERVAL
        request-rounds). -> (SGLang's result, [bs, 2 + len(smaller)] `round_accepts` on the device, None
        without `smaller`: the policy is off)."""
        draft_input = batch.spec_info
        if not isinstance(draft_input, DFlashDraftInputV2):
            raise RuntimeError("DDTREE expected DFlashDraftInputV2 state on the running batch")
        t0 = time.perf_counter()
        draft = self.draft(batch, draft_input)
        t1 = time.perf_counter()
        planned = self.plan(batch, draft_input, draft, budget)
        t2 = time.perf_counter()
        verified = self.verifier.verify(batch, draft_input, planned, self.check.due(), grammar_barrier)
        t3 = time.perf_counter()
        commit, kept, new_seq_lens = self.commit(batch, draft_input, draft, planned, verified, on_publish)
        self.hooks.committed(batch, planned.plan, commit)
        t4 = time.perf_counter()

        ms = {"draft": (t1 - t0) * 1e3, "build": (t2 - t1) * 1e3, "verify": (t3 - t2) * 1e3}
        ms["commit"] = (t4 - t3) * 1e3
        if self.stats is None:
            raise RuntimeError("DDTREE: a decode round before init_cuda_graphs (SGLang's start-up order changed)")
        if batch.return_logprob:  # the committed tokens' log-probs, from the rows of the path that chose them
            compute_spec_logprobs(batch, kept.logits_output, kept.predict, accept_index=kept.state_index)
        if self.rank == 0:  # sync 2, on a round that completes a line
            self.stats.push(stats_tensor(planned.plan, commit), ms)
        block = self.block
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

    def kv_window(self, batch: Any, draft_input: Any, prefix_lens: Tensor, width: int) -> KVWindow:
        """The first `width` KV slots SGLang reserved after each request's prefix, and their KV-location plan."""
        w = self.worker
        positions = prefix_lens.to(torch.int64).unsqueeze(1) + torch.arange(
            width, device=self.device, dtype=torch.int64
        )  # [bs, W]
        req_to_token = w.model_runner.req_to_token_pool.req_to_token
        locs = req_to_token[batch.req_pool_indices.to(torch.int64).unsqueeze(1), positions].to(torch.int64)
        plan = w.target_worker.model_runner.kv_index_translator.plan(
            req_pool_indices=batch.req_pool_indices,
            seq_lens=prefix_lens,
            seq_lens_cpu=batch.seq_lens_cpu if batch.seq_lens_cpu is not None else draft_input.nxt_kv_lens_cpu,
            write_virtual=locs.reshape(-1),
            read_extent=width,
        )
        return KVWindow(positions=positions, locs=locs, plan=plan)

    def draft(self, batch: Any, draft_input: Any) -> DraftBlock:
        """Step 1. DFLASH's draft block (the bonus token, then B - 1 mask tokens) through the drafter in the
        first B reserved slots, as DFLASH's eager path runs it; the drafter's hidden states at depths 1..B-1."""
        w = self.worker
        bs, block, device = len(batch.seq_lens), self.block, self.device
        prefix_lens = batch.seq_lens
        window = self.kv_window(batch, draft_input, prefix_lens, block)
        block_ids = torch.full((bs, block), int(w._mask_token_id), dtype=torch.int64, device=device)
        block_ids[:, 0].copy_(draft_input.bonus_tokens)
        target_model = w.target_worker.model_runner.model
        embed_module = dw.unwrap_lora_layer(dw._resolve_dflash_embedding_module(w.draft_model, target_model))
        if w._full_embed_gpu is not None:
            noise = torch.nn.functional.embedding(block_ids, w._full_embed_gpu)
        else:
            noise = embed_module(block_ids)
        if w._noise_embed_scale != 1.0:
            noise = noise * w._noise_embed_scale
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
            spec_info=w._draft_block_spec_info,
            capture_hidden_mode=CaptureHiddenMode.NULL,
            num_token_non_padded=(
                torch.full((), bs * block, dtype=torch.int32, device=device)
                if dw.enable_num_token_non_padded()
                else None
            ),
            global_num_token_non_padded_cpu=bs * block,
            can_run_decode_cuda_graph=batch.can_run_decode_cuda_graph,
        )
        window.plan.bind(draft_batch, w.draft_model_runner.kv_index_translator)
        with torch.inference_mode(), dw.draft_tp_context(w.draft_parallel_layout):
            draft_out = w.draft_model_runner.forward(draft_batch)
        hidden = draft_out.logits_output.hidden_states
        if hidden is None:
            raise RuntimeError("DFLASH draft model returned no hidden states")
        return DraftBlock(prefix_lens=prefix_lens, window=window, hidden=hidden.view(bs, block, -1)[:, 1:, :])

    def plan(self, batch: Any, draft_input: Any, draft: DraftBlock, budget: int) -> PlannedRound:
        """Step 2. The target's LM head on the drafter's hidden states gives log-probs [bs, B - 1, V]; every
        request's tree of `budget` nodes (the configured one, or the policy's smaller one: the same best-first
        tree cut, padded), in SGLang's layout and S slots, with FULL_MASK and the verify's KV window. The
        hooks' `planning` sees (and a benchmark's replay rewrites) the scores the trees are planned from."""
        head, config = lm_head(self.worker), self.config
        slots, prefix_lens = verify_slots(budget, self.block), draft.prefix_lens
        bs = int(prefix_lens.shape[0])
        window = draft.window  # a tree that fits the draft block's window, or twice as wide
        if slots != self.block:
            window = self.kv_window(batch, draft_input, prefix_lens, slots)
        graphed = False
        if head.tp_size > 1:  # a vocab-parallel head: each rank's top-k, gathered (the same trees everywhere)
            vals, ids = head_topk(draft.hidden, head, config.topk)  # [bs, B - 1, k]
            vals = self.hooks.planning(batch, vals, gathered=True)
            plan = plan_batch_topk(vals, ids, draft_input.bonus_tokens, prefix_lens, slots, budget)
        else:
            with torch.inference_mode():
                # one [bs * (B - 1), H] GEMM: draft.hidden is a strided view, and a 3-D matmul on it becomes a
                # batched GEMM that reads the whole head once per request (H200, 27B shape, bs 32: 20.6 ms
                # instead of ~2; dev/sglang_gpu/cost_bench.py)
                flat = draft.hidden.reshape(-1, draft.hidden.shape[-1]).to(head.weight.dtype)
                logits = (flat @ head.weight.T).view(bs, draft.hidden.shape[1], -1)  # [bs, B - 1, V]
                logprobs = self.hooks.planning(batch, torch.log_softmax(logits.float(), dim=-1), gathered=False)
            graphs = self.round_graphs(budget)
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

    def round_graphs(self, budget: int) -> RoundGraphs:
        """The plan / commit graphs of trees of `budget` nodes (one set per budget the policy runs)."""
        graphs = self.graphs.get(budget)
        if graphs is None:
            config = self.config
            slots = verify_slots(budget, self.block)
            graphs = RoundGraphs(slots, budget, config.topk, config.round_graphs_max_bs, fused=config.fused_build)
            self.graphs[budget] = graphs
        return graphs

    def commit(
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
        if planned.graphed:  # the graphs `plan` replayed
            commit = clone_result(self.round_graphs(planned.budget).commit(*args))
        else:
            commit = commit_batch(*args)
        if verified.check:
            kept = self.check.keep_chain(self.verifier, batch, draft_input, draft, planned, verified, commit)
        else:
            kept = self.keep_tree(batch, planned, verified, commit)
        if self.verifier.hybrid:
            commit_mamba_states_after_verify(
                self.worker.target_worker, batch, accept_lens=kept.commit_lens, accept_index=kept.state_index,
                draft_token_num=kept.state_width,
            )  # fmt: skip
        new_seq_lens = draft.prefix_lens + kept.commit_lens.to(draft.prefix_lens.dtype)
        if on_publish is not None:
            on_publish(new_seq_lens)
        self.hidden_to_drafter(draft, kept)
        return commit, kept, new_seq_lens

    def keep_tree(self, batch: Any, planned: PlannedRound, verified: VerifiedRound, commit: BatchCommit) -> KeptRound:
        """The tree's accepted path: req_to_token over the verify window permuted, accepted slots first."""
        bs, slots = commit.perm.shape
        window, req_to_token = planned.window, self.worker.model_runner.req_to_token_pool.req_to_token
        rows = batch.req_pool_indices.to(torch.int64).unsqueeze(1).expand(bs, slots)
        req_to_token[rows, window.positions] = window.locs.gather(1, commit.perm).to(req_to_token.dtype)
        hidden_loc = self.verifier.hidden_loc(window, slots).gather(1, commit.perm)
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

    def hidden_to_drafter(self, draft: DraftBlock, kept: KeptRound) -> None:
        """The kept rows' target hidden states, in path order, into the drafter's KV at prefix_len ..
        prefix_len + tau - 1 (DFLASH's own writer). tau <= B: a tree is at most B - 1 deep."""
        block = self.block
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
        self.worker._append_target_hidden_to_draft_kv_by_loc(
            target_hidden=hidden.reshape(-1, hidden.shape[-1]),
            cache_loc=draft_loc.reshape(-1),
            cache_loc_2d=draft_loc,
            positions=draft.window.positions.reshape(-1),
            commit_lens=kept.commit_lens,
        )
        kept.logits_output.hidden_states = None

    def warm(self, budgets: Iterable[int]) -> None:
        """Every budget the worker can run (the policy's smaller ones too) planned and committed once on the
        GPU before the first request (RoundGraphs.warm): no Triton compile or graph capture mid-request."""
        head = lm_head(self.worker)
        if torch.device(self.device).type != "cuda" or head.tp_size > 1:
            return  # the CPU path compiles nothing; a vocab-parallel head plans from gathered top-k
        budgets = sorted(set(budgets))
        started = time.perf_counter()
        try:
            for budget in budgets:
                graphs = self.round_graphs(budget)
                sizes = [*range(1, graphs.max_batch + 1), graphs.max_batch + 1]  # the graphed ones, one eager
                graphs.warm(sizes, self.block - 1, int(head.weight.shape[0]), torch.device(self.device))
        except Exception as exc:  # a slower first round is better than a server that will not start
            self.graphs.clear()
            logger.warning("DDTREE: planner warm-up failed (%s): each budget compiles on first use", exc)
            return
        if self.rank == 0:
            logger.info(
                "DDTREE: planner warmed for budgets %s in %.2f s", ",".join(map(str, budgets)),
                time.perf_counter() - started,
            )  # fmt: skip
