"""CPU time of the beam search (sync_every 1 and 8) against the previous search
(tests/unit/decode/reference_beam_search.py), three alternating rounds in one process.

    python scripts/micro/bench_search_cpu.py [THREADS] [MULTI30K_FOLDER]

The 200 first sentences of test_2016_flickr.en.gz (words hashed into 8,000 ids), a random tiny
model (3+3 layers, d_model 256) with the eos logit raised by 4.5 so that outputs end at varied
lengths, beam 4, batches of 50. Prints each round's seconds, the medians and their ratios.
"""
import gzip
import sys
import time
import zlib
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tests" / "unit" / "decode"))
import reference_beam_search as reference  # noqa: E402

from transformer_nmt.config import EOS_ID, PAD_ID, ModelConfig  # noqa: E402
from transformer_nmt.decode.beam_search import beam_search  # noqa: E402
from transformer_nmt.model.transformer import Transformer  # noqa: E402

torch.set_num_threads(int(sys.argv[1]) if len(sys.argv) > 1 else 1)
V = 8000
folder = Path(sys.argv[2]) if len(sys.argv) > 2 else Path("data/raw/multi30k")
lines = gzip.open(folder / "test_2016_flickr.en.gz", "rt").read().splitlines()[:200]


def ids(line: str) -> list[int]:
    return [4 + zlib.crc32(w.lower().encode()) % (V - 4) for w in line.split()] + [EOS_ID]


class EosBias(torch.nn.Module):
    """Random weights rarely end a sentence: the eos logit raised, outputs of varied length."""

    def __init__(self, model):
        super().__init__()
        self.m, self.cfg = model, model.cfg

    def encode(self, src):
        return self.m.encode(src)

    def new_cache(self):
        return self.m.new_cache()

    def decode(self, tgt, memory, mask, cache=None):
        out = self.m.decode(tgt, memory, mask, cache)
        out[..., EOS_ID] += 4.5
        return out


def main() -> None:
    rows = [ids(line) for line in lines]
    torch.manual_seed(0)
    cfg = ModelConfig(name="tiny", encoder_layers=3, decoder_layers=3, d_model=256, d_ff=1024,
                      heads=4, dropout=0.0, max_positions=256)
    model = EosBias(Transformer(cfg, vocab_size=V).eval())
    batches = []
    for i in range(0, len(rows), 50):
        chunk = rows[i:i + 50]
        src = torch.full((len(chunk), max(map(len, chunk))), PAD_ID, dtype=torch.long)
        for j, r in enumerate(chunk):
            src[j, :len(r)] = torch.tensor(r)
        batches.append(src)

    def run(fn, **kw):
        start = time.perf_counter()
        out = [fn(model, b, beam_size=4, **kw) for b in batches]
        return time.perf_counter() - start, out

    variants = {"previous": (reference.beam_search, {}),
                "sync_every=1": (beam_search, {"sync_every": 1}),
                "sync_every=8": (beam_search, {"sync_every": 8})}
    times: dict[str, list[float]] = {k: [] for k in variants}
    outs = {}
    run(beam_search)  # warm-up
    for _ in range(3):
        for name, (fn, kw) in variants.items():
            dt, outs[name] = run(fn, **kw)
            times[name].append(dt)
    toks = sum(len(h[0].tokens) for o in outs["previous"] for h in o)
    same = all([h.tokens for h in a] == [h.tokens for h in b]
               for x, y in zip(outs["previous"], outs["sync_every=1"]) for a, b in zip(x, y))
    print(f"{len(rows)} sentences, {toks} output tokens, identical at sync_every=1: {same}")
    for name, ts in times.items():
        print(f"{name:13s} " + " ".join(f"{t:.2f}" for t in ts) + f"  median {sorted(ts)[1]:.2f} s")
    ref = sorted(times["previous"])[1]
    for name in ("sync_every=1", "sync_every=8"):
        print(f"{name} / previous = {sorted(times[name])[1] / ref:.3f}")


if __name__ == "__main__":
    main()
