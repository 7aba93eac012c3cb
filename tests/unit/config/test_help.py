"""``--help`` of the console scripts: every setting of the schema has a description, and the
page shows the composed values of the command line (transformer_nmt.config.help)."""

from __future__ import annotations

import pytest

from transformer_nmt.config.help import (
    COMMANDS,
    GROUPS,
    field_descriptions,
    format_value,
    help_overrides,
    help_requested,
    help_text,
    section_keys,
    split_sweeps,
    summary,
)


def test_every_leaf_field_of_the_schema_has_a_description():
    docs = field_descriptions()
    assert len(docs) > 100 and "trainer.max_steps" in docs and "run_dir" in docs
    assert "trainer" not in docs  # a section, not a leaf
    missing = sorted(key for key, doc in docs.items() if not summary(doc).strip())
    assert not missing, f"add a docstring under these fields in config/schema.py: {missing}"


def test_every_command_shows_only_keys_and_groups_that_exist():
    docs = field_descriptions()
    for job, spec in COMMANDS.items():
        keys = [*spec.common, *(k for names in section_keys(spec).values() for k in names)]
        unknown = [k for k in keys if k not in docs]
        assert not unknown, (job, unknown)
        assert len(set(keys)) == len(keys), (job, "a key shown twice")
        assert set(spec.groups) <= set(GROUPS), job


def test_the_page_has_the_composed_values_and_their_descriptions():
    text = help_text("train", ["experiment=smoke", "trainer.precision=fp32"], columns=120)
    lines = text.splitlines()
    line = next(x for x in lines if x.strip().startswith("trainer.max_steps="))
    assert line.split()[0] == "trainer.max_steps=60"  # smoke's, not the default 100000
    assert "Stop after this many optimizer steps" in line
    assert "  trainer.precision=fp32 " in text and "  experiment=smoke " in text
    assert "  run_dir=runs/smoke " in text
    assert "--hydra-help" in text and "--cfg job" in text
    # the most-changed keys come first and are not repeated in their section
    assert text.index("trainer.max_steps=") < text.index("trainer.warmup_steps=")
    assert text.count("\n  trainer.max_steps=") == 1
    assert all(len(x) <= 120 for x in lines if " " in x.strip())


def test_a_table3_row_is_applied_to_the_values_shown():
    text = help_text("train", ["experiment=wmt14_en_de_base", "table3=C_N2"], columns=120)
    assert "model.encoder_layers=2 " in text and "table3=C_N2 " in text


def test_sweeps_are_named_not_composed():
    assert split_sweeps(["a=1", "b=1,2", "table3=glob(*)"]) == (["a=1"], ["b=1,2",
                                                                         "table3=glob(*)"])
    text = help_text("train", ["experiment=smoke", "trainer.max_steps=10,20"], columns=100)
    assert "trainer.max_steps=10,20" in text and "trainer.max_steps=60 " in text


def test_help_flags_and_the_overrides_beside_them():
    assert help_requested(["experiment=smoke", "--help"]) and help_requested(["-h"])
    assert not help_requested(["--hydra-help"]) and not help_requested(["translate.input=-h"])
    args = ["--cfg", "job", "experiment=smoke", "-m", "--info", "a=1", "--help"]
    assert help_overrides(args) == ["experiment=smoke", "a=1"]


@pytest.mark.parametrize("value, text", [
    (None, "null"), (True, "true"), ([0.9, 0.98], "[0.9,0.98]"), ({}, "{}"),
    ("A dog runs.", "'A dog runs.'"), ("runs/x", "runs/x"), ("", "''"),
])
def test_values_are_written_as_overrides(value, text):
    assert format_value(value) == text


def test_summary_drops_asides_only_from_long_sentences():
    assert summary("Stop after N steps (None = no limit). More.") == (
        "Stop after N steps (None = no limit).")
    long = "Round the lengths of training batches up (tensor cores, fewer shapes) to a multiple " \
           "of this; 1 = no rounding (as given). Second sentence."
    assert summary(long) == ("Round the lengths of training batches up to a multiple of this; "
                             "1 = no rounding.")
    assert summary("gnmt: ((5 + |Y|) / 6)^alpha (Wu et al. 2016, the paper). More.") == (
        "gnmt: ((5 + |Y|) / 6)^alpha (Wu et al. 2016, the paper).")
