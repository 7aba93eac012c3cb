"""Thin Hydra entry points, one per pipeline stage; each calls a plain function.

All of them compose ``configs/config.yaml`` (typed by :class:`transformer_nmt.config.Config`),
so ``nmt-train experiment=wmt14_en_de_base trainer.max_steps=1000`` works for every stage.

User errors (:data:`USER_ERRORS`: a bad value, file or combination) print one line
``error: <message>`` on standard error and exit with status 2 (:func:`run_app`). The config is
composed and validated before Hydra creates the run directory, so a bad override leaves
nothing behind; a user error raised later removes the ``.hydra`` folder and log that this
command created (or restores the ``.hydra`` files of an existing run). Other exceptions keep
Hydra's report with their traceback.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import platform
import re
import shutil
import sys
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

from omegaconf import DictConfig, OmegaConf

from transformer_nmt import config as _config  # registers the schema
from transformer_nmt.config import Config
from transformer_nmt.errors import UserError

USER_ERRORS: tuple[type[BaseException], ...] = (UserError, FileNotFoundError, PermissionError)
"""Exceptions reported as ``error: ...`` with exit status 2 (``DataError`` is a UserError;
``PermissionError``: a read-only data root or run folder, named by the message)."""
USER_EXIT = 2
INTERRUPTED_EXIT = 130
"""Exit status after Ctrl-C (128 + SIGINT), with one line and no traceback (:func:`run_app`)."""



def _config_dir() -> str:
    """``$NMT_CONFIG_DIR``, else the configs shipped in an installed package
    (``transformer_nmt/configs``), else the repository's ``configs/`` (a source checkout or an
    editable install)."""
    if os.environ.get("NMT_CONFIG_DIR"):
        return os.environ["NMT_CONFIG_DIR"]
    package = Path(__file__).resolve().parents[1]
    for folder in (package / "configs", package.parents[1] / "configs"):
        if (folder / "config.yaml").is_file():
            return str(folder)
    raise ImportError(f"transformer_nmt: no configs/config.yaml in {package} or {package.parents[1]}")


CONFIG_DIR = _config_dir()
"""Folder holding config.yaml and the config groups (see :func:`_config_dir`)."""


def typed_config(cfg: DictConfig) -> Config:
    """The composed config as the typed :class:`~transformer_nmt.config.Config` that every
    stage receives, validated: the one conversion each entry point makes.

    A Table 3 row (``table3=<row>``) is applied here (:func:`transformer_nmt.evaluate.table3.apply_row`),
    so every stage sees the row's model and trainer values.

    ``OmegaConf.to_object`` resolves the interpolations (``run_dir: runs/${name}``) and gives
    the schema's dataclasses (the entry point's subclass of ``Config`` where it has one:
    nmt-export, nmt-import, nmt-plot), choice fields as their Enums, free-form nodes
    (``extra``, ``data.custom_files``) as plain dicts and lists.

    Raises:
        omegaconf errors: a mandatory value missing, an interpolation that does not resolve.
        ConfigError (a UserError): from :func:`transformer_nmt.config.validate` or a Table 3
            row that does not apply to the experiment.
    """
    from transformer_nmt.evaluate.table3 import apply_row

    check_known_keys(cfg)
    typed = OmegaConf.to_object(cfg)
    apply_row(typed)  # a Table 3 row (``table3=...``) onto the experiment's model and trainer
    try:
        _config.validate(typed)
    except _config.ConfigError:
        raise
    except ValueError as e:  # reported as one line, also where no pre-flight check ran (-m)
        raise _config.ConfigError(str(e)) from e
    return typed


def check_known_keys(cfg: DictConfig) -> None:
    """Fail on a key that no field of the typed schema declares (``+trainer.max_stepz=3``,
    ``+lr=5``): Hydra's ``+`` adds keys even to typed groups, where they would be ignored.

    Free-form nodes (``extra``, ``data.custom_files``, ``table3.scale`` ...) take any key.

    Raises:
        ConfigError (a UserError): naming each unknown key, with the closest field.
    """
    import dataclasses
    import difflib

    errors: list[str] = []

    def walk(node: DictConfig, prefix: str) -> None:
        schema = OmegaConf.get_type(node)
        if not dataclasses.is_dataclass(schema):
            return  # a free-form dict
        fields = [f.name for f in dataclasses.fields(schema)]
        for key in node:
            name = f"{prefix}{key}"
            if key not in fields:
                close = difflib.get_close_matches(str(key), fields, n=1)
                errors.append(f"{name} is not a setting of {schema.__name__}"
                              + (f" (did you mean {prefix}{close[0]}?)" if close else ""))
                continue
            child = node._get_node(key)
            if isinstance(child, DictConfig) and not child._is_none() and not child._is_missing():
                walk(child, f"{name}.")

    walk(cfg, "")
    if errors:
        raise _config.ConfigError("unknown key: " + "; ".join(errors))


def compose(overrides: Sequence[str] = ()) -> Config:
    """Compose the primary config with overrides, as an entry point would (for tests, scripts).

    Args:
        overrides: Hydra override strings, e.g. ``["experiment=multi30k_en_de", "trainer.max_steps=5"]``.

    Returns:
        The composed, validated, typed config (:func:`typed_config`).

    Raises:
        hydra.errors.ConfigCompositionException / omegaconf errors: unknown keys or groups.
        ValueError: from :func:`transformer_nmt.config.validate`.
    """
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir

    with initialize_config_dir(config_dir=CONFIG_DIR, version_base="1.3"):
        cfg = hydra_compose(config_name="config", overrides=list(overrides))
    return typed_config(cfg)


_M_TRIM_THRESHOLD = -1  # glibc mallopt parameters (malloc.h)
_M_MMAP_MAX = -4


def retain_freed_memory() -> bool:
    """Let glibc malloc keep freed memory for reuse instead of handing it back to the OS.

    CPU tensors come from malloc. By default glibc serves large blocks (above a threshold
    that adapts up to 32 MiB) with fresh ``mmap`` pages and unmaps them when freed, and
    trims the heap's free top; a decoding step that allocates its (rows, vocabulary)
    log-probabilities, K/V and activations anew then pays a page fault (the kernel zeroing
    4 KiB) for every page of them, every step. With ``M_MMAP_MAX`` 0 (large blocks from the
    heap) and ``M_TRIM_THRESHOLD`` -1 (never trim), freed blocks are reused without faults;
    the process keeps its peak heap until it exits. The same as running with
    ``MALLOC_MMAP_MAX_=0 MALLOC_TRIM_THRESHOLD_=-1`` in the environment, or preloading
    jemalloc / tcmalloc. ``nmt-translate`` and ``nmt-evaluate`` call it (docs/benchmarks.md:
    beam-search page faults and time with and without).

    Returns:
        True when applied; False where the C library is not glibc (macOS, musl), where
        nothing changes.
    """
    if platform.system() != "Linux" or platform.libc_ver()[0] != "glibc":
        return False
    try:
        libc = ctypes.CDLL("libc.so.6")
    except OSError:
        return False
    ok = libc.mallopt(_M_MMAP_MAX, 0) == 1
    return ok and libc.mallopt(_M_TRIM_THRESHOLD, -1) == 1


class _UserExit(BaseException):
    """Carries a user error out of the Hydra task (Hydra reports every ``Exception`` itself)."""


def one_line(error: BaseException) -> str:
    """The message of ``error`` on one line (its lines joined with ``; ``)."""
    text = str(error) or type(error).__name__
    if isinstance(error, FileNotFoundError) and error.filename and str(error.filename) not in text:
        text = f"{text}: {error.filename}"
    cause = error.__cause__
    if cause is not None and not isinstance(error, UserError):  # Hydra's composition errors
        detail = str(cause).splitlines()[0].strip() if str(cause).strip() else ""
        if detail and detail not in text:
            text = f"{text}: {detail}"
    text = text.split("\nConfig search path:")[0]
    # Hydra suggests ``+key=value`` for a misspelt key, which only adds an unknown key
    text = re.sub(r"\s*To append to your config use \+\S+", "", text)
    text = "; ".join(part.strip() for part in text.splitlines() if part.strip()).replace(":; ", ": ")
    return text + _did_you_mean(text)


def _did_you_mean(text: str) -> str:
    """`` (did you mean trainer.max_steps?)`` for Hydra's "Key 'max_step' not in
    'TrainerConfig'" when a field of that schema class is close; else ``""``."""
    import dataclasses
    import difflib

    m = re.search(r"Key '([^']+)' not in '(\w+)'", text)
    where = re.search(r"override '([\w.]+)'", text)
    schema = getattr(_config, m.group(2), None) if m else None
    if not m or not dataclasses.is_dataclass(schema):
        return ""
    close = difflib.get_close_matches(m.group(1), [f.name for f in dataclasses.fields(schema)], n=1)
    if not close:
        return ""
    prefix = where.group(1).rsplit(".", 1)[0] + "." if where and "." in where.group(1) else ""
    return f" (did you mean {prefix}{close[0]}?)"


