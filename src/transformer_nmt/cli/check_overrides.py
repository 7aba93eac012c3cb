"""Check Hydra overrides before a job starts, as every console script checks them.

    python -m transformer_nmt.cli.check_overrides experiment=wmt14_en_de_big trainer.max_steps=10

composes and validates the config from the overrides (the pre-flight check of ``nmt-train``
and the other console scripts, :func:`transformer_nmt.cli.preflight_config`) and prints the
run directory (``run_dir``) they resolve to; a misspelt key or a bad value prints the one
line ``nmt-train`` would, ``error: <message>`` (with the closest valid key, never Hydra's
advice to add the key with ``+``), and exits with status 2. Nothing is created or written.
``scripts/cluster/slurm_train.sh`` runs it before anything else, so a bad override stops
the job before ``nmt-prepare`` or ``srun``.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence

from transformer_nmt.cli import USER_EXIT, preflight_config


def main(argv: Sequence[str] | None = None) -> None:
    """Print the run directory of the overrides ``argv`` (default ``sys.argv[1:]``), or one
    line ``error: ...`` on standard error and exit with status 2 (also for a flag such as
    ``--cfg``: only ``key=value`` overrides are checked)."""
    args = list(sys.argv[1:] if argv is None else argv)
    flag = next((a for a in args if a.startswith("-")), None)
    if flag is not None:
        cfg, error = None, f"{flag}: give Hydra overrides (key=value) only, not flags"
    else:
        cfg, _, error = preflight_config(args)
    if error is not None:
        print(f"error: {error}", file=sys.stderr)
        sys.exit(USER_EXIT)
    print(cfg.run_dir)


if __name__ == "__main__":
    main()
