"""Equal work with fairseq: one tiny Multi30k recipe trained by transformer-nmt and by fairseq,
then averaged, decoded and scored the same way.

The recipe (fairseq's tiny Multi30k setting, both toolkits):

* model ``tiny`` (3 + 3 layers, d_model 256, d_ff 1024, 4 heads, all embeddings shared),
  dropout 0.1 (no attention or activation dropout), label smoothing 0.1; ours initialised as
  fairseq does (``model.init=fairseq``; ``--init xavier`` trains ours with our default into
  ``<out>/ours_xavier``, a third row);
* Adam(0.9, 0.98, 1e-9), inverse square root schedule, 1,000 warm-up steps to a peak lr of
  1.976e-3 (lr_multiplier 1.0: 256^-0.5 x 1000^-0.5), no gradient clipping;
* max_tokens 4,096, one GPU/process, 20 epochs, a checkpoint and a validation at the end of
  every epoch; the last 5 epoch checkpoints averaged;
* beam 4, length penalty 0.6 in fairseq's form (score / |Y|^0.6), at most 1.0 x |X| + 50 tokens.

Both toolkits train on the same sentences and pieces (``bench_common.prepare_fairseq_data``).
Each toolkit's test translations are turned into text by the same SentencePiece model and scored
by sacreBLEU against the official reference files (``data/raw/<data>/ref``). Per-epoch training
loss (label-smoothed, nats per target token) and validation perplexity come from each toolkit's
own logs.

The run is resumable: each toolkit continues from its last epoch checkpoint when the script is
started again; finished stages are skipped. ``--toolkits ours`` and ``--toolkits fairseq`` may
run at the same time (``--threads 1`` each); ``--report`` then writes the table.

Examples::

    .venv-bench/bin/python scripts/bench/bench_equal_work.py                       # both, in turn
    .venv-bench/bin/python scripts/bench/bench_equal_work.py --toolkits ours --threads 1 &
    .venv-bench/bin/python scripts/bench/bench_equal_work.py --toolkits fairseq --threads 1 &
    .venv-bench/bin/python scripts/bench/bench_equal_work.py --report              # the table
    .venv-bench/bin/python scripts/bench/bench_equal_work.py --epochs 2 --average 2 \\
        --max-train-pairs 2000 --out data/bench/equal_work_smoke              # a smoke run

Results: ``<out>/<toolkit>/result.json`` and ``<out>/summary.json``; a Markdown table on stdout
for docs/results.md.
"""

from __future__ import annotations

import argparse
import fcntl
import json
import math
import os
import re
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import bench_common as bc

LN2 = math.log(2.0)
SIZE = "tiny"
TEST_SPLITS = ("test_2016_flickr", "test_2017_flickr")
RESULT_NAMES = ("ours", "ours_xavier", "fairseq")  # rows of the report, in order


def peak_lr(args) -> float:
    """lr_multiplier x d_model^-0.5 x warmup^-0.5 (the schedule's value at the last warm-up
    step)."""
    d_model = bc.SIZES[SIZE][2]
    return args.lr_multiplier * d_model ** -0.5 * args.warmup ** -0.5


def data_overrides(args) -> list[str]:
    """The data settings both toolkits' data come from (a smaller training set for smoke runs)."""
    out = ["experiment=multi30k_en_de"]
    if args.max_train_pairs:
        out += [f"data.name=multi30k_en_de_{args.max_train_pairs}",
                f"data.max_train_pairs={args.max_train_pairs}",
                f"data.vocab_size={args.vocab_size}"]
    return out


def data_config(args):
    from transformer_nmt.config import compose

    return compose(data_overrides(args)).data


# ------------------------------------------------------------------------------ ours


def ours_name(args) -> str:
    """The result name (and run folder) of ours: ``ours`` with fairseq's initialisation."""
    return "ours" if args.init == "fairseq" else f"ours_{args.init}"


