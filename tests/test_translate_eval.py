"""Translation, checkpoint averaging, evaluation and the results table, on tiny real parts:
the real Transformer, the real SentencePiece training of bpe.py, real checkpoint files."""

from __future__ import annotations

import json
import logging
import os
import random
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from transformer_nmt.beam_search import beam_search
from transformer_nmt.bpe import SentencePieceTokenizer, train_spm
from transformer_nmt.checkpoint import average_run, load_checkpoint, save_checkpoint
from transformer_nmt.cli import compose
from transformer_nmt.config import EOS_ID, DecodeConfig, to_plain
from transformer_nmt.corpora import reference_path
from transformer_nmt.evaluate import evaluate
from transformer_nmt.fileio import raw_path, spm_model_path
from transformer_nmt.model import Transformer
from transformer_nmt.report import PAPER_TABLE2, build_report, load_results, write_report
from transformer_nmt.translate import translate_lines

WORDS = ["a", "dog", "cat", "man", "woman", "child", "runs", "sits", "plays", "walks", "on", "in", "the", "red", "blue", "green", "big", "small", "street", "park", "water", "ball", "house", "near", "with", "two", "three", "people"]
TINY_MODEL = ["model.encoder_layers=1", "model.decoder_layers=1", "model.d_model=16",
              "model.d_ff=32", "model.heads=2", "model.dropout=0.0", "model.max_positions=128"]


