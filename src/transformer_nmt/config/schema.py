"""Typed configuration for every stage, registered in Hydra's ConfigStore.

Each config group under ``configs/`` (``data/``, ``model/``, ``trainer/``,
``decode/``, ``experiment/``) fills one of the dataclasses below; the options of the
other stages are groups of the same :class:`Config` (``average``, ``translate``, ``export``
for nmt-export and nmt-import, ``plot``, ``table`` for nmt-table). Because the
primary config starts from the ``config_schema`` node stored here, a misspelt key
(``trainer.max_stepz=10``) fails at start-up with Hydra's message naming the key,
and a value of the wrong type (``trainer.max_steps=abc``) fails with the value
and the expected type.

Units are part of the names: ``max_tokens`` is tokens per GPU per micro-batch,
``update_freq`` micro-batches per optimizer step, ``warmup_steps`` optimizer
steps, ``save_every_minutes`` wall-clock minutes.

Choice fields are str-valued Enums: OmegaConf rejects a value outside the choices
at composition (``model.norm=sandwich``: "Invalid value 'sandwich', expected one of
[post, pre]" with the full key), and a member still compares equal to its string
(``cfg.model.norm == "pre"``).

The range and cross-field checks that typing cannot express (d_model divisible by
heads, dropout in [0, 1), positive max_tokens, ...) live in
:func:`transformer_nmt.config.validate`, which every entry point calls before doing any work.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from hydra.core.config_store import ConfigStore
from omegaconf import MISSING, DictConfig

from transformer_nmt.choices import (
    Corpus,
    DecodePrecision,
    EncodingErrors,
    Engine,
    ExportFormat,
    GradCompression,
    Init,
    LenpenForm,
    LrScheduler,
    Norm,
    PlotFormat,
    PlotKind,
    Positions,
    Pretokenize,
    Quantization,
    ReportTable,
    ShareEmbeddings,
    SpmModelType,
    Stopping,
    TooLong,
    TrainPrecision,
    UnicodeForm,
)

# Special ids shared by SentencePiece, binarization, the model and decoding
# (pad=0, unk=1, bos=2, eos=3, docs/data.md). Defined here only.
PAD_ID = 0
UNK_ID = 1
BOS_ID = 2
EOS_ID = 3


@dataclass
class DataConfig:
    """Where a parallel corpus comes from and how it is cleaned, tokenized and binarized.

    Outputs: ``<root>/raw/<name>/``, ``<root>/spm/<name>/``, ``<root>/bin/<name>/``.
    """

    name: str = MISSING
    """Corpus name; also the folder name under data/raw, data/spm, data/bin."""
    corpus: Corpus = MISSING
    """Source kind: ``multi30k``, ``wmt14`` or ``custom``."""
    src_lang: str = "en"
    """Source language code (the file suffix: ``train.en``)."""
    tgt_lang: str = "de"
    """Target language code."""
    root: str = "data"
    """Folder that holds raw/, spm/ and bin/ (relative to the working directory)."""

    # --- sources -----------------------------------------------------------------
    mirror: str | None = None
    """Local folder holding the corpus files (Multi30k: ``train.en.gz`` ...); stands in
    for the network. Environment variable ``NMT_MULTI30K_MIRROR`` overrides it when unset."""
    url: str | None = None
    """Base URL of the official files (Multi30k)."""
    hf_dataset: str | None = None
    """Hugging Face ``datasets`` name (WMT14: ``wmt/wmt14``)."""
    hf_config: str | None = None
    """Its configuration (``de-en`` or ``fr-en``)."""
    custom_files: dict = field(default_factory=dict)
    """data=custom: split -> path prefix; files are ``<prefix>.<src_lang>`` and
    ``<prefix>.<tgt_lang>``."""
    max_train_pairs: int | None = None
    """Keep only the first N training pairs (dry runs, slices). None = all."""

    # --- splits --------------------------------------------------------------------
    train_split: str = "train"
    """Name of the training split."""
    valid_split: str = "valid"
    """Name of the validation (development) split."""
    test_splits: list[str] = field(default_factory=list)
    """Test sets evaluated by nmt-evaluate, e.g. newstest2014 and newstest2014_filtered."""

    # --- cleaning (training split only; test sets are never filtered) ---------------
    unicode_form: UnicodeForm = UnicodeForm.NFKC
    """Unicode normalisation form applied to every line (NFC, NFKC, NFD, NFKD or none)."""
    encoding_errors: EncodingErrors = EncodingErrors.strict
    """Invalid UTF-8: ``strict`` fails naming file and line; ``replace`` substitutes U+FFFD."""
    max_len: int = 250
    """Drop training pairs with more whitespace-separated words than this on either side."""
    max_ratio: float = 1.5
    """Drop training pairs whose word-length ratio (longer / shorter) exceeds this."""
    ratio_min_len: int = 10
    """The ratio rule only applies when the longer side has at least this many words
    (short captions vary a lot in relative length). Set 0 to apply it to all pairs."""
    dedup: bool = False
    """Drop exact duplicate (source, target) pairs."""
    lowercase: bool = False
    """Lowercase every line of every split after normalisation (Moses ``lowercase.perl``), as
    the Multi30k papers' data; translations stay lowercased. The official references are
    kept as distributed."""
    pretokenize: Pretokenize = Pretokenize.none
    """``moses``: every line of every split goes through Moses ``normalize-punctuation.perl``
    and ``tokenizer.perl -l <lang>`` (escaping on, no ``-a``; after ``lowercase``) before BPE;
    translations are Moses-detokenized (``nmt-translate`` also tokenizes its input)."""

    # --- SentencePiece ----------------------------------------------------------------
    vocab_size: int = 8000
    """Shared BPE vocabulary size (37000 WMT14 EN-DE, 32000 EN-FR)."""
    spm_model_type: SpmModelType = SpmModelType.bpe
    """SentencePiece model type: ``bpe`` or ``unigram``."""
    spm_character_coverage: float = 1.0
    """Share of characters SentencePiece covers (1.0: all of them)."""
    spm_sample_sentences: int = 2_000_000
    """Sentences (source and target counted separately) sampled to train SentencePiece."""
    spm_seed: int = 1
    """Seed of the sentence sample SentencePiece is trained on."""

    # --- binarization -------------------------------------------------------------------
    num_workers: int = 2
    """Encoder worker processes for binarization."""


@dataclass
class ModelConfig:
    """Transformer sizes and options (paper sections 3.1-3.5, Table 3)."""

    name: str = "base"
    """Model preset name (``base``, ``big``, ``tiny``), recorded in results."""
    encoder_layers: int = 6
    """N in the paper."""
    decoder_layers: int = 6
    """Decoder layers (N in the paper)."""
    d_model: int = 512
    """Model (embedding) width."""
    d_ff: int = 2048
    """Inner width of the feed-forward sub-layers."""
    heads: int = 8
    """h in the paper."""
    d_k: int | None = None
    """Per-head query/key size; None = d_model / heads (Table 3 row B changes it)."""
    d_v: int | None = None
    """Per-head value size; None = d_model / heads."""
    dropout: float = 0.1
    """P_drop: residual dropout on every sub-layer output and on embeddings + positions."""
    attention_dropout: float = 0.0
    """Dropout on attention weights."""
    activation_dropout: float = 0.0
    """Dropout after the feed-forward ReLU."""
    norm: Norm = Norm.post
    """``post`` (the paper: LayerNorm(x + Sublayer(x))) or ``pre`` (with a final LayerNorm)."""
    share_embeddings: ShareEmbeddings = ShareEmbeddings.all
    """``all`` (source, target, pre-softmax are one matrix, section 3.4), ``decoder``
    (target embedding and pre-softmax only) or ``none``."""
    positions: Positions = Positions.sinusoidal
    """``sinusoidal`` (section 3.5) or ``learned`` (Table 3 row E)."""
    max_positions: int = 1024
    """Longest sequence (tokens) the positional table covers."""
    init: Init = Init.xavier
    """``xavier``: Xavier-uniform linear weights, N(0, d_model^-0.5) embeddings."""


@dataclass
class TrainerConfig:
    """The training recipe (paper section 5) and the run's bookkeeping."""

    max_tokens: int = 4096
    """Tokens per GPU per micro-batch, counted with padding, for source and target each."""
    update_freq: int = 1
    """Micro-batches accumulated per optimizer step (gradient accumulation). Derived at
    start-up, and this value ignored, when ``tokens_per_step`` is set."""
    tokens_per_step: int | None = None
    """Target real (non-pad, eos included) tokens per optimizer step, source and target each
    (the paper, section 5.1: about 25,000). When set, ``update_freq`` is derived at start-up
    from the sampler's batches and the world size, and training refuses to start (one
    ``error:`` line) when the source or target tokens per step would fall outside
    ``tokens_per_step_tolerance`` of it. None: ``update_freq`` as given, no check."""
    tokens_per_step_tolerance: float = 0.1
    """Allowed relative distance from ``tokens_per_step`` (0.1 = ±10 %)."""
    auto_max_tokens: bool = False
    """On a GPU, choose ``max_tokens`` from the device's memory
    (:data:`transformer_nmt.train.batch_size.ESTIMATED_TOKENS_PER_GIB`, an estimate, not a
    measurement) and, with ``tokens_per_step``, as few micro-batches per step as fit; on CPU
    ``max_tokens`` is used as given. ``max_tokens`` also stays nmt-prepare's length limit."""
    max_steps: int | None = 100_000
    """Stop after this many optimizer steps (None = no limit)."""
    max_epochs: int | None = None
    """Stop after this many epochs (None = no limit)."""
    max_time_minutes: float | None = None
    """Stop after this much wall-clock training time."""

    lr_multiplier: float = 1.0
    """Scales lrate = d_model^-0.5 * min(step^-0.5, step * warmup_steps^-1.5)."""
    warmup_steps: int = 4000
    """Optimizer steps of linear learning-rate warm-up."""
    lr_scheduler: LrScheduler = LrScheduler.inverse_sqrt
    """After the warm-up: ``inverse_sqrt`` (the paper, equation 3), or from the same peak
    ``cosine`` / ``linear`` decay to 0 at ``max_steps`` (fairseq's ``cosine`` and
    ``polynomial_decay``; they need ``max_steps``, which a resumed run then keeps)."""
    adam_betas: list[float] = field(default_factory=lambda: [0.9, 0.98])
    """Adam's beta1 and beta2 (section 5.3)."""
    adam_eps: float = 1e-9
    """Adam's epsilon."""
    weight_decay: float = 0.0
    """Adam's (L2) weight decay; 0 = none, as the paper."""
    label_smoothing: float = 0.1
    """epsilon_ls (section 5.4)."""
    clip_norm: float = 0.0
    """Gradient-norm clipping threshold; 0 = off."""

    grad_compression: GradCompression = GradCompression.auto
    """Gradient all-reduce in bf16 across nodes (see :class:`GradCompression`)."""
    bucket_cap_mb: float = 25.0
    """DDP's gradient bucket size in MB (PyTorch's default)."""
    sdpa_backends: list[str] = field(default_factory=lambda: ["flash", "efficient", "math"])
    """Attention kernels ``F.scaled_dot_product_attention`` may use in training and
    validation, in order of preference (``torch.nn.attention.sdpa_kernel``): ``flash``,
    ``efficient`` (memory-efficient), ``cudnn``, ``math``. The default leaves out cuDNN
    attention, which PyTorch prefers on sm90 GPUs with a recent cuDNN: it builds a graph for
    every new (batch, source, target) shape (50-400 ms each, thousands with dynamic batches)
    and has a reported NaN gradient with masks; flash serves the causal decoder
    self-attention, memory-efficient the masked encoder and cross attention, math whatever
    neither takes. The kernels chosen are logged at the first step."""
    precision: TrainPrecision = TrainPrecision.auto
    """``auto`` (bf16 on GPUs that support it, fp16 on older GPUs, fp32 on CPU), ``fp32``,
    ``bf16`` or ``fp16`` (dynamic loss scaling)."""
    tf32: bool = True
    """Allow TF32 matrix products in fp32 on GPUs that have them."""
    compile: bool | None = None
    """torch.compile the model; None (default): on when training on CUDA, off elsewhere
    (on a CPU compilation costs more than it saves, docs/benchmarks.md)."""
    pad_to_multiple: int | None = None
    """Round the padded source and target lengths of training batches up to a multiple of
    this (tensor-core-sized matrices, fewer shapes for the compiled step); 1 = no rounding;
    None (default): 8 when training on CUDA, 1 elsewhere (on a CPU the extra padding is
    only extra work)."""
    packing: bool = False
    """Train on packed micro-batches (:mod:`transformer_nmt.data.packing`): whole sentence
    pairs laid end to end in ``max_tokens // pack_length`` rows of ``pack_length`` positions,
    each attending only within itself, positions restarting at every sentence; one static
    shape for the whole run, padding only at row tails. Off (padded length buckets) for every
    preset until a GPU measures it (docs/training.md, Packed batches). Validation and
    decoding are not packed."""
    cuda_graphs: bool = False
    """Run each optimizer step as one function (``packing`` only): forward, loss, backward,
    clipping, the non-finite skip, Adam and the step's figures, compiled whole
    (:mod:`transformer_nmt.train.whole_step`); on CUDA with ``compile`` captured as a CUDA
    graph and replayed (``torch.compile`` mode ``reduce-overhead``). One process, bf16 or
    fp32. Off until a GPU measures it (docs/training.md, The whole step in one graph)."""
    pack_length: int | None = None
    """Positions per packed row (``packing`` only), at least the longest training pair in
    pieces with eos or bos (one ``error:`` line names both otherwise); None: that longest pair,
    from the prepared data's ``.idx`` lengths."""
    max_bad_steps: int = 10
    """Stop after this many consecutive steps with a non-finite loss or gradient (fp16
    loss-scaler overflows do not count: they stop training only when the scale falls
    below 1e-4)."""
    too_long: TooLong = TooLong.error
    """A training pair longer than ``max_tokens`` on either side: ``error`` or ``skip``."""

    seed: int = 1
    """Seed of the model's initialisation and of the batch order."""
    num_workers: int = 0
    """DataLoader worker processes (collation and pinning off the training thread)."""
    prefetch_factor: int = 4
    """Batches each DataLoader worker prepares ahead (with ``num_workers > 0``)."""

    save_every_steps: int | None = None
    """Save a checkpoint every n optimizer steps (None = not by steps)."""
    save_every_epochs: int | None = None
    """Also save at the end of every n-th epoch (fairseq's ``--save-interval``)."""
    save_every_minutes: float | None = 10.0
    """Save a checkpoint every this many wall-clock minutes (None = not by time)."""
    keep_last: int = 20
    """Periodic checkpoints kept (the paper averages the last 5 base / 20 big); the newest
    one, written when training stopped, is kept besides them
    (:func:`transformer_nmt.checkpoint.prune_checkpoints`)."""
    no_save: bool = False
    """Write no checkpoint at all (fairseq's ``--no-save``); the dry run sets it."""
    init_from: str | None = None
    """Model file (a checkpoint, ``averaged.pt`` or an ``nmt-import`` output) whose weights
    start a new run (fine-tuning); optimizer, schedule and counters start fresh. Ignored when
    the run directory already holds checkpoints (the run resumes from them)."""
    validate_every_steps: int | None = 1000
    """Validate every n optimizer steps (None = only when training ends)."""
    validate_every_epochs: int | None = None
    """Also validate at the end of every n-th epoch (fairseq's ``--validate-interval``)."""
    log_every_steps: int = 100
    """Log (and write to metrics.jsonl) every n optimizer steps."""

    valid_bleu: bool = False
    """Also decode (a subset of) the valid set and track its BLEU."""
    valid_bleu_sentences: int = 500
    """Valid sentences decoded for ``valid_bleu``."""
    patience: int | None = None
    """Stop after this many validations without improvement (None = never)."""

    dry_run: bool = False
    """Build everything on a small slice of the data and run a few steps."""
    dry_run_steps: int = 10
    """Timed optimizer steps of a dry run (after ``dry_run_warmup_steps``), each of the real
    plan's ``update_freq`` micro-batches of ``max_tokens``."""
    dry_run_warmup_steps: int = 2
    """Dry-run steps run before the timed ones and left out of its bill (compilation,
    allocator and loader warm-up)."""

    resume_changed: list[str] = field(default_factory=list)
    """Dotted keys (``model.dropout``, ``trainer.lr_multiplier``) whose change from the
    settings a run was started with is deliberate: resuming accepts them (and ``nmt-average``
    then averages across the change). Every other change outside the allow-list
    :data:`transformer_nmt.checkpoint.RESUME_HARMLESS_KEYS` is refused
    (:func:`transformer_nmt.checkpoint.config_differences`); ``["*"]`` accepts any."""