def ours_overrides(args, run_dir: Path) -> list[str]:
    return [
        *data_overrides(args), f"model={SIZE}", "name=equal_work_ours", f"run_dir={run_dir}",
        f"model.init={args.init}", f"model.dropout={args.dropout}", "model.attention_dropout=0.0",
        "model.activation_dropout=0.0",
        f"trainer.max_tokens={args.max_tokens}", "trainer.update_freq=1",
        "trainer.max_steps=null", f"trainer.max_epochs={args.epochs}",
        "trainer.max_time_minutes=null", f"trainer.warmup_steps={args.warmup}",
        f"trainer.lr_multiplier={args.lr_multiplier}", "trainer.lr_scheduler=inverse_sqrt",
        "trainer.clip_norm=0.0",
        "trainer.label_smoothing=0.1", "trainer.precision=fp32", "trainer.seed=1",
        "trainer.num_workers=0", "trainer.save_every_steps=null",
        "trainer.save_every_minutes=null", "trainer.save_every_epochs=1",
        "trainer.validate_every_steps=null", "trainer.validate_every_epochs=1",
        # room for checkpoints written at an interruption, so the last epochs' ones stay
        f"trainer.keep_last={args.average + 3}", "trainer.log_every_steps=1",
        "trainer.valid_bleu=false", "trainer.patience=null", "trainer.compile=false",
        f"decode.beam_size={args.beam}",
        f"decode.lenpen={args.lenpen}", "decode.lenpen_form=fairseq", "decode.max_len_a=1.0",
        "decode.max_len_b=50",
    ]


def metrics_by_step(run_dir: Path, split: str) -> list[dict]:
    """``metrics.jsonl`` records of ``split``, one per step: a resumed run logs again the steps
    after its last checkpoint, and the later record wins."""
    by_step = {}
    for line in bc.read_lines(run_dir / "metrics.jsonl"):
        rec = json.loads(line) if line else None
        if rec and rec["split"] == split:
            by_step[rec["step"]] = rec
    return [by_step[k] for k in sorted(by_step)]


def ours_epoch_losses(run_dir: Path) -> list[float]:
    """Mean label-smoothed training loss (nats per target token) of each epoch, from the
    per-step records of ``metrics.jsonl`` (``epoch`` = completed epochs at the step's end)."""
    sums: dict[int, list[float]] = {}
    for rec in metrics_by_step(run_dir, "train"):
        ntok = rec["tokens_per_s"] * rec["seconds_per_step"]
        epoch = max(1, math.ceil(rec["epoch"] - 1e-9))
        acc = sums.setdefault(epoch, [0.0, 0.0])
        acc[0] += rec["loss"] * ntok
        acc[1] += ntok
    return [sums[e][0] / sums[e][1] for e in sorted(sums)]


def run_ours(args, out: Path) -> dict:
    """Train (resuming), average the last ``--average`` epoch checkpoints, evaluate."""
    name = ours_name(args)
    run_dir = out / name
    env = bc.thread_env(args.threads)
    overrides = ours_overrides(args, run_dir)
    summary_path = run_dir / "train_summary.json"
    done = summary_path.is_file() and json.loads(summary_path.read_text()).get(
        "stopped_by") == "max_epochs"
    if not done:
        bc.run_child([bc.venv_tool("nmt-train"), *overrides], out / f"{name}_train.log", env)
    summary = json.loads(summary_path.read_text())
    if summary.get("stopped_by") != "max_epochs":
        raise RuntimeError(f"{name} stopped by {summary.get('stopped_by')}, "
                           f"see {out / f'{name}_train.log'}")
    steps, epochs = summary["steps"], args.epochs
    if steps % epochs:
        raise RuntimeError(f"{name}: {steps} steps is not a whole number of steps per epoch")
    ckpts = [str(run_dir / "checkpoints" / f"checkpoint_{steps // epochs * e}.pt")
             for e in range(epochs - args.average + 1, epochs + 1)]
    overrides.append("average.checkpoints=[" + ",".join(f"'{c}'" for c in ckpts) + "]")
    bc.run_child([bc.venv_tool("nmt-average"), *overrides], out / f"{name}_average.log", env)
    bc.run_child([bc.venv_tool("nmt-evaluate"), *overrides], out / f"{name}_evaluate.log", env)
    dcfg = data_config(args)
    hyps = {split: bc.read_lines(run_dir / "translations" / f"{split}.{dcfg.tgt_lang}")
            for split in TEST_SPLITS}
    valid = metrics_by_step(run_dir, "valid")
    return {
        "train_loss_per_epoch": ours_epoch_losses(run_dir),
        "valid_ppl_per_epoch": [r["ppl"] for r in valid],
        "valid_steps": [r["step"] for r in valid],
        "steps": summary["steps"], "train_seconds": summary["train_seconds"],
        "parameters": summary["parameters"], "hypotheses": hyps,
    }


