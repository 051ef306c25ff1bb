"""The machine a training run ran on: what a reader needs to know what "the same machine" means
when a seed does not retrain bit for bit elsewhere.

A seed reproduces itself on one machine (one torch thread, deterministic kernels), but its model
depends on the floating-point kernels that ran: the CPU, the torch build, the BLAS library torch
calls and the instruction set its kernels were dispatched to. `machine()` records them; a
training run keeps one record per process that trained it (`train/run.py`: a resumed run adds
its own), and the sweep's summary and report name them.

torch is read only if this process has imported it (the grader's environment has no torch).
"""

from __future__ import annotations

import os
import platform
import re
import sys
from pathlib import Path

FIELDS = ("cpu", "cores", "os", "python", "numpy", "numpy_blas", "torch", "torch_build",
          "torch_blas", "torch_kernel")


def cpu_model() -> str:
    """The CPU's model name (`/proc/cpuinfo`), or what `platform` knows elsewhere."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def numpy_blas() -> str:
    """The BLAS numpy was built against, with its version (`scipy-openblas 0.3.31...`)."""
    import numpy as np
    try:
        blas = np.show_config(mode="dicts")["Build Dependencies"]["blas"]
        return f"{blas.get('name', '?')} {blas.get('version', '?')}"
    except (TypeError, KeyError, AttributeError):  # numpy < 1.25 has no mode="dicts"
        return "unknown"


def torch_fields() -> dict:
    """torch's version, build (CPU or CUDA, and the commit), the BLAS it calls (`mkl`, with
    the library's own version line) and the instruction set ATen dispatched its CPU kernels
    to (`AVX512`, `AVX2`, ...): the kernels that ran."""
    torch = sys.modules.get("torch")
    if torch is None:
        return {"torch": None, "torch_build": None, "torch_blas": None, "torch_kernel": None}
    config = torch.__config__.show()
    info = re.search(r"BLAS_INFO=(\w+)", config)
    library = next((line.strip(" -") for line in config.splitlines()
                    if "Math Kernel Library" in line or "OpenBLAS" in line), "")
    cuda = torch.version.cuda
    return {"torch": torch.__version__,
            "torch_build": f"{'cuda ' + cuda if cuda else 'cpu'}, commit "
                           f"{(torch.version.git_version or '?')[:12]}",
            "torch_blas": f"{info[1] if info else 'unknown'}"
                          + (f" ({library})" if library else ""),
            "torch_kernel": torch.backends.cpu.get_cpu_capability()}


def machine() -> dict:
    """This process's machine, every field of `FIELDS`."""
    import numpy as np
    return {"cpu": cpu_model(), "cores": os.cpu_count(), "os": platform.platform(),
            "python": platform.python_version(), "numpy": np.__version__,
            "numpy_blas": numpy_blas(), **torch_fields()}


def describe(record: dict) -> str:
    """One line for a caption: `Intel(R) Xeon(R) ... x2 cores, torch 2.13.0+cpu (mkl, AVX512),
    numpy 2.3.1, Python 3.11.14`."""
    torch = (f"torch {record['torch']} ({record['torch_blas'].split(' ')[0]}, "
             f"{record['torch_kernel']})" if record.get("torch") else "no torch")
    return (f"{record['cpu']}, {record['cores']} cores, {torch}, numpy {record['numpy']}, "
            f"Python {record['python']}")
