"""A vocabulary is identified by what turns text into ids (pieces, scores, normalizer), and
spm.model records no temporary path: a corpus prepared again with the same settings (a
fresh clone, a deleted data folder) serves the runs trained on it; checkpoints that record
only the file's SHA-256 get a clear message, or resume when their training data is the data
now; nmt-prepare warns when a data.name gets another vocabulary."""

from __future__ import annotations

import logging
import shutil

import pytest
from conftest import write_reversal_corpus
from sentencepiece import sentencepiece_model_pb2

from transformer_nmt.checkpoint import (
    check_vocab,
    latest_checkpoint,
    load_checkpoint,
    save_checkpoint,
)
from transformer_nmt.config import compose
from transformer_nmt.data import bpe
from transformer_nmt.data.prepare import prepare
from transformer_nmt.errors import DataError, UserError
from transformer_nmt.fileio import spm_model_path
from transformer_nmt.train.loop import train


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    return write_reversal_corpus(tmp_path_factory.mktemp("text"),
                                 {"train": 300, "valid": 20, "test": 20})


def _data(root, corpus, *extra: str) -> list[str]:
    return ["experiment=multi30k_en_de", "trainer.lr_scheduler=inverse_sqrt", "data=custom",
            "data.name=shared", "data.src_lang=en", "data.tgt_lang=de",
            f"data.root={root / 'data'}", "data.vocab_size=120", "data.num_workers=1",
            "data.valid_split=valid", "data.test_splits=[test]",
            *(f"+data.custom_files.{s}={corpus / s}" for s in ("train", "valid", "test")),
            *extra]


def _run(root, corpus, tiny_model, *extra: str) -> list[str]:
    return [*_data(root, corpus), *tiny_model, f"run_dir={root / 'run'}",
            "trainer.save_every_steps=2", "trainer.validate_every_steps=null",
            "trainer.max_tokens=512", "trainer.num_workers=0", "trainer.valid_bleu=false", *extra]


def _with_sample_path(model: bytes, path: str) -> bytes:
    """``model`` as an spm.model written before: its trainer_spec names the sample file."""
    proto = sentencepiece_model_pb2.ModelProto.FromString(model)
    proto.trainer_spec.input.append(path)
    return proto.SerializeToString()


def test_a_corpus_prepared_again_serves_the_runs_trained_on_it(tmp_path, corpus, tiny_model):
    run = _run(tmp_path, corpus, tiny_model)
    prepare(compose(run))
    model = spm_model_path(compose(run).data)
    before = model.read_bytes()
    train(compose([*run, "trainer.max_steps=2"]))
    ckpt = latest_checkpoint(tmp_path / "run")
    assert load_checkpoint(ckpt)["vocab"] == bpe.vocab_identity(model)

    shutil.rmtree(tmp_path / "data")  # a fresh clone, a deleted data folder
    prepare(compose(run))
    assert model.read_bytes() == before  # the same settings write the same file
    check_vocab(ckpt, bpe.SentencePieceTokenizer(model))  # translate, evaluate, export
    assert train(compose([*run, "trainer.max_steps=4"]))["steps"] == 4  # resume


def test_the_identity_leaves_out_how_the_model_was_trained(tmp_path, corpus):
    cfg = compose(_data(tmp_path, corpus))
    prepare(cfg)
    model = spm_model_path(cfg.data)
    now = model.read_bytes()
    assert b".spm_sample." not in now
    old = tmp_path / "old.model"  # the same vocabulary as an earlier version wrote it
    old.write_bytes(_with_sample_path(now, str(model.parent / ".spm_sample.k2x9qzva.txt")))
    assert bpe.without_sample_path(old.read_bytes()) == now
    a, b = bpe.vocab_identity(old), bpe.vocab_identity(model)
    assert a["spm_sha256"] != b["spm_sha256"]
    assert a["vocab_sha256"] == b["vocab_sha256"] and a["vocab_size"] == b["vocab_size"] == 120
    assert bpe.same_vocabulary(a, b)
    # a record of the file's SHA-256 only (an older checkpoint) compares the files
    file_only = {"spm_sha256": a["spm_sha256"], "vocab_size": 120}
    assert bpe.same_vocabulary(file_only, a) and not bpe.same_vocabulary(file_only, b)
    assert not bpe.same_vocabulary(dict(b, vocab_sha256="0" * 64), b)
    assert not bpe.same_vocabulary(dict(b, vocab_size=121), b)
    damaged = tmp_path / "damaged.model"
    damaged.write_bytes(now[:50])
    with pytest.raises(DataError, match=f"^{damaged} is not a SentencePiece model"):
        bpe.vocab_identity(damaged)


