// Batch kernels over key and row arrays that the Python layers call on every
// step: deduplication, routing and row sums. Each takes raw arrays, knows
// nothing about Python, and is called with the GIL released.
#pragma once

#include <cstddef>
#include <cstdint>

namespace pyfleet {}  // namespace pyfleet
