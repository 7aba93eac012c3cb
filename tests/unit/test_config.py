"""The Hydra configs compose, are typed, and reject bad keys and values with clear messages."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from hydra.errors import ConfigCompositionException
from omegaconf import OmegaConf

from transformer_nmt.config import CONFIG_DIR, compose, to_plain

EXPERIMENTS = sorted(p.stem for p in (Path(CONFIG_DIR) / "experiment").glob("*.yaml"))


@pytest.mark.parametrize("experiment", EXPERIMENTS)
def test_every_experiment_composes(experiment):
    cfg = compose([f"experiment={experiment}"])
    assert cfg.name == experiment
    assert cfg.run_dir == f"runs/{experiment}"


def test_paper_presets():
    base = compose(["experiment=wmt14_en_de_base"])
    assert (base.model.d_model, base.model.d_ff, base.model.heads) == (512, 2048, 8)
    assert base.data.vocab_size == 37000 and base.trainer.max_steps == 100_000
    assert list(base.trainer.adam_betas) == [0.9, 0.98] and base.trainer.adam_eps == 1e-9
    big = compose(["experiment=wmt14_en_de_big"])
    assert (big.model.d_model, big.model.d_ff, big.model.heads) == (1024, 4096, 16)
    assert big.model.dropout == 0.3 and big.average.last == 20
    assert compose(["experiment=wmt14_en_fr_big"]).model.dropout == 0.1
    assert compose(["experiment=wmt14_en_fr_base"]).data.vocab_size == 32000
    # The batch is a target (section 5.1), checkpoints spaced in steps (10 min at the paper's pace).
    assert (base.trainer.tokens_per_step, base.trainer.save_every_steps) == (25_000, 1400)
    assert (big.trainer.tokens_per_step, big.trainer.save_every_steps) == (25_000, 600)
    assert base.trainer.save_every_minutes is None and big.trainer.save_every_minutes is None
    # Ott et al. 2018: ~400k tokens per step at a peak learning rate of 1e-3 (warm-up 4000).
    ott = compose(["experiment=wmt14_en_de_big_ott2018"]).trainer
    assert ott.tokens_per_step == 400_000
    peak = 1024 ** -0.5 * ott.warmup_steps ** -0.5 * ott.lr_multiplier
    assert peak == pytest.approx(1e-3, rel=1e-3)


def test_misspelt_key_names_the_key():
    with pytest.raises(ConfigCompositionException) as err:
        compose(["trainer.max_stepz=3"])
    assert "max_stepz" in str(err.value)


def test_wrong_type_names_the_value():
    with pytest.raises(Exception) as err:
        compose(["trainer.max_steps=abc"])
    text = str(err.value) + str(err.value.__cause__)
    assert "abc" in text


@pytest.mark.parametrize(
    "override, fragment",
    [
        ("model.heads=7", "model.heads=7"),
        ("model.dropout=1.0", "model.dropout=1.0"),
        ("trainer.max_time_minutes=-1", "trainer.max_time_minutes=-1.0"),
        ("data.tgt_lang=en", "data.src_lang='en' equals data.tgt_lang='en'"),
        ("trainer.update_freq=0", "trainer.update_freq=0"),
        ("decode.max_tokens=0", "decode.max_tokens=0"),
        ("decode.nbest=9", "decode.nbest=9"),
        ("decode.sync_every=0", "decode.sync_every='0' must be auto or a whole number >= 1"),
        ("decode.sync_every=often", "decode.sync_every='often' must be auto or a whole number"),
        ("decode.compile=sometimes", "decode.compile='sometimes' must be auto, true or false"),
        ("trainer.label_smoothing=-0.1", "trainer.label_smoothing=-0.1"),
    ],
)
def test_semantic_validation_names_the_value(override, fragment):
    with pytest.raises(ValueError) as err:
        compose([override])
    assert fragment in str(err.value)


@pytest.mark.parametrize("override", ["trainer.max_time_minutes=-1", "data.tgt_lang=en"])
def test_single_bad_value_is_one_line(override):
    with pytest.raises(ValueError) as err:
        compose([override])
    assert "\n" not in str(err.value) and str(err.value).startswith("invalid configuration: ")


@pytest.mark.parametrize(
    "key, bad, choices",
    [
        ("model.norm", "sandwich", "[post, pre]"),
        ("model.positions", "rope", "[sinusoidal, learned]"),
        ("data.corpus", "europarl", "[multi30k, wmt14, custom]"),
        ("data.unicode_form", "NFX", "[NFC, NFKC, NFD, NFKD, none]"),
        ("trainer.precision", "fp8", "[auto, fp32, bf16, fp16]"),
        ("decode.precision", "auto", "[fp32, bf16, fp16, int8]"),
        ("decode.lenpen_form", "marian", "[gnmt, fairseq]"),
        ("decode.stopping", "never", "[bound, beam]"),
        ("trainer.lr_scheduler", "step", "[inverse_sqrt, cosine, linear]"),
    ],
)
def test_bad_choice_fails_at_composition_naming_the_key(key, bad, choices):
    with pytest.raises(ConfigCompositionException) as err:
        compose([f"{key}={bad}"])
    text = str(err.value) + str(err.value.__cause__)
    assert f"full_key: {key}" in text and f"Invalid value '{bad}'" in text and choices in text


def test_choices_compare_and_print_as_strings():
    cfg = compose(["model.norm=pre", "trainer.precision=bf16"])
    assert cfg.model.norm == "pre" and cfg.trainer.precision in ("bf16", "fp16")
    assert f"{cfg.model.norm}" == str(cfg.model.norm) == "pre"
    assert {"bf16": 1}[cfg.trainer.precision] == 1
    assert "norm: pre" in OmegaConf.to_yaml(cfg)
    plain = to_plain(cfg)  # what a checkpoint stores
    assert type(plain["model"]["norm"]) is str and plain["model"]["norm"] == "pre"


def test_table3_variants_are_overrides():
    cfg = compose(
        ["experiment=wmt14_en_de_base", "model.heads=16", "model.d_k=32", "model.d_v=32",
         "model.positions=learned", "trainer.label_smoothing=0.2"]
    )
    assert cfg.model.heads == 16 and cfg.model.positions == "learned"


@pytest.mark.parametrize("experiment", ["wmt14_en_de_base", "wmt14_en_de_big",
                                        "wmt14_en_fr_base", "wmt14_en_fr_big"])
def test_gpu_presets_collate_in_prefetching_workers(experiment):
    """The GPU experiments collate and pin in DataLoader workers that prefetch, not on the
    training thread between steps; on CUDA the lengths are rounded and the step compiled."""
    from transformer_nmt.train.setup import compile_enabled, resolve_pad_to_multiple

    t = compose([f"experiment={experiment}"]).trainer
    assert t.num_workers >= 2 and t.prefetch_factor >= 2
    cuda = torch.device("cuda", 0)
    assert compile_enabled(t.compile, cuda)
    assert resolve_pad_to_multiple(t.pad_to_multiple, cuda) == 8


def test_loader_workers_are_capped_at_the_cpus_left_to_them():
    from transformer_nmt.train.setup import loader_workers

    assert loader_workers(4, cpus=16) == 4
    assert loader_workers(4, cpus=2) == 1  # the training thread keeps one core
    assert loader_workers(0, cpus=16) == 0 and loader_workers(2, cpus=1) == 0
