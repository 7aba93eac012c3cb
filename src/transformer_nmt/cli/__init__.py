"""The console scripts' harness; ``cli/<name>.py`` holds one thin Hydra entry point per script.

Every entry point composes ``configs/config.yaml`` into the typed
:class:`transformer_nmt.config.Config` (:func:`transformer_nmt.config.typed_config`) and calls
its stage's plain function, so ``nmt-train experiment=wmt14_en_de_base trainer.max_steps=1000``
works for every stage; its ``main`` is :func:`run_app`.

User errors (:data:`USER_ERRORS`: a bad value, file or combination) print one line
``error: <message>`` on standard error and exit with status 2 (:func:`run_app`). The config is
composed and validated before Hydra creates the run directory, so a bad override leaves
nothing behind; a user error raised later removes the ``.hydra`` folder and log that this
command created (or restores the ``.hydra`` files of an existing run). Other exceptions keep
Hydra's report with their traceback. ``cli/check_overrides.py`` runs the same check alone
(:func:`preflight_config`), for job scripts that must stop on a bad override before they
start anything.

Hydra's flags are read first, as Hydra reads them but without its abbreviations (``--hel``
is not ``--help``): an unknown flag or a flag with a wrong value is one ``error:`` line.
With ``-m`` / ``--cfg`` / ``--info`` the overrides (the first job of a sweep) are composed
before Hydra starts, so a misspelt key gets the same line as without the flag. Ctrl-C while
the console script imports its modules (torch takes seconds) is one line and exit 130.
"""

from __future__ import annotations

import contextlib
import os
import re
import shlex
import shutil
import signal
import sys
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any, NoReturn

from omegaconf import OmegaConf

from transformer_nmt import config as _config  # registers the schema
from transformer_nmt.config import CONFIG_DIR, check_known_keys, typed_config
from transformer_nmt.config.help import (
    COMMANDS,
    help_overrides,
    help_requested,
    help_text,
    sweep_jobs,
)
from transformer_nmt.config.validate import NAME_MAX_BYTES, PATH_MAX_BYTES
from transformer_nmt.errors import UserError
from transformer_nmt.fileio import write_error

USER_ERRORS: tuple[type[BaseException], ...] = (UserError, FileNotFoundError, PermissionError)
"""Exceptions reported as ``error: ...`` with exit status 2 (``DataError`` is a UserError;
``PermissionError``: a read-only data root or run folder, named by the message)."""
USER_EXIT = 2
INTERRUPTED_EXIT = 130
"""Exit status after Ctrl-C (128 + SIGINT), with one line and no traceback (:func:`run_app`)."""


START_UP_INTERRUPT = "interrupted: stopped during start-up, before anything was written"
"""The line printed on Ctrl-C while a console script imports its modules."""
_starting = True


def _interrupted_at_start_up(signum: int, frame: Any) -> None:
    """SIGINT while a console script imports its modules: one line, exit 130 (the import of
    torch runs no handler of ours); after :func:`run_app` has started, Python's own."""
    if not _starting:
        signal.default_int_handler(signum, frame)
    with contextlib.suppress(Exception):
        sys.stderr.write(START_UP_INTERRUPT + "\n")
        sys.stderr.flush()
    os._exit(INTERRUPTED_EXIT)


def _console_script_starting() -> bool:
    """Whether this import is a console script's start: ``nmt-<name>``, or ``python -m``
    locating its module (``sys.argv[0]`` is ``-m`` until it is found)."""
    name = Path(sys.argv[0]).name if sys.argv and sys.argv[0] else ""
    return name == "-m" or name.startswith("nmt-")


if _console_script_starting() and signal.getsignal(signal.SIGINT) is signal.default_int_handler:
    with contextlib.suppress(ValueError):  # not the main thread
        signal.signal(signal.SIGINT, _interrupted_at_start_up)


class _UserExit(BaseException):
    """Carries a user error out of the Hydra task (Hydra reports every ``Exception`` itself)."""


def error_message(error: BaseException) -> str:
    """The message of ``error`` on one line (its lines joined with ``; ``)."""
    text = str(error) or type(error).__name__
    unquoted = _unquoted_character(error)
    if unquoted:
        return unquoted
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
    text = "; ".join(
        part.strip() for part in text.splitlines() if part.strip()
    ).replace(":; ", ": ")
    return text + _did_you_mean(text)


