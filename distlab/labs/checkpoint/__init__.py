"""Plumbing for Lab 12, "When a rank dies": the run and its whole state (``run_state``), saving
and loading it with ``torch.distributed.checkpoint`` on any world size (``saving``), what a
checkpoint folder holds and merging the folders of ranks that saved apart (``layout``), refusing
a folder that cannot be loaded whole (``refusals``), the rank bodies of a resume and of
resharding (``runs``), a training loop that resumes after a rank is killed (``restart``; under
torchrun: ``torchrun_job``), the stall of a blocking save beside an asynchronous one (``stall``;
the lab's table: ``async_views``), the restart drawn against the uninterrupted run and the same
loop under torchrun --max-restarts, with the student's own functions (``restart_views``), and the
checkpoint interval (``interval``: Young/Daly, and a simulation of failures; ``plans``: blocking
or asynchronous saves, Section 6's design; ``llama3``: the figures at Llama 3's scale;
``save_costs``: what a save costs on real ranks; ``interval_views``: what Sections 5 and 6
show)."""
