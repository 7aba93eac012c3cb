"""nmt-table's Table 3 groups runs by their whole resolved recipe (the seed and harmless keys
aside): runs of one row name with other steps or another d_model are separate rows, true
seeds of the base recipe are pooled, short runs are marked and kept out of Δ and the seed
noise, and the configured rows with no results are listed as not run."""

from __future__ import annotations

import json

from transformer_nmt.config import compose, to_plain
from transformer_nmt.evaluate.identity import recipe, row_recipe
from transformer_nmt.evaluate.report import build_report
from transformer_nmt.evaluate.table3_groups import base_line, configured_rows, table3_lines

PROXY = ["experiment=table3_proxy", "trainer.max_steps=1000"]


def _entry(kind: str, score: float) -> dict:
    return {"type": kind, "label": kind, "score": score, "signature": f"sig-{kind}"}


def fake_row(variant: str, seed: int, bleu: float, *extra: str, steps: int | None = None,
             stopped_by: str = "max_steps", date: str = "2026-01-01T00:00:00+00:00") -> dict:
    """A results.json of a Table 3 row as nmt-evaluate writes it (the run's resolved config,
    the decode settings, the dev-set scores and the train summary)."""
    cfg = compose([*PROXY, f"table3={variant}", f"trainer.seed={seed}", *extra])
    plain = to_plain(cfg)
    trained = cfg.trainer.max_steps if steps is None else steps
    return {
        "experiment": cfg.name, "date": date, "run_dir": cfg.run_dir,
        "table3_row": variant, "table3": {"variant": variant, "seed": seed},
        "data": {"name": cfg.data.name, "corpus": "multi30k", "src_lang": "en", "tgt_lang": "de"},
        "model": {"name": cfg.model.name, "params": 9_000_000, "config": plain["model"]},
        "trainer": {"label_smoothing": cfg.trainer.label_smoothing,
                    "max_steps": cfg.trainer.max_steps},
        "steps": trained, "run_config": plain,
        "decode": {k: plain["decode"][k] for k in (
            "beam_size", "lenpen", "lenpen_form", "stopping", "max_len_a", "max_len_b",
            "nbest", "max_tokens", "max_input_tokens", "precision", "engine")},
        "test_sets": {"valid": {"bleu": {"paper_bleu": _entry("paper_bleu", bleu),
                                         "sacrebleu": _entry("sacrebleu", bleu - 1)},
                                "chrf": _entry("chrf", 50.0)}},
        "train_summary": {"steps": trained, "stopped_by": stopped_by, "valid": {"ppl": 20.0}},
    }


def _write(tmp_path, results: dict[str, dict]) -> list[dict]:
    out = []
    for name, r in results.items():
        path = tmp_path / "runs" / "table3_proxy" / "table3" / name / "results.json"
        path.parent.mkdir(parents=True)
        path.write_text(json.dumps(r))
        out.append({**r, "_path": str(path)})
    return out


def _line(text: str, start: str) -> list[str]:
    return [x for x in text.splitlines() if x.startswith(start)]


def test_base_runs_with_other_steps_or_d_model_are_not_pooled(tmp_path):
    """Three results of row "base" at 10 steps, 40 steps and d_model 128: three rows, each
    with one seed; none is pooled into another, and no seed noise is claimed."""
    results = _write(tmp_path, {
        "base_a": fake_row("base", 1, 20.0, "trainer.max_steps=10"),
        "base_b": fake_row("base", 2, 24.0, "trainer.max_steps=40"),
        "base_c": fake_row("base", 3, 16.0, "trainer.max_steps=40", "model.d_model=128"),
    })
    [lines] = table3_lines(results).values()
    assert [len(x.runs) for x in lines] == [1, 1, 1]
    text = build_report(results, ["table3"])
    assert "seed noise of the base row" not in text
    rows = _line(text, "| base |")
    assert len(rows) == 3 and all("| 1 |" in row for row in rows)
    # each row that is not the base recipe names what differs from it
    assert sum("other settings than the base recipe gives this row" in r for r in rows) == 2
    assert any("model.d_model=128" in r for r in rows)


