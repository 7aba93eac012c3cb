"""The checks that typing cannot express: ranges, divisibility, combinations of values.

:func:`validate` runs on every composed config (:func:`transformer_nmt.config.typed_config`);
:func:`validate_model_config` also runs on a model config built in code or read back from a
checkpoint, before any tensor is allocated.
"""

from __future__ import annotations

import math

from omegaconf import DictConfig, ListConfig

from transformer_nmt.choices import Choice, Init, Norm, Positions, ShareEmbeddings
from transformer_nmt.config.schema import PAD_ID, Config, ModelConfig

_MODEL_CHOICES: dict[str, type[Choice]] = {
    "norm": Norm, "share_embeddings": ShareEmbeddings, "positions": Positions, "init": Init,
}


def validate_model_config(cfg: ModelConfig, vocab_size: int | None = None,
                          pad_id: int = PAD_ID) -> None:
    """Check a model config before any tensor is allocated.

    Args:
        cfg: a :class:`~transformer_nmt.config.ModelConfig`.
        vocab_size: the shared vocabulary size (checked when given).
        pad_id: the padding id (must lie inside the vocabulary).

    Raises:
        ValueError: listing every bad field as ``model.<key>=<value>`` and what is allowed.
            The choice fields are checked here too: a ``ModelConfig`` built in code is not
            typed by OmegaConf.
    """
    errors: list[str] = []
    for key, choice in _MODEL_CHOICES.items():  # a plain dataclass or dict is not typed
        value = getattr(cfg, key)
        allowed = [m.value for m in choice]
        if value not in allowed:
            errors.append(f"model.{key}={value!r} is not one of {allowed}")
    for key in ("encoder_layers", "decoder_layers", "d_model", "d_ff", "heads", "max_positions"):
        value = getattr(cfg, key)
        if not isinstance(value, int) or value <= 0:
            errors.append(f"model.{key}={value!r} must be a positive integer")
    for key in ("d_k", "d_v"):
        value = getattr(cfg, key)
        if value is not None and (not isinstance(value, int) or value <= 0):
            errors.append(f"model.{key}={value!r} must be a positive integer or None")
    d_model, heads = cfg.d_model, cfg.heads
    if (
        isinstance(d_model, int) and isinstance(heads, int) and d_model > 0 and heads > 0
        and d_model % heads != 0 and (cfg.d_k is None or cfg.d_v is None)
    ):
        errors.append(
            f"model.d_model={d_model} is not divisible by model.heads={heads}; "
            "set model.d_k and model.d_v explicitly or change the sizes"
        )
    for key in ("dropout", "attention_dropout", "activation_dropout"):
        value = getattr(cfg, key)
        if not isinstance(value, (int, float)) or not 0.0 <= value < 1.0:
            errors.append(f"model.{key}={value!r} must be in [0, 1)")
    if vocab_size is not None:
        if vocab_size <= 0:
            errors.append(f"vocab_size={vocab_size} must be positive")
        elif not 0 <= pad_id < vocab_size:
            errors.append(f"pad_id={pad_id} must be in [0, vocab_size={vocab_size})")
    if errors:
        raise ValueError("invalid model configuration:\n  " + "\n  ".join(errors))


DECODE_RANGES = (("lenpen", 0.0, 10.0), ("max_len_b", -1_000_000, 1_000_000))
"""Ranges of decode numbers (:func:`validate`): the length penalty's exponent alpha (the paper:
0.6; beyond 10 the penalty overflows), the output-length limit ``max_len_a * source length +
max_len_b`` (a limit beyond the model's positions is capped there anyway; ``max_len_a`` up to
:data:`MAX_LEN_A`)."""
MAX_LEN_A = 100.0
"""The largest ``decode.max_len_a`` (output tokens per source token)."""


NAME_MAX_BYTES = 255
"""The longest folder name (in UTF-8 bytes) the usual file systems take (``NAME_MAX``)."""
PATH_MAX_BYTES = 4096
"""Linux's ``PATH_MAX``: a path, its terminating NUL included, in bytes."""


