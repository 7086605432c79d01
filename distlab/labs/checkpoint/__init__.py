"""Plumbing for Lab 12, "When a rank dies": the run and its whole state (``run_state``), saving
and loading it with ``torch.distributed.checkpoint`` on any world size (``saving``), what a
checkpoint folder holds (``layout``), refusing one that cannot be loaded whole (``refusals``), a
training loop that resumes after a rank is killed (``restart``; under torchrun: ``torchrun_job``),
and the checkpoint interval (``interval``: Young/Daly, and a simulation of failures)."""
