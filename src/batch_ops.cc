#include "pyfleet/batch_ops.h"

namespace pyfleet {}  // namespace pyfleet
