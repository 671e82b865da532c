"""DFlash (block-diffusion drafting): a round's k proposals from one forward of a small decoder
over a block [newest token, mask, mask, ...], every block position attending to the context
features of the verified tokens and to each other (non-causal).

The convention, as both engines compute it (read from their source; file:line of the vendored
llama.cpp under .engines/llamacpp/src and of vLLM 0.32.0's package under
.engines/vllm/lib/python3.11/site-packages/vllm):

1. Which target hidden states. `dflash_config.target_layer_ids` names target layers whose
   *output* (the residual stream after the layer) is read, concatenated in the order given:
   llama.cpp's converter writes `target_layers = [i + 1 for i in target_layer_ids]`
   (conversion/qwen.py:735-738) and the driver turns on `llama_set_embeddings_layer_inp(ctx_tgt,
   i + 1)` (common/speculative.cpp:1056-1059), the input of layer i + 1 (`res->t_layer_inp[il] =
   inpL`, src/models/qwen3.cpp:72); vLLM adds 1 likewise, "to convert DFlash's aux layer id
   semantics" to its aux-hidden-state ids, which are layer inputs
   (v1/worker/gpu/spec_decode/eagle/eagle3_utils.py:108-111). In reference.hidden terms:
   HiddenStates(target_layer_ids, "output"), un-normed.
   (llama.cpp's Qwen3 graph records layer inputs for il < N only, so an id of N - 1, the last
   layer's output, has no tensor there; the kit's served heads read layers below it.)
2. Context features, fused once per token: c_j = hidden_norm(fc(f_j)), an fc [nH -> H] without
   bias, then an RMSNorm of the head's own (llama.cpp: `fc` then `output_norm_enc`,
   src/models/dflash.cpp:619-620; vLLM: combine_hidden_states runs the fc,
   model_executor/models/qwen3_dflash.py:864-884, and _project_context_kv the hidden_norm,
   :599-614). c_j is never a query and never passes through the layers' input_layernorm: for
   every draft layer l it gives only that layer's context key and value at position j,
   k = k_norm_l(k_proj_l(c_j)) rotated to position j, v = v_proj_l(c_j) (dflash.cpp:623-668;
   qwen3_dflash.py:651-726, the same c_j for every layer).
3. The block. The round whose newest token t_n sits at position n (the bonus or correction
   token of the last verify, or the first generated token) drafts from the block
   [t_n, m, m, ..., m] at positions n, n + 1, ..., n + B - 1, m = `mask_token_id`, embedded by the
   target's embedding (llama.cpp: `batch.add(i == 0 ? dp.id_last : mask_token_id, n + i, ...)`,
   common/speculative.cpp:1201-1210, dp.pos0 = the slot's next position,
   tools/server/server-context.cpp:3010; vLLM: "one bonus query followed by K mask queries",
   config/speculative.py:1909-1911, v1/spec_decode/dflash.py:126). B = k + 1 in both:
   llama.cpp decodes n_max + 1 tokens (n_max = --spec-draft-n-max, clamped to the trained
   block_size - 1, speculative.cpp:1014-1023, 1203-1205) and cuts the result to the round's cap
   afterwards (speculative.cpp:2832-2835); vLLM 1 + num_speculative_tokens.
4. The layers: Qwen3 decoder layers over the block, x = x + o_proj(attn(input_layernorm(x))),
   x = x + mlp(post_attention_layernorm(x)); queries and block keys get q_norm / k_norm and RoPE
   (NeoX, half-split, llama-model.cpp:3179-3185; vLLM is_neox_style) at their positions
   (dflash.cpp:703-792; qwen3_dflash.py:294-321, 390-410), scale 1/sqrt(head_dim).
   Attention is non-causal: every block position attends to every context position j < n and
   to every block position (llama.cpp: `llama_set_causal_attn(ctx_dft, false)` unless the GGUF
   says causal, speculative.cpp:1063, dflash.cpp:737; vLLM: `use_non_causal` on the draft's
   attention config and causal=False metadata, v1/spec_decode/dflash.py:91-104, 208, 300-311).
   Then the head's own final norm (`norm`; llama.cpp output_norm, dflash.cpp:797).
5. The k proposals: the logits at block positions 1 .. k (the masks) -- position n + i gives the
   law of t_{n+i}, read in place; the newest token's own row is not used (llama.cpp "greedily
   read the predicted block at this sequence's noise positions 1..n_block_tokens-1", the
   draft sampler's top candidate, speculative.cpp:1296-1317; vLLM token_indices_to_sample = the
   mask positions, v1/spec_decode/dflash.py:136-140). All k come from this one forward: no proposal reads
   another.
6. Vocabulary and head: the target's embedding and lm_head unless the checkpoint ships its own
   (llama.cpp takes the target's tok_embd / output through ctx_other when the draft has none,
   dflash.cpp:677-684, 802-811, and an `output` tensor of its own when it has one, :167-171;
   vLLM shares the target's when the checkpoint has none, v1/spec_decode/llm_base_proposer.py
   _maybe_share_embeddings / _maybe_share_lm_head). Here: `own_lm_head=False` borrows the
   target's lm_head; True gives the head one of its own (the kit's served heads, fitted).
7. Context across rounds: both engines keep the context keys and values in the draft's KV
   cache -- written for every token of every target forward (llama.cpp process(),
   speculative.cpp:1098-1181; vLLM precompute_and_store_context_kv at the target positions) and
   cut back to the committed tokens (llama.cpp: seq_rm of the block before the verify,
   server-context.cpp:3044, and of the rejected positions after it, :3979, on the draft's
   memory too; vLLM: seq_lens minus the rejected tokens, v1/spec_decode/dflash.py:182-186). Each entry is a
   function of one verified token's features alone, so this reference recomputes the context
   keys and values from the verified features every round: the same numbers, no cache to roll
   back. The block itself is never kept.

Like the other heads, a round proposes nothing when no token is verified yet (a one-token
prompt's first round in speculative_generate).
"""

