"""The batched speculative engine: B prompts of different lengths, one target call per round.

A round, for all rows at once:
1. the drafter proposes k tokens per row (k draft steps of [B, 1], the first maybe [B, 2]);
2. the target scores [last, proposals] as one [B, k+1] block at each row's own offset;
3. verification (greedy or exact rejection sampling) gives each row its accepted count and
   its corrected or bonus token (fast/verify.py);
4. commit applies stop ids and budgets and rolls each row's caches back by setting its length
   (fast/commit.py);
5. ONE host sync reads back which rows finished, whether any row needs the draft's catch-up,
   and the longest row (so eager attention reads only the live prefix of the cache).
Rows that finish are compacted away (their cache rows moved out of the batch) so they stop
costing target compute: exactly in eager mode, down to the next batch bucket with graphs.

Invariant at the top of every round, per active row: the target cache holds exactly the
committed sequence (prompt + output) except its newest token `last`, which neither model has
been fed; the draft cache holds the same, or one entry less when the row accepted all k
proposals last round (then `catch_up` is set and the draft re-feeds [prev, last]).
"""

import torch

from fast import checks
from fast.commit import Rows, commit
from fast.drafter import ModelDrafter
from fast.dynamic import generate_dynamic, is_dynamic
from fast.graphs import StepRunner
from fast.runner import ModelRunner, padded_prompts
from fast.sampling import Sampler, device_generator, same_device
from fast.tree import TreeShape, check_tree, tree_round
from fast.verify import greedy_verify, rejection_sample
from fast.weights import ModelWeights, model_weights, unwrap


def is_drafter(draft) -> bool:
    """A drafter object (fast/drafter.py protocol) rather than a model to draft with."""
    return all(hasattr(draft, name) for name in ("prefill", "propose", "after_round", "compact"))


def graphs_wanted(cuda_graphs, device) -> bool:
    checks.check_cuda_graphs(cuda_graphs)
    on = torch.cuda.is_available() if cuda_graphs is None else cuda_graphs
    return bool(on) and torch.device(device).type == "cuda"


def batch_bucket(n: int, graphs: bool, current: int) -> int:
    """Physical batch for n live rows: exactly n eagerly; with graphs the next power of two
    (each bucket's steps are captured once), never more than the current batch."""
    if not graphs:
        return n
    bucket = 1
    while bucket < n:
        bucket *= 2
    return min(bucket, current)


