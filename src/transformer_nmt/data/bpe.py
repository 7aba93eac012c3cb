"""One shared SentencePiece BPE model for both languages (paper section 5.1: a shared
source-target vocabulary of about 37,000 pieces for EN-DE, 32,000 for EN-FR).

Special ids are fixed here and nowhere else in SentencePiece's terms:
pad=0, unk=1, bos=2, eos=3 (:data:`transformer_nmt.config.PAD_ID` ...).

Training reads a bounded random sample: reservoir sampling keeps
``data.spm_sample_sentences`` lines (source and target lines counted separately) out of
the cleaned training text in one pass, whatever its size, and writes them to a temporary
file for SentencePiece; the ``spm.model`` written does not record that file's random path
(:func:`without_sample_path`), so one corpus prepared again with the same settings gives the
same file. A vocabulary's identity is what decides how text becomes ids: the pieces, their
scores and SentencePiece's normalizer (:func:`vocab_identity`).

SentencePiece's own normaliser is switched off (``identity``): text is normalised by
:func:`transformer_nmt.data.clean.normalize` with ``data.unicode_form``, which
:class:`SentencePieceTokenizer` also applies to new input (the form is kept in ``spm.json``
beside the model).
"""

from __future__ import annotations

import hashlib
import io
import json
import logging
import os
import random
import tempfile
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path

import sentencepiece as spm

from transformer_nmt.config import BOS_ID, EOS_ID, PAD_ID, UNK_ID, DataConfig
from transformer_nmt.data import moses
from transformer_nmt.data.clean import normalize, text_steps
from transformer_nmt.data.corpora import read_lines
from transformer_nmt.errors import DataError
from transformer_nmt.fileio import (
    atomic_write,
    file_digest,
    read_json,
    spm_model_path,
)

log = logging.getLogger(__name__)


def _varint(buf: bytes, i: int) -> tuple[int, int]:
    """The base-128 varint at ``buf[i:]`` and the index after it."""
    value = shift = 0
    while True:
        byte = buf[i]
        i += 1
        value |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return value, i
        shift += 7


def _encode_varint(value: int) -> bytes:
    out = bytearray()
    while True:
        byte, value = value & 0x7F, value >> 7
        out.append(byte | (0x80 if value else 0))
        if not value:
            return bytes(out)


def _proto_fields(buf: bytes) -> list[tuple[int, bytes, bytes]]:
    """The top-level fields of a serialized protobuf message, in order: ``(number, the
    field's bytes with its tag, its payload)`` (the payload is empty but for
    length-delimited fields).

    Raises:
        ValueError: the bytes are not a protobuf message (truncated, unknown wire type).
    """
    fields, i = [], 0
    try:
        while i < len(buf):
            start = i
            key, i = _varint(buf, i)
            number, wire, payload = key >> 3, key & 7, b""
            if wire == 0:
                _, i = _varint(buf, i)
            elif wire == 1:
                i += 8
            elif wire == 2:
                size, i = _varint(buf, i)
                payload, i = buf[i:i + size], i + size
            elif wire == 5:
                i += 4
            else:
                raise ValueError(f"wire type {wire} at byte {start}")
            if i > len(buf) or number == 0:
                raise ValueError(f"truncated at byte {start}")
            fields.append((number, buf[start:i], payload))
    except IndexError as e:
        raise ValueError(f"truncated at byte {i}") from e
    return fields


_PIECES, _TRAINER_SPEC, _NORMALIZER_SPEC, _DENORMALIZER_SPEC = 1, 2, 3, 5
"""Field numbers of SentencePiece's ``ModelProto`` (sentencepiece_model.proto)."""
_TRAINER_INPUT = 1
"""``TrainerSpec.input``: the training files' paths."""


def without_sample_path(model: bytes) -> bytes:
    """The serialized SentencePiece model ``model`` with ``trainer_spec.input`` (the path of
    the temporary sample it was trained on, random for each training) removed, so that one
    corpus prepared with one set of settings always writes the same ``spm.model`` bytes.

    Raises:
        ValueError: ``model`` is not a serialized model.
    """
    out = bytearray()
    for number, raw, payload in _proto_fields(model):
        if number != _TRAINER_SPEC:
            out += raw
            continue
        spec = b"".join(sub for n, sub, _ in _proto_fields(payload) if n != _TRAINER_INPUT)
        out += raw[:1] + _encode_varint(len(spec)) + spec  # tag 0x12: one byte
    return bytes(out)