@pytest.fixture(autouse=True)
def one_thread():
    """Tiny models run fastest on one thread (and leave the shared cores to others)."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def sentences(n: int, seed: int) -> list[str]:
    rng = random.Random(seed)
    return [" ".join(rng.choice(WORDS) for _ in range(rng.randint(3, 9))).capitalize() + "."
            for _ in range(n)]


def make_cfg(root: Path, *extra: str):
    return compose([
        f"data.root={root / 'data'}", f"run_dir={root / 'runs' / 'tiny'}", "name=tiny",
        "data.vocab_size=60", "data.test_splits=[test_2016_flickr]", "decode.beam_size=2",
        "decode.max_len_b=6", *TINY_MODEL, *extra,
    ])


@pytest.fixture(scope="module")
def workspace(tmp_path_factory):
    """Raw test text, a trained SentencePiece model and the run config, in a temp folder."""
    root = tmp_path_factory.mktemp("ws")
    cfg = make_cfg(root)
    train_file = raw_path(cfg.data, "train", "en")
    train_file.parent.mkdir(parents=True)
    train_file.write_text("\n".join(sentences(300, 0)) + "\n", encoding="utf-8")
    train_spm(cfg.data, [train_file], spm_model_path(cfg.data))
    for lang, seed in (("en", 1), ("de", 2)):
        raw_path(cfg.data, "test_2016_flickr", lang).write_text(
            "\n".join(sentences(12, seed)) + "\n", encoding="utf-8")
    # The official reference as distributed: what the model sees (cleaned) is not what it is
    # scored against (ellipsis, NBSP, full-width digits, German quotes, soft hyphen).
    ref = sentences(12, 2)
    ref[0] = "Zwei\u00a0Hunde \u2026 im \u201ePark\u201c."
    ref[1] = "\uff12 Kinder spie\u00adlen."
    reference_path(cfg.data, "test_2016_flickr", "de").parent.mkdir(parents=True)
    reference_path(cfg.data, "test_2016_flickr", "de").write_bytes(
        ("\n".join(ref) + "\n").encode("utf-8"))
    return root, cfg


@pytest.fixture(scope="module")
def tokenizer(workspace):
    return SentencePieceTokenizer(spm_model_path(workspace[1].data))


def new_model(cfg, vocab_size: int, seed: int) -> Transformer:
    torch.manual_seed(seed)
    return Transformer(cfg.model, vocab_size=vocab_size).eval()


def write_checkpoint(path: Path, model: Transformer, cfg, step: int) -> None:
    save_checkpoint(path, {
        "model": model.state_dict(), "config": to_plain(cfg),
        "vocab_size": model.vocab_size, "step": step,
    })


# ---------------------------------------------------------------- translate_lines


def test_translate_lines_order_empty_and_overlong(workspace, tokenizer, caplog):
    _, cfg = workspace
    model = new_model(cfg, tokenizer.vocab_size, seed=1)
    decode = DecodeConfig(beam_size=2, max_len_b=4, max_tokens=120, max_input_tokens=50)
    long_line = " ".join(["the big red dog runs in the park"] * 4)
    lines = sentences(9, 5)
    lines[2:2] = ["", "   "]
    lines.insert(6, long_line)
    with caplog.at_level(logging.WARNING, logger="transformer_nmt.translate"):
        outputs, stats = translate_lines(model, tokenizer, lines, decode, "cpu")
    assert len(outputs) == len(lines)
    assert outputs[2] == "" and outputs[3] == ""
    assert stats["empty"] == 2 and stats["truncated"] == 1
    assert "line 7" in caplog.text and "truncated" in caplog.text
    assert stats["batches"] >= 2  # max_tokens=120 forces several batches
    assert stats["sentences"] == len(lines) and stats["target_tokens"] > 0
    assert stats["sentences_per_second"] > 0 and stats["target_tokens_per_second"] > 0
    # Input order: each line alone gives the same translation.
    for line, out in zip(lines, outputs):
        if line.strip() and line is not long_line:
            assert translate_lines(model, tokenizer, [line], decode, "cpu")[0] == [out]
    # The over-long line is translated from its first max_input_tokens pieces.
    head = tokenizer.encode(long_line)[:50] + [EOS_ID]
    hyp = beam_search(model, torch.tensor([head]), beam_size=2, max_len_b=4)[0][0]
    assert outputs[6] == tokenizer.decode(hyp.tokens)
    # n-best lists, best first.
    nbest, _ = translate_lines(model, tokenizer, lines[:2], DecodeConfig(beam_size=3, nbest=3,
                               max_len_b=4), "cpu", return_hypotheses=True)
    for hyps in nbest:
        scores = [s for _, s in hyps]
        assert len(hyps) == 3 and scores == sorted(scores, reverse=True)


@pytest.mark.parametrize("precision", ["bf16", "fp16"])
def test_translate_lines_reduced_precision(workspace, tokenizer, precision):
    _, cfg = workspace
    model = new_model(cfg, tokenizer.vocab_size, seed=1)
    decode = DecodeConfig(beam_size=2, max_len_b=4, precision=precision)
    lines = sentences(4, 8)
    outputs, stats = translate_lines(model, tokenizer, lines, decode, "cpu")
    assert len(outputs) == 4 and all(outputs) and stats["precision"] == precision


# ---------------------------------------------------------------- averaging


def test_average_is_mean_of_params(workspace, tokenizer, tmp_path):
    _, cfg = workspace
    cfg = make_cfg(tmp_path, "average.last=2")
    models = [new_model(cfg, tokenizer.vocab_size, seed=s) for s in (1, 2, 3)]
    folder = Path(cfg.run_dir) / "checkpoints"
    for step, m in zip((10, 20, 30), models):
        write_checkpoint(folder / f"checkpoint_{step}.pt", m, cfg, step)
    out = average_run(cfg)
    avg = load_checkpoint(out)
    assert avg["averaged_from"] == ["checkpoint_20.pt", "checkpoint_30.pt"]
    assert avg["step"] == 30 and avg["vocab_size"] == tokenizer.vocab_size
    assert avg["config"]["model"]["d_model"] == 16
    for name, p in models[1].state_dict().items():
        expected = (p.double() + models[2].state_dict()[name].double()) / 2
        torch.testing.assert_close(avg["model"][name], expected.to(p.dtype))
    # Explicit list overrides average.last.
    cfg.average.checkpoints = [str(folder / "checkpoint_10.pt"), str(folder / "checkpoint_30.pt")]
    avg = load_checkpoint(average_run(cfg))
    assert avg["averaged_from"] == ["checkpoint_10.pt", "checkpoint_30.pt"]
    key = "embed_tokens.weight"
    torch.testing.assert_close(
        avg["model"][key], (models[0].state_dict()[key] + models[2].state_dict()[key]) / 2
    )


def test_average_mismatch_names_keys_and_shapes(workspace, tokenizer, tmp_path):
    cfg = make_cfg(tmp_path)
    folder = Path(cfg.run_dir) / "checkpoints"
    model = new_model(cfg, tokenizer.vocab_size, seed=1)
    write_checkpoint(folder / "a.pt", model, cfg, 1)
    state = model.state_dict()
    dropped = dict(state)
    del dropped["embed_tokens.weight"]
    save_checkpoint(folder / "b.pt", {"model": dropped})
    wider = dict(state)
    wider["embed_tokens.weight"] = torch.zeros(7, 16)
    save_checkpoint(folder / "c.pt", {"model": wider})
    cfg.average.checkpoints = [str(folder / "a.pt"), str(folder / "b.pt")]
    with pytest.raises(ValueError, match="embed_tokens.weight"):
        average_run(cfg)
    cfg.average.checkpoints = [str(folder / "a.pt"), str(folder / "c.pt")]
    with pytest.raises(ValueError, match=r"embed_tokens.weight has shape \(7, 16\)"):
        average_run(cfg)
    cfg.average.checkpoints = []
    with pytest.raises(FileNotFoundError, match="no checkpoint_<step>.pt"):
        average_run(cfg)


# ---------------------------------------------------------------- evaluate end to end


def test_evaluate_end_to_end(workspace, tokenizer, tmp_path, capsys):
    root, cfg = workspace
    run_dir = Path(cfg.run_dir)
    for step, seed in ((4, 1), (8, 2)):
        write_checkpoint(run_dir / "checkpoints" / f"checkpoint_{step}.pt",
                         new_model(cfg, tokenizer.vocab_size, seed), cfg, step)
    cfg.average.last = 2
    average_run(cfg)
    (run_dir / "train_summary.json").write_text(json.dumps(
        {"gpu_hours": 0.5, "flops": 1.5e15, "train_seconds": 1800.0, "world_size": 1,
         "valid": {"ppl": 12.5}}))
    results = evaluate(cfg)

    printed = capsys.readouterr().out
    assert "sacreBLEU (detokenized, 13a, mixed case): " in printed
    assert "paper BLEU (t2t get_ende_bleu.sh): " in printed
    assert "chrF" in printed
    translations = run_dir / "translations" / "test_2016_flickr.de"
    assert len(translations.read_text(encoding="utf-8").splitlines()) == 12
    saved = json.loads((run_dir / "results.json").read_text())
    assert saved == json.loads(json.dumps(results))
    assert saved["experiment"] == "tiny" and saved["steps"] == 8
    assert saved["checkpoints_averaged"] == ["checkpoint_4.pt", "checkpoint_8.pt"]
    assert saved["model"]["params"] == new_model(cfg, tokenizer.vocab_size, 0).num_parameters()
    assert saved["decode"]["beam_size"] == 2 and saved["decode"]["lenpen_form"] == "gnmt"
    assert saved["training_cost"] == {"gpu_hours": 0.5, "flops": 1.5e15, "train_seconds": 1800.0,
                                      "world_size": 1}
    test = saved["test_sets"]["test_2016_flickr"]
    for entry in (test["bleu"]["sacrebleu"], test["bleu"]["paper_bleu"], test["chrf"]):
        assert entry["label"] and entry["signature"] and 0 <= entry["score"] <= 100
    assert test["speed"]["sentences"] == 12
    # Scored against the official reference file: the number is what the command line gives.
    ref_file = reference_path(cfg.data, "test_2016_flickr", "de")
    assert test["reference"] == str(ref_file)
    proc = subprocess.run([str(Path(sys.executable).parent / "sacrebleu"), str(ref_file), "-i",
                           str(translations), "-f", "json", "-w", "6"],
                          capture_output=True, text=True, check=True)
    cli = json.loads(proc.stdout)
    assert test["bleu"]["sacrebleu"]["score"] == pytest.approx(float(cli["score"]), abs=1e-6)
    assert test["bleu"]["sacrebleu"]["signature"] == cli["signature"]

    # The table reads what evaluate wrote (an "other run": Multi30k).
    report = build_report(load_results(str(root / "runs" / "*" / "results.json")))
    assert "## Other runs" in report and "| tiny | multi30k_en_de (en-de)" in report
    assert "| 0.50 | 1.5e+15 |" in report

    # Without a train summary the training cost is null.
    (run_dir / "train_summary.json").unlink()
    assert evaluate(cfg)["training_cost"] is None


def test_translate_cli_prints_only_translations(workspace, tokenizer, tmp_path):
    root, cfg = workspace
    ckpt = tmp_path / "model.pt"
    write_checkpoint(ckpt, new_model(cfg, tokenizer.vocab_size, 3), cfg, 1)
    args = [f"data.root={root / 'data'}", f"run_dir={tmp_path / 'run'}", f"decode.checkpoint={ckpt}",
            "decode.beam_size=2", "decode.max_len_b=4", "decode.device=cpu", *TINY_MODEL,
            "data.vocab_size=60"]
    proc = subprocess.run(
        [sys.executable, "-m", "transformer_nmt.cli.translate", *args], check=False,
        input="A dog runs.\n\nTwo people in the park.\n", capture_output=True, text=True,
        cwd=tmp_path, env={**os.environ, "OMP_NUM_THREADS": "1"}, timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout.split("\n")
    assert len(out) == 4 and out[1] == "" and out[3] == ""  # 3 lines + final newline
    assert "sentences/s" in proc.stderr


# ---------------------------------------------------------------- the results table


def fake_result(experiment, corpus, data_name, tgt, model_name, splits, tok, sacre, *,
                row=None, model_cfg=None, ls=0.1, flops=None, ppl=None):
    entry = lambda kind, label, score: {"type": kind, "label": label, "score": score,
                                        "signature": f"sig-{kind}"}
    model_cfg = model_cfg or {"encoder_layers": 6, "decoder_layers": 6, "d_model": 512,
                              "d_ff": 2048, "heads": 8, "d_k": None, "d_v": None,
                              "dropout": 0.1, "positions": "sinusoidal"}
    return {
        "experiment": experiment, "table3_row": row, "steps": 100000,
        "data": {"name": data_name, "corpus": corpus, "src_lang": "en", "tgt_lang": tgt},
        "model": {"name": model_name, "params": 61_000_000, "config": model_cfg},
        "trainer": {"label_smoothing": ls},
        "num_checkpoints_averaged": 5,
        "test_sets": {s: {"bleu": {"sacrebleu": entry("sacrebleu", "sacreBLEU (detokenized)", sacre),
                                   "paper_bleu": entry("paper_bleu", "paper BLEU", tok)},
                          "chrf": entry("chrf", "chrF", 50.0)} for s in splits},
        "training_cost": {"gpu_hours": 96.0, "flops": flops, "train_seconds": 1, "world_size": 8},
        "train_summary": {"valid": {"ppl": ppl}} if ppl else None,
    }


def test_report_tables(tmp_path):
    variant = {"encoder_layers": 6, "decoder_layers": 6, "d_model": 512, "d_ff": 2048,
               "heads": 8, "d_k": 16, "d_v": None, "dropout": 0.1, "positions": "sinusoidal"}
    fakes = {
        "wmt14_en_de_base": fake_result("wmt14_en_de_base", "wmt14", "wmt14_en_de", "de", "base",
                                        ["newstest2014", "newstest2014_filtered"], 26.91, 26.02,
                                        flops=2.1e18),
        "wmt14_en_fr_big": fake_result("wmt14_en_fr_big", "wmt14", "wmt14_en_fr", "fr", "big",
                                       ["newstest2014"], 40.55, 38.77, flops=1.9e19),
        "row_b_dk16": fake_result("row_b_dk16", "wmt14", "wmt14_en_de", "de", "base",
                                  ["newstest2013"], 24.83, 24.1, row="B", model_cfg=variant, ppl=5.2),
        "multi30k": fake_result("multi30k", "multi30k", "multi30k_en_de", "de", "tiny",
                                ["test_2016_flickr", "test_2017_flickr"], 35.52, 34.47),
    }
    old = fake_result("wmt14_en_de_old", "wmt14", "wmt14_en_de", "de", "base", ["newstest2014"],
                      29.9, 25.0, flops=2.0e18)
    for test in old["test_sets"].values():
        test["bleu"]["tokenized_bleu"] = test["bleu"].pop("paper_bleu")
    fakes["wmt14_en_de_old"] = old
    for name, result in fakes.items():
        path = tmp_path / "runs" / name / "results.json"
        path.parent.mkdir(parents=True)
        path.write_text(json.dumps(result))
    cfg = compose([f"results_glob={tmp_path}/runs/*/results.json",
                   f"table_output={tmp_path}/docs/results.md"])
    text = write_report(cfg).read_text(encoding="utf-8")

    # Table 2: paper numbers beside ours, every BLEU column named.
    assert ("EN-DE paper BLEU (t2t get_ende_bleu.sh) | EN-DE sacreBLEU | "
            "EN-FR paper BLEU (Moses tokenizer, multi-bleu) | EN-FR sacreBLEU") in text
    for size, paper in PAPER_TABLE2.items():
        assert f"| Transformer ({size}), paper | {paper['de']:.1f} | – | {paper['fr']:.1f} |" in text
    assert "| 3.3e+18 | 3.3e+18 |" in text and "| 2.3e+19 | 2.3e+19 |" in text
    assert "| Transformer (base), ours: wmt14_en_de_base | 26.9 | 26.0 | – | – | 2.1e+18 | – |" in text
    # Symmetric tokenized BLEU of an older results.json is not the paper's way: not compared.
    assert "| Transformer (base), ours: wmt14_en_de_old (†) | – | 25.0 | – | – | 2.0e+18 | – |" in text
    assert "(†): a results.json written before" in text
    assert "29.9" not in text.split("### Table 2 runs")[0]
    assert "| Transformer (big), ours: wmt14_en_fr_big | – | – | 40.5 | 38.8 | – | 1.9e+19 |" in text
    # Table 3: the variant matched to the paper's line (d_k=16: PPL 5.16, BLEU 25.1, 58M).
    assert "## Table 3" in text
    assert "| B | row_b_dk16 | d_k=16 | 61.0M | 5.20 | 24.8 | 24.1 | newstest2013 | 5.16 | 25.1 | 58M |" in text
    # Other runs: both Multi30k test sets, with every score type named in the header.
    assert "| paper BLEU | sacreBLEU | chrF |" in text
    assert "test_2016_flickr | 35.52 | 34.47 | 50.00" in text and "test_2017_flickr" in text
    assert "row_b_dk16" not in text.split("## Other runs")[1].split("## Score")[0]
    assert "`sig-paper_bleu`" in text
    # Both newstest2014 variants of the Table 2 runs are listed with their scores.
    assert "| wmt14_en_de_base | wmt14_en_de (en-de) | base | 61.0M | 100000 | 5 | newstest2014_filtered |" in text


ALLOC_PROBE = """
import resource, sys, torch
from transformer_nmt.cli import retain_freed_memory
applied = retain_freed_memory() if sys.argv[1] == "retain" else False
torch.empty(16 << 20).fill_(1.0)  # 64 MiB: allocate, touch and free once
before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
for _ in range(10):
    torch.empty(16 << 20).fill_(1.0)
