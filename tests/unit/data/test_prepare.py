"""Data stage: corpora -> clean -> SentencePiece -> binarized files, and its error paths."""

from __future__ import annotations

import gzip
import io
import pickle
import random
import sys
from pathlib import Path

import numpy as np
import pytest
from omegaconf import OmegaConf

from transformer_nmt.config import BOS_ID, EOS_ID, PAD_ID, UNK_ID, compose, to_plain
from transformer_nmt.data import binarize, bpe, clean, corpora
from transformer_nmt.data.binarize import TokenDataset
from transformer_nmt.data.bpe import SentencePieceTokenizer
from transformer_nmt.data.corpora import DataError
from transformer_nmt.data.prepare import prepare
from transformer_nmt.fileio import raw_path, spm_model_path

WORDS_EN = ["the", "a", "man", "woman", "dog", "cat", "runs", "walks", "park", "street", "red",
            "blue", "small", "big", "house"]
WORDS_XX = ["der", "die", "ein", "eine", "mann", "frau", "hund", "katze", "läuft", "geht", "park",
            "straße", "rot", "blau", "haus"]


def write_pairs(prefix: Path, n: int, seed: int = 0, langs=("en", "de")) -> Path:
    """A small synthetic parallel corpus ``<prefix>.en`` / ``<prefix>.de`` (n lines each)."""
    rng = random.Random(seed)
    src, tgt = [], []
    for _ in range(n):
        k = rng.randint(3, 12)
        idx = [rng.randrange(len(WORDS_EN)) for _ in range(k)]
        src.append(" ".join(WORDS_EN[i] for i in idx) + " .")
        tgt.append(" ".join(WORDS_XX[i] for i in idx) + " .")
    prefix.parent.mkdir(parents=True, exist_ok=True)
    Path(f"{prefix}.{langs[0]}").write_text("\n".join(src) + "\n", encoding="utf-8")
    Path(f"{prefix}.{langs[1]}").write_text("\n".join(tgt) + "\n", encoding="utf-8")
    return prefix


def custom_cfg(tmp_path: Path, n_train: int = 300, **over):
    corpus = tmp_path / "corpus"
    write_pairs(corpus / "train", n_train, seed=1)
    write_pairs(corpus / "valid", 20, seed=2)
    write_pairs(corpus / "test", 20, seed=3)
    overrides = [
        "data=custom", "data.name=toy", "data.src_lang=en", "data.tgt_lang=de",
        f"data.root={tmp_path / 'data'}", "data.vocab_size=60", "data.num_workers=1",
        f"+data.custom_files.train={corpus / 'train'}",
        f"+data.custom_files.valid={corpus / 'valid'}",
        f"+data.custom_files.test={corpus / 'test'}",
    ] + [f"data.{k}={v}" for k, v in over.items()]
    return compose(overrides)


def leftovers(root: Path) -> list[Path]:
    """Temporary files of atomic writes that a failure left behind."""
    return [p for p in root.rglob("*") if p.name.endswith(".tmp")] if root.exists() else []


# --- cleaning rules --------------------------------------------------------------------------


def test_normalize_removes_controls_and_collapses_whitespace():
    raw = "\ufeffA\u00a0cafe\u0301\tis \x00open\r  \u200bhere\x85 ﬁne "
    out = clean.normalize(raw, "NFKC")
    assert out == "A café is open here fine"
    assert clean.normalize(out, "NFKC") == out  # idempotent
    assert clean.normalize("cafe\u0301", "none") == "cafe\u0301"
    assert clean.normalize("cafe\u0301", "NFC") == "caf\u00e9"


