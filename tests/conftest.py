"""Shared fixtures: a synthetic parallel corpus prepared once, the tiny model, a decoding
workspace (SentencePiece model and test text), the real Multi30k text (a local mirror, or a
cache filled once by the project's downloader: multi30k_source.py) for the tests that need
it, and ``--update-golden``."""

from __future__ import annotations

import random
from dataclasses import dataclass
from pathlib import Path

import multi30k_source
import pytest
from helpers import TINY_MODEL, make_cfg, sentences

SYNTHETIC_SIZES = {"train": 2000, "valid": 100, "test": 100}
SYNTHETIC_VOCAB = 200


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--update-golden", action="store_true", default=False,
                     help="rewrite tests/data/golden_*.json from this run instead of comparing")


@pytest.fixture(autouse=True)
def one_thread():
    """Every test on one CPU thread, as the training subprocesses (OMP_NUM_THREADS=1): tiny
    models gain nothing from threads, and on busy shared cores a second thread only waits."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="session")
def update_golden(request: pytest.FixtureRequest) -> bool:
    """True under ``pytest --update-golden``: golden files are rewritten, not compared."""
    return bool(request.config.getoption("--update-golden"))


@pytest.fixture(scope="session")
def multi30k_mirror() -> Path:
    """Folder with the real Multi30k files (train.en.gz, ...): the local mirror, else the
    user's cache folder, downloaded into once from the official URL; the tests that need it
    skip, with the reason, when neither works (:func:`multi30k_source.locate`)."""
    folder, reason = multi30k_source.locate(multi30k_source.default_mirror(),
                                            multi30k_source.official_url(),
                                            multi30k_source.default_cache())
    if folder is None:
        pytest.skip(reason)
    return folder


@pytest.fixture(scope="session")
def tiny_model() -> list[str]:
    """Overrides for the one tiny model of the tests (d_model 32, 2 heads, 1 + 1 layers)."""
    return list(TINY_MODEL)


def write_reversal_corpus(folder: Path, sizes: dict[str, int] = SYNTHETIC_SIZES,
                          seed: int = 0) -> Path:
    """Write ``<folder>/<split>.en`` / ``.de``: random strings of 3-12 made-up words, the
    target the source in reverse order.

    The words come from a fixed list of 400 letter strings (2-7 letters) with Zipf's
    frequencies (weight 1/rank, as in natural text), so SentencePiece finds a few hundred
    pieces and a tiny model's loss falls within a few dozen steps; the same seed gives the
    same files on every machine.
    """
    rng = random.Random(seed)
    letters = "abcdefghijklmnopqrstuvwxyz"
    words = sorted({"".join(rng.choice(letters) for _ in range(rng.randint(2, 7)))
                    for _ in range(400)})
    zipf = [1.0 / rank for rank in range(1, len(words) + 1)]
    folder.mkdir(parents=True, exist_ok=True)
    for split, n in sizes.items():
        src, tgt = [], []
        for _ in range(n):
            sentence = rng.choices(words, weights=zipf, k=rng.randint(3, 12))
            src.append(" ".join(sentence))
            tgt.append(" ".join(reversed(sentence)))
        (folder / f"{split}.en").write_text("\n".join(src) + "\n", encoding="utf-8")
        (folder / f"{split}.de").write_text("\n".join(tgt) + "\n", encoding="utf-8")
    return folder


@dataclass(frozen=True)
class SyntheticCorpus:
    """A prepared ``data=custom`` corpus (see :func:`synthetic_corpus`)."""

    files: Path
    """Folder with the text files ``<split>.en`` / ``<split>.de``."""
    overrides: tuple[str, ...]
    """Config overrides selecting it (``data=custom``, ``data.root``, the file prefixes)."""
    vocab_size: int
    sizes: dict[str, int]


@pytest.fixture(scope="session")
def synthetic_corpus(tmp_path_factory: pytest.TempPathFactory) -> SyntheticCorpus:
    """The reversal task (:func:`write_reversal_corpus`: 2,000 training pairs, 100 valid, 100
    test) as ``data=custom`` under the name ``reverse``, prepared once per session by
    :func:`transformer_nmt.data.prepare.prepare` (what ``nmt-prepare`` runs) with a 200-piece
    vocabulary. The overrides come after any ``experiment=`` and override its data group."""
    from transformer_nmt.config import compose
    from transformer_nmt.data.prepare import prepare

    base = tmp_path_factory.mktemp("reverse")
    files = write_reversal_corpus(base / "text")
    overrides = (
        "data=custom", "data.name=reverse", "data.src_lang=en", "data.tgt_lang=de",
        f"data.root={base / 'data'}", f"data.vocab_size={SYNTHETIC_VOCAB}",
        "data.num_workers=1", "data.valid_split=valid", "data.test_splits=[test]",
        *(f"+data.custom_files.{split}={files / split}" for split in SYNTHETIC_SIZES),
    )
    prepare(compose(list(overrides)))
    return SyntheticCorpus(files, overrides, SYNTHETIC_VOCAB, dict(SYNTHETIC_SIZES))


@pytest.fixture(scope="module")
def workspace(tmp_path_factory):
    """Raw test text, a trained SentencePiece model and the run config (tiny model, beam 2),
    in a temporary folder: ``(root, cfg)``, once per test module."""
    from transformer_nmt.data.bpe import train_spm
    from transformer_nmt.data.corpora import reference_path
    from transformer_nmt.fileio import raw_path, spm_model_path

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
    """The workspace's SentencePiece model."""
    from transformer_nmt.data.bpe import SentencePieceTokenizer
    from transformer_nmt.fileio import spm_model_path

    return SentencePieceTokenizer(spm_model_path(workspace[1].data))
