"""``nmt-translate``: translate a file or standard input with a run's model.

Example: ``nmt-translate experiment=multi30k_en_de translate.input=in.en translate.output=out.de``,
or ``echo "A dog runs." | nmt-translate experiment=multi30k_en_de``. Only translations go
to standard output; log messages go to standard error.
"""

from __future__ import annotations

import logging
import os
import sys

import hydra
from omegaconf import DictConfig

from transformer_nmt.cli import run_app, user_errors
from transformer_nmt.config import CONFIG_DIR, typed_config
from transformer_nmt.decode.translate import translate
from transformer_nmt.interop.ctranslate2 import decode_engine
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
            translate(cfg, engine=decode_engine)
        except BrokenPipeError:  # the reader of standard output left (| head -1)
            _quiet_stdout()
            sys.exit(BROKEN_PIPE_EXIT)


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
    run_app(app, "translate")


if __name__ == "__main__":
    main()