def folder_name_error(key: str, value: object) -> str | None:
    """Why ``value`` cannot be the folder name that ``key`` gives a run (``name``:
    ``runs/<name>``) or a corpus (``data.name``: ``<data.root>/raw/<data.name>``, ...), or
    ``None`` when it can.

    A folder name is not empty, holds no ``/`` (nor NUL), is not ``.`` or ``..`` and has at
    most :data:`NAME_MAX_BYTES` bytes: ``name=..`` would write into the project root,
    ``data.name=`` into ``data/raw/`` itself.
    """
    text = "" if value is None else str(value)
    size = len(text.encode("utf-8", "surrogatepass"))
    if not text:
        why = "it is empty"
    elif text in (".", ".."):
        why = f"{text} is {'the folder itself' if text == '.' else 'the folder above'}"
    elif "/" in text or "\0" in text:
        why = "it holds a '/'" if "/" in text else "it holds a NUL character"
    elif size > NAME_MAX_BYTES:
        why = f"{size} bytes, more than the {NAME_MAX_BYTES} a file system takes"
    else:
        return None
    shown = repr(text) if len(text) <= 40 else f"'{text[:16]}...{text[-8:]}'"
    where = ("the run's folder is runs/<name>" if key == "name"
             else "the corpus's folders are <data.root>/raw/<data.name>, spm/<data.name> and "
                  "bin/<data.name>")
    return (f"{key}={shown} is not a folder name ({why}): {where}; give a name that is not "
            "empty, holds no '/', is not . or .. and has at most "
            f"{NAME_MAX_BYTES} bytes")


def _non_finite(cfg: Config) -> list[str]:
    """One message per NaN or infinite float of the ``decode``, ``trainer``, ``data`` and
    ``model`` groups (lists included)."""
    errors = []
    for group in ("decode", "trainer", "data", "model"):
        node = getattr(cfg, group)
        items = node.items() if isinstance(node, DictConfig) else vars(node).items()
        for key, value in items:
            values = list(value) if isinstance(value, (list, tuple, ListConfig)) else [value]
            if any(isinstance(v, float) and not math.isfinite(v) for v in values):
                errors.append(f"{group}.{key}={value} must be a finite number")
    return errors


