"""Convert one exported checkpoint to GGUF (float32) with llama.cpp's vendored converter.

``python gguf_convert.py LLAMA_CPP_SOURCE MODEL_DIR OUTFILE [TARGET_DIR]``, run with a Python
that has torch, numpy, safetensors and transformers (the project's .venv). TARGET_DIR is a
head's target (the converter's --target-model-dir: an EAGLE-3 head takes its tokenizer and
depth from there). Three things about the kit's tokenizer need saying to the converter, and
this driver says them without editing its files:

* its pre-tokenizer is recognised by a hash of how a tokenizer splits a test text; the kit's
  one-character tokenizer matches no known hash ("BPE pre-tokenizer was not recognized"), so
  the driver declares it "default" (no pre-tokenizer split: the kit's texts are one word);
* the kit's export has no sentencepiece model (tokenizer.model), and the converter tries one
  first (importing sentencepiece, which need not be installed): the driver answers that try
  with the FileNotFoundError the converter expects when the file is missing;
* llama.cpp's loader wants a `tokenizer.ggml.merges` key for a BPE vocabulary even when there
  are no merges ("cannot find tokenizer merges in model file"), and GGUF cannot store an
  empty list, so the driver writes one inert merge (MERGE) when the converter wrote none;
* GLM-4.5's vocabulary step (`_set_vocab_glm`, for the kit's target with an MTP layer,
  properties/export/glm_mtp.py) looks up GLM's own special tokens ("[gMASK]", "<|user|>", ...),
  which the kit's tokenizer has not: the driver gives it the plain BPE step Qwen3's conversion
  takes (`_set_vocab_gpt2`), so the GGUF's vocabulary is the kit target's.
"""

from __future__ import annotations

import sys
from pathlib import Path

MERGE = "a b"


def main(argv) -> int:
    if len(argv) not in (3, 4):
        print("usage: gguf_convert.py LLAMA_CPP_SOURCE MODEL_DIR OUTFILE [TARGET_DIR]",
              file=sys.stderr)
        return 2
    source, model_dir, outfile = (Path(a) for a in argv[:3])
    target = ["--target-model-dir", argv[3]] if len(argv) == 4 else []
    # run as a script, this folder is sys.path[0], and its engine modules (transformers.py,
    # vllm.py) would shadow the libraries of those names
    here = Path(__file__).resolve().parent
    sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != here]
    sys.path.insert(0, str(source / "gguf-py"))
    sys.path.insert(0, str(source))
    import gguf
    from conversion import base

    base.TextModel.get_vocab_base_pre = lambda self, tokenizer: "default"

    def no_sentencepiece(self, *args, **kwargs):
        raise FileNotFoundError(f"{model_dir / 'tokenizer.model'}: the kit's tokenizer is BPE")

    base.TextModel._set_vocab_sentencepiece = no_sentencepiece
    from conversion import glm
    glm.Glm4MoeModel.set_vocab = base.TextModel._set_vocab_gpt2
    original = gguf.SpecialVocab.add_to_gguf

    def add_to_gguf(self, gw, quiet: bool = False):
        if not self.merges:
            # GGUF has no empty arrays (the writer refuses one), so the key holds one merge of
            # two kit tokens into a string that is no token: it can only act on text prompts,
            # and the kit sends token ids only
            gw.add_token_merges([MERGE])
        return original(self, gw, quiet=quiet)

    gguf.SpecialVocab.add_to_gguf = add_to_gguf
    sys.argv = ["convert_hf_to_gguf.py", str(model_dir), "--outtype", "f32", "--outfile",
                str(outfile)] + target
    import runpy
    runpy.run_path(str(source / "convert_hf_to_gguf.py"), run_name="__main__")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