@dataclass
class DecodeConfig:
    """Beam search and evaluation settings (paper section 6.1)."""

    beam_size: int = 4
    """Beam width; 1 = greedy decoding."""
    lenpen: float = 0.6
    """Length penalty alpha."""
    lenpen_form: LenpenForm = LenpenForm.gnmt
    """``gnmt``: ((5 + |Y|) / 6)^alpha (Wu et al. 2016, the paper); ``fairseq``: |Y|^alpha."""
    max_len_a: float = 1.0
    """Maximum output length slope (see ``max_len_b``)."""
    max_len_b: int = 50
    """Maximum output length = max_len_a * source length + max_len_b."""
    nbest: int = 1
    """Hypotheses written per sentence (nmt-translate, at most ``beam_size``)."""
    stopping: Stopping = Stopping.bound
    """When a sentence's search ends: ``bound`` once no live hypothesis can beat its best
    finished one (exact; tensor2tensor's rule, with the length penalty at the maximum
    length); ``beam`` once ``beam_size`` hypotheses have finished (fairseq, Hugging Face
    ``early_stopping=True``; fewer steps, not exact)."""
    sync_every: str = "auto"
    """Decoding steps between two host reads of the search's finished flags: a whole number
    >= 1, or ``auto``: 8 on CUDA (the search stays on the device in between, finished
    sentences masked), 1 elsewhere (a finished sentence leaves the batch at once). The
    translations do not depend on it (docs/model.md, "Beam search on the device")."""
    compile: str = "false"
    """Run each search step compiled over a static cache of bucketed shapes (the decoder
    call and the search's update as one function, beam or greedy search): ``true``,
    ``false`` (the default until a GPU has measured it), or ``auto``: on CUDA only
    (``torch.compile`` mode ``reduce-overhead``, a CUDA graph per bucket); on a CPU compiling
    costs more than it saves. The same translations either way (docs/model.md, "Compiled
    decoding step")."""
    max_tokens: int = 8000
    """Source tokens per decoding batch."""
    max_input_tokens: int = 1000
    """Longer inputs are truncated (with a warning)."""
    precision: DecodePrecision = DecodePrecision.fp32
    """fp32, bf16 or fp16 (autocast), or int8: the linear layers' weights in int8 with one
    scale per output channel, on a CPU (:mod:`transformer_nmt.decode.quantize`)."""
    weight_prepack: bool = True
    """fp32 on a CPU: the linear layers' weights packed once in oneDNN's blocked layout (the
    same translations to float32 rounding, faster; :mod:`transformer_nmt.decode.prepack`);
    false: PyTorch's plain ``F.linear``. Not with ``compile=true``."""
    engine: Engine = Engine.native
    """``native`` (our beam search), ``ctranslate2`` or ``ctranslate2_int8``
    (transformer_nmt.interop)."""
    device: str = "auto"
    """``auto`` (cuda when available, else cpu), ``cpu``, ``cuda`` or ``cuda:<n>``."""
    checkpoint: str | None = None
    """Model file to decode with; None = the run's averaged model, else its latest checkpoint."""
    sdpa_backends: list[str] = field(default_factory=lambda: ["flash", "efficient", "math"])
    """Attention kernels for decoding, in order of preference (as ``trainer.sdpa_backends``)."""
    paper_bleu_form: str | None = None
    """The form of the paper's BLEU ``nmt-evaluate`` records as ``paper_bleu``
    (:data:`transformer_nmt.evaluate.bleu.PAPER_LABELS`: ``t2t-2017``, ``t2t-2018``, ``moses``,
    ``moses-a``, ``ott2018``); None: the target language's default. The others beside it."""


