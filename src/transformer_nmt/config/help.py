"""``--help`` of the console scripts: the command's settings as composed, with descriptions.

:func:`help_text` composes ``configs/config.yaml`` with the overrides given beside ``--help``
(``nmt-train experiment=wmt14_en_de_base --help``), so every value shown is the one the
command would use, and prints, for the sections that command reads, one line per key:
``section.key=value`` and the first sentence of the field's docstring in
:mod:`transformer_nmt.config.schema` (:func:`field_descriptions`). The presets (config groups)
and the few keys most people change for that command (:data:`COMMANDS`) come first.
Nothing is written: no run directory, no ``.hydra`` folder.
"""

from __future__ import annotations

import ast
import dataclasses
import enum
import functools
import inspect
import itertools
import re
import shutil
import textwrap
import typing
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from transformer_nmt.config.compose import CONFIG_DIR, check_known_keys
from transformer_nmt.config.schema import Config
from transformer_nmt.config.table3 import apply_row

WIDTH = 120
"""Lines are wrapped to this many characters when standard output is not a terminal (else to
the terminal's width, from 80 to 120)."""
KEY_WIDTH = 38
"""The widest ``key=value`` column; a longer one puts its description on the next line."""


@dataclass(frozen=True)
class CommandHelp:
    """What ``--help`` of one console script shows."""

    command: str
    """The console script's name (``nmt-train``)."""
    summary: str
    """One sentence on what the command does."""
    example: str
    """A typical command line."""
    common: tuple[str, ...]
    """Dotted keys most people change for this command, shown first."""
    sections: dict[str, tuple[str, ...] | None]
    """Config sections shown after them (``""``: the top-level keys), each with the keys the
    command reads (None: all of them)."""
    groups: tuple[str, ...] = ()
    """Config groups (presets) the command is usually run with."""


GROUPS = {
    "experiment": "a whole recipe (data, model, trainer, decode)",
    "data": "the corpus",
    "model": "the model's size",
    "trainer": "the training recipe",
    "decode": "the search (greedy: beam 1)",
    "table3": "a row of the paper's Table 3 applied to the experiment",
}
"""The config groups of ``configs/`` (``group=option`` overrides) and what each one sets."""

_TRAIN_DATA = ("name", "root", "src_lang", "tgt_lang", "train_split", "valid_split",
               "vocab_size", "max_train_pairs")
_TEXT_DATA = ("name", "root", "src_lang", "tgt_lang", "lowercase", "pretokenize")

COMMANDS: dict[str, CommandHelp] = {
    "prepare": CommandHelp(
        "nmt-prepare",
        "Fetch, clean, tokenize (SentencePiece BPE) and binarize one corpus under data.root.",
        "nmt-prepare data=multi30k_en_de",
        ("data.root", "data.mirror", "data.vocab_size", "data.max_train_pairs",
         "data.lowercase", "data.pretokenize", "trainer.max_tokens"),
        {"data": None, "model": ("max_positions",)},
        ("experiment", "data")),
    "train": CommandHelp(
        "nmt-train",
        "Train a Transformer on a prepared corpus; a run folder that holds checkpoints resumes.",
        "nmt-train experiment=multi30k_en_de trainer.max_steps=20000",
        ("trainer.max_steps", "trainer.max_tokens", "trainer.update_freq",
         "trainer.tokens_per_step", "trainer.precision", "trainer.max_time_minutes",
         "trainer.dry_run", "run_dir"),
        {"": None, "trainer": None, "model": None, "data": _TRAIN_DATA,
         "decode": ("max_tokens", "max_len_a", "max_len_b")},
        ("experiment", "data", "model", "trainer", "decode", "table3")),
    "average": CommandHelp(
        "nmt-average",
        "Average the parameters of a run's last checkpoints into checkpoints/averaged.pt.",
        "nmt-average experiment=multi30k_en_de average.last=5",
        ("average.last", "average.checkpoints", "run_dir"),
        {"": None, "average": None},
        ("experiment",)),
    "evaluate": CommandHelp(
        "nmt-evaluate",
        "Translate a run's test sets and score them (sacreBLEU, the paper's BLEU, chrF).",
        "nmt-evaluate experiment=multi30k_en_de decode.beam_size=4",
        ("decode.beam_size", "decode.lenpen", "data.test_splits", "decode.checkpoint",
         "decode.engine", "decode.device", "decode.max_tokens", "decode.precision"),
        {"": None, "decode": None, "data": (*_TEXT_DATA, "test_splits")},
        ("experiment", "decode", "table3")),
    "translate": CommandHelp(
        "nmt-translate",
        "Translate a file or standard input with a run's model (translations on stdout).",
        "echo 'A dog runs.' | nmt-translate experiment=multi30k_en_de",
        ("translate.input", "translate.output", "decode.beam_size", "decode.lenpen",
         "decode.nbest", "decode.checkpoint", "decode.engine", "decode.device"),
        {"": None, "translate": None, "decode": None, "data": _TEXT_DATA},
        ("experiment", "decode")),
    "export": CommandHelp(
        "nmt-export",
        "Write a run's model as a Hugging Face Marian folder or a CTranslate2 model.",
        "nmt-export experiment=multi30k_en_de export.format=ctranslate2",
        ("export.format", "export.quantization", "export.output", "export.overwrite",
         "decode.checkpoint"),
        {"": None, "export": ("format", "quantization", "output", "overwrite"),
         "data": ("name", "root")},
        ("experiment",)),
    "import_model": CommandHelp(
        "nmt-import",
        "Import a Marian-architecture transformers folder as a run of ours.",
        "nmt-import export.source=path/to/marian_folder name=imported data.name=imported_spm",
        ("export.source", "name", "data.name", "export.overwrite", "run_dir"),
        {"": None, "export": ("source", "overwrite"), "data": ("name", "root", "src_lang",
                                                              "tgt_lang")},
        ("experiment",)),
    "table": CommandHelp(
        "nmt-table",
        "Rebuild the results tables (the paper's Tables 2 and 3) from every results.json.",
        "nmt-table table.output=runs/results.md",
        ("table.results_glob", "table.output", "table.tables", "table.table3_plot"),
        {"table": None}),
    "plot": CommandHelp(
        "nmt-plot",
        "Draw a run's training curves, BLEU per checkpoint and attention maps.",
        "nmt-plot experiment=multi30k_en_de plot.format=svg",
        ("plot.kinds", "plot.runs", "plot.sentence", "plot.format", "plot.dir",
         "plot.bleu_sentences"),
        {"": None, "plot": None, "decode": None, "data": (*_TEXT_DATA, "valid_split"),
         "average": ("last",)},
        ("experiment", "decode")),
}
"""``--help`` of each console script, by its Hydra job name (``cli/<job>.py``)."""

