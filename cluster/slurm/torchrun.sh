# Sourced by cluster/slurm/*.sbatch (not submitted itself): start one torchrun agent per node of
# the job with srun, meeting through the c10d rendezvous on the first node, each agent starting
# GPUS_PER_NODE processes of `python -m $MODULE "$@"`.
#
# Settings (environment, e.g. sbatch --export=ALL,GPUS_PER_NODE=4 ...):
#   GPUS_PER_NODE  processes per node: default the GPUs Slurm gave the job on a node
#                  (SLURM_GPUS_ON_NODE), else the GPUs nvidia-smi lists, else 2 (a CPU node: gloo)
#   MASTER_ADDR    the rendezvous host: default the first node's address (NodeAddr in Slurm)
#   MASTER_PORT    the rendezvous port: default 29500 + (job id mod 1000)
#   RENDEZVOUS_WAIT  seconds a node waits for the first node's agent to answer there before it
#                  stops the job, naming the endpoint (default 60)
#   MAX_RESTARTS   how often each agent restarts its workers after one fails (torchrun's
#                  --max-restarts; default 0: a failure ends the job). Above 0 the agents keep
#                  their rendezvous store to themselves (TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1)
#   PYTHON         default ./.venv/bin/python of the repository sbatch ran in
: "${MODULE:?set MODULE to the program to run}"
: "${SLURM_JOB_ID:?submit this with sbatch (README.md, On a cluster)}"
# Slurm runs a copy of the script from its spool folder: the repository is where sbatch ran.
REPO=${REPO:-${SLURM_SUBMIT_DIR:-$PWD}}
PYTHON=${PYTHON:-$REPO/.venv/bin/python}
if [[ -z ${GPUS_PER_NODE:-} ]]; then
    GPUS_PER_NODE=${SLURM_GPUS_ON_NODE:-$(nvidia-smi -L 2>/dev/null | grep -c '^GPU' || true)}
    (( GPUS_PER_NODE > 0 )) || GPUS_PER_NODE=2
fi
first=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)
if [[ -z ${MASTER_ADDR:-} ]]; then
    MASTER_ADDR=$(scontrol show node "$first" | sed -n 's/.*NodeAddr=\([^ ]*\).*/\1/p' | head -n 1)
    MASTER_ADDR=${MASTER_ADDR:-$first}
fi
MASTER_PORT=${MASTER_PORT:-$(( 29500 + SLURM_JOB_ID % 1000 ))}
RENDEZVOUS_WAIT=${RENDEZVOUS_WAIT:-60}
MAX_RESTARTS=${MAX_RESTARTS:-0}
if (( MAX_RESTARTS > 0 )); then
    # torch's agents otherwise share their rendezvous store with the workers and keep it across
    # a restart: restarted workers would read the addresses of the attempt before and fail to
    # connect. Without sharing, rank 0 serves a fresh store for each attempt.
    export TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1
fi
export MODULE PYTHON GPUS_PER_NODE MASTER_ADDR MASTER_PORT RENDEZVOUS_WAIT MAX_RESTARTS

cd "$REPO"
echo "$MODULE: $SLURM_NNODES node(s) ($SLURM_JOB_NODELIST) x $GPUS_PER_NODE process(es)," \
     "c10d rendezvous at $MASTER_ADDR:$MASTER_PORT"
# One task per node, each a torchrun agent. Single quotes: SLURM_PROCID is each task's own (the
# node rank), read where the task runs, not here in the batch script (where it is 0). Before its
# agent starts, each node checks the endpoint (distlab.cluster.group): a wrong one stops the job
# within RENDEZVOUS_WAIT seconds with a line naming it (--kill-on-bad-exit stops the others).
srun --ntasks-per-node=1 --kill-on-bad-exit=1 bash -c '
    "$PYTHON" -m distlab.cluster.group "$MASTER_ADDR:$MASTER_PORT" --node-rank "$SLURM_PROCID" \
        --wait "$RENDEZVOUS_WAIT" || exit 2
    exec "$PYTHON" -u -m torch.distributed.run \
    --nproc_per_node "$GPUS_PER_NODE" --nnodes "$SLURM_NNODES" --node_rank "$SLURM_PROCID" \
    --max_restarts "$MAX_RESTARTS" \
    --rdzv_id="$SLURM_JOB_ID" --rdzv_backend=c10d --rdzv_endpoint="$MASTER_ADDR:$MASTER_PORT" \
    -m "$MODULE" "$@"' torchrun "$@"
