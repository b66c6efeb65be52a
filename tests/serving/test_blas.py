"""pyfleet serve's model steps run on one OpenBLAS thread unless
OPENBLAS_NUM_THREADS chose: the count numpy's OpenBLAS reports itself."""

import ctypes

import numpy as np
import pytest

from pyfleet.serving.blas import _loaded_openblas, one_blas_thread

_GETTERS = ("scipy_openblas_get_num_threads64_", "openblas_get_num_threads64_",
            "openblas_get_num_threads")
_SETTERS = ("scipy_openblas_set_num_threads64_", "openblas_set_num_threads64_",
            "openblas_set_num_threads")


def _openblas():
    """numpy's OpenBLAS: (get, set) of its thread count."""
    np.ones(1)
    for path in _loaded_openblas():
        lib = ctypes.CDLL(path)
        get = next((getattr(lib, n) for n in _GETTERS if hasattr(lib, n)), None)
        put = next((getattr(lib, n) for n in _SETTERS if hasattr(lib, n)), None)
        if get is not None and put is not None:
            put.argtypes = [ctypes.c_int]
            return get, put
    pytest.skip("numpy is not linked with OpenBLAS here")


def test_without_openblas_num_threads_the_server_uses_one_thread(monkeypatch):
    get, put = _openblas()
    monkeypatch.delenv("OPENBLAS_NUM_THREADS", raising=False)
    put(2)
    try:
        assert get() == 2
        assert one_blas_thread() != []
        assert get() == 1
    finally:
        put(1)


def test_openblas_num_threads_set_by_the_user_is_left_alone(monkeypatch):
    get, put = _openblas()
    monkeypatch.setenv("OPENBLAS_NUM_THREADS", "2")
    put(2)
    try:
        assert one_blas_thread() == []
        assert get() == 2
    finally:
        put(1)