def _unquoted_character(error: BaseException) -> str:
    """For Hydra's ``LexerNoViableAltException`` (a character its grammar reads only inside
    quotes, such as ``ä`` in ``plot.sentence=Ein Mann fährt``): the message that says to
    quote the value; else ``""``."""
    text = str(error)
    override = getattr(error, "override", None)
    prefix = "LexerNoViableAltException: "
    if not isinstance(override, str) or not text.startswith(prefix):
        return ""
    lines = text.splitlines()
    at = lines[1].find("^") - len(prefix) if len(lines) > 1 else -1
    char = override[at] if 0 <= at < len(override) else ""
    what = f"Hydra reads {char!r}" if char else "Hydra reads a character of it"
    key, sep, value = override.partition("=")
    if not sep or (0 <= at < len(key)):
        return f"cannot parse the override {override}: {what} only inside a quoted value"
    quote = "'" if '"' in value else '"'
    quoted = shlex.quote(f"{key}={quote}{value}{quote}")
    return (f"cannot parse the override {override}: {what} only inside a quoted value; quote "
            f"the value inside the shell's quotes: {quoted}")


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
    try:
        yield
    except USER_ERRORS as e:
        raise _UserExit(error_message(e)) from e
    except OSError as e:
        error = write_error(e)
        if error is None:
            raise
        raise _UserExit(error_message(error)) from e


def _preflight(overrides: list[str]) -> tuple[Path | None, str | None]:
    """Compose and validate as Hydra will, before it creates the run directory.

    Returns:
        ``(run_dir, error)``: Hydra's ``hydra.run.dir`` and ``None``, or ``(None, message)``
        for a bad override or value.
    """
    _, run_dir, error = preflight_config(overrides)
    return run_dir, error


def preflight_config(overrides: Sequence[str]) -> tuple[Any, Path | None, str | None]:
    """The pre-flight check of every console script (:func:`run_app`): compose the config
    from ``overrides`` as Hydra will and validate it, without creating anything.

    Returns:
        ``(config, run_dir, None)``: the typed :class:`transformer_nmt.config.Config` and
        Hydra's ``hydra.run.dir``; or ``(None, None, message)`` for a bad override or value,
        the one line a console script prints after ``error:`` (Hydra's advice to add the key
        with ``+`` dropped, the closest valid key named), or for a ``run_dir`` that is a file.
    """
    from hydra.errors import HydraException
    from omegaconf.errors import OmegaConfBaseException

    try:
        cfg, run_dir = _compose(overrides)
        typed = typed_config(cfg)
    except (HydraException, OmegaConfBaseException, ValueError, OSError) as e:
        # composition (unknown key or group, bad type, bad override) or validation
        return None, None, error_message(e)
    error = run_dir_error(run_dir)
    if error is not None:
        return None, None, error
    return typed, run_dir, None


def run_dir_error(run_dir: Path) -> str | None:
    """Why Hydra cannot create or enter ``run_dir``, as one line, or ``None`` when it can.

    Each folder on the way is looked at from the top: a regular file (``run_dir`` itself or a
    folder above it), a symlink loop, a symlink whose target does not exist (Hydra would fail
    to create the folder), a name longer than the file system takes, or another error of the
    file system, is named; a missing folder is fine (Hydra creates it and those below it).
    """
    import errno
    import stat

    def shown(path: Path | str) -> str:
        text = str(path)
        return text if len(text) <= 120 else f"{text[:60]}...{text[-40:]}"

    parts = run_dir.parts
    longest = max((len(os.fsencode(part)) for part in parts), default=0)
    total = len(os.fsencode(str(run_dir.absolute())))
    if longest > NAME_MAX_BYTES or total >= PATH_MAX_BYTES:
        what = (f"a folder name of {longest} bytes, more than {NAME_MAX_BYTES}"
                if longest > NAME_MAX_BYTES else
                f"{total} bytes from /, more than {PATH_MAX_BYTES - 1}")
        return (f"run_dir={shown(run_dir)} is too long for the file system (File name too long: "
                f"{what}); give the run another run_dir=")
    for i in range(1, len(parts) + 1):
        here = Path(*parts[:i])
        subject = (f"run_dir={shown(run_dir)}" if here == run_dir
                   else f"run_dir={shown(run_dir)}: {shown(here)}")
        try:
            mode = os.stat(here).st_mode
        except FileNotFoundError:
            if not os.path.islink(here):
                return None  # Hydra creates it and the folders below it
            target = shown(os.path.normpath(here.parent / os.readlink(here)))
            why = f"is a symlink to {target}, which does not exist; create {target} or"
        except OSError as e:
            if e.errno == errno.ELOOP:
                why = "is a symlink loop (it never reaches a folder);"
            elif e.errno == errno.ENAMETOOLONG:
                why = (f"is too long for the file system (File name too long: "
                       f"{len(os.fsencode(str(here)))} bytes);")
            else:
                why = f"cannot be looked at ({e.strerror or type(e).__name__});"
        else:
            if stat.S_ISDIR(mode):
                continue
            why = "is a file, not a folder;"
        return f"{subject} {why} give the run another run_dir="
    return None


