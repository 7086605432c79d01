"""The graded checks, one module per lab (``lab01`` for ``01_collectives``), called from test cells.

Each module defines ``check_*`` functions (visible tests use the stored references in ``data/``,
hidden tests pass a fresh ``seed``) and ``make_references()``, which ``distlab references`` writes
to ``data/<lab>/``.
"""