@dataclass
class AverageConfig:
    """``nmt-average``: which checkpoints to average (paper section 6.1)."""

    last: int = 5
    """Number of most recent regularly spaced checkpoints to average (the paper: 5 base, 20 big)."""
    checkpoints: list[str] = field(default_factory=list)
    """Explicit checkpoint files (override ``last``)."""


@dataclass
class TranslateConfig:
    """``nmt-translate``: where the text comes from and goes to."""

    input: str | None = None
    """Input file (None = standard input)."""
    output: str | None = None
    """Output file (None = standard output)."""


@dataclass
class Table3Config:
    """A row of the paper's Table 3 (section 6.2) applied to the experiment's model.

    Set by the ``table3`` config group (``configs/table3/<variant>.yaml``); empty (``variant``
    None) for every other run. :func:`transformer_nmt.evaluate.table3.apply_row` turns it into the
    model and trainer values of the row, relative to the experiment's own (base) values, so
    one row file serves ``wmt14_en_de_base`` (the paper's values exactly) and the CPU proxy.
    """

    variant: str | None = None
    """The row's config name (``A_h1``, ``C_N2``, ``base`` ...); the run folder is
    ``runs/<name>/table3/<variant>_seed<seed>``."""
    scale: dict[str, float] = field(default_factory=dict)
    """Multipliers of the experiment's values: ``heads``, ``d_k`` (the per-head key size,
    d_model / heads unless set), ``layers`` (encoder and decoder), ``d_model``, ``d_ff``,
    ``max_steps``. The product must be a whole number."""
    fixed: dict[str, Any] = field(default_factory=dict)
    """Absolute values: ``heads``, ``dropout``, ``label_smoothing``, ``positions``."""
    scale_steps: bool = True
    """Apply a row's ``max_steps`` multiplier (big: 300K steps against base's 100K); the CPU
    proxy sets False so that every row trains the same number of steps."""
    evaluate: bool = True
    """``nmt-train`` evaluates the row when training ends, as the paper did for Table 3: the
    last checkpoint (no averaging), beam search, on the development set (``data.valid_split``,
    newstest2013 for WMT14), skipped when the row's results.json is already current."""