def test_pair_filter_counts_each_rule_in_order():
    f = clean.PairFilter(max_len=5, max_ratio=1.5, ratio_min_len=4, dedup=True)
    pairs = [
        ("", "x"),                                   # empty
        ("a b c d e f", "a b c d e f"),              # too_long (6 > 5)
        ("a b c d", "a b"),                          # ratio 2 > 1.5, longer side 4 >= 4
        ("a b c", "a"),                              # ratio 3 but longer side 3 < 4: kept
        ("a b c", "a"),                              # duplicate of the previous kept pair
        ("a b", "a b"),                              # kept
    ]
    rules = [f.rule(s, t) for s, t in pairs]
    assert rules == ["empty", "too_long", "ratio", None, "duplicate", None]
    assert f.counts == {"empty": 1, "too_long": 1, "ratio": 1, "duplicate": 1}


def test_reservoir_sample_is_bounded_seeded_and_covers_the_stream():
    lines = [f"line {i}" for i in range(1000)] + [""]
    sample, seen = bpe.reservoir_sample(iter(lines), 50, seed=3)
    assert len(sample) == 50 and seen == 1000 and len(set(sample)) == 50
    assert sample == bpe.reservoir_sample(iter(lines), 50, seed=3)[0]
    assert sample != bpe.reservoir_sample(iter(lines), 50, seed=4)[0]
    # late lines are as likely as early ones (not just a prefix)
    assert max(int(s.split()[1]) for s in sample) > 500
    assert bpe.reservoir_sample(iter(lines[:10]), 50, seed=3)[0] == lines[:10]


# --- line splitting: one rule for every reader ------------------------------------------------

CR_TEXT = b"a lone\rcarriage return\nwindows line\r\n\r\nlast\rline without newline"
CR_LINES = ["a lone\rcarriage return", "windows line", "", "last\rline without newline"]


def test_one_line_splitting_rule_for_data_and_translate(tmp_path, monkeypatch):
    """\\n ends a line, \\r\\n is accepted as its ending, a lone \\r stays in the line."""
    from transformer_nmt import fileio
    from transformer_nmt.decode import translate

    plain, packed = tmp_path / "in.txt", tmp_path / "in.txt.gz"
    plain.write_bytes(CR_TEXT)
    packed.write_bytes(gzip.compress(CR_TEXT))
    assert list(fileio.read_lines(plain)) == CR_LINES
    assert list(fileio.read_lines(packed)) == CR_LINES
    assert corpora.read_lines is fileio.read_lines and clean.read_lines is fileio.read_lines
    assert translate.read_input(plain) == CR_LINES
    assert len(CR_TEXT.splitlines()) == 6  # what splitting on every separator would give

    class Stdin:
        buffer = io.BytesIO(CR_TEXT)

    monkeypatch.setattr(sys, "stdin", Stdin)
    assert translate.read_input(None) == CR_LINES


def test_translate_reader_errors_name_file_and_line(tmp_path):
    from transformer_nmt.decode import translate

    bad = tmp_path / "bad.en"
    bad.write_bytes(b"fine\r\ncaf\xe9\n")
    with pytest.raises(ValueError, match=rf"{bad}, line 2: invalid UTF-8 at byte 3") as err:
        translate.read_input(bad)
    assert "data.encoding_errors" not in str(err.value)  # not a data-stage setting here
    with pytest.raises(FileNotFoundError, match="nowhere.en"):
        translate.read_input(tmp_path / "nowhere.en")


def test_translate_file_writes_one_line_per_input_line(tmp_path):
    """A carriage return inside a line gives no extra output line (the output stays aligned)."""
    import torch

    from transformer_nmt.config import DecodeConfig, ModelConfig
    from transformer_nmt.decode.translate import translate_file
    from transformer_nmt.model.transformer import Transformer

    class CharTokenizer:
        def encode(self, text):
            return [4 + ord(c) % 20 for c in text]

        def decode(self, ids):
            return " ".join(str(i) for i in ids)

    torch.manual_seed(0)
    cfg = ModelConfig(name="test", encoder_layers=1, decoder_layers=1, d_model=16, d_ff=32,
                      heads=2, dropout=0.0, max_positions=128)
    model = Transformer(cfg, vocab_size=24).eval()
    src, out = tmp_path / "in.en", tmp_path / "out.de"
    src.write_bytes(CR_TEXT)
    decode = DecodeConfig(beam_size=2, max_len_a=0.0, max_len_b=3)
    stats = translate_file(model, CharTokenizer(), decode, "cpu", src, out)
    assert stats["sentences"] == len(CR_LINES)
    written = len(out.read_bytes().split(b"\n")) - 1
    assert written == len(CR_LINES) == len(list(corpora.read_lines(src)))
    assert b"\r" not in out.read_bytes()


