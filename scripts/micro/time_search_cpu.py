"""One process's CPU time of beam search on the set-up of bench_search_cpu.py (the 200 first
sentences of test_2016_flickr, words hashed into 8,000 ids, a random tiny model with the eos
logit raised by 4.5, beam 4, batches of 50), for comparing two source trees or the compiled
decoder step.

    python scripts/micro/time_search_cpu.py THREADS MODE [PASSES] [MULTI30K_FOLDER]

MODE ``default``: the search's default settings; ``compile``: ``compile_step=True`` (inductor
on a CPU; the first pass compiles). Prints each pass's seconds, output tokens and a digest of
the outputs (equal digests: the same tokens). Old against new: run it alternately with
PYTHONPATH set to each tree's ``src`` (``git archive <commit> src configs`` gives an old one).
"""
import gzip
import hashlib
import sys
import time
import zlib
from pathlib import Path

import torch

from transformer_nmt.config import EOS_ID, PAD_ID, ModelConfig
from transformer_nmt.decode.beam_search import beam_search
from transformer_nmt.model.transformer import Transformer

V = 8000


class EosBias(Transformer):
    """Random weights rarely end a sentence: the eos logit raised, outputs of varied length."""

    def decode(self, *args, **kwargs):
        out = super().decode(*args, **kwargs)
        out[..., EOS_ID] += 4.5
        return out

    def decode_static(self, cache):
        out = super().decode_static(cache)
        return out + torch.nn.functional.one_hot(torch.tensor(EOS_ID), out.size(-1)) * 4.5


def main() -> None:
    torch.set_num_threads(int(sys.argv[1]))
    mode = sys.argv[2]
    passes = int(sys.argv[3]) if len(sys.argv) > 3 else 1
    folder = Path(sys.argv[4]) if len(sys.argv) > 4 else Path("data/raw/multi30k")
    lines = gzip.open(folder / "test_2016_flickr.en.gz", "rt").read().splitlines()[:200]
    rows = [[4 + zlib.crc32(w.lower().encode()) % (V - 4) for w in line.split()] + [EOS_ID]
            for line in lines]
    torch.manual_seed(0)
    cfg = ModelConfig(name="tiny", encoder_layers=3, decoder_layers=3, d_model=256, d_ff=1024,
                      heads=4, dropout=0.0, max_positions=256)
    model = EosBias(cfg, vocab_size=V).eval()
    batches = []
    for i in range(0, len(rows), 50):
        chunk = rows[i:i + 50]
        src = torch.full((len(chunk), max(map(len, chunk))), PAD_ID, dtype=torch.long)
        for j, r in enumerate(chunk):
            src[j, :len(r)] = torch.tensor(r)
        batches.append(src)
    kwargs = {} if mode == "default" else {"compile_step": True}
    for p in range(passes):
        start = time.perf_counter()
        out = [beam_search(model, b, beam_size=4, **kwargs) for b in batches]
        seconds = time.perf_counter() - start
        tokens = [h[0].tokens for o in out for h in o]
        digest = hashlib.sha1(str(tokens).encode()).hexdigest()[:12]
        print(f"{mode} pass {p}: {seconds:.2f} s, {sum(map(len, tokens))} tokens, "
              f"outputs {digest}", flush=True)


if __name__ == "__main__":
    main()