@dataclass
class ExportConfig:
    """``nmt-export`` (a run's model in another toolkit's format) and ``nmt-import`` (a Marian
    folder into a run of ours)."""

    format: ExportFormat = ExportFormat.hf
    """``hf`` (a MarianMTModel folder) or ``ctranslate2``."""
    quantization: Quantization = Quantization.none
    """CTranslate2 weights: ``none`` (float32), ``int8``, ``int8_float32``, ``float16``."""
    output: str | None = None
    """Folder to write; None = ``<run_dir>/export/hf`` or ``<run_dir>/export/ctranslate2[_<q>]``."""
    overwrite: bool = False
    """Replace an existing output folder that holds an earlier export (atomically); a folder
    nmt-export did not write is never replaced. nmt-import: replace the target run's
    averaged.pt (a run that already holds checkpoints is refused without it)."""
    source: str | None = None
    """nmt-import: the Marian-architecture transformers folder to import."""


@dataclass
class PlotConfig:
    """``nmt-plot``: what it draws, from which runs, and where."""

    kinds: list[PlotKind] = field(default_factory=lambda: [PlotKind.curves, PlotKind.bleu])
    """Figures: ``curves`` (metrics.jsonl), ``bleu`` (validation BLEU of each kept checkpoint
    and the average; decodes, cached in plots/checkpoint_bleu.json), ``attention``."""
    format: PlotFormat = PlotFormat.png
    """``png`` or ``svg``."""
    dpi: int = 100
    """Resolution of PNG figures (dots per inch)."""
    dir: str | None = None
    """Output folder; None = ``<first run>/plots``."""
    bleu_sentences: int | None = None
    """Decode only the first N validation sentences per checkpoint (None = all)."""
    sentence: str | None = None
    """Source sentence for the attention maps (adds ``attention`` to the kinds)."""
    layer: int = 0
    """Encoder layer whose self-attention heads are drawn, from 1; 0 = the last."""
    cross_layer: int = 0
    """Decoder layer whose encoder-decoder attention heads are drawn, from 1; 0 = the last."""
    runs: list[str] = field(default_factory=list)
    """Run names (folders beside ``run_dir``, under runs/) or paths to draw together;
    empty = ``run_dir``."""