HYDRA_FLAGS = ("Hydra's own flags: --cfg job (the composed config as YAML), --hydra-help, "
               "-m / --multirun (a sweep over comma-separated values or glob(...)).")


# -- descriptions ---------------------------------------------------------------------------


def attribute_docs(cls: type) -> dict[str, str]:
    """The docstrings under the fields of a dataclass's source (the string literal right after
    ``name: type = default``), by field name."""
    try:
        tree = ast.parse(textwrap.dedent(inspect.getsource(cls)))
    except (OSError, TypeError):  # no source shipped: keys and values without descriptions
        return {}
    body = tree.body[0].body  # the class
    docs = {}
    for node, after in zip(body, body[1:]):
        if (isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name)
                and isinstance(after, ast.Expr) and isinstance(after.value, ast.Constant)
                and isinstance(after.value.value, str)):
            docs[node.target.id] = inspect.cleandoc(after.value.value)
    return docs


def _sections(cls: type) -> dict[str, type]:
    """The fields of ``cls`` that are themselves dataclasses (its sections), with their class."""
    hints = typing.get_type_hints(cls)
    return {f.name: hints[f.name] for f in dataclasses.fields(cls)
            if dataclasses.is_dataclass(hints[f.name])}


@functools.lru_cache(maxsize=None)
def field_descriptions(cls: type = Config) -> dict[str, str]:
    """Every leaf key of the schema (``trainer.max_steps``, ``run_dir``) and its docstring
    (``""`` where it has none), in the order of the schema."""
    docs = attribute_docs(cls)
    sections = _sections(cls)
    out: dict[str, str] = {}
    for f in dataclasses.fields(cls):
        if f.name in sections:
            inner = field_descriptions(sections[f.name])
            out.update({f"{f.name}.{k}": v for k, v in inner.items()})
        else:
            out[f.name] = docs.get(f.name, "")
    return out


def first_sentence(doc: str) -> str:
    """The first sentence of a docstring as plain text on one line (reST markup dropped)."""
    text = re.sub(r":\w+:`~?([^`]+)`", r"\1", doc).replace("``", "")
    text = " ".join(text.split())
    return re.split(r"(?<!e\.g\.)(?<!i\.e\.)(?<!al\.)(?<=\.)\s+(?=\w)", text, maxsplit=1)[0]


def summary(doc: str, limit: int = 80) -> str:
    """A field's description for ``--help``: its docstring's first sentence, without the
    parenthesised asides when that is longer than ``limit`` characters."""
    text = first_sentence(doc)
    if len(text) <= limit:
        return text
    while True:
        shorter = re.sub(r"\s*\([^()]*\)", "", text)
        if shorter == text:
            return text
        text = shorter


