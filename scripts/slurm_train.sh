#!/bin/bash
# Train on K nodes x 8 GPUs: one torchrun per node (srun, one task per node), eight workers
# each, joined by torchrun's c10d rendezvous on the first node of the allocation.
#
#   sbatch --nodes=2 scripts/slurm_train.sh experiment=wmt14_en_de_big
#   sbatch --nodes=1 scripts/slurm_train.sh experiment=wmt14_en_de_base trainer.max_steps=100000
#
# Every argument is passed to nmt-train as a Hydra override. The run directory is the config's
# run_dir (runs/<experiment>), on a file system all nodes share; a job started again on the
# same run directory resumes from its latest checkpoint (--requeue makes SLURM do that after a
# pre-emption).
#
# Pre-emption and time limits: --signal=TERM@120 sends SIGTERM to every task (the torchrun
# agents) 120 s before the end; torchrun forwards it to its workers, which checkpoint at the
# next step boundary and exit (torchrun waits 30 s before it kills them).
#
# Environment knobs: GPUS_PER_NODE (8), MASTER_PORT (29500), VENV (.venv), OMP_NUM_THREADS (8).
#SBATCH --job-name=nmt-train
#SBATCH --nodes=1
#SBATCH --ntasks-per-node=1
#SBATCH --gpus-per-node=8
#SBATCH --cpus-per-task=64
#SBATCH --time=24:00:00
#SBATCH --signal=TERM@120
#SBATCH --requeue
#SBATCH --output=slurm-%x-%j.out

set -euo pipefail

GPUS_PER_NODE=${GPUS_PER_NODE:-8}
MASTER_PORT=${MASTER_PORT:-29500}
VENV=${VENV:-.venv}
MASTER_ADDR=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-8}
export NMT_MULTI30K_MIRROR=${NMT_MULTI30K_MIRROR:-}

echo "nodes: $SLURM_JOB_NUM_NODES x $GPUS_PER_NODE GPUs, rendezvous at $MASTER_ADDR:$MASTER_PORT"
echo "overrides: $*"

srun --kill-on-bad-exit=1 --ntasks-per-node=1 \
  "$VENV/bin/python" -m torch.distributed.run \
    --nnodes="$SLURM_JOB_NUM_NODES" \
    --nproc_per_node="$GPUS_PER_NODE" \
    --rdzv_id="$SLURM_JOB_ID" \
    --rdzv_backend=c10d \
    --rdzv_endpoint="$MASTER_ADDR:$MASTER_PORT" \
    -m transformer_nmt.cli.train "$@"
