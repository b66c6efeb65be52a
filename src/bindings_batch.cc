// pyfleet._core's batch kernels (see include/pyfleet/batch_ops.h).
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>

#include "pyfleet/batch_ops.h"

namespace py = pybind11;

void RegisterBatchOps(py::module_& m) { (void)m; }