def vocab_identity(model_path: str | os.PathLike) -> dict:
    """What identifies a vocabulary: ``{"vocab_sha256", "vocab_size", "spm_sha256"}``.

    ``vocab_sha256`` is the SHA-256 of what decides how text becomes ids: the pieces with
    their scores and types, SentencePiece's normalizer and denormalizer, as serialized in
    ``spm.model``; how the model was trained (``trainer_spec``: the temporary sample's path,
    the thread count) is left out, so a corpus prepared again with the same settings keeps
    its identity. ``spm_sha256`` is the file's SHA-256, which older checkpoints record alone
    (:func:`same_vocabulary`). Checkpoints keep the identity under ``"vocab"``
    (:func:`transformer_nmt.checkpoint.read.check_vocab`).

    Raises:
        DataError: the file is not a SentencePiece model.
    """
    try:
        fields = _proto_fields(Path(model_path).read_bytes())
    except ValueError as e:
        raise DataError(f"{model_path} is not a SentencePiece model ({e})") from e
    digest = hashlib.sha256()
    for number, raw, _ in fields:
        if number in (_PIECES, _NORMALIZER_SPEC, _DENORMALIZER_SPEC):
            digest.update(raw)
    size = sum(1 for number, _, _ in fields if number == _PIECES)
    return {"vocab_sha256": digest.hexdigest(), "vocab_size": size,
            "spm_sha256": file_digest(model_path)}


def same_vocabulary(a: Mapping, b: Mapping) -> bool:
    """Whether two vocabulary identities (:func:`vocab_identity`, as checkpoints record them)
    name one vocabulary: equal ``vocab_size`` and equal ``vocab_sha256``; where either
    record lacks it (a checkpoint written before it was recorded), equal ``spm_sha256``,
    the SHA-256 of the ``spm.model`` file, which differs for the same vocabulary when the
    corpus was prepared again (:func:`file_only_note`)."""
    if a.get("vocab_size") != b.get("vocab_size"):
        return False
    key = "vocab_sha256" if a.get("vocab_sha256") and b.get("vocab_sha256") else "spm_sha256"
    return a.get(key) == b.get(key)


def describe_vocabulary(identity: Mapping, other: Mapping | None = None) -> str:
    """``N pieces, sha256 <12 hex digits>`` of :func:`vocab_identity`'s ``vocab_sha256``, or
    ``N pieces, spm.model file sha256 …`` where ``identity`` or ``other`` (the identity it is
    compared with) lacks it."""
    both = identity.get("vocab_sha256") and (other is None or other.get("vocab_sha256"))
    digest = identity.get("vocab_sha256") if both else identity.get("spm_sha256")
    return (f"{identity.get('vocab_size')} pieces, {'' if both else 'spm.model file '}sha256 "
            f"{str(digest)[:12]}")


def file_only_note(saved: Mapping, here: Mapping,
                   advice: str = "use the spm.model file the model was trained with") -> str:
    """``""``, or, where the checkpoint's identity ``saved`` lacks ``vocab_sha256`` and the
    sizes agree, what a differing file SHA-256 may mean, then ``advice``: the text appended
    to a refusal."""
    if saved.get("vocab_sha256") or saved.get("vocab_size") != here.get("vocab_size"):
        return ""
    return ("; that checkpoint records only the SHA-256 of its spm.model file (it was written "
            "before the vocabulary's own identity was recorded), and an spm.model prepared "
            "before that recorded the random path of its training sample, so the same corpus "
            f"prepared again has another file: {advice}")


def meta_path(model_path: str | os.PathLike) -> Path:
    """Sidecar ``spm.json`` beside the model: training parameters and ``unicode_form``."""
    return Path(model_path).with_suffix(".json")


