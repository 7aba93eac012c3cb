"""``nmt-evaluate``: translate a run's test sets and score them (sacreBLEU against the official
reference, the paper's BLEU, chrF).

Example: ``nmt-evaluate experiment=wmt14_en_de_base`` writes ``runs/<name>/translations/`` and
``runs/<name>/results.json`` and prints every score with its label and signature. With a
Table 3 row (``table3=C_N2``) the row is evaluated as the paper's Table 3 was: the development
set, the last checkpoint, no averaging (:func:`transformer_nmt.evaluate.table3.evaluation_config`).
"""

from __future__ import annotations

import hydra
from omegaconf import DictConfig

from transformer_nmt.cli import run_app, user_errors
from transformer_nmt.config import CONFIG_DIR, typed_config
from transformer_nmt.evaluate.evaluate import evaluate
from transformer_nmt.interop.ctranslate2 import decode_engine
from transformer_nmt.runtime import retain_freed_memory


@hydra.main(version_base="1.3", config_path=CONFIG_DIR, config_name="config")
def app(cfg: DictConfig) -> None:
    """Type and validate the config (:func:`typed_config`),
    then run :func:`transformer_nmt.evaluate.evaluate.evaluate`."""
    with user_errors():
        cfg = typed_config(cfg)
        retain_freed_memory()  # beam search allocates large tensors at every step
        if cfg.table3.variant:
            from transformer_nmt.evaluate.table3 import evaluation_config

            cfg = evaluation_config(cfg)
        evaluate(cfg, engine=decode_engine)


def main() -> None:
    """Console entry point: :func:`app` with one-line user errors (exit status 2)."""
    run_app(app, "evaluate")


if __name__ == "__main__":
    main()
