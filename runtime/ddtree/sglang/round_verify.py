"""The tree round's verify step (`ddtree.sglang.round_runner` runs it): one target forward over every request's
tree (TARGET_VERIFY, the FULL_MASK custom mask), each node's choice (argmax, or the request's logit rules and
SGLang's sampler: `ddtree.sglang.request_kinds`), and SGLang's `verify_tree_greedy` walk over those choices; and
DFLASH's own causal verify of a chain (a self-check round's re-verify, `ddtree.sglang.selfcheck`).

On an exact hybrid target SGLang's GDN backend reads the tree's links whenever it builds its metadata, so its
top-k is raised for the tree verify only (DFLASH's own rounds stay chains).

This module imports sglang."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import torch
from sglang.kernels.ops.speculative.spec_tree import verify_tree_greedy_func
from sglang.srt.model_executor.forward_batch_info import CaptureHiddenMode
from sglang.srt.speculative.dflash_info import DFlashVerifyInput
from sglang.srt.speculative.spec_utils import GrammarTree, build_grammar_vocab_mask
from torch import Tensor

from ddtree.acceptance import chain_layout
from ddtree.sglang.batch_round import BatchPlan
from ddtree.sglang.bench_hooks import RoundHooks
from ddtree.sglang.penalty_counts import OutputCounts
from ddtree.sglang.request_kinds import baseline_penalty_order, node_choices, rules_of_batch
from ddtree.sglang.selfcheck import AcceptedStates, accepted_states
from ddtree.sglang.tree_round import KVWindow, PlannedRound, VerifiedRound


class TreeVerifier:
    """The verify forwards of one worker (`worker`: the DFlashWorkerV2 whose target and pools it uses)."""

    def __init__(self, worker: Any, topk: int, hybrid: bool, hooks: RoundHooks) -> None:
        self.worker, self.topk, self.hybrid, self.hooks = worker, topk, hybrid, hooks
        self.block = int(worker.block_size)
        self.device = worker.device
        self.linear: Any = None  # a hybrid target's linear-attention backend (set at init_attention_backends)
        self.exact_hybrid = False  # the GDN backend runs its tree path for our verifies (set at init_cuda_graphs)
        self.penalty_order = baseline_penalty_order()  # the penalties' order the baseline applies
        self.output_counts: OutputCounts | None = None  # the penalties' counts, kept across rounds (first use)

    def verify(
        self, batch: Any, draft_input: Any, planned: PlannedRound, check: bool, grammar_barrier: Any = None
    ) -> VerifiedRound:
        """One target forward (TARGET_VERIFY) over every tree, writing the verify window's KV; SGLang's
        verify_tree_greedy walks the target's choices (argmax, or each request's rules and sampler) over the tree
        links. A grammar-constrained request's nodes are masked first, each by its grammar after its path."""
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
        conv_snapshot = self.snapshot_conv_states(batch) if check and self.hybrid else None
        verify_input = DFlashVerifyInput(
            draft_token=plan.tokens.reshape(-1),
            positions=plan.positions,
            draft_token_num=slots,
            custom_mask=planned.custom_mask,
            capture_hidden_mode=CaptureHiddenMode.FULL,
            kv_loc_plan=planned.window.plan,
        )
        batch.out_cache_loc = planned.window.locs.reshape(-1)
        with self.verify_seq_lens(batch, draft_input, slots):
            output = self.tree_forward(verify_input, plan, batch)
        logits_output, target_lp = output.logits_output, self.worker._target_logits_processor
        if target_lp is not None and target_lp.is_deferred_shard(logits_output.next_token_logits):
            target_predict = target_lp.deferred_argmax(logits_output.next_token_logits)
            logits_output.next_token_logits = None
        else:
            logits = logits_output.next_token_logits
            if grammar_tree is not None:
                self.grammar_mask(batch, grammar_tree, logits, grammar_barrier)
            choices = self.choices(batch, logits, plan.tokens, plan.tree_mask, plan.depths, plan.positions)
            target_predict = torch.argmax(logits, dim=-1) if choices is None else choices
        target_predict = self.hooks.steer(plan, target_predict.view(bs, slots))
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
            topk=self.topk,
        )
        return VerifiedRound(output, target_predict, accept_index, accept_num, check, conv_snapshot)

    def chain_verify(
        self, batch: Any, draft_input: Any, tokens: Tensor, window: KVWindow
    ) -> tuple[Any, Tensor, Tensor]:
        """DFLASH's own verify (causal, chain metadata) of `tokens` [bs, B] in the draft window; returns the
        logits output, the target's logits [bs, B, V] and its choices [bs, B]."""
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
        with self.verify_seq_lens(batch, draft_input, width):
            verify_batch, _ = verify_input.prepare_for_verify(batch, self.worker.target_worker)
            out = self.target_forward(verify_batch).logits_output
        if batch.has_grammar:  # the FSMs were advanced before the tree's masks: no barrier here
            self.grammar_mask(batch, GrammarTree.from_linear_chain(tokens), out.next_token_logits, None)
        logits = out.next_token_logits.view(bs, width, -1)
        mask, depths = chain_layout(width, bs, tokens.device)
        flat = out.next_token_logits.view(bs * width, -1)
        choices = self.choices(batch, flat, tokens, mask, depths, window.positions.reshape(-1))
        return out, logits, torch.argmax(logits, dim=-1) if choices is None else choices

    def choices(
        self, batch: Any, logits: Tensor, tokens: Tensor, tree_mask: Tensor, depths: Tensor, positions: Tensor
    ) -> Tensor | None:
        """[bs, S] each node's choice under the batch's sampling and logit rules (request_kinds.node_choices);
        None for a plain greedy batch (the caller's argmax)."""
        info = batch.sampling_info
        if self.output_counts is None:
            self.output_counts = OutputCounts(int(logits.shape[-1]), logits.device)
        rules = rules_of_batch(batch, int(logits.shape[-1]), logits.device, self.output_counts)  # None: no rule
        if (info is None or info.is_all_greedy) and rules is None:
            return None
        sampler = self.worker.target_worker.model_runner.sampler
        order = self.penalty_order
        choices, rows = node_choices(batch, logits, tokens, tree_mask, depths, positions, sampler, rules, order)
        if batch.return_logprob and rules is not None:  # the log-probs read the rows the choices came from
            logits.copy_(rows.reshape(logits.shape))
        return choices

    @staticmethod
    def grammar_mask(batch: Any, tree: Any, logits: Tensor, barrier: Any) -> None:
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

    def tree_forward(self, verify_input: Any, plan: BatchPlan, batch: Any) -> Any:
        """Prepare and run the verify forward. On an exact hybrid target SGLang's GDN backend reads the tree
        links whenever it builds its metadata (in prepare_for_verify, and again inside the forward), so its
        top-k is raised for this verify only: DFLASH's own rounds (prefill, sampling batches) stay chains."""
        target = self.worker.target_worker
        if not self.exact_hybrid:
            verify_batch, _ = verify_input.prepare_for_verify(batch, target)
            return self.target_forward(verify_batch)
        verify_input.retrieve_next_token = plan.retrieve_next_token
        verify_input.retrieve_next_sibling = plan.retrieve_next_sibling
        linear, topk = self.linear, self.linear.topk
        linear.topk = max(2, int(topk))
        try:
            verify_batch, _ = verify_input.prepare_for_verify(batch, target)
            target_out = self.target_forward(verify_batch)
        finally:
            linear.topk = topk
        if getattr(linear.forward_metadata, "retrieve_parent_token", None) is None:
            raise RuntimeError("DDTREE: SGLang's GDN backend did not take its tree path for the verify")
        return target_out

    @contextlib.contextmanager
    def verify_seq_lens(self, batch: Any, draft_input: Any, width: int) -> Iterator[None]:
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

    def target_forward(self, verify_batch: Any) -> Any:
        return self.worker.target_worker.forward_batch_generation(
            batch=None, forward_batch=verify_batch, is_verify=True, skip_attn_backend_init=True
        )

    def snapshot_conv_states(self, batch: Any) -> list[tuple[Tensor, Tensor, Tensor]]:
        """(conv state tensor [L, slots, ...], the batch's rows, a copy of them) per conv type."""
        pool = self.worker.target_worker.model_runner.req_to_token_pool
        rows = self.linear._translate_mamba_indices(pool.get_mamba_indices(batch.req_pool_indices))
        rows = rows.to(torch.int64)
        return [(conv, rows, conv[:, rows].clone()) for conv in pool.mamba_pool.mamba_cache.conv]

    def verify_states(self, steps: Tensor) -> AcceptedStates:
        """The verify's per-step conv windows and recurrent-state norms at `steps` [bs] (hybrid targets)."""
        caches = self.worker.target_worker.model_runner.req_to_token_pool.mamba_pool.mamba_cache
        return accepted_states(list(caches.intermediate_conv_window), caches.intermediate_ssm, steps)

    def hidden_loc(self, window: KVWindow, width: int) -> Tensor:
        """[bs, width] int64: the drafter's KV locations of the window's first `width` slots."""
        bs = int(window.positions.shape[0])
        ids: Tensor = self.worker._draft_write_ids(window.plan)
        return ids.view(bs, width).to(torch.int64)
