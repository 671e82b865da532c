"""DSpark (semi-autoregressive block drafting): DFlash (reference/heads/dflash.py) with the
anchor-first block and a Markov head chained across the block. Everything DFlash's docstring
states holds (the hidden states, the fused context c_j as every layer's keys and values, the
non-causal Qwen3 layers, the head's final norm, the context across rounds) apart from these, read
from the vendored llama.cpp under .engines/llamacpp/src and vLLM 0.32.0's package under
.engines/vllm/lib/python3.11/site-packages/vllm:

1. The block is anchor-first: k tokens [t_n, m, ..., m] at positions n .. n + k - 1 (DFlash: k + 1,
   the newest and k masks), and every row is read: row i (position n + i) gives the law of
   t_{n+i+1}, the newest token's own row the first proposal's, "standard next-token". llama.cpp:
   `n_block_tokens = n_draft + (is_dspark && sample_from_anchor ? 0 : 1)` and the proposals
   read from block row `i_draft_beg = 0` (common/speculative.cpp:1205-1209, 1267-1294);
   `n_draft_max = block_size` rather than block_size - 1 (:1014-1023). vLLM:
   `num_query_per_req = num_speculative_steps` "(anchor + N-1 noise), NOT 1 + N ... the anchor
   predicts the first draft token" (v1/worker/gpu/spec_decode/dspark/speculator.py:9-15, 52-55).
   Both take this layout when the config's `sample_from_anchor` is true or absent (llama.cpp's
   converter defaults it to true for DFlash-lineage configs, conversion/qwen.py:878-881, the
   GGUF key `dflash.sample_from_anchor`, speculative.cpp:987-989; vLLM speculator.py:49-51);
   the other layout (1 + N, the anchor a bonus slot) is not modelled here.
2. The Markov head: a vanilla low-rank transition bias. With e = markov_w1[prev] (an embedding
   of the target's vocabulary into rank r) the row's logits are base_i + markov_w2 e (a
   [V x r] projection, no bias): llama.cpp build_dspark_markov_head (src/models/dflash.cpp:
   295-406, called at :849-851: `w1_prev = get_rows(w1, prev)`, `bias = w2 w1_prev`, `col = base_i + bias`); vLLM
   DSparkMarkovHead (model_executor/models/qwen3_dspark.py:48-93, `markov_w1` an nn.Embedding,
   `markov_w2` a ParallelLMHead, the speculator's `logits_i = base_logits[:, i] + bias`,
   speculator.py:177-188). `markov_head_type` must be "vanilla" (conversion/qwen.py:898-899).
3. The chain: prev_0 = t_n, the anchor (llama.cpp: token 0 of the block, dflash.cpp:331-334;
   vLLM: `input_ids[_anchor_idx]`, speculator.py:177), and prev_{i+1} = the token row i drafts.
   llama.cpp takes the argmax of the biased row inside the graph whatever the sampling ("the
   in-graph chain is greedy (argmax)", dflash.cpp:347-348, 384-386) and proposes the draft
   sampler's top candidate of it (speculative.cpp:1280-1293); vLLM feeds the token it samples
   from the row (`prev = draft_sampled_i`, speculator.py:189-190). Under greedy decoding these
   are the same token; this reference follows llama.cpp (the argmax), so a sampled request's
   later laws q_i are llama.cpp's.
4. The head's lm_head: llama.cpp's DSpark converter drops a checkpoint lm_head of the full
   vocabulary (`if self._n_vocab_draft == vocab_size and name.endswith("lm_head.weight"):
   return`, conversion/qwen.py:926-927), so the draft reads through the target's output
   (dflash.cpp:802-811): the served DSpark head borrows the target's lm_head (own_lm_head
   False), and a reduced draft vocabulary (d2t) is not modelled.
5. The optional confidence head (`conf_proj`, a sigmoid of [hidden; markov_w1[prev]]) only
   truncates a round below --spec-draft-p-min in llama.cpp (speculative.cpp:1270-1277, with
   p_min 0 never) and steers vLLM's adaptive verification, which is off by default; it changes
   no proposal, and this head has none (the converter then writes
   `dflash.has_confidence_head` false, qwen.py:911-913).
"""

import torch
import torch.nn as nn

from reference.heads.dflash import DFlashHead
from reference.sampling import greedy_token


class DSparkHead(DFlashHead):
    first_row = 0           # the anchor's own row is the first proposal's (1. above)

    def __init__(self, target, hidden=None, block_size: int = 4, mask_token_id=None,
                 num_layers: int = 1, own_lm_head: bool = False, markov_rank: int = 8):
        """As DFlashHead; block_size is the block's tokens, all read: at most block_size
        proposals a round. markov_rank: r of markov_w1 [V x r] and markov_w2 [r -> V]."""
        super().__init__(target, hidden, block_size=block_size, mask_token_id=mask_token_id,
                         num_layers=num_layers, own_lm_head=own_lm_head)
        if not isinstance(markov_rank, int) or isinstance(markov_rank, bool) or markov_rank < 1:
            raise ValueError(f"DSparkHead: markov_rank must be an int >= 1, got "
                             f"{markov_rank!r}")
        self.markov_rank = markov_rank
        V = self.config.vocab_size
        self.markov_head = nn.Module()      # the engines' names: markov_head.markov_w{1,2}
        self.markov_head.markov_w1 = nn.Embedding(V, markov_rank)
        self.markov_head.markov_w2 = nn.Linear(markov_rank, V, bias=False)

    def markov_bias(self, prev):
        """prev [B] token ids -> the Markov bias [B, V] of the row after them."""
        m = self.markov_head
        return m.markov_w2(m.markov_w1(prev))

    def forward(self, features, newest):
        """As DFlashHead.forward: logits [B, block_size, V], row i the law of t_{n+i+1}: the
        base logits plus the Markov bias of the token before, chained by argmax from t_n."""
        base = super().forward(features, newest)                                 # [B, T, V]
        prev = torch.as_tensor(newest, device=base.device).long()
        rows = []
        for i in range(base.shape[1]):
            rows.append(base[:, i] + self.markov_bias(prev))
            prev = greedy_token(rows[-1])
        return torch.stack(rows, 1)
