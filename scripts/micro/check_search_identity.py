"""Decode a test set with the beam search and with the previous search it replaced (the test
oracle, tests/unit/decode/reference_beam_search.py), and count the sentences whose outputs differ.

The two must agree token for token (beam size 1: greedy search, as nmt-translate runs it,
against the oracle's greedy search): the script prints, per beam size, the number of sentences
whose best hypothesis differs (0 expected; exit status 1 otherwise), the largest score
difference, and each search's decoding time (the same batches, one after the other, after a
warm-up batch).

    python scripts/micro/check_search_identity.py                          # runs/multi30k_en_de
    python scripts/micro/check_search_identity.py --device cuda --precision bf16
    python scripts/micro/check_search_identity.py --checkpoint M.pt --spm S.model --input test.en
    python scripts/micro/check_search_identity.py --compile        # decode.compile's search
    python scripts/micro/check_search_identity.py --compile --beams 1    # greedy search

The model is ``--checkpoint``, else the run's ``checkpoints/averaged.pt``, else its latest
``checkpoint_<step>.pt``; the SentencePiece model and the source text default to those of the
model's recorded data settings (``data/spm/...``, ``data/raw/.../<split>.<src_lang>``, relative
to the current folder: run it from the project root). Beam search settings other than the beam
size are the model's recorded ``decode`` settings.
"""

from __future__ import annotations

import argparse
import contextlib
import sys
import time
from pathlib import Path

import numpy as np
import torch

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tests" / "unit" / "decode"))
import reference_beam_search as reference  # noqa: E402

from transformer_nmt.decode.beam_search import beam_search, greedy_search  # noqa: E402


def model_file(args) -> Path:
    """``--checkpoint``, else the run's averaged model, else its latest checkpoint."""
    from transformer_nmt.checkpoint import AVERAGED_NAME, checkpoint_dir, latest_checkpoint

    if args.checkpoint:
        return Path(args.checkpoint)
    averaged = checkpoint_dir(args.run) / AVERAGED_NAME
    if averaged.is_file():
        return averaged
    latest = latest_checkpoint(args.run)
    if latest is None:
        sys.exit(f"error: no {AVERAGED_NAME} and no checkpoint_<step>.pt in "
                 f"{checkpoint_dir(args.run)}; train first (make train) or pass --checkpoint")
    return latest


def batches(tokenizer, lines: list[str], max_tokens: int):
    """``src_tokens`` (B, S) batches of similar lengths, as nmt-translate forms them."""
    from transformer_nmt.data.batching import LengthBucketSampler, collate

    ids = [np.asarray(tokenizer.encode(line.strip()), dtype=np.int64) for line in lines]
    sizes = np.asarray([len(x) for x in ids], dtype=np.int64)
    for indices in LengthBucketSampler(sizes, None, max_tokens, shuffle=False):
        if indices:
            yield collate([(j, ids[j], None) for j in indices]).src_tokens


def timed(search, model, srcs, device, precision, **kwargs):
    """(seconds, per-batch results) of ``search`` over ``srcs``."""
    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(precision)
    ctx = (torch.autocast(device.type, dtype=dtype) if dtype is not None
           else contextlib.nullcontext())
    out = []
    with ctx:
        search(model, srcs[0], **kwargs)  # warm-up
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        start = time.perf_counter()
        for src in srcs:
            out.append(search(model, src, **kwargs))
        if device.type == "cuda":
            torch.cuda.synchronize(device)
    return time.perf_counter() - start, out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--run", type=Path, default=Path("runs/multi30k_en_de"))
    p.add_argument("--checkpoint", default=None, help="model file (default: the run's)")
    p.add_argument("--spm", default=None, help="SentencePiece model (default: the model's)")
    p.add_argument("--split", default="test_2016_flickr")
    p.add_argument("--input", default=None, help="source text (default: the split's)")
    p.add_argument("--sentences", type=int, default=0, help="the first N lines only (0: all)")
    p.add_argument("--beams", default="4,5")
    p.add_argument("--device", default="cpu")
    p.add_argument("--precision", default="fp32", choices=["fp32", "bf16", "fp16"])
    p.add_argument("--threads", type=int, default=0, help="CPU threads (0: PyTorch's default)")
    p.add_argument("--max-tokens", type=int, default=8000, help="source tokens per batch")
    p.add_argument("--sync-every", default="auto", help="decode.sync_every of the search")
    p.add_argument("--compile", action="store_true",
                   help="the search with decode.compile=true (its whole step compiled; the "
                        "warm-up batch compiles it, and its time counts the first batches' "
                        "CUDA graph recordings on a GPU)")
    p.add_argument("--compile-backend", default=None,
                   help="torch.compile backend of --compile (default: reduce-overhead on CUDA, "
                        "inductor elsewhere)")
    args = p.parse_args(argv)

    from transformer_nmt.checkpoint import load_model
    from transformer_nmt.data.bpe import SentencePieceTokenizer
    from transformer_nmt.fileio import raw_path, spm_model_path

    if args.threads:
        torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    path = model_file(args)
    model, cfg = load_model(path, device)
    model.eval()
    spm = Path(args.spm) if args.spm else spm_model_path(cfg.data)
    source = Path(args.input) if args.input else raw_path(cfg.data, args.split, cfg.data.src_lang)
    for what, f in (("SentencePiece model", spm), ("source text", source)):
        if not f.is_file():
            sys.exit(f"error: {what} {f} does not exist (prepare the data, or pass it)")
    lines = source.read_text(encoding="utf-8").splitlines()
    if args.sentences:
        lines = lines[: args.sentences]
    srcs = [s.to(device) for s in batches(SentencePieceTokenizer(spm), lines, args.max_tokens)]
    d = cfg.decode
    print(f"model {path}, {len(lines)} sentences of {source}, {args.device} {args.precision}"
          f"{', decode.compile' if args.compile else ''}; "
          f"lenpen {d.lenpen} ({d.lenpen_form}), stopping {d.stopping}, "
          f"max length {d.max_len_a} x source + {d.max_len_b}")
    differ_total = 0
    for beam in (int(b) for b in args.beams.split(",")):
        kwargs = {"max_len_a": d.max_len_a, "max_len_b": d.max_len_b}
        search, previous = greedy_search, reference.greedy_search
        if beam != 1:
            kwargs.update(beam_size=beam, lenpen=d.lenpen, lenpen_form=str(d.lenpen_form),
                          stopping=str(d.stopping))
            search, previous = beam_search, reference.beam_search
        t_new, new = timed(search, model, srcs, device, args.precision,
                           sync_every=args.sync_every, compile_step=args.compile,
                           compile_backend=args.compile_backend, **kwargs)
        t_ref, ref = timed(previous, model, srcs, device, args.precision, **kwargs)
        differ, worst, tokens = 0, 0.0, 0
        for got, want in zip(new, ref):
            for g, w in zip(got, want):
                differ += g[0].tokens != w[0].tokens
                tokens += len(g[0].tokens) + 1
                if g[0].tokens == w[0].tokens:
                    worst = max(worst, abs(g[0].score - w[0].score))
        differ_total += differ
        print(f"beam {beam}: {differ} of {len(lines)} sentences differ, largest score "
              f"difference {worst:.2e}; search {t_new:.2f} s ({tokens / t_new:,.0f} target "
              f"tokens/s), previous search {t_ref:.2f} s ({tokens / t_ref:,.0f} tokens/s), "
              f"ratio {t_ref / t_new:.2f}")
    return 1 if differ_total else 0


if __name__ == "__main__":
    sys.exit(main())