@dataclass
class TableConfig:
    """``nmt-table``: which results.json files, which sections, which file."""

    results_glob: str = "runs/**/results.json"
    """Results files to tabulate (``**`` matches any depth)."""
    output: str = "runs/results.md"
    """The file written. Under runs/ by default, so that a run never rewrites the committed
    docs/results.md; rebuild that with ``table.output=docs/results.md``."""
    tables: list[ReportTable] = field(default_factory=lambda: list(ReportTable))
    """The sections to write (``table2``, ``table3``, ``other``)."""
    table3_plot: str | None = None
    """Also draw each Table 3 row's dev BLEU difference to the base row (PNG)."""


@dataclass
class Config:
    """The whole configuration: one object for every entry point."""

    data: DataConfig = field(default_factory=DataConfig)
    model: ModelConfig = field(default_factory=ModelConfig)
    trainer: TrainerConfig = field(default_factory=TrainerConfig)
    decode: DecodeConfig = field(default_factory=DecodeConfig)
    average: AverageConfig = field(default_factory=AverageConfig)
    translate: TranslateConfig = field(default_factory=TranslateConfig)
    name: str = "no_experiment"
    """Experiment name (each experiment config sets its own); the run directory is runs/<name>."""
    run_dir: str = "runs/${name}"
    """``runs/<name>``; a Table 3 row's run (set by its config):
    ``runs/<name>/table3/<variant>_seed<seed>``."""
    table3: Table3Config = field(default_factory=Table3Config)
    export: ExportConfig = field(default_factory=ExportConfig)
    plot: PlotConfig = field(default_factory=PlotConfig)
    table: TableConfig = field(default_factory=TableConfig)
    extra: Any = None
    """Free-form notes copied into results.json."""


