// Admission ("entry") policies: when a key that has no row gets one.
// The exact semantics are documented in pyfleet/entry.py.
#pragma once

#include <cstdint>

namespace pyfleet {

enum class EntryKind : uint32_t {
  kAll = 0,          // every key gets a row on first pull or push
  kCountFilter = 1,  // after `count` pull calls that name it
  kProbability = 2,  // each pull call admits it with `probability`
};

struct EntryConfig {
  EntryKind kind = EntryKind::kAll;
  uint32_t count = 0;
  float probability = 1.f;
};

}  // namespace pyfleet