def spm_params(data_cfg: DataConfig) -> dict:
    """The config values the SentencePiece model depends on (a change means training again);
    with ``data.lowercase`` / ``data.pretokenize`` set, also those and the two languages
    (:func:`transformer_nmt.data.clean.text_steps`), which :class:`SentencePieceTokenizer`
    reads back from ``spm.json``."""
    keys = ("vocab_size", "spm_model_type", "spm_character_coverage", "spm_sample_sentences",
            "spm_seed", "unicode_form")
    params = {k: getattr(data_cfg, k) for k in keys}
    steps = text_steps(data_cfg)
    if steps:
        params.update(steps, src_lang=data_cfg.src_lang, tgt_lang=data_cfg.tgt_lang)
    return params


def reservoir_sample(lines: Iterable[str], k: int, seed: int) -> tuple[list[str], int]:
    """Uniform random sample of ``k`` items from a stream of unknown length (Algorithm R).

    Memory holds ``k`` lines at most. Empty lines are skipped.

    Returns:
        ``(sample, n_seen)``: the sample (in stream order when the stream has <= k lines)
        and the number of non-empty lines seen.
    """
    rng = random.Random(seed)
    sample: list[str] = []
    n = 0
    for line in lines:
        if not line:
            continue
        if n < k:
            sample.append(line)
        else:
            j = rng.randrange(n + 1)
            if j < k:
                sample[j] = line
        n += 1
    return sample, n


def train_spm(data_cfg: DataConfig, text_files: Sequence[Path], model_path: Path) -> dict:
    """Train the shared SentencePiece model on a random sample of ``text_files``.

    Args:
        data_cfg: ``cfg.data`` (``vocab_size``, ``spm_*``, ``unicode_form``, ``num_workers``).
        text_files: cleaned training text, both languages.
        model_path: output ``spm.model``; ``spm.vocab`` and ``spm.json`` are written beside it.

    Returns:
        The metadata written to ``spm.json`` (parameters, sample size, lines seen).

    Raises:
        DataError: no text to train on, or a vocabulary too large for the sample (with the
            largest size SentencePiece would accept when it says so).
    """
    def all_lines():
        for path in text_files:
            yield from read_lines(path, "strict")

    sample, n_seen = reservoir_sample(all_lines(), data_cfg.spm_sample_sentences,
                                      data_cfg.spm_seed)
    if not sample:
        raise DataError(f"no text to train SentencePiece on in {[str(p) for p in text_files]}")
    model_path = Path(model_path)
    model_path.parent.mkdir(parents=True, exist_ok=True)
    fd, sample_file = tempfile.mkstemp(dir=model_path.parent, prefix=".spm_sample.",
                                       suffix=".txt")
    model = io.BytesIO()
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            for line in sample:
                f.write(line + "\n")
        n_sample = len(sample)
        del sample
        log.info("SentencePiece: training %s vocab %d on %d of %d lines", data_cfg.spm_model_type,
                 data_cfg.vocab_size, n_sample, n_seen)
        try:
            spm.SentencePieceTrainer.train(
                input=sample_file,
                model_writer=model,
                model_type=data_cfg.spm_model_type,
                vocab_size=data_cfg.vocab_size,
                character_coverage=data_cfg.spm_character_coverage,
                normalization_rule_name="identity",
                pad_id=PAD_ID, unk_id=UNK_ID, bos_id=BOS_ID, eos_id=EOS_ID,
                input_sentence_size=0,
                num_threads=max(1, data_cfg.num_workers),
                minloglevel=2,
            )
        except RuntimeError as e:
            raise DataError(
                f"SentencePiece could not train data.vocab_size={data_cfg.vocab_size} on "
                f"{n_sample} lines of {[str(p) for p in text_files]}: {e}"
                + ("; lower data.vocab_size" if "Vocabulary size" in str(e) else "")
            ) from e
    finally:
        os.unlink(sample_file)
    meta = {"params": spm_params(data_cfg), "sample_lines": n_sample, "lines_seen": n_seen}
    written = without_sample_path(model.getvalue())  # the same bytes for the same settings
    proc = spm.SentencePieceProcessor(model_proto=written)
    with atomic_write(model_path.with_suffix(".vocab")) as f:
        for i in range(proc.get_piece_size()):
            f.write(f"{proc.id_to_piece(i)}\t{proc.get_score(i):g}\n")
    with atomic_write(meta_path(model_path)) as f:
        json.dump(meta, f, indent=2)
    with atomic_write(model_path, "wb") as f:  # last: its presence means the stage finished
        f.write(written)
    return meta