def to_plain(cfg: DictConfig | object) -> dict:
    """The config as plain Python types (choices as ``str``), resolved: what a checkpoint stores.

    ``torch.load(weights_only=True)`` reads no Enum, so every config written into a
    checkpoint goes through here.
    """
    from omegaconf import OmegaConf

    node = cfg if OmegaConf.is_config(cfg) else OmegaConf.structured(cfg)
    return OmegaConf.to_container(node, resolve=True, enum_to_str=True)


def as_plain(node: Any) -> Any:
    """A config node (typed dataclass or DictConfig) as :func:`to_plain` gives it; any other
    value unchanged."""
    import dataclasses

    from omegaconf import OmegaConf

    if OmegaConf.is_config(node) or dataclasses.is_dataclass(node):
        return to_plain(node)
    return node


def field_value(cfg: Any, key: str, default: Any = None) -> Any:
    """``cfg.key`` of a typed config, or ``cfg[key]`` of a plain dict (a checkpoint's or
    results.json's config); ``default`` when absent."""
    return cfg.get(key, default) if isinstance(cfg, dict) else getattr(cfg, key, default)


def register_configs() -> None:
    """Store the schema in Hydra's ConfigStore (called on import of this module)."""
    cs = ConfigStore.instance()
    cs.store(name="config_schema", node=Config)


register_configs()