@contextlib.contextmanager
def user_errors() -> Iterator[None]:
    """Inside a Hydra task: turn :data:`USER_ERRORS`, and an ``OSError`` whose errno is a
    write's cause the user fixes (full disk, quota, file-size limit, read-only file system:
    :func:`transformer_nmt.fileio.write_error`), into an exit that :func:`run_app` reports."""
    from transformer_nmt.fileio import write_error

    try:
        yield
    except USER_ERRORS as e:
        raise _UserExit(one_line(e)) from e
    except OSError as e:
        error = write_error(e)
        if error is None:
            raise
        raise _UserExit(one_line(error)) from e


def _preflight(overrides: list[str]) -> tuple[Path | None, str | None]:
    """Compose and validate as Hydra will, before it creates the run directory.

    Returns:
        ``(run_dir, error)``: Hydra's ``hydra.run.dir`` and ``None``, or ``(None, message)``
        for a bad override or value.
    """
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir
    from hydra.errors import HydraException
    from omegaconf.errors import OmegaConfBaseException

    try:
        with initialize_config_dir(config_dir=CONFIG_DIR, version_base="1.3"):
            cfg = hydra_compose(config_name="config", overrides=overrides,
                                return_hydra_config=True)
        run_dir = Path(str(OmegaConf.select(cfg, "hydra.run.dir")))
        OmegaConf.set_struct(cfg, False)
        cfg.pop("hydra")
        typed_config(cfg)
    except (HydraException, OmegaConfBaseException, ValueError, OSError) as e:
        # composition (unknown key or group, bad type, bad override) or validation
        return None, one_line(e)
    if run_dir.exists() and not run_dir.is_dir():
        return None, f"run_dir={run_dir} is a file, not a folder; give the run another run_dir="
    return run_dir, None


