"""``nmt-translate``: translate a file or standard input with a run's model.

Example: ``nmt-translate experiment=multi30k_en_de translate.input=in.en translate.output=out.de``,
or ``echo "A dog runs." | nmt-translate experiment=multi30k_en_de``. Only translations go
to standard output; log messages go to standard error.
"""

from __future__ import annotations

import contextlib
import logging
import os
import sys
from pathlib import Path

import hydra
from omegaconf import DictConfig

from transformer_nmt.cli import not_writable, run_app, user_errors
from transformer_nmt.config import CONFIG_DIR, Config, typed_config
from transformer_nmt.decode.translate import translate
from transformer_nmt.errors import UserError
from transformer_nmt.interop.ctranslate2 import decode_engine
from transformer_nmt.run.lock import folder_lock
from transformer_nmt.runtime import retain_freed_memory


def _log_to_stderr() -> None:
    """Move console log handlers that write to standard output over to standard error."""
    for handler in logging.getLogger().handlers:
        if isinstance(handler, logging.StreamHandler) and handler.stream is sys.stdout:
            handler.setStream(sys.stderr)


@hydra.main(version_base="1.3", config_path=CONFIG_DIR, config_name="config")
def app(cfg: DictConfig) -> None:
    """Type and validate the config (:func:`typed_config`),
    then run :func:`transformer_nmt.decode.translate.translate`."""
    _log_to_stderr()
    with user_errors():
        cfg = typed_config(cfg)
        retain_freed_memory()  # beam search allocates large tensors at every step
        try:
            with _run_lock(cfg):
                translate(cfg, engine=decode_engine)
        except BrokenPipeError:  # the reader of standard output left (| head -1)
            _quiet_stdout()
            sys.exit(BROKEN_PIPE_EXIT)


def _run_lock(cfg: Config) -> contextlib.AbstractContextManager:
    """The run folder's lock (:func:`transformer_nmt.run.lock.folder_lock`) when this
    translation writes into the run: ``translate.output`` inside ``run_dir``, or a CTranslate2
    engine, whose converted model is cached under the run's ``checkpoints/``. None for a run
    folder that cannot be written (a published model on a read-only mount: the CTranslate2
    cache then goes elsewhere).

    Raises:
        UserError: ``translate.output`` inside a run folder that cannot be written.
    """
    run_dir = Path(cfg.run_dir).resolve()
    output = cfg.translate.output
    inside = output is not None and run_dir in Path(output).resolve().parents
    why = not_writable(run_dir)
    if why is not None:
        if inside:
            raise UserError(f"translate.output={output} is inside the run folder {run_dir}, "
                            f"which cannot be written ({why}); write the translations "
                            "elsewhere")
        return contextlib.nullcontext()
    if inside or str(cfg.decode.engine) != "native":
        return folder_lock(cfg.run_dir, "nmt-translate")
    return contextlib.nullcontext()


BROKEN_PIPE_EXIT = 141
"""Exit status when standard output's reader has gone: 128 + SIGPIPE, what a process killed
by SIGPIPE reports (shells ignore it in pipelines such as ``| head -1``)."""


def _quiet_stdout() -> None:
    """Point standard output at /dev/null, so the interpreter's final flush stays silent."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())
    os.close(devnull)


def main() -> None:
    """Console entry point: :func:`app` with one-line user errors (exit status 2)."""
    run_app(app, "translate", writes_run=False)


if __name__ == "__main__":
    main()
