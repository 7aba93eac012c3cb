"""Does a sentence's translation depend on the other sentences of its batch? Decodes a test set
with our engine twice, in batches of two sizes (``decode.max_tokens``), in fp32 and in int8
(``decode.precision=int8``), and prints per precision the number of sentences whose output
differs between the two batchings and the sacreBLEU of each.

fp32 gives 0 (batch-mates change nothing). int8 quantizes each input row with its own scale, so
its batch-mates change no rounding either; what can still differ is a sentence's padding (the
fp32 rounding of masked attention, which int8's rounding to 8 bits may then amplify).

    .venv/bin/python scripts/micro/int8_batch_dependence.py \\
        --checkpoint runs/multi30k_en_de/checkpoints/averaged.pt --max-tokens 8000 500
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import sacrebleu
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))
import bench_common as bc  # noqa: E402  (scripts/bench, on the path above)
import bench_decode as bd  # noqa: E402

from transformer_nmt.decode.quantize import quantize_int8  # noqa: E402
from transformer_nmt.decode.translate import translate_lines  # noqa: E402
from transformer_nmt.runtime import retain_freed_memory  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--checkpoint", required=True)
    p.add_argument("--spm", default=None,
                   help="the SentencePiece model (default: data/spm/multi30k_en_de/spm.model)")
    p.add_argument("--input", default="data/raw/multi30k_en_de/test_2016_flickr.en")
    p.add_argument("--reference", default="data/raw/multi30k_en_de/ref/test_2016_flickr.de")
    p.add_argument("--max-tokens", type=int, nargs=2, default=[8000, 500],
                   help="the two batch sizes, source tokens per batch")
    p.add_argument("--threads", type=int, default=2)
    args = p.parse_args(argv)
    torch.set_num_threads(args.threads)
    retain_freed_memory()
    model, tokenizer = bd.load(args)
    lines = bc.read_lines(args.input)
    refs = bc.read_lines(args.reference)
    print(f"{len(lines)} sentences of {args.input}, batches of {args.max_tokens[0]} and "
          f"{args.max_tokens[1]} source tokens")
    for precision in ("fp32", "int8"):
        if precision == "int8":
            model = quantize_int8(model, args.checkpoint)
        outputs = []
        for max_tokens in args.max_tokens:
            cfg = bd.decode_config(argparse.Namespace(
                beam=4, lenpen=0.6, stopping="beam", max_len_a=1.0, max_len_b=50,
                max_tokens=max_tokens, precision=precision, device="cpu", compile="false"))
            outputs.append(translate_lines(model, tokenizer, lines, cfg, "cpu")[0])
        differ = sum(a != b for a, b in zip(*outputs))
        bleu = [sacrebleu.corpus_bleu(o, [refs]).score for o in outputs]
        print(f"{precision}: {differ} of {len(lines)} outputs differ; sacreBLEU "
              f"{bleu[0]:.2f} / {bleu[1]:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
