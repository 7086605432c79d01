"""``distlab doctor``: is this machine ready for the labs? Prints what it finds, checks that torch
has what the labs call, runs a 2-rank all-reduce and all-to-all on gloo (and on NCCL where there
are GPUs: 2 ranks on two GPUs, 1 rank on one, since "auto" runs 1-rank work on NCCL then), exits
non-zero with what to fix."""
from __future__ import annotations

import os
import platform
import shutil
import sys


def _line(name: str, value: str) -> None:
    print(f"  {name:<22} {value}")


def _smoke(backend: str, world_size: int = 2) -> str | None:
    """None when all-reducing rank r's r + 1 gives their sum on every rank, else what went wrong."""
    import distlab
    try:
        out = distlab.run(_all_reduce_ranks, world_size, backend=backend, timeout=60)
    except Exception as exc:  # doctor reports every failure, whatever it is
        return f"{type(exc).__name__}: {exc}"
    expected = [float(sum(range(1, world_size + 1)))] * world_size
    return None if out == expected else f"wrong all-reduce result {out} (expected {expected})"


def _all_reduce_ranks(rank: int, world_size: int) -> float:
    import torch
    import torch.distributed as dist
    device = "cuda" if dist.get_backend() == "nccl" else "cpu"
    t = torch.tensor([float(rank + 1)], device=device)  # not 0: a no-op would pass on one rank
    dist.all_reduce(t)
    # Labs 9 and 10 exchange lists of tensors (all_to_all), which gloo lacked in torch 2.11
    dist.all_to_all([torch.zeros(1, device=device) for _ in range(world_size)],
                    [torch.ones(1, device=device) for _ in range(world_size)])
    return t.item()


# What the labs call that older torch releases lack (torch 2.11 on an H100 had none of them:
# bench/reports/gpu-2026-11-27-1813-vm.md); gloo's all_to_all is tried by the smoke test.
NEEDED = ("all_gather_single", "reduce_scatter_single")


def _pinned_torch() -> str | None:
    """The torch version distlab pins (pyproject.toml), from the installed package's metadata."""
    from importlib import metadata
    try:
        requires = metadata.requires("distlab") or []
    except metadata.PackageNotFoundError:   # run from a checkout on PYTHONPATH, not installed
        return None
    return next((r.split("==")[1].split(";")[0].strip() for r in requires
                 if r.replace(" ", "").startswith("torch==")), None)


def _torch_problem(torch, dist) -> str | None:
    """Why this torch cannot run every lab, or None."""
    missing = [f"torch.distributed.{name}" for name in NEEDED if not hasattr(dist, name)]
    if not missing:
        return None
    pinned = _pinned_torch() or "2.13.0"
    return (f"torch {torch.__version__} lacks {', '.join(missing)}, which the labs call. Install "
            f"the course's torch: `make setup` (pip install torch=={pinned}; on a machine with an "
            f"NVIDIA GPU that is the CUDA build).")


def main(argv: list[str] | None = None) -> int:
    problems = []
    print("distlab doctor")
    _line("python", f"{platform.python_version()} ({sys.executable})")
    try:
        import torch
        import torch.distributed as dist
    except ImportError as exc:
        print(f"\nFAIL: torch does not import ({exc}). Run `make setup` (or `make test`) from the "
              f"repository root: it installs the pinned versions into .venv.")
        return 1
    pinned = _pinned_torch()
    _line("torch", torch.__version__ + (f" (the course pins {pinned})" if pinned and
                                        torch.__version__.split("+")[0] != pinned else ""))
    _line("torch.distributed", "available" if dist.is_available() else "NOT available")
    backends = [b for b, ok in (("gloo", dist.is_gloo_available()),
                                ("nccl", dist.is_nccl_available()),
                                ("mpi", dist.is_mpi_available())) if ok]
    _line("backends", ", ".join(backends) or "none")
    gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    names = ", ".join(torch.cuda.get_device_name(i) for i in range(gpus))
    _line("GPUs", f"{gpus}" + (f" ({names})" if names else " (labs run on CPU with gloo)"))
    _line("nsys on PATH", shutil.which("nsys") or "no (Lab 6 reads a stored nsys export instead)")
    problem = _torch_problem(torch, dist)
    if problem:
        problems.append(problem)
    if "gloo" not in backends:
        problems.append("gloo is missing from this torch build: reinstall with `make clean-venv setup`.")
    else:
        error = _smoke("gloo")
        _line("2-rank gloo collectives", "ok" if error is None else "FAILED")
        if error:
            ifname = os.environ.get("GLOO_SOCKET_IFNAME")
            fix = (" This torch's gloo lacks a collective the labs call: install the course's "
                   "torch (`make setup`)." if "does not support" in error else
                   f" GLOO_SOCKET_IFNAME={ifname} is set: unset it or name an interface that "
                   f"exists (`ip addr`)." if ifname else
                   " Check that this machine can open TCP connections to 127.0.0.1.")
            problems.append(f"the gloo smoke test failed.{fix}\n    {error.splitlines()[0]}")
    if gpus >= 1 and "nccl" in backends:
        ranks = min(gpus, 2)  # NCCL needs a GPU per rank
        error = _smoke("nccl", ranks)
        _line(f"{ranks}-rank NCCL collectives", "ok" if error is None else "FAILED")
        if error:
            problems.append(f"the NCCL smoke test failed: {error}. Check the driver (nvidia-smi) "
                            f"and try NCCL_DEBUG=INFO; the labs still run on gloo.")
    if problems:
        print("\nFAIL:\n" + "\n".join(f"  - {p}" for p in problems))
        return 1
    print("\nOK: ready for the labs.")
    return 0