# --- bad input ---------------------------------------------------------------------------------


def test_invalid_utf8_strict_names_file_and_line(tmp_path):
    cfg = custom_cfg(tmp_path)
    bad = Path(cfg.data.custom_files["train"] + ".de")
    lines = bad.read_bytes().split(b"\n")
    lines[6] = b"caf\xe9 au lait"
    bad.write_bytes(b"\n".join(lines))
    with pytest.raises(DataError) as err:
        prepare(cfg)
    assert str(bad) in str(err.value) and "line 7" in str(err.value)
    root = Path(cfg.data.root)
    assert not raw_path(cfg.data, "train", "en").exists()
    assert not raw_path(cfg.data, "train", "de").exists()
    assert not clean.report_path(cfg.data).exists() and leftovers(root) == []


def test_invalid_utf8_replace_policy(tmp_path):
    cfg = custom_cfg(tmp_path, encoding_errors="replace")
    bad = Path(cfg.data.custom_files["valid"] + ".en")
    bad.write_bytes(b"caf\xe9 au lait\n" + b"\n".join(bad.read_bytes().split(b"\n")[1:]))
    summary = prepare(cfg)
    assert raw_path(cfg.data, "valid", "en").read_text().splitlines()[0] == "caf\ufffd au lait"
    assert summary["pairs"]["valid"]["invalid_utf8_lines"] == 1


def test_line_count_mismatch_names_both_files_and_counts(tmp_path):
    cfg = custom_cfg(tmp_path)
    src = Path(cfg.data.custom_files["valid"] + ".en")
    tgt = Path(cfg.data.custom_files["valid"] + ".de")
    src.write_text(src.read_text() + "one more line\nand another\n")
    with pytest.raises(DataError) as err:
        prepare(cfg)
    msg = str(err.value)
    assert f"{src} has 22 lines" in msg and f"{tgt} has 20 lines" in msg
    # the failing split left nothing behind; nothing looks finished
    assert not raw_path(cfg.data, "valid", "en").exists()
    assert not clean.report_path(cfg.data).exists()
    assert leftovers(Path(cfg.data.root)) == []
    # the target side longer: reported the other way round
    src.write_text("\n".join(src.read_text().splitlines()[:19]) + "\n")
    with pytest.raises(DataError, match=f"{src} has 19 lines but {tgt} has 20 lines"):
        prepare(cfg)


def test_missing_file_and_unknown_corpus(tmp_path):
    cfg = custom_cfg(tmp_path)
    Path(cfg.data.custom_files["test"] + ".de").unlink()
    with pytest.raises(DataError, match=r"file not found: .*test\.de"):
        prepare(cfg)
    cfg.data.test_splits = ["other"]
    with pytest.raises(DataError, match="no entry for split 'other'"):
        prepare(cfg)
    # the typed config refuses the value; an untyped one (from code) reaches fetch's check
    untyped = OmegaConf.create(to_plain(cfg.data))
    untyped.corpus = "europarl"
    with pytest.raises(DataError, match="unknown corpus data.corpus='europarl'"):
        corpora.fetch(untyped)
    from hydra.errors import ConfigCompositionException

    with pytest.raises(ConfigCompositionException, match="europarl"):
        compose(["data=europarl"])
    mirror = compose(["data=multi30k_en_de", f"data.mirror={tmp_path / 'nowhere'}"])
    with pytest.raises(DataError, match="mirror folder not found"):
        corpora.fetch(mirror.data)