def validate(cfg: Config) -> None:
    """Check the values typing cannot (ranges, divisibility, combinations).

    Args:
        cfg: a composed :class:`Config`.

    Raises:
        ValueError: naming every offending key with its value and what is allowed.
    """
    errors: list[str] = []
    for key, value in (("name", cfg.name), ("data.name", cfg.data.name)):
        problem = folder_name_error(key, value)
        if problem is not None:
            errors.append(problem)
    try:
        validate_model_config(cfg.model)
    except ValueError as e:
        errors.extend(line.strip() for line in str(e).splitlines()[1:])
    t = cfg.trainer
    for key in ("max_tokens", "update_freq", "warmup_steps", "keep_last", "prefetch_factor"):
        if getattr(t, key) <= 0:
            errors.append(f"trainer.{key}={getattr(t, key)} must be positive")
    if not 0.0 <= t.label_smoothing < 1.0:
        errors.append(f"trainer.label_smoothing={t.label_smoothing} must be in [0, 1)")
    for key in ("max_time_minutes", "save_every_steps", "save_every_epochs",
                "validate_every_steps", "validate_every_epochs", "pad_to_multiple"):
        if getattr(t, key) is not None and getattr(t, key) <= 0:
            errors.append(f"trainer.{key}={getattr(t, key)} must be positive (or null)")
    if t.tokens_per_step is not None and t.tokens_per_step <= 0:
        errors.append(f"trainer.tokens_per_step={t.tokens_per_step} must be positive (or null)")
    if not 0.0 < t.tokens_per_step_tolerance < 1.0:
        errors.append(f"trainer.tokens_per_step_tolerance={t.tokens_per_step_tolerance} "
                      "must be in (0, 1)")
    if len(t.adam_betas) != 2 or not all(0.0 <= b < 1.0 for b in t.adam_betas):
        errors.append(f"trainer.adam_betas={list(t.adam_betas)} must be two values in [0, 1)")
    for key in ("lr_multiplier", "adam_eps", "valid_bleu_sentences", "max_bad_steps"):
        if getattr(t, key) <= 0:
            errors.append(f"trainer.{key}={getattr(t, key)} must be positive")
    for key in ("max_steps", "max_epochs"):
        if getattr(t, key) is not None and getattr(t, key) <= 0:
            errors.append(f"trainer.{key}={getattr(t, key)} must be positive (or null for no "
                          "limit)")
    for key in ("weight_decay", "clip_norm", "num_workers"):
        if getattr(t, key) < 0:
            errors.append(f"trainer.{key}={getattr(t, key)} must be >= 0")
    if t.pack_length is not None and not 0 < t.pack_length <= t.max_tokens:
        errors.append(f"trainer.pack_length={t.pack_length} must be positive and at most "
                      f"trainer.max_tokens={t.max_tokens} (a packed micro-batch is "
                      "max_tokens // pack_length rows), or null")
    if t.cuda_graphs and not t.packing:
        errors.append("trainer.cuda_graphs=true needs trainer.packing=true (the whole step is "
                      "captured over the one static shape of packed batches); set "
                      "trainer.packing=true, or trainer.cuda_graphs=false")
    if t.patience is not None and t.patience <= 0:
        errors.append(f"trainer.patience={t.patience} must be positive (or null)")
    elif (t.patience is not None and t.validate_every_steps is None
          and t.validate_every_epochs is None):
        errors.append(f"trainer.patience={t.patience} counts validations without improvement, "
                      "but none is scheduled (trainer.validate_every_steps and "
                      "trainer.validate_every_epochs are null: the run validates only when it "
                      "ends); set one of them, or trainer.patience=null")
    if t.lr_scheduler != "inverse_sqrt" and t.max_steps is None:
        errors.append(f"trainer.lr_scheduler={t.lr_scheduler} decays to 0 at trainer.max_steps, "
                      "which is null; set trainer.max_steps, or trainer.lr_scheduler="
                      "inverse_sqrt for a run limited by time or epochs")
    d = cfg.decode
    errors.extend(_non_finite(cfg))
    for key, low, high in DECODE_RANGES:
        value = getattr(d, key)
        if math.isfinite(value) and not low <= value <= high:
            errors.append(f"decode.{key}={value} must be in [{low:g}, {high:g}]")
    if d.beam_size <= 0:
        errors.append(f"decode.beam_size={d.beam_size} must be positive")
    if d.max_input_tokens <= 0:
        errors.append(f"decode.max_input_tokens={d.max_input_tokens} must be positive")
    if d.max_tokens < 2:  # a batch holds at least one piece and the eos appended to it
        errors.append(f"decode.max_tokens={d.max_tokens} must be at least 2 (source tokens per "
                      "batch, the eos appended to each sentence included)")
    if d.max_len_a < 0:
        errors.append(f"decode.max_len_a={d.max_len_a} must be >= 0 (the maximum output length "
                      "max_len_a * source length + max_len_b falls below 1 for long sources)")
    elif d.max_len_a > MAX_LEN_A:
        errors.append(f"decode.max_len_a={d.max_len_a} must be in [0, {MAX_LEN_A:g}]")
    elif d.max_len_a + d.max_len_b < 1:
        errors.append(f"decode.max_len_a={d.max_len_a} and decode.max_len_b={d.max_len_b} give a "
                      f"maximum output length of {d.max_len_a + d.max_len_b:g} for a one-token "
                      "source; it must be at least 1")
    if not 0 < d.nbest <= d.beam_size:
        errors.append(f"decode.nbest={d.nbest} must be in [1, beam_size={d.beam_size}]")
    sync_every = str(getattr(d, "sync_every", "auto")).strip()
    if sync_every.lower() != "auto" and not (sync_every.isdigit() and int(sync_every) >= 1):
        errors.append(f"decode.sync_every={sync_every!r} must be auto or a whole number >= 1 "
                      "(decoding steps between two host reads of the finished flags)")
    compile_step = str(getattr(d, "compile", "auto")).strip().lower()
    if compile_step not in ("auto", "true", "false"):
        errors.append(f"decode.compile={getattr(d, 'compile')!r} must be auto, true or false "
                      "(run the decoder step compiled over a static cache)")
    if cfg.data.src_lang == cfg.data.tgt_lang:
        errors.append(
            f"data.src_lang={cfg.data.src_lang!r} equals data.tgt_lang={cfg.data.tgt_lang!r}; "
            "the two sides need different languages"
        )
    for key in ("vocab_size", "max_len"):
        if getattr(cfg.data, key) <= 0:
            errors.append(f"data.{key}={getattr(cfg.data, key)} must be positive")
    if cfg.data.max_ratio < 1.0:
        errors.append(f"data.max_ratio={cfg.data.max_ratio} must be >= 1")
    if len(errors) == 1:
        raise ValueError(f"invalid configuration: {errors[0]}")
    if errors:
        raise ValueError("invalid configuration:\n  " + "\n  ".join(errors))
