"""``nmt-table``: rebuild docs/results.md (the paper's Tables 2 and 3) from all results.json.

Example: ``nmt-table`` (reads ``table.results_glob``, writes ``table.output``).
"""

from __future__ import annotations

import hydra
from omegaconf import DictConfig

from transformer_nmt.cli import run_app, user_errors
from transformer_nmt.config import CONFIG_DIR, typed_config
from transformer_nmt.evaluate.report import write_report


@hydra.main(version_base="1.3", config_path=CONFIG_DIR, config_name="config")
def app(cfg: DictConfig) -> None:
    """Type and validate the config (:func:`typed_config`),
    then run :func:`transformer_nmt.evaluate.report.write_report`."""
    with user_errors():
        cfg = typed_config(cfg)
        print(write_report(cfg))


def main() -> None:
    """Console entry point: :func:`app` with one-line user errors (exit status 2)."""
    run_app(app, "table")


if __name__ == "__main__":
    main()