import math

import torch
import torch.nn as nn

from reference.heads.base import share_target, one_layer
from reference.heads.verified import Verified
from reference.hidden import HiddenStates
from reference.model import MLP, Attention, RMSNorm, rotate


def default_hidden(num_layers: int) -> HiddenStates:
    """One middle layer's output, (N - 1) // 2 of an N-layer target: never the last layer,
    whose output llama.cpp's Qwen3 graph does not record (see 1. above)."""
    if not isinstance(num_layers, int) or num_layers < 1:
        raise ValueError(f"default_hidden: num_layers must be an int >= 1, got {num_layers!r}")
    return HiddenStates(((num_layers - 1) // 2,), "output")


class DFlashLayer(nn.Module):
    """A Qwen3 decoder layer whose attention reads the block (queries, keys, values) and the
    fused context (keys and values only), without a mask."""

    def __init__(self, config):
        super().__init__()
        c = config
        self.config = c
        self.input_layernorm = RMSNorm(c.hidden_size, c.rms_norm_eps)
        self.self_attn = Attention(c, 0)    # q/k/v/o_proj, q_norm, k_norm: Qwen3's names
        self.post_attention_layernorm = RMSNorm(c.hidden_size, c.rms_norm_eps)
        self.mlp = MLP(c)

    def heads(self, x, proj, norm, count):
        """x [B, T, H] -> [B, count, T, head_dim] through a projection (and a per-head norm)."""
        B, T, _ = x.shape
        y = proj(x).view(B, T, count, self.config.head_dim)
        return (y if norm is None else norm(y)).transpose(1, 2)

    def forward(self, x, context, block_positions, context_positions, mask=None):
        """x [B, T, H] the block's residual stream, context [B, n, H] the fused features c_j;
        positions [B, T] and [B, n]. -> the block's stream after this layer [B, T, H].
        mask: None (a round: every query sees every key), or [T, n + T] bool, what each query
        may see, for training many blocks of one window in one pass (reference/train_dflash.py)."""
        c, a = self.config, self.self_attn
        h = self.input_layernorm(x)
        q = rotate(self.heads(h, a.q_proj, a.q_norm, c.num_attention_heads), block_positions,
                   c.rope_theta)
        k = rotate(self.heads(h, a.k_proj, a.k_norm, c.num_key_value_heads), block_positions,
                   c.rope_theta)
        v = self.heads(h, a.v_proj, None, c.num_key_value_heads)
        if context.shape[1] > 0:
            k_ctx = rotate(self.heads(context, a.k_proj, a.k_norm, c.num_key_value_heads),
                           context_positions, c.rope_theta)
            v_ctx = self.heads(context, a.v_proj, None, c.num_key_value_heads)
            k, v = torch.cat([k_ctx, k], dim=2), torch.cat([v_ctx, v], dim=2)  # context first
        groups = c.num_attention_heads // c.num_key_value_heads
        k, v = k.repeat_interleave(groups, 1), v.repeat_interleave(groups, 1)
        # a round: every query sees every key, no mask at all
        scores = q @ k.transpose(-1, -2) / math.sqrt(c.head_dim)
        if mask is not None:
            scores = scores.masked_fill(~mask, float("-inf"))
        weights = torch.softmax(scores, dim=-1)
        y = (weights @ v).transpose(1, 2).reshape(x.shape[0], x.shape[1], -1)   # [B, T, nh*D]
        x = x + a.o_proj(y)
        return x + self.mlp(self.post_attention_layernorm(x))


class DFlashHead(nn.Module):
    # the block row whose output is the first proposal's law: DFlash reads the masks (rows 1 ..),
    # DSpark (reference/heads/dspark.py) every row from the newest token's own (row 0)
    first_row = 1

    def __init__(self, target, hidden: HiddenStates | None = None, block_size: int = 5,
                 mask_token_id: int | None = None, num_layers: int = 1,
                 own_lm_head: bool = False):
        """target: the Qwen3 it drafts for (its embedding, and its lm_head unless own_lm_head,
        are borrowed, never copied). hidden: the target layers' outputs it reads (default
        default_hidden). block_size: B, the block's tokens (the newest and B - 1 masks), so at
        most B - 1 proposals a round. mask_token_id: the id whose embedding fills the masks
        (default: the last id of the vocabulary). num_layers: the head's decoder layers."""
        super().__init__()
        c = target.config
        V = c.vocab_size
        if not isinstance(block_size, int) or isinstance(block_size, bool) or block_size < 2:
            raise ValueError(f"DFlashHead: block_size must be an int >= 2 (the newest token and "
                             f"at least one mask), got {block_size!r}")
        if mask_token_id is None:
            mask_token_id = V - 1
        if (not isinstance(mask_token_id, int) or isinstance(mask_token_id, bool)
                or not 0 <= mask_token_id < V):
            raise ValueError(f"DFlashHead: mask_token_id must be a token id in [0, {V}), got "
                             f"{mask_token_id!r}")
        if not isinstance(num_layers, int) or isinstance(num_layers, bool) or num_layers < 1:
            raise ValueError(f"DFlashHead: num_layers must be an int >= 1, got {num_layers!r}")
        if not isinstance(own_lm_head, bool):
            raise ValueError(f"DFlashHead: own_lm_head must be a bool, got {own_lm_head!r}")
        self.hidden = default_hidden(c.num_hidden_layers) if hidden is None else hidden
        if not isinstance(self.hidden, HiddenStates) or self.hidden.where != "output" \
                or self.hidden.normed:
            raise ValueError(f"DFlashHead: hidden must be a HiddenStates of un-normed layer "
                             f"outputs (DFlash's target_layer_ids), got {hidden!r}")
        self.hidden.indices(c.num_hidden_layers)
        self.block_size, self.mask_token_id = block_size, mask_token_id
        self.own_lm_head = own_lm_head
        self.config = one_layer(c)     # the target's shapes; num_layers decoder layers below
        H = c.hidden_size
        self.fc = nn.Linear(self.hidden.width(H), H, bias=False)
        self.hidden_norm = RMSNorm(H, c.rms_norm_eps)
        self.layers = nn.ModuleList(DFlashLayer(self.config) for _ in range(num_layers))
        self.norm = RMSNorm(H, c.rms_norm_eps)
        if own_lm_head:
            self.lm_head = nn.Linear(H, V, bias=False)
        share_target(self, target)

    @property
    def draft_to_target(self):
        return None

    @property
    def max_proposals(self) -> int:
        return self.block_size - self.first_row

    def readout(self):
        """The linear map from the final norm's output to the logits: the head's own lm_head,
        or the target's."""
        return self.lm_head if self.own_lm_head else self.target.lm_head

    def forward(self, features, newest):
        """features [B, n, width]: the target's features f_0 .. f_{n-1} of the verified tokens
        (positions 0 .. n - 1; n may be 0); newest [B]: the token t_n at position n. -> logits
        [B, block_size - 1, V]: row i - 1 is the law of t_{n+i}, i = 1 .. block_size - 1."""
        return self.readout()(self.states(features, newest))

    def states(self, features, newest):
        """The final norm's output at the rows read (the masks), [B, max_proposals, H]: what
        the readout (lm_head) turns into the logits of forward."""
        width = self.hidden.width(self.config.hidden_size)
        if not torch.is_tensor(features) or features.dim() != 3 or features.shape[-1] != width:
            raise ValueError(f"DFlashHead: features must be [batch, tokens, {width}] "
                             f"({self.hidden.describe()}), got "
                             f"{tuple(getattr(features, 'shape', ())) or type(features).__name__}")
        newest = torch.as_tensor(newest, device=features.device)
        V = self.config.vocab_size
        if newest.dim() != 1 or newest.shape[0] != features.shape[0] \
                or newest.is_floating_point():
            raise ValueError(f"DFlashHead: newest must be [batch] token ids for features of "
                             f"batch {features.shape[0]}, got {tuple(newest.shape)} "
                             f"{newest.dtype}")
        if newest.numel() and (newest.min() < 0 or newest.max() >= V):
            raise ValueError(f"DFlashHead: newest holds a token id outside [0, {V}): "
                             f"{newest.tolist()}")
        B, n = features.shape[:2]
        T = self.block_size
        device = features.device
        context = self.hidden_norm(self.fc(features))                            # [B, n, H]
        block = torch.full((B, T), self.mask_token_id, dtype=torch.long, device=device)
        block[:, 0] = newest.long()
        x = self.target.model.embed_tokens(block)                                # [B, T, H]
        block_positions = torch.arange(n, n + T, device=device).expand(B, T)
        context_positions = torch.arange(n, device=device).expand(B, n)
        for layer in self.layers:
            x = layer(x, context, block_positions, context_positions)
        return self.norm(x)[:, self.first_row:]                         # [B, max_proposals, H]


class DFlashProposer:
    """A DFlash head as a proposer for speculative_generate (built by head_proposer): the
    verified features as reference.heads.proposer keeps them; each round one forward of the
    head over [newest, masks] gives all of its proposals, the first min(k, block_size - 1)."""

    def __init__(self, head, sampler, device):
        self.verified = Verified(head, sampler, device)
        self.head, self.device = head, device
        self.hidden = head.hidden
        self.forwards = 0            # head forwards run (one per proposing round)

    def saw(self, features):
        self.verified.saw(features)

    def prefill(self, ids):
        self.verified.prefill(ids)

    def propose(self, context, k):
        n = len(context) - 1
        if self.verified.verified(context) == 0:
            return [], []
        features = self.verified.feature_rows(0, n)[None]                        # [1, n, width]
        logits = self.head(features, torch.tensor([context[-1]], device=self.device))[0]
        self.forwards += 1
        proposals, q = [], []
        for i in range(min(k, self.head.max_proposals)):
            token, law = self.verified.choose(logits[i])
            proposals.append(token)
            if law is not None:
                q.append(law)
        return proposals, q

    def commit(self, accepted, proposals):
        self.verified.keep(accepted)