class _FlagError(Exception):
    """An argument Hydra's flag parser refuses (argparse's message)."""


def parse_flags(args: Sequence[str]) -> Any:
    """Hydra's flags among ``args``, read by Hydra's own parser but without abbreviations.

    Returns:
        argparse's namespace (``help``, ``hydra_help``, ``multirun``, ``cfg``, ``info``,
        ``config_path`` ..., and ``overrides``), or None for ``--version`` (Hydra answers it).

    Raises:
        ValueError: one line: an unknown flag (``--hel``: ``unrecognized argument --hel (did
            you mean --help?)``), a flag given a value it takes none of (``--help=x``), a
            value outside a flag's choices (``--cfg jbo``).
    """
    import difflib

    from hydra._internal.utils import get_args_parser

    if "--version" in args:
        return None
    parser = get_args_parser()
    parser.allow_abbrev = False

    def refuse(message: str) -> NoReturn:
        raise _FlagError(message)

    parser.error = refuse  # type: ignore[method-assign]
    try:
        flags, unknown = parser.parse_known_args(list(args))
    except _FlagError as e:
        raise ValueError(str(e)) from None
    if unknown:
        options = [o for action in parser._actions for o in action.option_strings]
        bad = unknown[0]
        close = ([o for o in options if o.startswith(bad.split("=")[0]) and o.startswith("--")]
                 or difflib.get_close_matches(bad, options, n=1))
        hint = f" (did you mean {close[0]}?)" if close and bad.startswith("-") else ""
        if len(unknown) > 1:
            raise ValueError(f"unrecognized arguments: {' '.join(unknown)}{hint}")
        raise ValueError(f"unrecognized argument {bad}{hint}")
    return flags


def _hydra_mode(flags: Any) -> str:
    """``"run"`` for a plain run (the pre-flight check with validation), ``"compose"`` for
    ``-m`` / ``--cfg`` / ``--info`` / ``--resolve`` / ``--package`` (composition checked,
    values not validated), ``"hydra"`` for what Hydra alone answers (``--hydra-help``,
    another config path or name, shell completion, a rerun)."""
    if flags is None or flags.hydra_help or flags.shell_completion or flags.experimental_rerun \
            or flags.config_path or flags.config_name or flags.config_dir:
        return "hydra"
    if flags.multirun or flags.cfg or flags.info or flags.resolve or flags.package:
        return "compose"
    return "run"


def composition_error(overrides: Sequence[str], multirun: bool = False) -> str | None:
    """The one-line error of composing ``overrides`` (for ``multirun``, the first job of the
    sweep, :func:`transformer_nmt.config.help.sweep_jobs`), or a key no field declares
    (:func:`transformer_nmt.config.check_known_keys`); None when they compose. Values are
    not validated: ``--cfg job`` shows them, and each job of a sweep checks its own."""
    from hydra.errors import HydraException
    from omegaconf.errors import OmegaConfBaseException

    try:
        if multirun:
            overrides = sweep_jobs(overrides)[0]
        cfg, _ = _compose(overrides)
        check_known_keys(cfg)
    except (HydraException, OmegaConfBaseException, ValueError, OSError) as e:
        return error_message(e)
    return None


def _compose(overrides: Sequence[str]) -> tuple[Any, Path]:
    """Hydra's composition of ``overrides`` without its ``hydra`` node, and ``hydra.run.dir``."""
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir

    with initialize_config_dir(config_dir=CONFIG_DIR, version_base="1.3"):
        cfg = hydra_compose(config_name="config", overrides=list(overrides),
                            return_hydra_config=True)
    run_dir = Path(str(OmegaConf.select(cfg, "hydra.run.dir")))
    OmegaConf.set_struct(cfg, False)
    cfg.pop("hydra")
    return cfg, run_dir