# -- values ---------------------------------------------------------------------------------


def format_value(value: Any) -> str:
    """A value as an override writes it (``null``, ``true``, ``[0.9,0.98]``, ``'two words'``)."""
    if value is None:
        return "null"
    if isinstance(value, enum.Enum):
        return str(value.value)
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (list, tuple)):
        return "[" + ",".join(format_value(v) for v in value) + "]"
    if isinstance(value, dict):
        return "{" + ",".join(f"{k}:{format_value(v)}" for k, v in value.items()) + "}"
    text = str(value)
    if not text or re.search(r"[\s,=\[\]{}'\"]", text):
        return "'" + text.replace("'", "\\'") + "'"
    return text


def _lookup(cfg: Any, key: str) -> Any:
    for part in key.split("."):
        cfg = getattr(cfg, part)
    return cfg


def composed(overrides: Sequence[str]) -> tuple[Config, dict[str, str | None]]:
    """The typed config of ``configs/config.yaml`` with ``overrides`` (a Table 3 row applied,
    not validated), and the option chosen in each config group.

    Raises:
        Hydra's and OmegaConf's errors: an unknown key or group, a bad value or override.
        ConfigError: an unknown key added with ``+``; a Table 3 row that does not apply.
    """
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir
    from omegaconf import OmegaConf

    with initialize_config_dir(config_dir=CONFIG_DIR, version_base="1.3"):
        cfg = hydra_compose(config_name="config", overrides=list(overrides),
                            return_hydra_config=True)
    choices = {k: v for k, v in OmegaConf.to_container(cfg.hydra.runtime.choices).items()
               if not k.startswith("hydra/")}
    OmegaConf.set_struct(cfg, False)
    cfg.pop("hydra")
    check_known_keys(cfg)
    typed = OmegaConf.to_object(cfg)
    apply_row(typed)
    return typed, choices


def group_options(group: str) -> list[str]:
    """The options of a config group: the YAML files of ``configs/<group>/``."""
    return sorted(p.stem for p in Path(CONFIG_DIR, group).glob("*.yaml"))


# -- the page -------------------------------------------------------------------------------


def _wrap(text: str, columns: int, first: str = "", indent: int = 0) -> list[str]:
    return textwrap.wrap(text, columns, initial_indent=first, subsequent_indent=" " * indent,
                         break_long_words=False, break_on_hyphens=False)


def _entry(key: str, value: str, description: str, width: int, columns: int) -> list[str]:
    """``  key=value  description``, the description from column ``width + 2`` on, wrapped to
    ``columns``."""
    left = f"  {key}={value}"
    if len(left) > width:
        return [left, *_wrap(description, columns, " " * (width + 2), width + 4)]
    return _wrap(description, columns, f"{left:<{width}}  ", width + 4) or [left]


def section_keys(spec: CommandHelp) -> dict[str, list[str]]:
    """The dotted keys each section of ``spec`` shows, less those of ``spec.common``."""
    docs = field_descriptions()
    out = {}
    for section, keys in spec.sections.items():
        prefix = f"{section}." if section else ""
        names = ([k for k in docs if (k.startswith(prefix) if section else "." not in k)]
                 if keys is None else [prefix + k for k in keys])
        out[section] = [k for k in names if k not in spec.common]
    return out