class SentencePieceTokenizer:
    """Text <-> piece ids with the shared model (contract of the data stage).

    Args:
        model_path: ``spm.model`` (``fileio.spm_model_path(cfg.data)``). When ``spm.json``
            lies beside it, input text is normalised with its ``unicode_form`` first.

    Attributes:
        vocab_size: number of pieces (ids ``0 .. vocab_size - 1``).
        pad_id, unk_id, bos_id, eos_id: 0, 1, 2, 3.
        lowercase, pretokenize, src_lang, tgt_lang: the text steps the data was prepared
            with (``spm.json``; False, None, None, None when it has none):
            :meth:`preprocess` and :meth:`detokenize` repeat and undo them.
    """

    def __init__(self, model_path: str | os.PathLike) -> None:
        path = Path(model_path)
        if not path.is_file():
            raise DataError(f"SentencePiece model not found: {path} (run nmt-prepare first)")
        self.model_path = path
        self.sp = spm.SentencePieceProcessor(model_file=str(path))
        meta = meta_path(path)
        params = read_json(meta)["params"] if meta.is_file() else {}
        self.unicode_form = params.get("unicode_form")
        self.lowercase = bool(params.get("lowercase", False))
        self.pretokenize = params.get("pretokenize")
        self.src_lang, self.tgt_lang = params.get("src_lang"), params.get("tgt_lang")
        self.vocab_size = self.sp.get_piece_size()
        self.pad_id, self.unk_id = self.sp.pad_id(), self.sp.unk_id()
        self.bos_id, self.eos_id = self.sp.bos_id(), self.sp.eos_id()
        if (self.pad_id, self.unk_id, self.bos_id, self.eos_id) != (PAD_ID, UNK_ID, BOS_ID, EOS_ID):
            raise DataError(
                f"{path}: special ids pad/unk/bos/eos are {self.pad_id}/{self.unk_id}/"
                f"{self.bos_id}/{self.eos_id}, expected {PAD_ID}/{UNK_ID}/{BOS_ID}/{EOS_ID}"
            )
        self._special = {PAD_ID, BOS_ID, EOS_ID}

    def preprocess(self, lines: Sequence[str]) -> list[str]:
        """Source text as the data stage wrote it: lowercased and Moses-tokenized when the
        data was (the cleaned files under ``data/raw`` already are; new input is not)."""
        if not (self.lowercase or self.pretokenize == "moses"):
            return list(lines)
        return moses.preprocess([self._norm(line) for line in lines], self.src_lang,
                                self.lowercase, self.pretokenize == "moses")

    def detokenize(self, lines: Sequence[str]) -> list[str]:
        """Translations as text: Moses-detokenized (``tgt_lang``) when the data was
        Moses-tokenized, else unchanged."""
        if self.pretokenize != "moses":
            return list(lines)
        return moses.detokenize(lines, self.tgt_lang)

    def _norm(self, text: str) -> str:
        return normalize(text, self.unicode_form) if self.unicode_form else text

    def encode(self, text: str) -> list[int]:
        """Piece ids of one line (no bos/eos)."""
        return self.sp.encode(self._norm(text), out_type=int)

    def encode_batch(self, texts: list[str], num_threads: int = 1) -> list[list[int]]:
        """Piece ids of many lines (no bos/eos), in input order."""
        return self.sp.encode([self._norm(t) for t in texts], out_type=int,
                              num_threads=num_threads)

    def decode(self, ids: Sequence[int]) -> str:
        """Text of piece ids; pad, bos and eos ids are ignored (unk decodes as `` ⁇ ``)."""
        return self.sp.decode([int(i) for i in ids if int(i) not in self._special])


def load_tokenizer(data_cfg: DataConfig) -> SentencePieceTokenizer:
    """The shared SentencePiece model of ``data_cfg`` (``data/spm/<name>/spm.model``).

    Raises:
        FileNotFoundError: naming the path when the model is missing (run nmt-prepare).
    """
    path = spm_model_path(data_cfg)
    if not path.is_file():
        raise FileNotFoundError(f"SentencePiece model {path} not found; run nmt-prepare first")
    return SentencePieceTokenizer(path)