def not_writable(folder: str | os.PathLike) -> str | None:
    """Why nothing can be written into ``folder`` (or, when it does not exist yet, into its
    nearest existing parent, where it would be created): ``"a read-only file system"`` or
    ``"no write permission"``; None when it can be written. ``os.access`` answers for the
    process's user (root too, on a read-only mount)."""
    path = _existing(Path(folder))
    if os.access(path, os.W_OK | os.X_OK):
        return None
    with contextlib.suppress(OSError):
        if os.statvfs(path).f_flag & os.ST_RDONLY:
            return "a read-only file system"
    return "no write permission"


READ_ONLY_RUN = ("hydra.output_subdir=null", "~hydra.job_logging.handlers.file",
                 "hydra.job_logging.root.handlers=[console]")
"""Hydra's overrides for a run folder that cannot be written: no ``.hydra`` files, no log
file (the log goes to the console only)."""


def _existing(folder: Path) -> Path:
    """``folder``, or its nearest parent that exists."""
    path = Path(os.path.abspath(folder))
    while not path.exists() and path != path.parent:
        path = path.parent
    return path


def _read_only_run(run_dir: Path, job: str, writes_run: bool) -> None:
    """Before Hydra starts, for a run folder that cannot be written (:func:`not_writable`):
    a command that writes into it exits with one line saying so; one that only reads it
    (``nmt-translate``) runs without Hydra's files there (:data:`READ_ONLY_RUN`), logging to
    the console only. Nothing happens for a writable folder."""
    why = not_writable(run_dir)
    if why is None:
        return

    command = COMMANDS[job].command if job in COMMANDS else job
    if writes_run:
        print(f"error: the run folder {run_dir} is read-only ({why}): {command} writes into "
              "it; copy the run to a writable folder and give that as run_dir=",
              file=sys.stderr)
        sys.exit(USER_EXIT)
    _hydra_writes_nothing(run_dir)


def _hydra_writes_nothing(run_dir: Path) -> None:
    """Let Hydra write nothing for this command: no ``.hydra`` files, no log file (the log
    goes to the console only, :data:`READ_ONLY_RUN`), and no run folder created (Hydra's
    folder pointed at the nearest one that exists)."""
    overrides = list(READ_ONLY_RUN)
    if not run_dir.exists():  # Hydra creates hydra.run.dir: point it at a folder that is there
        folder = str(_existing(run_dir)).replace("\\", "\\\\").replace("'", "\\'")
        overrides.append(f"hydra.run.dir='{folder}'")
    sys.argv.extend(overrides)


def _snapshot(run_dir: Path, job: str) -> dict[Path, bytes] | None:
    """The run directory's ``.hydra/<job>`` files before Hydra rewrites them, and its
    ``<job>.log`` when there is one; None when the run directory does not exist yet."""
    if not run_dir.exists():
        return None
    folder = run_dir / ".hydra" / job
    files = {p: p.read_bytes() for p in folder.glob("*") if p.is_file()} if folder.is_dir() else {}
    log_file = run_dir / f"{job}.log"
    if log_file.is_file():
        files[log_file] = b""  # kept as it is: only its presence is recorded
    return files


def _undo_hydra_files(run_dir: Path, job: str, before: dict[Path, bytes] | None) -> None:
    """Remove what Hydra wrote for a command that failed on a user error: for a new run
    directory its ``.hydra`` folder, its log and the directory itself when nothing else is
    in it; for an existing one, the ``.hydra/<job>`` files as they were, the folders this
    command made when they are left empty, and an empty log that it created."""
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
            log_file = run_dir / f"{job}.log"
            for p in (hydra_dir / job).glob("*"):
                if p.is_file() and p not in before:
                    p.unlink()
            for p, data in before.items():
                if p != log_file:
                    p.write_bytes(data)
            with contextlib.suppress(OSError):
                (hydra_dir / job).rmdir()  # only when empty: this command made it
            with contextlib.suppress(OSError):
                hydra_dir.rmdir()
            if log_file not in before and log_file.is_file() and log_file.stat().st_size == 0:
                log_file.unlink()


@contextlib.contextmanager
def hydra_write_errors() -> Iterator[None]:
    """While Hydra starts a job: a failed write of its own files (``.hydra/<job>/config.yaml``,
    ``hydra.yaml``, ``overrides.yaml``) for a cause the user fixes (full disk, quota,
    file-size limit, read-only file system: :func:`transformer_nmt.fileio.write_error`) is a
    user error naming the file, which :func:`run_app` reports as one line."""
    import hydra.core.utils as hydra_utils

    save = hydra_utils._save_config

    def save_config(cfg: Any, filename: str, output_dir: Path) -> None:
        try:
            save(cfg, filename, output_dir)
        except OSError as e:
            error = write_error(e, Path(output_dir) / filename)
            if error is None:
                raise
            raise _UserExit(error_message(error)) from e

    hydra_utils._save_config = save_config
    try:
        yield
    finally:
        hydra_utils._save_config = save