def test_corpus_empty_after_filtering(tmp_path):
    cfg = custom_cfg(tmp_path, max_len=2)  # every synthetic sentence has >= 4 words
    with pytest.raises(DataError) as err:
        prepare(cfg)
    msg = str(err.value)
    assert "'train' is empty after cleaning" in msg and "too_long" in msg
    assert cfg.data.custom_files["train"] in msg
    assert not any((Path(cfg.data.root) / "raw").rglob("train.*"))
    assert leftovers(Path(cfg.data.root)) == []


def test_vocabulary_too_large_is_a_clear_error(tmp_path):
    cfg = custom_cfg(tmp_path, vocab_size=5000)
    with pytest.raises(DataError, match="vocab_size=5000"):
        prepare(cfg)
    assert not spm_model_path(cfg.data).exists() and leftovers(Path(cfg.data.root)) == []


# --- binarized files -----------------------------------------------------------------------------


def test_parallel_binarize_matches_serial_and_reads_back(tmp_path):
    cfg = custom_cfg(tmp_path)
    prepare(cfg)
    text = raw_path(cfg.data, "train", "de")
    model = spm_model_path(cfg.data)
    tok = SentencePieceTokenizer(model)
    a, b = tmp_path / "serial", tmp_path / "parallel"
    binarize.binarize_files([(text, a)], model, tok.vocab_size, num_workers=1)
    binarize.binarize_files([(text, b)], model, tok.vocab_size, num_workers=2, chunk_lines=7)
    assert Path(f"{a}.bin").read_bytes() == Path(f"{b}.bin").read_bytes()
    assert Path(f"{a}.idx").read_bytes() == Path(f"{b}.idx").read_bytes()
    ds = TokenDataset(b)
    lines = text.read_text(encoding="utf-8").splitlines()
    assert len(ds) == len(lines) and ds.sizes.dtype == np.int64
    for i in (0, 17, len(ds) - 1, -1):
        assert ds[i].dtype == np.int64 and ds[i].tolist() == tok.encode(lines[i])
        assert ds.sizes[i] == len(ds[i])
    with pytest.raises(IndexError):
        ds[len(ds)]
    clone = pickle.loads(pickle.dumps(ds))
    assert len(pickle.dumps(ds)) < 1000 and clone[5].tolist() == ds[5].tolist()


def test_parallel_binarize_under_the_run_lock_ends_every_time(tmp_path):
    """nmt-prepare binarizes while it holds the run lock, whose SIGTERM handler exits through
    Python; the forked encoder workers inherited it, and the pool's terminate then waited
    forever for a worker blocked in a lock (about one run in seven). Workers die on SIGTERM as
    by default, and binarizing ends every time."""
    import multiprocessing as mp
    import signal
    import subprocess

    from transformer_nmt.run.lock import _released_on_sigterm

    cfg = custom_cfg(tmp_path)
    prepare(cfg)
    text = raw_path(cfg.data, "train", "de")
    model = spm_model_path(cfg.data)
    with _released_on_sigterm():
        assert signal.getsignal(signal.SIGTERM) is not signal.SIG_DFL
        ctx = mp.get_context("fork")
        with ctx.Pool(1, binarize._init_worker, (str(model), "uint16")) as pool:
            assert pool.apply(signal.getsignal, (signal.SIGTERM,)) == signal.SIG_DFL
    script = (
        "import sys; from pathlib import Path\n"
        "from transformer_nmt.data.binarize import binarize_files\n"
        "from transformer_nmt.run.lock import _released_on_sigterm\n"
        "for i in range(20):\n"
        "    with _released_on_sigterm():\n"
        f"        binarize_files([(Path({str(text)!r}), Path({str(tmp_path)!r}) / f'o{{i}}')],\n"
        f"                       Path({str(model)!r}), 8000, num_workers=2, chunk_lines=16)\n")
    subprocess.run([sys.executable, "-c", script], check=True, timeout=120)


