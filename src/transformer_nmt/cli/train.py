"""``nmt-train``: train a Transformer (``transformer_nmt.train.loop.train``) from the Hydra config.

    nmt-prepare experiment=multi30k_en_de && nmt-train experiment=multi30k_en_de
    nmt-train experiment=wmt14_en_de_base      # one GPU: update_freq from trainer.tokens_per_step
    torchrun --nproc_per_node=8 -m transformer_nmt.cli.train experiment=wmt14_en_de_base
    nmt-train experiment=wmt14_en_de_big trainer.dry_run=true             # no corpus needed

Training reads the prepared data (``nmt-prepare`` / ``make data``) and fails with one line
naming the missing file when it is not there. The run directory is ``cfg.run_dir``
(``runs/<name>``), the same on every rank; a run directory that already holds checkpoints
is resumed from its latest one. ``trainer.dry_run=true`` runs
:func:`transformer_nmt.train.dryrun.dry_run` instead.

The paper's Table 3 as one sweep (each row its own run folder, trained then evaluated on the
development set; rows already done are skipped; Ctrl-C stops the row at the next step with a
checkpoint and ends the sweep, and the next sweep resumes that row)::

    nmt-train -m experiment=wmt14_en_de_base 'table3=glob(*)'
    nmt-train -m experiment=wmt14_en_de_base 'table3=glob(*)' hydra/launcher=slurm_torchrun

Under Hydra's submitit SLURM launcher each task gets the torchrun environment from SLURM
(:func:`transformer_nmt.train.distributed.export_submitit_environment`).
"""

from __future__ import annotations

import sys

import hydra
from omegaconf import DictConfig

from transformer_nmt.cli import run_app, sweep, user_errors
from transformer_nmt.config import CONFIG_DIR, typed_config


# An absolute config path (the repository's configs/, or $NMT_CONFIG_DIR): a path relative
# to this file is not found when the app starts from the nmt-train console script.
@hydra.main(version_base="1.3", config_path=CONFIG_DIR, config_name="config")
def app(cfg: DictConfig) -> None:
    """Type and validate the config (:func:`typed_config`, which applies a Table 3 row), then
    train (or dry-run: prepare a slice, then train a few steps); a Table 3 row is evaluated
    after training. In a local sweep (:mod:`transformer_nmt.cli.sweep`) a user error or a
    stop signal ends the whole sweep and names the rows not run."""
    with user_errors(), sweep.name_jobs_not_run():
        from transformer_nmt.train.distributed import export_submitit_environment

        cfg = typed_config(cfg)
        export_submitit_environment()
        if cfg.trainer.dry_run:
            from transformer_nmt.train.dryrun import dry_run

            dry_run(cfg)
            return
        from transformer_nmt.evaluate.table3 import evaluate_after_training
        from transformer_nmt.interop.ctranslate2 import decode_engine
        from transformer_nmt.train.loop import train
        from transformer_nmt.train.step import DIVERGED_EXIT, TrainingDiverged

        try:
            summary = train(cfg)
        except TrainingDiverged as e:  # not a user error: the run and its .hydra files stay
            num = sweep.current_job()
            note = sweep.jobs_not_run(num) if num is not None else ""
            print(f"error: {e}" + (f"; {note}" if note else ""), file=sys.stderr)
            sys.exit(DIVERGED_EXIT)
        evaluated = evaluate_after_training(cfg, summary, decode_engine) is not None
        sweep.stop_if_signalled(summary, cfg.trainer.max_steps, evaluated)


def main() -> None:
    """Console entry point: :func:`app` with one-line user errors (exit status 2). Stop signals
    are recorded from here on (:mod:`transformer_nmt.train.startup_signals`), so one that
    comes during the start-up stops the run before its first step instead of killing it."""
    from transformer_nmt.train import startup_signals

    startup_signals.record()
    try:
        run_app(app, "train")
    finally:
        startup_signals.release()


if __name__ == "__main__":
    main()