def _snapshot(run_dir: Path, job: str) -> dict[Path, bytes] | None:
    """The run directory's ``.hydra/<job>`` files before Hydra rewrites them; None when the
    run directory does not exist yet."""
    if not run_dir.exists():
        return None
    folder = run_dir / ".hydra" / job
    return {p: p.read_bytes() for p in folder.glob("*") if p.is_file()} if folder.is_dir() else {}


def _undo_hydra_files(run_dir: Path, job: str, before: dict[Path, bytes] | None) -> None:
    """Remove what Hydra wrote for a command that failed on a user error: for a new run
    directory its ``.hydra`` folder, its log and the directory itself when nothing else is
    in it; for an existing one, the ``.hydra/<job>`` files as they were."""
    hydra_dir = run_dir / ".hydra"
    with contextlib.suppress(OSError):
        if before is None:
            shutil.rmtree(hydra_dir / job, ignore_errors=True)
            with contextlib.suppress(OSError):
                hydra_dir.rmdir()  # only when empty
            log_file = run_dir / f"{job}.log"
            others = [p for p in run_dir.iterdir() if p != log_file] if run_dir.is_dir() else []
            if log_file.is_file() and (not others or log_file.stat().st_size == 0):
                log_file.unlink()
            with contextlib.suppress(OSError):
                run_dir.rmdir()  # only when empty
        else:
            for p in (hydra_dir / job).glob("*"):
                if p.is_file() and p not in before:
                    p.unlink()
            for p, data in before.items():
                p.write_bytes(data)


def run_app(app: Callable[[], None], job: str, argv: Sequence[str] | None = None) -> None:
    """Run a ``@hydra.main`` app as a console script with one-line user errors.

    Args:
        app: the Hydra-decorated task of a ``cli`` module; its body runs inside
            :func:`user_errors`.
        job: Hydra's job name for that module (its file name: ``train``, ``prepare`` ...),
            which names ``.hydra/<job>`` and ``<job>.log`` in the run directory.
        argv: the command-line arguments (default ``sys.argv[1:]``).

    Exits with status 2 after printing ``error: <message>`` on a user error, with 130 after
    one line on Ctrl-C (a KeyboardInterrupt that reaches it); Hydra flags (``--help``,
    ``--cfg``, ``-m`` ...) skip the checks made before Hydra starts.
    """
    args = list(sys.argv[1:] if argv is None else argv)
    run_dir, before = None, None
    if not any(a.startswith("-") for a in args):
        run_dir, error = _preflight(args)
        if error is not None:
            print(f"error: {error}", file=sys.stderr)
            sys.exit(USER_EXIT)
        before = _snapshot(run_dir, job)
    try:
        app()
    except _UserExit as e:
        if run_dir is not None:
            _undo_hydra_files(run_dir, job, before)
        print(f"error: {e}", file=sys.stderr)
        sys.exit(USER_EXIT)
    except KeyboardInterrupt:  # Ctrl-C: outputs are written atomically, so nothing is half-written
        print("interrupted: stopped before the end (no output file is left half-written)",
              file=sys.stderr)
        sys.exit(INTERRUPTED_EXIT)
