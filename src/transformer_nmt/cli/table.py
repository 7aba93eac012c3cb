"""``nmt-table``: rebuild docs/results.md (the paper's Tables 2 and 3) from all results.json.

Example: ``nmt-table`` (reads ``results_glob``, writes ``table_output``).
"""

from __future__ import annotations

import hydra
from omegaconf import DictConfig

from transformer_nmt.cli import CONFIG_DIR, run_app, user_errors
from transformer_nmt.config import validate
from transformer_nmt.report import write_report


@hydra.main(version_base="1.3", config_path=CONFIG_DIR, config_name="config")
def app(cfg: DictConfig) -> None:
    """Validate the config and run :func:`transformer_nmt.report.write_report`."""
    with user_errors():
        validate(cfg)
        print(write_report(cfg))


def main() -> None:
    """Console entry point: :func:`app` with one-line user errors (exit status 2)."""
    run_app(app, "table")


if __name__ == "__main__":
    main()
