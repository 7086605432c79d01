"""The course's programs a student takes from the laptop to a cluster.

    python -m distlab.cluster.busbw      # Lab 1: the bandwidth sweep, nccl-tests' way
    python -m distlab.cluster.train3d    # Lab 7: a PP x DP x TP run checked against one process

Each runs unchanged on a laptop (it starts its ranks with ``distlab.run``), under
``torchrun --standalone`` and under torchrun across nodes (``RANK``/``WORLD_SIZE`` set: it joins
that group); ``cluster/slurm/*.sbatch`` start them with srun, one torchrun agent per node. NCCL
where every process of a node has a GPU of its own, gloo elsewhere. ``group.py`` holds what both
share: where a process sits (node, local rank), joining the group, and the messages for settings
that cannot work. Course tooling: nothing in the package imports it.
"""
