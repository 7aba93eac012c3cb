"""nmt-table (transformer_nmt.evaluate.report): the paper's Table 2 and Table 3 beside our
results."""

from __future__ import annotations

import json

from transformer_nmt.config import compose
from transformer_nmt.evaluate.gate import last_periodic_steps
from transformer_nmt.evaluate.paper import PAPER_TABLE2
from transformer_nmt.evaluate.report import preset_config, write_report


def fake_result(experiment, corpus, data_name, tgt, model_name, splits, tok, sacre, *,
                row=None, model_cfg=None, ls=0.1, flops=None, ppl=None, steps=100000,
                averaged=5, per_step=25_000.0, max_train_pairs=None):
    def entry(kind, label, score):
        return {"type": kind, "label": label, "score": score, "signature": f"sig-{kind}"}

    model_cfg = model_cfg or {"encoder_layers": 6, "decoder_layers": 6, "d_model": 512,
                              "d_ff": 2048, "heads": 8, "d_k": None, "d_v": None,
                              "dropout": 0.1, "positions": "sinusoidal"}
    # a WMT14 run records its preset's whole config (the Table 2 gate compares it)
    preset = preset_config(f"wmt14_en_{tgt}_{model_name}") if corpus == "wmt14" else None
    recorded = {}
    if preset is not None:
        t = preset["trainer"]
        recorded = {"run_config": {**preset, "data": {**preset["data"],
                                                      "max_train_pairs": max_train_pairs}},
                    "decode": preset["decode"],
                    "averaged_steps": last_periodic_steps(steps, t["save_every_steps"],
                                                          averaged)}
    return {
        **recorded,
        "experiment": experiment, "table3_row": row, "steps": steps,
        "data": {"name": data_name, "corpus": corpus, "src_lang": "en", "tgt_lang": tgt,
                 "max_train_pairs": max_train_pairs},
        "model": {"name": model_name, "params": 61_000_000, "config": model_cfg},
        "trainer": {"label_smoothing": ls},
        "num_checkpoints_averaged": averaged,
        "test_sets": {s: {"bleu": {"sacrebleu": entry("sacrebleu", "sacreBLEU (detokenized)",
                                                      sacre),
                                   "paper_bleu": {**entry("paper_bleu", "paper BLEU", tok),
                                                  "form": "t2t-2017" if tgt == "de" else "moses"}},
                          "chrf": entry("chrf", "chrF", 50.0)} for s in splits},
        "training_cost": {"gpu_hours": 96.0, "flops": flops, "train_seconds": 1, "world_size": 8},
        "train_summary": {"valid": {"ppl": ppl} if ppl else {}, "steps": steps,
                          "real_tokens_per_step": {"src": per_step, "tgt": per_step}},
    }