def test_an_older_checkpoint_gets_a_clear_message_or_resumes_on_the_same_data(
        tmp_path, corpus, tiny_model, caplog):
    run = _run(tmp_path, corpus, tiny_model)
    prepare(compose(run))
    model = spm_model_path(compose(run).data)
    train(compose([*run, "trainer.max_steps=2"]))
    ckpt = latest_checkpoint(tmp_path / "run")
    state = load_checkpoint(ckpt)
    # trained on the same vocabulary as an earlier version wrote it (another file SHA-256)
    old = _with_sample_path(model.read_bytes(), "/old/.spm_sample.k2x9qzva.txt")
    import hashlib

    state["vocab"] = {"spm_sha256": hashlib.sha256(old).hexdigest(), "vocab_size": 120}
    save_checkpoint(ckpt, state)
    with pytest.raises(DataError) as e:
        check_vocab(ckpt, bpe.SentencePieceTokenizer(model))
    here = bpe.vocab_identity(model)
    assert str(e.value) == (
        f"{ckpt} was trained with another vocabulary than {model} (checkpoint: 120 pieces, "
        f"spm.model file sha256 {state['vocab']['spm_sha256'][:12]}; tokenizer: 120 pieces, "
        f"spm.model file sha256 {here['spm_sha256'][:12]}); that checkpoint records only the "
        "SHA-256 of its spm.model file (it was written before the vocabulary's own identity "
        "was recorded), and an spm.model prepared before that recorded the random path of its "
        "training sample, so the same corpus prepared again has another file: use the "
        "spm.model file the model was trained with")
    # its training data is the data now, token for token: the run resumes
    with caplog.at_level(logging.INFO, logger="transformer_nmt.train.resume"):
        assert train(compose([*run, "trainer.max_steps=3"]))["steps"] == 3
    assert "the training data it records is the data now" in caplog.text
    # other training data too: refused with the same explanation
    ckpt = latest_checkpoint(tmp_path / "run")
    state = load_checkpoint(ckpt)
    state["vocab"] = {"spm_sha256": "f" * 64, "vocab_size": 120}
    state["data"] = dict(state["data"], sha256="e" * 64)
    save_checkpoint(ckpt, state)
    with pytest.raises(UserError, match=r"run was trained with another vocabulary \(checkpoint_3"
                       r"\.pt: 120 pieces, spm\.model file sha256 ffffffffffff; the data now: "
                       r"120 pieces, spm\.model file sha256 [0-9a-f]{12}\); that checkpoint "
                       r"records only .*: resume it with the spm\.model file it was trained "
                       r"with, or give a new run another run_dir= or name=$"):
        train(compose([*run, "trainer.max_steps=4"]))


def test_prepare_warns_when_a_data_name_gets_another_vocabulary(tmp_path, corpus, caplog):
    data = _data(tmp_path, corpus)
    prepare(compose(data))
    model = spm_model_path(compose(data).data)
    first = bpe.vocab_identity(model)
    with caplog.at_level(logging.WARNING, logger="transformer_nmt.data.prepare"):
        model.with_name("spm.stamp.json").unlink()  # rebuilt: the same vocabulary, no word
        prepare(compose(data))
        assert "another vocabulary" not in caplog.text
        prepare(compose([*data, "data.lowercase=true", "data.vocab_size=110"]))
    now = bpe.vocab_identity(model)
    assert caplog.text.count("another vocabulary") == 1
    assert (f"{model} now holds another vocabulary than before (data.lowercase: False -> True; "
            f"data.vocab_size: 120 -> 110; before: 120 pieces, sha256 "
            f"{first['vocab_sha256'][:12]}; now: 110 pieces, sha256 {now['vocab_sha256'][:12]}): "
            "runs trained on the earlier one can no longer translate, evaluate, export or "
            "resume with data.name=shared; give data prepared with other settings its own "
            "data.name") in caplog.text
