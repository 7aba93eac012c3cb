"""``nmt-table``: rebuild docs/results.md (the paper's Tables 2 and 3) from all results.json.

Example: ``nmt-table`` (reads ``table.results_glob``, writes ``table.output``).
"""

from __future__ import annotations

import hydra
from omegaconf import DictConfig

from transformer_nmt.cli import run_app, user_errors
from transformer_nmt.config import CONFIG_DIR, typed_config
from transformer_nmt.evaluate.report import load_results, write_report
from transformer_nmt.evaluate.table3_groups import table3_figures


@hydra.main(version_base="1.3", config_path=CONFIG_DIR, config_name="config")
def app(cfg: DictConfig) -> None:
    """Type and validate the config (:func:`typed_config`), then write the tables
    (:func:`transformer_nmt.evaluate.report.write_report`) and, with ``table.table3_plot``,
    draw Table 3's figures (:func:`transformer_nmt.plot.table3.plot_table3`)."""
    with user_errors():
        cfg = typed_config(cfg)
        skipped: list[tuple[str, str]] = []
        results = load_results(cfg.table.results_glob, skipped)
        print(write_report(cfg, results, skipped))
        if cfg.table.table3_plot:
            # late: matplotlib, which the tables alone never need
            from transformer_nmt.plot.table3 import plot_table3

            for exp, lines, path in table3_figures(results, cfg.table.table3_plot):
                plot_table3(exp, lines, path)
                print(path)


def main() -> None:
    """Console entry point: :func:`app` with one-line user errors (exit status 2)."""
    run_app(app, "table", writes_run=False, run_folder=False)


if __name__ == "__main__":
    main()