# --------------------------------------------------------------------------- fairseq


def fairseq_train_cmd(args, data_bin: Path, save_dir: Path) -> list[str]:
    return bc.fairseq_train_cmd(
        data_bin, SIZE, dropout=args.dropout, peak_lr=peak_lr(args), warmup=args.warmup,
        max_tokens=args.max_tokens, log_interval=50,
    ) + ["--max-epoch", str(args.epochs), "--cpu", "--save-dir", str(save_dir),
         "--keep-last-epochs", str(args.average), "--save-interval", "1"]


def average_fairseq(save_dir: Path, epochs: int, n: int) -> Path:
    """Mean of the model weights of ``checkpoint{epochs-n+1..epochs}.pt`` (fairseq's
    scripts/average_checkpoints.py --num-epoch-checkpoints n), written to ``averaged.pt``."""
    import torch

    paths = [save_dir / f"checkpoint{e}.pt" for e in range(epochs - n + 1, epochs + 1)]
    missing = [str(p) for p in paths if not p.is_file()]
    if missing:
        raise FileNotFoundError(f"fairseq epoch checkpoints missing: {missing}")
    avg: dict = {}
    state = None
    for p in paths:
        state = torch.load(p, map_location="cpu", weights_only=False)
        for k, v in state["model"].items():
            v = v.double()
            avg[k] = avg[k] + v if k in avg else v
    assert state is not None
    state["model"] = {k: (v / n).float() for k, v in avg.items()}
    state["last_optimizer_state"] = None
    out = save_dir / "averaged.pt"
    torch.save(state, out)
    return out


def fairseq_hypotheses(log_path: Path, sp) -> list[str]:
    """Text of the ``H-<id>`` lines of fairseq-generate's output, in id order."""
    hyps: dict[int, str] = {}
    for line in bc.read_lines(log_path):
        m = re.match(r"^H-(\d+)\t\S+\t?(.*)$", line)
        if m:
            hyps[int(m.group(1))] = sp.decode_pieces(m.group(2).split())
    return [hyps[i] for i in range(len(hyps))]


def fairseq_epoch_logs(log_paths: list[Path]) -> tuple[list[float], list[float]]:
    """Per-epoch training loss (nats) and validation perplexity from fairseq's JSON logs
    (in attempt order)."""
    train, valid = {}, {}
    lines = [line for path in log_paths for line in bc.read_lines(path)]
    for line in lines:
        if "{" not in line:
            continue
        try:
            rec = json.loads(line[line.index("{"):])
        except json.JSONDecodeError:
            continue
        if "train_loss" in rec:
            train[int(rec["epoch"])] = float(rec["train_loss"]) * LN2
        if "valid_ppl" in rec:
            valid[int(rec["epoch"])] = float(rec["valid_ppl"])
    return [train[e] for e in sorted(train)], [valid[e] for e in sorted(valid)]