def test_true_seeds_of_the_base_recipe_are_pooled_and_give_the_noise(tmp_path):
    """Base seeds 1, 2, 3 (BLEU 20, 22, 24) pool into one row (noise ± 2.00); a base run at 40
    steps stays apart; the A_h1 row made from the base recipe gets Δ, one at 40 steps not."""
    results = _write(tmp_path, {
        "base_seed1": fake_row("base", 1, 20.0),
        "base_seed2": fake_row("base", 2, 22.0),
        "base_seed3": fake_row("base", 3, 24.0),
        "base_40": fake_row("base", 1, 30.0, "trainer.max_steps=40"),
        "A_h1_seed1": fake_row("A_h1", 1, 21.0),
        "A_h1_40": fake_row("A_h1", 1, 29.0, "trainer.max_steps=40"),
    })
    lines = table3_lines(results)["table3_proxy"]
    base = base_line(lines)
    assert base is not None and sorted(base.values("paper_bleu")) == [20.0, 22.0, 24.0]
    text = build_report(results, ["table3"])
    assert "seed noise of the base row: ± 2.00 BLEU" in text
    [pooled] = [r for r in _line(text, "| base |") if "| 0 (base) | 0 (base) |" in r]
    assert "| 3 |" in pooled and "| 22.00 ± 2.00 |" in pooled
    h1 = _line(text, "| A | h=1")
    assert len(h1) == 2
    assert "| -1.00 |" in h1[0] and h1[0].endswith("| -0.9 |  |")
    assert "| – | -0.9 |" in h1[1] and "trainer.max_steps=40" in h1[1]


def test_a_row_is_compared_only_when_it_is_its_change_of_the_base_recipe():
    """The recipe an A_h1 run should have is the base recipe with one head; a run with one head
    and another dropout differs in model.dropout only."""
    base = recipe(fake_row("base", 1, 20.0))
    h1 = fake_row("A_h1", 1, 20.0)
    assert row_recipe(base, h1["run_config"]["table3"]) == recipe(h1)
    other = recipe(fake_row("A_h1", 1, 20.0, "model.dropout=0.3"))
    expected = row_recipe(base, h1["run_config"]["table3"])
    assert {k for k in other if other[k] != expected[k]} == {"model.dropout"}
    # paths, logging, workers and the seed are not part of a run's identity
    assert recipe(fake_row("base", 2, 20.0, "data.root=/elsewhere", "trainer.log_every_steps=7",
                           "data.num_workers=5")) == base


def test_a_short_run_is_marked_and_left_out_of_delta_and_noise(tmp_path):
    """A base run stopped by Ctrl-C at step 68 of 1000 is its own row, "short: 68 of 1000
    steps", and neither the base of Δ nor part of the noise; with no complete base row no
    row gets a Δ."""
    results = _write(tmp_path, {
        "base_seed1": fake_row("base", 1, 9.0, steps=68, stopped_by="signal SIGINT"),
        "A_h1_seed1": fake_row("A_h1", 1, 21.0),
    })
    text = build_report(results, ["table3"])
    [base] = _line(text, "| base |")
    assert "short: 68 of 1,000 steps (signal SIGINT); not in Δ or the seed noise" in base
    assert "| 0 (base) | 0 (base) |" not in base
    [h1] = _line(text, "| A | h=1")
    assert "| – | -0.9 |" in h1
    assert "No base row trained to its step target: no Δ." in text
    # a complete base seed beside the short one: the base, without the short run's BLEU
    results += _write(tmp_path, {"base_seed2": fake_row("base", 2, 20.0)})
    text = build_report(results, ["table3"])
    assert "seed noise of the base row" not in text
    [complete] = [r for r in _line(text, "| base |") if "short" not in r]
    assert "| 1 |" in complete and "| 20.00 |" in complete
    assert "| +1.00 |" in _line(text, "| A | h=1")[0]


def test_configured_rows_without_results_are_listed_as_not_run(tmp_path):
    results = _write(tmp_path, {"base_seed1": fake_row("base", 1, 20.0),
                                "C_N4_seed1": fake_row("C_N4", 1, 20.0)})
    text = build_report(results, ["table3"])
    missing = [row for row in configured_rows() if row not in ("base", "C_N4")]
    assert f"Not run (no results.json): {', '.join(missing)}." in text
    assert missing[:3] == ["A_h1", "A_h4", "A_h16"] and "big" in missing


def test_a_second_result_of_the_same_seed_counts_once(tmp_path):
    """The same seed of the same recipe in two folders is one run (the newer result), not two
    seeds whose spread would pass for seed noise."""
    results = _write(tmp_path, {
        "base_seed1": fake_row("base", 1, 20.0, date="2026-01-01T00:00:00+00:00"),
        "copy_base_seed1": fake_row("base", 1, 20.5, date="2026-02-01T00:00:00+00:00"),
    })
    text = build_report(results, ["table3"])
    [base] = _line(text, "| base |")
    assert "| 1 |" in base and "| 20.50 |" in base and "seed noise of the base" not in text
    assert "Left out as older results of a seed already in its row: " in text
    assert "base_seed1/results.json" in text