class FastEngine:
    """A target and a drafter with static caches for up to max_batch rows of max_cache_len."""

    def __init__(self, target, draft, *, max_batch: int, max_cache_len: int, max_k: int = 8,
                 cuda_graphs=None, target_weights: ModelWeights | None = None):
        """target_weights: model_weights(target) when the caller has just built them (fast.api
        does, to check the prompts): building them again fingerprints every parameter of the
        target, ~4 ms a call for the 8-layer weight-bound target, a decode step and a half."""
        sizes = (("max_batch", max_batch), ("max_cache_len", max_cache_len), ("max_k", max_k))
        for name, value in sizes:
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"{name} must be an int >= 1, got {value!r}")
        if target_weights is not None and not isinstance(target_weights, ModelWeights):
            raise ValueError(f"target_weights must be the target's fast.weights.ModelWeights or "
                             f"None, got {type(target_weights).__name__}")
        self.target_weights = (model_weights(target, "target") if target_weights is None
                               else target_weights)
        device = self.target_weights.device
        limit = getattr(unwrap(target).config, "max_position_embeddings", None)
        if limit is not None and max_cache_len > limit:
            raise ValueError(f"max_cache_len={max_cache_len} exceeds the target's "
                             f"max_position_embeddings={limit}")
        self.steps = StepRunner(graphs_wanted(cuda_graphs, device), device)
        self.target = ModelRunner(self.target_weights, max_batch, max_cache_len, self.steps)
        if is_drafter(draft):
            self.drafter = draft
            if hasattr(draft, "bind"):   # a drafter without a model (fast/lookup.py)
                draft.bind(self.target_weights.shape.vocab_size, device)
            if hasattr(draft, "attach"):  # a drafter fed by the target's forwards (fast/head.py)
                draft.attach(self.target_weights, max_batch, max_cache_len)
        else:
            weights = model_weights(draft, "draft")
            if not same_device(weights.device, device):
                raise ValueError(f"draft is on {weights.device} but the target is on {device}")
            self.drafter = ModelDrafter(ModelRunner(weights, max_batch, max_cache_len, self.steps))
        checks.check_pair(self.target_weights, self.drafter.vocab_size)
        self.max_batch, self.capacity, self.max_k = max_batch, max_cache_len, max_k
        # the residual states the drafter reads from the target's own forwards (fast/head.py):
        # the prefill and every verify return them beside the logits, and the drafter `saw`s them
        self.states = getattr(self.drafter, "states", None)

    @property
    def device(self):
        return self.target_weights.device

    @property
    def vocab_size(self) -> int:
        return self.target_weights.shape.vocab_size

    def _start(self, prompts, max_new, width):
        """Prefill both models and build the row state. Returns (rows, out)."""
        B, device = len(prompts), self.device
        padded, lengths = padded_prompts(prompts, device)
        features = self.target.prefill(padded, lengths, self.states)
        self.drafter.prefill(padded, lengths)
        if self.states is not None:
            self.drafter.saw(features)
        rows = Rows(row_ids=torch.arange(B, device=device),
                    last=torch.tensor([p[-1] for p in prompts], device=device),
                    prev=torch.tensor([p[-2] if len(p) > 1 else p[-1] for p in prompts],
                                      device=device),
                    n_out=torch.zeros(B, dtype=torch.long, device=device),
                    max_new=torch.tensor(max_new, device=device),
                    active=torch.tensor([n > 0 for n in max_new], device=device))
        out = torch.zeros(B, max(max_new) + width, dtype=torch.long, device=device)  # [B, width']
        return rows, out

    def _compact(self, rows: Rows, count: int, live: int):
        """Move live rows to the front and shrink the physical batch when a bucket allows."""
        new_count = batch_bucket(live, self.steps.use_graphs, count)
        if new_count == count:
            return rows, count
        # Stable: live rows first, in their current order (no host round trip for the order).
        order = torch.argsort((~rows.active).to(torch.int8), stable=True)
        self.target.cache.compact(order, new_count)
        self.drafter.compact(order, new_count)
        return rows.select(order, new_count), new_count

    @torch.no_grad()
    def generate(self, prompts, max_new_tokens, k: int = 4, temperature: float = 0.0, stop_ids=(),
                 generator=None, *, top_k: int = 0, top_p: float = 1.0):
        """Speculative generation for a batch; see fast.batched_generate."""
        checks.check_k(k, self.max_k)
        prompts, max_new, stops = self._check_batch(prompts, max_new_tokens, stop_ids)
        checks.check_sampling(temperature, top_k, top_p)
        checks.check_generator(generator)
        width = k + 1
        checks.check_room(prompts, max_new, width, self.capacity, "k", k)
        sampler = Sampler(temperature, top_k, top_p, device_generator(generator, self.device),
                          self.device, len(prompts))

        def chain_round(rows, lengths, bound):
            proposals, q = self.drafter.propose(rows, lengths, k, sampler, bound)  # [B', k]
            block_ids = torch.cat([rows.last[:, None], proposals], 1)           # [B', k+1]
            if self.states is None:
                logits = self.target.chain(block_ids, lengths, bound)           # [B', k+1, V]
            else:   # the verify's own features feed the drafter's next round
                logits, features = self.target.chain(block_ids, lengths, bound,
                                                     states=self.states)
                self.drafter.saw(features)
            if sampler.greedy:
                return greedy_verify(logits, proposals)
            u = sampler.uniforms(rows.row_ids, width)                           # [B', k+1]
            return rejection_sample(sampler.probs(logits), q, proposals, u[:, :k], u[:, k])

        return self._loop(prompts, max_new, stops, width, k, chain_round)

    @torch.no_grad()
    def generate_tree(self, prompts, max_new_tokens, tree=(2, 2, 2), stop_ids=(),
                      temperature: float = 0.0, generator=None, *, top_k: int = 0,
                      top_p: float = 1.0):
        """Tree speculation for a batch (fast/tree.py): one target call per round over the
        whole tree. Greedy at temperature 0 (each row is the target's greedy continuation),
        else exact sampling (each row distributed as the target's sampling). Needs a model
        draft: the tree is grown from the draft's distributions. tree="dynamic" or a
        reference.dynamic_tree.DynamicTree: a tree grown per round and row (fast/dynamic.py)."""
        if is_dynamic(tree):
            return generate_dynamic(self, prompts, max_new_tokens, tree, stop_ids, temperature,
                                    generator, top_k=top_k, top_p=top_p)
        if not hasattr(self.drafter, "runner"):
            raise ValueError("draft must be a Qwen3-family model for tree verification, got a "
                             f"{type(self.drafter).__name__} drafter")
        tree = check_tree(tree, self.vocab_size)
        prompts, max_new, stops = self._check_batch(prompts, max_new_tokens, stop_ids)
        checks.check_sampling(temperature, top_k, top_p)
        checks.check_generator(generator)
        shape = TreeShape(tree, self.device)
        checks.check_room(prompts, max_new, shape.size, self.capacity, "tree", tree)
        sampler = Sampler(temperature, top_k, top_p, device_generator(generator, self.device),
                          self.device, len(prompts))
        return self._loop(prompts, max_new, stops, shape.size, shape.depth_max,
                          tree_round(self, shape, sampler))

    def _check_batch(self, prompts, max_new_tokens, stop_ids):
        prompts = checks.check_prompts(prompts, self.vocab_size)
        if len(prompts) > self.max_batch:
            raise ValueError(f"prompts has {len(prompts)} rows, more than this engine's "
                             f"max_batch={self.max_batch}")
        max_new = checks.check_max_new(max_new_tokens, len(prompts))
        stops = checks.check_stop_ids(stop_ids, self.vocab_size)
        return prompts, max_new, stops

    def _loop(self, prompts, max_new, stops, width, depth, one_round):
        """The round loop shared by chain and tree speculation.

        one_round(rows, lengths, bound) -> (accepted [B'], block [B', depth + 1]) proposes,
        verifies, and leaves the accepted entries at slots [length, length + accepted] of both
        caches; this loop commits, rolls back, syncs once and compacts.
        """
        device, B = self.device, len(prompts)
        stop_tensor = torch.tensor(stops, device=device) if stops else None
        rows, out = self._start(prompts, max_new, width)
        rounds_per_row = torch.zeros(B, dtype=torch.long, device=device)
        accepted_per_row = torch.zeros(B, dtype=torch.long, device=device)
        produced = torch.zeros(B, dtype=torch.long, device=device)
        count, live = B, sum(n > 0 for n in max_new)
        longest = max(len(p) for p in prompts) - 1   # host bound on the longest cache length
        rows, count = self._compact(rows, count, live)
        rounds = host_syncs = 0
        while live > 0:
            rounds += 1
            lengths = self.target.cache.lengths[:count]                         # [B']
            accepted, block = one_round(rows, lengths, longest + width)
            was_active = rows.active
            rounds_per_row.index_add_(0, rows.row_ids, was_active.to(torch.long))
            accepted_per_row.index_add_(0, rows.row_ids, torch.where(was_active, accepted, 0))
            rows, new_lengths, take, finished, continuing = commit(
                rows, lengths, accepted, block, stop_tensor, out)
            produced.index_add_(0, rows.row_ids, take)
            self.target.cache.rollback(count, new_lengths)
            catch_up = (continuing & (accepted == depth)).any()
            # The round's one host sync: finished flags, catch-up flag, longest length.
            flags = torch.cat([finished.to(torch.long), catch_up.to(torch.long)[None],
                               new_lengths.max()[None]]).tolist()
            host_syncs += 1
            longest = flags[-1]
            self.drafter.after_round(bool(flags[-2]))
            done = sum(flags[:count])
            if done:
                live -= done
                rows, count = self._compact(rows, count, live)
        # After the loop: read the outputs and per-row counters back.
        lengths_out = produced.tolist()
        table = out.tolist()
        outputs = [table[i][:lengths_out[i]] for i in range(B)]
        return outputs, self._stats(outputs, rounds, depth, rounds_per_row.tolist(),
                                    accepted_per_row.tolist(), host_syncs)

    def _stats(self, outputs, rounds, k, rounds_per_row, accepted_per_row, host_syncs):
        per_row = []
        for tokens, r, a in zip(outputs, rounds_per_row, accepted_per_row):
            per_row.append({"rounds": r, "acceptance_rate": a / (r * k) if r else 0.0,
                            "tokens_per_target_call": len(tokens) / r if r else 0.0})
        row_rounds, accepted = sum(rounds_per_row), sum(accepted_per_row)
        total = sum(len(t) for t in outputs)
        return {
            "rounds": rounds,                       # batched target calls
            "acceptance_rate": accepted / (row_rounds * k) if row_rounds else 0.0,
            "tokens_per_target_call": total / rounds if rounds else 0.0,
            "row_rounds": row_rounds,               # sum over rows of rounds each took part in
            "accepted": accepted,
            "proposed": row_rounds * k,
            "tokens": total,
            "tokens_per_row_round": total / row_rounds if row_rounds else 0.0,
            # Tokens a verify yielded per row-round before stop/budget cuts: 1 + accepted.
            "verified_tokens_per_row_round": 1 + accepted / row_rounds if row_rounds else 0.0,
            "host_syncs": host_syncs,               # inside the round loop: one per round
            "cuda_graphs": self.steps.use_graphs,
            "per_row": per_row,
        }