def test_token_dataset_int32_width_and_inconsistent_files(tmp_path):
    prefix = tmp_path / "big"
    seqs = [[70000, 5], [], [3, 65535, 1]]
    Path(f"{prefix}.bin").write_bytes(np.array([i for s in seqs for i in s],
                                               dtype=np.int32).tobytes())
    offsets = np.cumsum([0] + [len(s) for s in seqs]).astype(np.int64)
    Path(f"{prefix}.idx").write_bytes(offsets.tobytes())
    ds = TokenDataset(prefix)
    assert [ds[i].tolist() for i in range(len(ds))] == seqs and ds.sizes.tolist() == [2, 0, 3]
    assert binarize.id_dtype(65536) == np.int32 and binarize.id_dtype(65535) == np.uint16
    Path(f"{prefix}.bin").write_bytes(b"\x00" * 7)
    with pytest.raises(DataError, match="do not hold the 5 ids"):
        TokenDataset(prefix)


def test_tokenizer_special_ids_and_decode(tmp_path):
    cfg = custom_cfg(tmp_path)
    prepare(cfg)
    tok = SentencePieceTokenizer(spm_model_path(cfg.data))
    assert (tok.pad_id, tok.unk_id, tok.bos_id, tok.eos_id) == (PAD_ID, UNK_ID, BOS_ID, EOS_ID)
    ids = tok.encode("the  dog\u00a0runs .")
    assert BOS_ID not in ids and EOS_ID not in ids
    assert tok.decode([BOS_ID, *ids, EOS_ID, PAD_ID, PAD_ID]) == "the dog runs ."
    assert tok.encode_batch(["the dog runs .", "a cat"]) == [ids, tok.encode("a cat")]
    assert UNK_ID in tok.encode("ж")  # a character never seen in training


# --- sources: WMT14 (datasets + sacreBLEU) and Multi30k by URL, without the network -----------


def test_wmt14_streams_records_and_adds_filtered_newstest2014(tmp_path, monkeypatch):
    import datasets
    import sacrebleu.utils

    calls = []

    def fake_load_dataset(name, config, split, streaming=False):
        calls.append((name, config, split, streaming))
        n = {"train": 500, "validation": 30, "test": 40}[split]
        rng = random.Random(split)

        def records():  # a one-pass iterable, as streaming returns
            for i in range(n):
                k = rng.randint(2, 8)
                en = " ".join(rng.choice(WORDS_EN) for _ in range(k))
                yield {"translation": {"de": f"{split} {i} {en}\nzwei", "en": f"{split} {i} {en}"}}

        return records()

    def fake_download_test_set(test_set, langpair):
        assert test_set in ("wmt14", "wmt14/full") and langpair == "en-de"
        n = 27 if test_set == "wmt14" else 40
        paths = []
        for lang in ("en", "de"):
            p = tmp_path / "sacrebleu" / test_set / f"en-de.{lang}"
            p.parent.mkdir(parents=True, exist_ok=True)
            p.write_bytes("".join(f"„{test_set}“ {i} {lang}\u00a0…\n" for i in range(n)).encode())
            paths.append(str(p))
        return paths

    monkeypatch.setattr(datasets, "load_dataset", fake_load_dataset)
    monkeypatch.setattr(sacrebleu.utils, "download_test_set", fake_download_test_set)
    monkeypatch.setattr(corpora, "WMT14_OFFICIAL_LINES",  # the stand-ins' sizes
                        {("newstest2014", "de"): 40, ("newstest2014_filtered", "de"): 27})
    cfg = compose(["data=wmt14_en_de", f"data.root={tmp_path / 'data'}", "data.vocab_size=80",
                   "data.num_workers=2", "data.max_train_pairs=300"])
    summary = prepare(cfg)
    assert all(c[:2] == ("wmt/wmt14", "de-en") and c[3] for c in calls)
    assert {c[2] for c in calls} == {"train", "validation"}  # test sets come from sacreBLEU
    assert summary["sentences"] == {"train": summary["pairs"]["train"]["kept"],
                                    "newstest2013": 30, "newstest2014": 40,
                                    "newstest2014_filtered": 27}
    assert summary["pairs"]["train"]["read"] == 300
    # the official references: sacreBLEU's bytes, untouched by cleaning
    for split, test_set in (("newstest2014", "wmt14/full"), ("newstest2014_filtered", "wmt14")):
        assert (corpora.reference_path(cfg.data, split, "de").read_bytes()
                == (tmp_path / "sacrebleu" / test_set / "en-de.de").read_bytes())
    assert "\u00a0" not in raw_path(cfg.data, "newstest2014", "de").read_text()  # cleaned copy
    # a newline inside a record does not break the alignment
    assert raw_path(cfg.data, "newstest2013", "de").read_text().splitlines()[3].endswith("zwei")
    calls.clear()
    assert prepare(cfg)["stages"]["download"]["status"] == "skipped" and calls == []


