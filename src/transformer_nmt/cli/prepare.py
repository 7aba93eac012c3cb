"""``nmt-prepare data=<corpus>``: download, clean, BPE and binarize one corpus.

Example: ``nmt-prepare data=multi30k_en_de`` (Multi30k from ``$NMT_MULTI30K_MIRROR`` or by URL),
``nmt-prepare data=wmt14_en_de``, or ``nmt-prepare data=custom +data.custom_files.train=...``.
"""

from __future__ import annotations

from pathlib import Path

import hydra
from omegaconf import DictConfig

from transformer_nmt.cli import run_app, user_errors
from transformer_nmt.config import CONFIG_DIR, typed_config
from transformer_nmt.data.corpora import orig_dir
from transformer_nmt.data.prepare import format_summary, prepare
from transformer_nmt.fileio import created_folders_removed_when_empty
from transformer_nmt.run.lock import folder_lock


@hydra.main(version_base="1.3", config_path=CONFIG_DIR, config_name="config")
def app(cfg: DictConfig) -> None:
    """Validate the config, run :func:`transformer_nmt.data.prepare.prepare`, print its summary."""
    with user_errors():
        cfg = typed_config(cfg)
        # a failed first run (no network, a bad record) leaves no empty data folders behind
        with created_folders_removed_when_empty(orig_dir(cfg.data)), \
                folder_lock(Path(cfg.data.root) / "raw" / cfg.data.name, "nmt-prepare"):
            print(format_summary(prepare(cfg)))


def main() -> None:
    """Console entry point: :func:`app` with one-line user errors (exit status 2)."""
    run_app(app, "prepare", writes_run=False)


if __name__ == "__main__":
    main()
