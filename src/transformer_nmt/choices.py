"""The closed sets of values that config fields take: str-valued Enums.

OmegaConf rejects a value outside a field's choices when the config is composed
(``model.norm=sandwich``: "Invalid value 'sandwich', expected one of [post, pre]" with the
full key), and a member still compares equal to its string (``cfg.model.norm == "pre"``).
:mod:`transformer_nmt.config` uses them as field types and re-exports them.
"""

from __future__ import annotations

from enum import Enum


class Choice(str, Enum):
    """A config choice: member name == value, so OmegaConf accepts the value as written.

    ``str()`` and f-strings give the bare value (``post``, not ``Norm.post``), so messages,
    file names and SentencePiece arguments read as before.
    """

    def __str__(self) -> str:
        return str(self.value)

    def __format__(self, spec: str) -> str:
        return format(str(self.value), spec)


class Corpus(Choice):
    """data.corpus: where the parallel text comes from."""

    multi30k = "multi30k"
    wmt14 = "wmt14"
    custom = "custom"


class EncodingErrors(Choice):
    """data.encoding_errors: what invalid UTF-8 gets."""

    strict = "strict"
    replace = "replace"


class UnicodeForm(Choice):
    """data.unicode_form: normalisation applied to every line (``none``: unchanged)."""

    NFC = "NFC"
    NFKC = "NFKC"
    NFD = "NFD"
    NFKD = "NFKD"
    none = "none"


class Pretokenize(Choice):
    """data.pretokenize: word tokenization of every line before BPE (``none``: none)."""

    none = "none"
    moses = "moses"


class SpmModelType(Choice):
    """data.spm_model_type: the SentencePiece algorithm."""

    bpe = "bpe"
    unigram = "unigram"


class Norm(Choice):
    """model.norm: where LayerNorm sits (section 3.1: post)."""

    post = "post"
    pre = "pre"


class ShareEmbeddings(Choice):
    """model.share_embeddings: which embedding matrices are one (section 3.4: all)."""

    all = "all"
    decoder = "decoder"
    none = "none"


class Positions(Choice):
    """model.positions: section 3.5 (sinusoidal) or Table 3 row E (learned)."""

    sinusoidal = "sinusoidal"
    learned = "learned"


class Init(Choice):
    """model.init: the weight initialisation (docs/model.md, "Initialisation")."""

    xavier = "xavier"
    fairseq = "fairseq"


class TooLong(Choice):
    """trainer.too_long: a training pair that alone exceeds ``max_tokens``."""

    error = "error"
    """refuse to start, naming the pair (``nmt-prepare`` filters such pairs out)"""
    skip = "skip"
    """leave it out of the batches, with a logged count"""


class GradCompression(Choice):
    """trainer.grad_compression: the dtype of DDP's gradient all-reduce."""

    auto = "auto"
    """bf16 when the job spans several nodes on CUDA (``WORLD_SIZE > LOCAL_WORLD_SIZE``),
    none otherwise"""
    none = "none"
    """float32, as the gradients are"""
    bf16 = "bf16"
    """DDP's bf16 compression hook: half the bytes, mantissa rounded to 8 bits (CUDA)"""


class TrainPrecision(Choice):
    """trainer.precision: arithmetic of the training step."""

    auto = "auto"
    fp32 = "fp32"
    bf16 = "bf16"
    fp16 = "fp16"


class DecodePrecision(Choice):
    """decode.precision: arithmetic of decoding."""

    fp32 = "fp32"
    bf16 = "bf16"
    fp16 = "fp16"
    int8 = "int8"
    """the linear layers' weights in int8, one scale per output channel (our engine, on a CPU:
    :mod:`transformer_nmt.decode.quantize`)"""


class LenpenForm(Choice):
    """decode.lenpen_form: the length penalty lp(|Y|)."""

    gnmt = "gnmt"
    fairseq = "fairseq"


class LrScheduler(Choice):
    """trainer.lr_scheduler: the learning rate after the linear warm-up."""

    inverse_sqrt = "inverse_sqrt"
    cosine = "cosine"
    linear = "linear"


class Stopping(Choice):
    """decode.stopping: when a sentence's beam search ends."""

    bound = "bound"
    beam = "beam"


class Engine(Choice):
    """decode.engine: our beam search, or CTranslate2 (float32 / int8) through an export."""

    native = "native"
    ctranslate2 = "ctranslate2"
    ctranslate2_int8 = "ctranslate2_int8"


class ExportFormat(Choice):
    """export.format: what ``nmt-export`` writes."""

    hf = "hf"
    """a Hugging Face ``MarianMTModel`` folder (weights, config, tokenizer, model card)"""
    ctranslate2 = "ctranslate2"
    """a CTranslate2 model folder"""


class Quantization(Choice):
    """export.quantization: the CTranslate2 weights (``export.format=ctranslate2`` only)."""

    none = "none"
    """float32"""
    int8 = "int8"
    int8_float32 = "int8_float32"
    float16 = "float16"


class PlotKind(Choice):
    """plot.kinds: the figures ``nmt-plot`` draws."""

    curves = "curves"
    """training and validation curves from metrics.jsonl"""
    bleu = "bleu"
    """validation BLEU of each kept checkpoint and of their average"""
    attention = "attention"
    """encoder self-attention and encoder-decoder attention maps of one sentence"""


class PlotFormat(Choice):
    """plot.format: the file format of the figures."""

    png = "png"
    svg = "svg"


class ReportTable(Choice):
    """table.tables: the sections ``nmt-table`` writes."""

    table2 = "table2"
    """the paper's Table 2 (newstest2014 BLEU) with our runs beside it"""
    table3 = "table3"
    """the paper's Table 3 (model variations, development set)"""
    other = "other"
    """every other run"""