def run_fairseq(args, out: Path) -> dict:
    import sentencepiece as spm

    from transformer_nmt.fileio import spm_model_path

    dcfg = data_config(args)
    data_bin = bc.prepare_fairseq_data(dcfg, out / "fairseq_data",
                                       ["train", "valid", *TEST_SPLITS])
    save_dir = out / "fairseq" / "checkpoints"
    save_dir.mkdir(parents=True, exist_ok=True)
    env = bc.thread_env(args.threads)
    # fairseq 0.12 pickles its config into checkpoints: its own files, read back without
    # torch's weights-only default (resume, generate)
    env["TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD"] = "1"
    # one log per attempt: fairseq resumes from checkpoint_last.pt, and a later attempt's
    # record of an epoch replaces an interrupted one's
    logs = sorted(out.glob("fairseq_train.*.log"), key=lambda p: int(p.suffixes[0][1:]))
    if not (save_dir / f"checkpoint{args.epochs}.pt").is_file():
        log = out / f"fairseq_train.{len(logs) + 1}.log"
        bc.run_child(fairseq_train_cmd(args, data_bin, save_dir), log, env)
        logs.append(log)
    losses, ppls = fairseq_epoch_logs(logs)
    avg = average_fairseq(save_dir, args.epochs, args.average)
    sp = spm.SentencePieceProcessor(model_file=str(spm_model_path(dcfg)))
    hyps = {}
    for i, split in enumerate(TEST_SPLITS):
        subset = "test" if i == 0 else f"test{i}"
        gen_log = out / f"fairseq_generate_{split}.log"
        bc.run_child([
            bc.venv_tool("fairseq-generate"), str(data_bin), "--path", str(avg),
            "--source-lang", "en", "--target-lang", "de", "--gen-subset", subset,
            "--beam", str(args.beam), "--lenpen", str(args.lenpen), "--max-len-a", "1.0",
            "--max-len-b", "50", "--batch-size", "64", "--cpu", "--seed", "1",
        ], gen_log, env)
        hyps[split] = fairseq_hypotheses(gen_log, sp)
    return {"train_loss_per_epoch": losses, "valid_ppl_per_epoch": ppls, "hypotheses": hyps}


# ---------------------------------------------------------------------------- report


def score(args, result: dict) -> dict:
    """sacreBLEU of each test set against the official reference file."""
    import sacrebleu

    from transformer_nmt.data.corpora import reference_path

    dcfg = data_config(args)
    scores = {}
    for split, hyps in result["hypotheses"].items():
        ref = reference_path(dcfg, split, dcfg.tgt_lang)
        refs = bc.read_lines(ref if ref.is_absolute() else bc.REPO / ref)
        if len(refs) != len(hyps):
            raise RuntimeError(f"{split}: {len(hyps)} hypotheses for {len(refs)} references")
        bleu = sacrebleu.metrics.BLEU()
        scores[split] = {"bleu": round(bleu.corpus_score(hyps, [refs]).score, 2),
                         "signature": str(bleu.get_signature())}
    return scores


def partial_result(toolkit: str, out: Path) -> dict | None:
    """The finished epochs of a run still in progress (no BLEU yet), or None before the first."""
    if toolkit.startswith("ours"):
        run_dir = out / toolkit
        if not (run_dir / "metrics.jsonl").is_file():
            return None
        ppls = [r["ppl"] for r in metrics_by_step(run_dir, "valid")]
        losses = ours_epoch_losses(run_dir)[:len(ppls)]  # epochs that ended in a validation
    else:
        logs = sorted(out.glob("fairseq_train.*.log"), key=lambda p: int(p.suffixes[0][1:]))
        losses, ppls = fairseq_epoch_logs(logs)
    if not losses:
        return None
    return {"train_loss_per_epoch": losses, "valid_ppl_per_epoch": ppls, "partial": True}