def test_report_tables(tmp_path):
    variant = {"encoder_layers": 6, "decoder_layers": 6, "d_model": 512, "d_ff": 2048,
               "heads": 8, "d_k": 16, "d_v": None, "dropout": 0.1, "positions": "sinusoidal"}
    fakes = {
        "wmt14_en_de_base": fake_result("wmt14_en_de_base", "wmt14", "wmt14_en_de", "de", "base",
                                        ["newstest2014", "newstest2014_filtered"], 26.91, 26.02,
                                        flops=2.1e18),
        "wmt14_en_fr_big": fake_result("wmt14_en_fr_big", "wmt14", "wmt14_en_fr", "fr", "big",
                                       ["newstest2014"], 40.55, 38.77, flops=1.9e19,
                                       steps=300000, averaged=20),
        "row_b_dk16": fake_result("row_b_dk16", "wmt14", "wmt14_en_de", "de", "base",
                                  ["newstest2013"], 24.83, 24.1, row="B", model_cfg=variant,
                                  ppl=5.2),
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
    cfg = compose([f"table.results_glob={tmp_path}/runs/*/results.json",
                   f"table.output={tmp_path}/docs/results.md"])
    text = write_report(cfg).read_text(encoding="utf-8")

    # Table 2: paper numbers beside ours, every BLEU column named.
    assert ("EN-DE paper BLEU (t2t get_ende_bleu.sh, 2017 form) | EN-DE sacreBLEU | "
            "EN-FR paper BLEU (Moses tokenizer, multi-bleu) | EN-FR sacreBLEU") in text
    for size, paper in PAPER_TABLE2.items():
        assert (f"| Transformer ({size}), paper | {paper['de']:.1f} | – | {paper['fr']:.1f} |"
                in text)
    assert ("| training cost: GPU time x sustained TFLOPS (FLOPs, the paper's) | "
            "training cost: 6 x weights x tokens + attention (FLOPs, ours) |") in text
    assert "| 3.3e+18 | – | – |" in text and "| 2.3e+19 | – | – |" in text
    assert ("| Transformer (base), ours: wmt14_en_de_base | 26.9 | "
            "26.0 | – | – | – | 2.1e+18 |" in text)
    # Symmetric tokenized BLEU of an older results.json is not the paper's way: not compared.
    assert ("| Transformer (base), ours: wmt14_en_de_old (†) | – | "
            "25.0 | – | – | – | 2.0e+18 |" in text)
    assert "(†): a results.json written before" in text
    assert "29.9" not in text.split("### Table 2 runs")[0]
    assert ("| Transformer (big), ours: wmt14_en_fr_big | – | – | 40.5 | "
            "38.8 | – | 1.9e+19 |" in text)
    assert "WMT14 runs not in Table 2" not in text  # every candidate above is comparable
    # Table 3: the variant matched to the paper's line (d_k=16: PPL 5.16, BLEU 25.1, 58M).
    assert "## Table 3" in text
    assert "### row_b_dk16 (dev set: newstest2013)" in text
    assert ("| B | d_k=16 | 6, 512, 2048, 8, 16, 64, 0.1, 0.1, sinusoidal | 1 | 100000 | 61.0M | "
            "58M | 5.20 | 5.16 | 24.83 | 24.10 | 25.1 | – | -0.7 |") in text
    # Other runs: both Multi30k test sets, with every score type named in the header.
    assert "| paper BLEU | Multi30k BLEU (mmt) | sacreBLEU | chrF |" in text
    assert "test_2016_flickr | 35.52 | – | 34.47 | 50.00" in text and "test_2017_flickr" in text
    assert "row_b_dk16" not in text.split("## Other runs")[1].split("## Score")[0]
    assert "`sig-paper_bleu`" in text
    # Both newstest2014 variants of the Table 2 runs are listed with their scores.
    assert ("| wmt14_en_de_base | wmt14_en_de (en-de) | base | 61.0M | "
            "100000 | 5 | newstest2014_filtered |" in text)


def test_table3_seeds_are_averaged_and_rows_differenced_against_the_base(tmp_path):
    """Base row with seeds scoring 20, 22, 24 (mean 22, sample std 2) and one N=2 row at 21."""
    tiny = {"encoder_layers": 3, "decoder_layers": 3, "d_model": 256, "d_ff": 1024, "heads": 4,
            "d_k": None, "d_v": None, "dropout": 0.1, "positions": "sinusoidal"}
    runs = {f"base_seed{i}": ("base", i, bleu, ppl)
            for i, bleu, ppl in ((1, 20.0, 9.0), (2, 22.0, 10.0), (3, 24.0, 11.0))}
    runs["C_N2_seed1"] = ("C_N2", 1, 21.0, 12.0)
    for name, (variant, seed, bleu, ppl) in runs.items():
        r = fake_result("table3_proxy", "multi30k", "multi30k_en_de", "de", "tiny", ["valid"],
                        bleu, bleu - 1, row="x", model_cfg=dict(tiny), ppl=ppl)
        r["table3"] = {"variant": variant, "seed": seed}
        path = tmp_path / "runs" / "table3_proxy" / "table3" / name / "results.json"
        path.parent.mkdir(parents=True)
        path.write_text(json.dumps(r))
    cfg = compose([f"table.results_glob={tmp_path}/runs/**/results.json", "table.tables=[table3]",
                   f"table.output={tmp_path}/t3.md"])
    text = write_report(cfg).read_text(encoding="utf-8")
    assert "### table3_proxy (dev set: valid; seed noise of the base row: ± 2.00 BLEU)" in text
    assert "| base | base model |" in text and "| 3 | 100000 |" in text
    assert ("| 10.00 ± 1.00 | 4.92 | 22.00 ± 2.00 | 21.00 ± 2.00 | "
            "25.8 | 0 (base) | 0 (base) |" in text)
    assert "| C | N=2 |" in text and "| 21.00 | 20.00 | 23.7 | -1.00 | -2.1 |" in text
    assert "## Table 2" not in text and "## Other runs" not in text


def test_table2_admits_only_comparable_runs(tmp_path):
    """A WMT14 base/big run enters Table 2 only with the paper's steps, real tokens per step
    (±10 %), checkpoints averaged and full data; otherwise it is under Other runs with why."""
    def de_base(name, **kw):
        return fake_result(name, "wmt14", "wmt14_en_de", "de", "base", ["newstest2014"],
                           27.0, 26.0, flops=2e18, **kw)

    fakes = {
        "ok": de_base("ok", per_step=23_000.0),  # -8 %: inside
        "short": de_base("short", steps=50_000),
        "one_gpu": de_base("one_gpu", per_step=3_140.0),
        "four_avg": de_base("four_avg", averaged=4),
        "slice": de_base("slice", max_train_pairs=100_000),
    }
    for name, result in fakes.items():
        path = tmp_path / "runs" / name / "results.json"
        path.parent.mkdir(parents=True)
        path.write_text(json.dumps(result))
    cfg = compose([f"table.results_glob={tmp_path}/runs/*/results.json",
                   f"table.output={tmp_path}/results.md"])
    text = write_report(cfg).read_text(encoding="utf-8")
    table2, others = text.split("## Other runs")[0], text.split("## Other runs")[1]
    assert "ours: ok |" in table2
    for name in ("short", "one_gpu", "four_avg", "slice"):
        assert f"ours: {name} |" not in table2 and f"| {name} |" in others
    assert "- short (" in others and "trained 50,000 steps, not the preset's 100,000" in others
    assert "3,140 real source tokens per step, not 25,000 ± 10% (the run's tolerance)" in others
    assert "not the last 5 periodic checkpoints" in others
    assert "data.max_train_pairs=100000, the preset's –" in others
    assert "- ok (" not in others


def test_default_table_goes_under_runs_and_docs_results_md_is_nmt_table_output():
    """`make all` / `make table` write runs/results.md, never the committed docs/results.md,
    and docs/results.md holds only what nmt-table writes (no hand-written text)."""
    from pathlib import Path

    from transformer_nmt.evaluate.report import build_report

    assert compose([]).table.output == "runs/results.md"
    repo = Path(__file__).resolve().parents[3]
    make_table = (repo / "Makefile").read_text().split("\ntable:")[1].split("\n\n")[0]
    assert "docs/" not in make_table
    doc = (repo / "docs" / "results.md").read_text(encoding="utf-8").split("\n")
    assert doc[2].startswith("Built by `nmt-table` from ") and doc[3] == ""
    assert "wmt14" not in doc[2]  # no WMT14 run: its Table 2 section is the paper's rows only

    def table2(lines):
        i = lines.index("## Table 2: newstest2014 (full, 3,003 sentences)")
        return lines[i:next(k for k in range(i + 1, len(lines)) if lines[k].startswith("## "))]

    assert table2(doc) == table2(build_report([]).split("\n"))
