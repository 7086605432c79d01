"""Lab 8 top to bottom in a fresh kernel, as the site and a self-learner run it: seconds per
cell and in all (the target: under 90 s on a 2-core machine). The runner is bench/lab_run.py's.

    python bench/lab08.py [--save OUT.ipynb]
"""
from lab_run import main

if __name__ == "__main__":
    main("08_sharded_data_parallel")
