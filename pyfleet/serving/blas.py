"""One BLAS thread for the server's model steps, unless the environment chose.

numpy's OpenBLAS starts a thread a core when ``OPENBLAS_NUM_THREADS`` is unset;
for the small matrices of a serving step those threads mostly wait on each other
(the 64-row steps of the reference DNN cost 20 times the CPU on a loaded 2-core
machine: ``benchmarks/service/bench_serve.py``'s floor, run both ways). The
variable is read when numpy loads, before ``pyfleet serve`` runs, so the count
is set through OpenBLAS's own call in the library numpy loaded. Another BLAS
(MKL, Accelerate) is left alone.
"""

import ctypes
import os

__all__ = ["one_blas_thread"]

# The setter's name in each OpenBLAS build numpy has shipped (scipy-openblas
# wheels since numpy 2.0, the 64-bit-integer builds, a system OpenBLAS).
_SETTERS = ("scipy_openblas_set_num_threads64_", "openblas_set_num_threads64_",
            "openblas_set_num_threads")


def _loaded_openblas():
    """Paths of the OpenBLAS libraries mapped into this process."""
    try:
        with open("/proc/self/maps") as f:
            paths = {line.split()[-1] for line in f if "/" in line}
    except OSError:  # not Linux: leave BLAS as the environment set it
        return []
    return sorted(p for p in paths
                  if "openblas" in os.path.basename(p).lower() and ".so" in p)


def one_blas_thread():
    """Set OpenBLAS to one thread when ``OPENBLAS_NUM_THREADS`` is unset; the
    libraries set (empty when the environment chose or no OpenBLAS is loaded)."""
    if os.environ.get("OPENBLAS_NUM_THREADS"):
        return []
    import numpy  # noqa: F401  (its BLAS is the one to set)
    done = []
    for path in _loaded_openblas():
        try:
            lib = ctypes.CDLL(path)
        except OSError:
            continue
        for name in _SETTERS:
            setter = getattr(lib, name, None)
            if setter is not None:
                setter.argtypes = [ctypes.c_int]
                setter.restype = None
                setter(1)
                done.append(path)
                break
    return done