def test_multi30k_by_url_downloads_official_names(tmp_path, monkeypatch):
    site = tmp_path / "site"
    for official, n in (("train", 200), ("val", 20), ("test_2016_flickr", 10),
                        ("test_2017_flickr", 10)):
        write_pairs(site / official, n, seed=len(official))
        for lang in ("en", "de"):
            plain = Path(f"{site / official}.{lang}")
            with gzip.open(f"{plain}.gz", "wb") as f:
                f.write(plain.read_bytes())
    cfg = compose(["data=multi30k_en_de", f"data.root={tmp_path / 'data'}", "data.mirror=",
                   f"data.url={site.as_uri()}", "data.vocab_size=60", "data.num_workers=1"])
    monkeypatch.delenv(corpora.MIRROR_ENV, raising=False)
    summary = prepare(cfg)
    assert summary["stages"]["download"]["status"] == "done"
    assert summary["sentences"]["valid"] == 20 and summary["sentences"]["test_2017_flickr"] == 10
    assert (corpora.orig_dir(cfg.data) / "val.de.gz").exists()
    cfg.data.url = (tmp_path / "gone").as_uri()  # already downloaded: no new request
    assert prepare(cfg)["stages"]["download"]["status"] == "skipped"
    (corpora.orig_dir(cfg.data) / "val.de.gz").unlink()
    with pytest.raises(DataError, match=r"could not download .*gone/val\.de\.gz"):
        prepare(cfg)
    assert leftovers(tmp_path / "data") == []


# --- the real thing: a slice of Multi30k ----------------------------------------------------------


def test_prepare_summary_names_every_filter_with_its_values_and_count():
    """nmt-prepare's printed summary says what each training-pair filter tested (the ratio:
    on words, not pieces) and how many pairs it dropped."""
    from transformer_nmt.data.prepare import format_summary

    params = {"max_len": 250, "max_ratio": 1.5, "ratio_min_len": 10, "dedup": True,
              "max_train_pairs": None}
    dropped = {"empty": 3, "too_long": 4, "ratio": 5, "duplicate": 6}
    summary = {
        "name": "wmt14_en_de", "src_lang": "en", "tgt_lang": "de", "vocab_size": 100,
        "pairs": {"train": {"read": 100, "kept": 82, "dropped": dropped},
                  "newstest2013": {"read": 10, "kept": 10, "dropped": {}}},
        "tokens": {s: {"en": 1, "de": 1} for s in ("train", "newstest2013")},
        "unk_rate": {s: {"en": 0.0, "de": 0.0} for s in ("train", "newstest2013")},
        "padding_efficiency": {"max_tokens": 4096, "batches": 1, "value": 0.9},
        "token_filter": {"max_len": 255, "max_positions": 256, "max_tokens": 3600,
                         "split": "train", "dropped": 7},
        "clean_params": params,
    }
    text = format_summary(summary)
    assert "- empty: either side empty after normalisation: 3 dropped" in text
    assert "- too_long: more than 250 words on either side (data.max_len): 4 dropped" in text
    assert ("- ratio: longer / shorter side > 1.5 counted in whitespace words, not pieces, where "
            "the longer side has >= 10 words") in text and "not in the paper): 5 dropped" in text
    assert "- duplicate: the same pair again (data.dedup=True): 6" in text
    assert "training pairs longer than 255 pieces" in text and "7 dropped" in text
    assert "- data.max_train_pairs: all pairs read" in text