def help_text(job: str, overrides: Sequence[str] = (), columns: int | None = None) -> str:
    """The ``--help`` page of the console script whose Hydra job is ``job`` (``train``,
    ``translate`` ...), with the values that ``overrides`` give, wrapped to ``columns``
    (None: see :data:`WIDTH`).

    Raises:
        as :func:`composed`.
    """
    spec = COMMANDS[job]
    if columns is None:
        columns = min(max(shutil.get_terminal_size((WIDTH, 24)).columns, 80), 120)
    overrides, swept = split_sweeps(overrides)
    cfg, choices = composed(overrides)
    docs = field_descriptions()
    section_docs = {name: first_sentence(inspect.getdoc(cls) or "")
                    for name, cls in _sections(Config).items()}
    values = {key: format_value(_lookup(cfg, key)) for key in docs}

    sections = section_keys(spec)
    shown = [*spec.common, *(k for names in sections.values() for k in names)]
    width = min(max(len(f"  {k}={values[k]}") for k in shown), KEY_WIDTH, columns // 3)

    lines = [f"usage: {spec.command} [GROUP=OPTION ...] [KEY=VALUE ...] [--help]", "",
             spec.summary, f"Example: {spec.example}", "",
             "Settings as this command line composes them (override any as KEY=VALUE)."]
    if swept:
        lines += _wrap("Swept with -m, so shown with their defaults: " + " ".join(swept), columns,
                       indent=2)
    groups = [g for g in spec.groups if len(group_options(g)) > 1]
    if groups:
        lines += ["", "Presets (GROUP=OPTION):"]
        for group in groups:
            text = f"{GROUPS[group]}: {', '.join(group_options(group))}"
            lines += _entry(group, format_value(choices.get(group)), text, width, columns)
    lines += ["", "Most often changed:"]
    for k in spec.common:
        lines += _entry(k, values[k], summary(docs[k]), width, columns)
    for section, names in sections.items():
        if not names:
            continue
        title = f"{section}: {section_docs[section]}" if section else "The run:"
        if spec.sections[section] is not None:
            title = f"{section} (the keys {spec.command} reads): {section_docs[section]}"
        lines += ["", *_wrap(title, columns, indent=2)]
        for k in names:
            lines += _entry(k, values[k], summary(docs[k]), width, columns)
    lines += ["", *_wrap(f"Every setting: {spec.command} --cfg job. {HYDRA_FLAGS}", columns)]
    return "\n".join(lines) + "\n"


def split_sweeps(overrides: Sequence[str]) -> tuple[list[str], list[str]]:
    """``(fixed, swept)``: the overrides that set one value, and the sweeps of ``-m``
    (``trainer.max_steps=1,2``, ``'table3=glob(*)'``), which one config cannot show.

    Raises:
        hydra.errors.OverrideParseException: an override Hydra cannot parse.
    """
    from hydra.core.override_parser.overrides_parser import OverridesParser

    parsed = OverridesParser.create().parse_overrides(list(overrides))
    return ([o.input_line for o in parsed if not o.is_sweep_override()],
            [o.input_line for o in parsed if o.is_sweep_override()])


_FLAGS_WITH_VALUE = ("--config-path", "-cp", "--config-name", "-cn", "--config-dir", "-cd",
                     "--experimental-rerun")


class _Groups:
    """What Hydra's override parser asks of a config loader to expand ``glob(...)``: the
    options of a config group, the YAML files of its folder."""

    def __init__(self, config_dir: str | Path) -> None:
        self.config_dir = Path(config_dir)

    def get_group_options(self, group: str, results_filter: Any = None) -> list[str]:
        return sorted(p.stem for p in (self.config_dir / group).glob("*.yaml"))


def sweep_jobs(args: Sequence[str], config_dir: str | Path = CONFIG_DIR) -> list[list[str]]:
    """The jobs of ``nmt-train -m <args>`` in the order Hydra's basic sweeper runs them (the
    product of every sweep, the first override outermost), each as its overrides
    (``["experiment=table3_proxy", "table3=A_h1"]``); Hydra's own flags and ``hydra.*``
    overrides are left out.

    Raises:
        hydra.errors.HydraException: an override that does not parse.
    """
    from hydra.core.override_parser.overrides_parser import OverridesParser

    overrides, skip = [], False
    for arg in args:
        if skip:
            skip = False
        elif arg in _FLAGS_WITH_VALUE:
            skip = True
        elif not arg.startswith("-"):
            overrides.append(arg)
    parser = OverridesParser.create(config_loader=_Groups(config_dir))  # type: ignore[arg-type]
    lists: dict[str, list[str]] = {}
    for o in parser.parse_overrides(overrides):
        if o.is_hydra_override():
            continue
        key = o.get_key_element()
        lists[key] = ([f"{key}={v}" for v in o.sweep_string_iterator()]
                      if o.is_sweep_override() else [f"{key}={o.get_value_element_as_str()}"])
    return [list(job) for job in itertools.product(*lists.values())]


def help_requested(args: Sequence[str]) -> bool:
    """Whether the command line asks for ``--help`` / ``-h`` (Hydra's ``--hydra-help`` is
    Hydra's own)."""
    return any(a in ("--help", "-h") for a in args)


VALUE_FLAGS = ("--cfg", "-c", "--package", "-p", "--info", "-i", "--config-path", "-cp",
               "--config-name", "-cn", "--config-dir", "-cd", "--experimental-rerun")
"""Hydra's flags that take a value (``--cfg job``; ``--info`` optionally) as the next argument."""


def help_overrides(args: Sequence[str]) -> list[str]:
    """The overrides among the arguments of a ``--help`` command line: every argument that is
    neither a flag nor the value of one (``--cfg job``; a value never holds ``=``)."""
    out, skip = [], False
    for a in args:
        if a.startswith("-"):
            skip = a in VALUE_FLAGS
        elif skip and "=" not in a:
            skip = False
        else:
            skip = False
            out.append(a)
    return out


__all__ = ["COMMANDS", "CommandHelp", "attribute_docs", "composed", "field_descriptions",
           "first_sentence", "format_value", "group_options", "help_overrides", "help_requested",
           "help_text", "section_keys", "split_sweeps", "summary", "sweep_jobs"]
