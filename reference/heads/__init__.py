"""Feature-level draft heads: small networks that draft from the target's own hidden states.

    EagleHead    EAGLE (Li et al., 2024): fc([embedding, feature]) -> one decoder layer ->
                 the target's final norm and lm_head; chained on its own outputs
    Eagle3Head   EAGLE-3 (Li et al., 2025): fc(low, middle, high features) -> one decoder layer
                 over [embedding, hidden] -> its own norm and lm_head, optional draft vocabulary
    MedusaHeads  Medusa (Cai et al., 2024): head i predicts the token i + 1 places ahead of the
                 feature's position, from that one feature; not chained
    MTPLayer     one multi-token-prediction layer (DeepSeek-V3, MiMo): proj([norm(embedding),
                 norm(feature)]) -> one block -> the target's final norm and lm_head; chained
    DFlashHead   DFlash (block diffusion): norm(fc(features)) as keys and values of context,
                 one non-causal pass over [newest token, masks] gives all k proposals at once
    DSparkHead   DSpark: DFlash over an anchor-first block (every row read) plus a Markov bias
                 of the token before each row, chained by argmax

Each head says which hidden states it reads (`head.hidden`, a reference.hidden.HiddenStates);
reference.heads.proposer turns a head into a proposer for speculative_generate, fed with the
hidden states of the tokens the target has verified, from the target's own verify forwards.

The layout every chained head uses (EAGLE, EAGLE-3, MTP): the pair (f_j, t_{j+1}) -- the
target's feature at position j and the token after it -- sits at position j. The head's output
there is its guess of the target's feature at j + 1, which the head's lm_head turns into a law
for t_{j+2}. Chained heads are decoders with a one-layer KV cache of their own, holding only
pairs built from features the target verified.
"""

from reference.heads.dflash import DFlashHead
from reference.heads.dspark import DSparkHead
from reference.heads.eagle import EagleHead
from reference.heads.eagle3 import Eagle3Head
from reference.heads.medusa import MedusaHeads
from reference.heads.mtp import MTPLayer

HEADS = (EagleHead, Eagle3Head, MedusaHeads, MTPLayer, DFlashHead)
# a subclass before its base: save_head names a head by the first kind it is an instance of
KINDS = {"eagle": EagleHead, "eagle3": Eagle3Head, "medusa": MedusaHeads, "mtp": MTPLayer,
         "dspark": DSparkHead, "dflash": DFlashHead}


def is_head(draft) -> bool:
    return isinstance(draft, HEADS)
