"""The kit's scripted drafts inside vLLM: proposer classes for its `custom_class` method
(`--speculative-config '{"method": "custom_class", "model":
"properties.engines.vllm_scripted.Right", "num_speculative_tokens": 4}'`, the repository root
on PYTHONPATH: properties/engines/vllm.py sets it).

vLLM 0.32.0 (vllm/v1/spec_decode/custom_class_proposer.py, create_custom_proposer) imports the
class, instantiates it with the VllmConfig and calls, after each step's bookkeeping
(vllm/v1/worker/gpu_model_runner.py, propose_draft_token_ids, method "custom_class"):

    propose(sampled_token_ids, num_tokens_no_spec, token_ids_cpu, slot_mappings=None)
        sampled_token_ids   list[list[int]], per request of the batch the tokens this step
                            committed (empty: the request is not drafted for this step)
        num_tokens_no_spec  per request, the length of its committed sequence
        token_ids_cpu       [max_num_reqs, max_model_len]: the committed sequences (prompt and
                            output, the newest sampled tokens included)
    -> list[list[int]], per request its proposals (empty: none)

as the n-gram proposer is called. A proposer sees the sequence, not the request, so the
script is the class: Right, Wrong, RightThenWrong (properties/scripted.py). Their proposals
are the script's from the target rebuilt in float64 from the kit's seeds, exactly what the
kit's oracle replays.
"""

from __future__ import annotations

from properties import scripted


class Scripted:
    script = "right"

    def __init__(self, vllm_config=None):
        spec = getattr(vllm_config, "speculative_config", None)
        self.k = int(getattr(spec, "num_speculative_tokens", 4) or 4)

    def load_model(self, *args, **kwargs):   # nothing to load (as the n-gram proposer)
        pass

    def propose(self, sampled_token_ids, num_tokens_no_spec, token_ids_cpu,
                slot_mappings=None, **kwargs) -> list[list[int]]:
        out = []
        for i, sampled in enumerate(sampled_token_ids):
            if not sampled:
                out.append([])
                continue
            n = int(num_tokens_no_spec[i])
            context = [int(t) for t in token_ids_cpu[i, :n]]
            out.append(scripted.propose(self.script, context, self.k))
        return out


class Right(Scripted):
    script = "right"


class Wrong(Scripted):
    script = "wrong"


class RightThenWrong(Scripted):
    script = "right-then-wrong"


CLASSES = {"right": Right, "wrong": Wrong, "right-then-wrong": RightThenWrong}