def markdown(results: dict) -> str:
    names = [t for t in RESULT_NAMES if t in results]
    lines = ["| toolkit | " + " | ".join(f"sacreBLEU {s}" for s in TEST_SPLITS)
             + " | valid ppl (last epoch) | train loss (last epoch, nats) |",
             "|---" * (len(TEST_SPLITS) + 3) + "|"]
    for t in names:
        r = results[t]
        bleu = [f"{r['bleu'][s]['bleu']:.2f}" if "bleu" in r else "–" for s in TEST_SPLITS]
        name = f"{t} (epochs 1-{len(r['train_loss_per_epoch'])} so far)" if r.get("partial") else t
        lines.append(f"| {name} | " + " | ".join(bleu)
                     + f" | {r['valid_ppl_per_epoch'][-1]:.2f}"
                     + f" | {r['train_loss_per_epoch'][-1]:.4f} |")
    lines += ["",
              "| epoch | " + " | ".join(f"{t} train loss | {t} valid ppl" for t in names) + " |",
              "|---" * (1 + 2 * len(names)) + "|"]
    epochs = max(len(results[t]["train_loss_per_epoch"]) for t in names)
    for e in range(epochs):
        cells = []
        for t in names:
            r = results[t]
            loss = r["train_loss_per_epoch"]
            ppl = r["valid_ppl_per_epoch"]
            cells += [f"{loss[e]:.4f}" if e < len(loss) else "",
                      f"{ppl[e]:.2f}" if e < len(ppl) else ""]
        lines.append(f"| {e + 1} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--toolkits", default="ours,fairseq")
    p.add_argument("--report", action="store_true",
                   help="only write the table: finished results, else the epochs done so far")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--epochs", type=int, default=20)
    p.add_argument("--average", type=int, default=5, help="last epoch checkpoints averaged")
    p.add_argument("--max-tokens", type=int, default=4096)
    p.add_argument("--warmup", type=int, default=1000)
    p.add_argument("--lr-multiplier", type=float, default=1.0)
    p.add_argument("--dropout", type=float, default=0.1)
    p.add_argument("--beam", type=int, default=4)
    p.add_argument("--lenpen", type=float, default=0.6)
    p.add_argument("--init", choices=["fairseq", "xavier"], default="fairseq",
                   help="ours' model.init (fairseq: as fairseq initialises)")
    p.add_argument("--max-train-pairs", type=int, default=None,
                   help="a smaller training set (smoke runs), with --vocab-size pieces")
    p.add_argument("--vocab-size", type=int, default=2000)
    p.add_argument("--out", type=Path, default=bc.REPO / "data" / "bench" / "equal_work")
    args = p.parse_args(argv)
    if args.average > args.epochs:
        p.error(f"--average {args.average} is more than --epochs {args.epochs}")
    out = args.out.resolve()
    out.mkdir(parents=True, exist_ok=True)
    mirror = bc.REPO.parent / "shared" / "data" / "multi30k"
    if not os.environ.get("NMT_MULTI30K_MIRROR") and (mirror / "train.en.gz").is_file():
        os.environ["NMT_MULTI30K_MIRROR"] = str(mirror)  # as the Makefile does
    # one toolkit's driver prepares while the other waits (they may run at the same time)
    with open(out / "prepare.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        bc.run_child([bc.venv_tool("nmt-prepare"), *data_overrides(args)], out / "prepare.log",
                     bc.thread_env(args.threads))
        if not args.report and "fairseq" in args.toolkits.split(","):
            bc.prepare_fairseq_data(data_config(args), out / "fairseq_data",
                                    ["train", "valid", *TEST_SPLITS])
    if not args.report:
        for toolkit in args.toolkits.split(","):
            result = {"ours": run_ours, "fairseq": run_fairseq}[toolkit](args, out)
            result["bleu"] = score(args, result)
            name = ours_name(args) if toolkit == "ours" else toolkit
            bc.write_json(out / name / "result.json", result)
    results = {}
    for t in RESULT_NAMES:
        if (out / t / "result.json").is_file():
            results[t] = json.loads((out / t / "result.json").read_text())
        elif args.report and (partial := partial_result(t, out)):
            results[t] = partial
    if not results:
        return
    summary = {"machine": bc.machine_info(), "recipe": {**vars(args), "out": str(out),
               "peak_lr": peak_lr(args)},
               "results": {t: {k: v for k, v in r.items() if k != "hypotheses"}
                           for t, r in results.items()}}
    bc.write_json(out / "summary.json", summary)
    print(markdown(results))


if __name__ == "__main__":
    bc.run_main(main)