print(applied, resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
"""


@pytest.mark.skipif(sys.platform != "linux", reason="glibc malloc settings")
def test_retain_freed_memory_stops_page_faults_on_reallocation():
    """A freed 64 MiB tensor allocated again costs 16k page faults (one per 4 KiB page) every
    time by default; after retain_freed_memory() (what nmt-translate / nmt-evaluate call)
    the ten reallocations fault at most once in all."""
    faults = {}
    for mode in ("default", "retain"):
        out = subprocess.run([sys.executable, "-c", ALLOC_PROBE, mode], capture_output=True,
                             text=True, check=True).stdout.split()
        faults[mode] = (out[0], int(out[1]))
    if faults["retain"][0] != "True":
        pytest.skip("the C library is not glibc")
    assert faults["default"][1] > 10 * 16_000 * 0.9, faults  # every reallocation faults again
    assert faults["retain"][1] < 1.1 * 16_384, faults


def test_evaluate_scores_against_the_official_reference_bytes(workspace, tokenizer, tmp_path,
                                                              monkeypatch):
    """A system that outputs the cleaned (NFKC) reference: scored against the cleaned text it
    would get 100; against the official file it gets what `sacrebleu REF -i HYP` prints."""
    import unicodedata

    from transformer_nmt import evaluate as evaluate_module

    _, cfg = workspace
    cfg = cfg.copy()
    cfg.run_dir = str(tmp_path / "run")
    ckpt = tmp_path / "model.pt"
    write_checkpoint(ckpt, new_model(cfg, tokenizer.vocab_size, 5), cfg, 3)
    cfg.decode.checkpoint = str(ckpt)
    ref_file = reference_path(cfg.data, "test_2016_flickr", "de")
    official = ref_file.read_text(encoding="utf-8").splitlines()
    cleaned = [" ".join(unicodedata.normalize("NFKC", r.replace("\u00ad", "")).split())
               for r in official]
    monkeypatch.setattr(evaluate_module, "translate_lines",
                        lambda model, tok, lines, decode, device: (cleaned, {"sentences": 12}))
    results = evaluate(cfg)
    test = results["test_sets"]["test_2016_flickr"]
    proc = subprocess.run([str(Path(sys.executable).parent / "sacrebleu"), str(ref_file), "-i",
                           test["translations"], "-f", "json", "-w", "6"],
                          capture_output=True, text=True, check=True)
    score = test["bleu"]["sacrebleu"]["score"]
    assert score == pytest.approx(float(json.loads(proc.stdout)["score"]), abs=1e-6)
    assert 50 < score < 99.9  # the two altered lines cost n-grams; the rest match
    assert test["bleu"]["paper_bleu"]["score"] < 99.9
