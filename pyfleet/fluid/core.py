"""``fluid.core``: the core names Fluid scripts touch.

``LoDTensorArray`` is a list of :class:`LoDTensor` (what Fluid's fetch of a
tensor array returns; PaddleRec's runner tests fetched values against it).
``VarDesc.VarType`` holds Fluid's variable-type enum with the numbers of its
``framework.proto``; the data types among them convert to numpy dtypes
(:func:`VarDesc.VarType.to_numpy` / ``convert_dtype``).
"""

import enum

import numpy as np

from pyfleet.fluid.tensor import CPUPlace, LoDTensor, Scope

__all__ = ["CPUPlace", "EOFException", "LoDTensor", "LoDTensorArray", "Scope", "VarDesc"]


class EOFException(Exception):
    """Raised by ``Executor.run`` when a started non-iterable ``PyReader`` has
    no batch left; call ``reader.reset()`` and ``start()`` for the next pass."""


class LoDTensorArray(list):
    """Fluid's ``core.LoDTensorArray``: a list of LoDTensors (``append``, index, ``len``)."""

    def append(self, tensor):
        if not isinstance(tensor, LoDTensor):
            raise TypeError(f"LoDTensorArray holds LoDTensors, got {type(tensor).__name__}")
        super().append(tensor)


class _VarType(enum.IntEnum):
    BOOL = 0
    INT16 = 1
    INT32 = 2
    INT64 = 3
    FP16 = 4
    FP32 = 5
    FP64 = 6
    LOD_TENSOR = 7
    SELECTED_ROWS = 8
    FEED_MINIBATCH = 9
    FETCH_LIST = 10
    STEP_SCOPES = 11
    LOD_RANK_TABLE = 12
    LOD_TENSOR_ARRAY = 13
    PLACE_LIST = 14
    READER = 15
    RAW = 17
    TUPLE = 18
    SIZE_T = 19
    UINT8 = 20
    INT8 = 21

    def to_numpy(self):
        """The numpy dtype of a data type member (ValueError for the others)."""
        try:
            return np.dtype(_NUMPY[self])
        except KeyError:
            raise ValueError(f"VarType.{self.name} is not a data type") from None

    # numpy accepts objects with a ``dtype`` attribute in np.dtype(...).
    @property
    def dtype(self):
        return self.to_numpy()


_NUMPY = {_VarType.BOOL: "bool", _VarType.INT16: "int16", _VarType.INT32: "int32",
          _VarType.INT64: "int64", _VarType.FP16: "float16", _VarType.FP32: "float32",
          _VarType.FP64: "float64", _VarType.SIZE_T: "uint64", _VarType.UINT8: "uint8",
          _VarType.INT8: "int8"}


class VarDesc:
    """Fluid's ``core.VarDesc``: its ``VarType`` enum (``VarDesc.VarType.FP32``, ...)."""

    VarType = _VarType