def _print_help(job: str, args: list[str]) -> NoReturn:
    """Print the ``--help`` page of ``job`` on standard output and exit 0 (2 with one line
    when the other arguments do not compose); writes no file."""
    from hydra.errors import HydraException
    from omegaconf.errors import OmegaConfBaseException

    try:
        text = help_text(job, help_overrides(args))
    except (HydraException, OmegaConfBaseException, ValueError, OSError) as e:
        print(f"error: {error_message(e)}", file=sys.stderr)
        sys.exit(USER_EXIT)
    try:
        sys.stdout.write(text)
        sys.stdout.flush()
    except BrokenPipeError:  # | head: the reader has what it wanted
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
    sys.exit(0)


def run_app(app: Callable[[], None], job: str, argv: Sequence[str] | None = None,
            writes_run: bool = True, run_folder: bool = True) -> None:
    """Run a ``@hydra.main`` app as a console script with one-line user errors.

    Args:
        app: the Hydra-decorated task of a ``cli`` module; its body runs inside
            :func:`user_errors`.
        job: Hydra's job name for that module (its file name: ``train``, ``prepare`` ...),
            which names ``.hydra/<job>`` and ``<job>.log`` in the run directory.
        argv: the command-line arguments (default ``sys.argv[1:]``).
        writes_run: whether the command writes into the run folder (``run_dir``): then a
            folder that cannot be written is one ``error:`` line before Hydra starts; else
            (``nmt-translate``, ``nmt-table``, ``nmt-prepare``) the command runs without
            Hydra's ``.hydra`` files and log file there (:func:`_read_only_run`).
        run_folder: False for a command that keeps nothing in a run folder (``nmt-table``):
            Hydra then creates none and writes no ``.hydra`` files or log file
            (:func:`_hydra_writes_nothing`).

    Exits with status 2 after printing ``error: <message>`` on a user error, with 130 after
    one line on Ctrl-C (a KeyboardInterrupt that reaches it; one with a message, such as
    :class:`transformer_nmt.cli.sweep.SweepStopped`, prints it and exits with its
    ``exit_status``). ``--help`` / ``-h`` prints the command's settings as the other
    arguments compose them, with their descriptions
    (:func:`transformer_nmt.config.help.help_text`), and exits before Hydra starts. Hydra's
    flags are read first (:func:`parse_flags`: an unknown, abbreviated or misused one is one
    ``error:`` line); ``-m`` and ``--cfg`` check the composition only
    (:func:`composition_error`), ``--hydra-help`` shows Hydra's page whatever the overrides.
    """
    global _starting
    _starting = False
    if signal.getsignal(signal.SIGINT) is _interrupted_at_start_up:
        signal.signal(signal.SIGINT, signal.default_int_handler)
    args = list(sys.argv[1:] if argv is None else argv)
    if help_requested(args):
        _print_help(job, args)
    try:
        flags = parse_flags(args)
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        sys.exit(USER_EXIT)
    mode = _hydra_mode(flags)
    run_dir, before, error = None, None, None
    if mode == "run":
        run_dir, error = _preflight(flags.overrides)
    elif mode == "compose":
        error = composition_error(flags.overrides, multirun=flags.multirun)
    if error is not None:
        print(f"error: {error}", file=sys.stderr)
        sys.exit(USER_EXIT)
    if run_dir is not None and not run_folder:
        _hydra_writes_nothing(run_dir)
        run_dir = None
    if run_dir is not None:
        _read_only_run(run_dir, job, writes_run)
        before = _snapshot(run_dir, job)
    if flags is not None and flags.hydra_help:
        sys.argv[1:] = ["--hydra-help"]  # Hydra's page composes Hydra's config only
    try:
        with hydra_write_errors():
            app()
    except _UserExit as e:
        if run_dir is not None:
            _undo_hydra_files(run_dir, job, before)
        print(f"error: {e}", file=sys.stderr)
        sys.exit(USER_EXIT)
    except KeyboardInterrupt as e:  # Ctrl-C: outputs are written atomically, none half-written
        why = str(e) or "stopped before the end (no output file is left half-written)"
        print(f"interrupted: {why}", file=sys.stderr)
        sys.exit(getattr(e, "exit_status", INTERRUPTED_EXIT))
