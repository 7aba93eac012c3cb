#!/bin/bash
# Train on K nodes x 8 GPUs: one torchrun per node (srun, one task per node), eight workers
# each, joined by torchrun's c10d rendezvous on the first node of the allocation.
#
#   sbatch --nodes=2 scripts/cluster/slurm_train.sh experiment=wmt14_en_de_big
#   sbatch --nodes=1 scripts/cluster/slurm_train.sh experiment=wmt14_en_de_base trainer.max_steps=100000
#
# Every argument is passed to nmt-prepare and nmt-train as a Hydra override. They are checked
# first, as nmt-train checks them: a misspelt key or a bad value stops the job with the one
# line nmt-train prints (`error: ...`, the closest valid key named) and exit status 2, before
# anything runs. The run directory is the config's run_dir (runs/<experiment>), on a file
# system all nodes share; a job started again on the same run directory resumes from its
# latest checkpoint.
#
# Time limits and pre-emption: --signal=TERM@300 makes SLURM send SIGTERM to every process of
# the job step 300 s before the end. The workers checkpoint at the next step boundary and exit 0;
# the torchrun agents wait up to TORCH_ELASTIC_SHUTDOWN_TIMEOUT (240 s, room for a `big`
# checkpoint) before killing them, and exit non-zero themselves. This script then reads the
# run's train_summary.json: a run stopped by a signal is requeued (`scontrol requeue`, the job
# starts again and resumes) and the job ends with 0, also when the signal came during the
# workers' start-up, before their first step (no new checkpoint then), or reached the torchrun
# agent before its worker had started (srun ends with 128 + SIGTERM, SIGINT, SIGUSR1 or SIGUSR2
# and this job wrote no summary); a run that reached its
# limit ends with 0; a run that diverged ends with 3 and is not requeued (train_summary.json
# names its last finite checkpoint); anything else keeps srun's exit code.
#
# Environment knobs: GPUS_PER_NODE (8), MASTER_PORT (29500), VENV (.venv), OMP_NUM_THREADS (8),
# TORCH_ELASTIC_SHUTDOWN_TIMEOUT (240), NMT_NO_REQUEUE (set to 1 to never requeue).
#SBATCH --job-name=nmt-train
#SBATCH --nodes=1
#SBATCH --ntasks-per-node=1
#SBATCH --gpus-per-node=8
#SBATCH --cpus-per-task=64
#SBATCH --time=24:00:00
#SBATCH --signal=TERM@300
#SBATCH --requeue
#SBATCH --open-mode=append
#SBATCH --output=slurm-%x-%j.out

set -euo pipefail

GPUS_PER_NODE=${GPUS_PER_NODE:-8}
MASTER_PORT=${MASTER_PORT:-29500}
VENV=${VENV:-.venv}

export OMP_NUM_THREADS=${OMP_NUM_THREADS:-8}
export TORCH_ELASTIC_SHUTDOWN_TIMEOUT=${TORCH_ELASTIC_SHUTDOWN_TIMEOUT:-240}
export NMT_MULTI30K_MIRROR=${NMT_MULTI30K_MIRROR:-}

# The overrides checked as nmt-train checks them (one `error:` line, exit 2, for a bad key or
# value; Hydra's own report would advise adding the key with `+`), and the run directory they
# resolve to.
RUN_DIR=$("$VENV/bin/python" -m transformer_nmt.cli.check_overrides "$@" | tail -n 1) || exit $?
SUMMARY="$RUN_DIR/train_summary.json"

# awk reads all of its input: with pipefail, head's early exit would fail the script (SIGPIPE).
MASTER_ADDR=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | awk 'NR == 1')

echo "nodes: $SLURM_JOB_NUM_NODES x $GPUS_PER_NODE GPUs, rendezvous at $MASTER_ADDR:$MASTER_PORT"
echo "run directory: $RUN_DIR; overrides: $*"

# Stages share files: the data is prepared once, here, before any worker starts (skipped when
# up to date).
"$VENV/bin/python" -m transformer_nmt.cli.prepare "$@"

STARTED=$(mktemp)
trap 'rm -f "$STARTED"' EXIT
status=0
srun --kill-on-bad-exit=1 --ntasks-per-node=1 --cpus-per-task="${SLURM_CPUS_PER_TASK:-1}" \
  "$VENV/bin/python" -m torch.distributed.run \
    --nnodes="$SLURM_JOB_NUM_NODES" \
    --nproc_per_node="$GPUS_PER_NODE" \
    --rdzv_id="$SLURM_JOB_ID" \
    --rdzv_backend=c10d \
    --rdzv_endpoint="$MASTER_ADDR:$MASTER_PORT" \
    -m transformer_nmt.cli.train "$@" || status=$?

# What the run says about how it ended (only a summary written by this job counts).
stopped_by=""
if [ -f "$SUMMARY" ] && [ "$SUMMARY" -nt "$STARTED" ]; then
  stopped_by=$("$VENV/bin/python" -c 'import json, sys; print(json.load(open(sys.argv[1])).get("stopped_by") or "")' "$SUMMARY")
fi
# A job step ended by a stop signal (srun: 128 + its number) with no summary of its own: the
# signal reached the torchrun agent before its worker had started (the first second of a
# requeued job), so nothing could record it. A signal stop too. SIGKILL (137: the OOM killer,
# say) keeps its status.
if [ -z "$stopped_by" ]; then
  case "$status" in
    130) stopped_by="signal SIGINT" ;;
    138) stopped_by="signal SIGUSR1" ;;
    140) stopped_by="signal SIGUSR2" ;;
    143) stopped_by="signal SIGTERM" ;;
  esac
  if [ -n "$stopped_by" ]; then
    echo "srun ended by ${stopped_by#signal } (exit status $status) before the run wrote a summary"
  fi
fi
echo "srun exit status $status; run stopped by: ${stopped_by:-unknown}"

case "$stopped_by" in
  signal*)
    if [ "${NMT_NO_REQUEUE:-0}" != 1 ]; then
      echo "requeueing job $SLURM_JOB_ID to resume from the last checkpoint"
      scontrol requeue "$SLURM_JOB_ID"
    fi
    exit 0 ;;
  max_steps|max_epochs|max_time|patience|finished)
    exit 0 ;;
  divergence)
    echo "the run diverged: not requeued; see $SUMMARY"
    exit 3 ;;
  *)
    exit "$status" ;;
esac
