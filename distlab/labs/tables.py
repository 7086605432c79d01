"""Plain-text tables of the labs' measurements (a list of dicts with the same keys)."""
from __future__ import annotations


def format_table(rows: list[dict]) -> str:
    """A plain-text table of dicts (same keys), columns right-aligned for numbers."""
    if not rows:
        return "(nothing)"
    keys = list(rows[0])
    cells = [[str(r.get(k, "")) for k in keys] for r in rows]
    width = [max(len(k), *(len(c[i]) for c in cells)) for i, k in enumerate(keys)]
    line = lambda vals: "  ".join(v.rjust(w) if v[:1].isdigit() else v.ljust(w)  # noqa: E731
                                  for v, w in zip(vals, width))
    return "\n".join([line(keys), line(["-" * w for w in width])] + [line(c) for c in cells])
