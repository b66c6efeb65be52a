// Initial values of rows: a pure function of (seed, key, element index).
#pragma once

#include <cstddef>
#include <cstdint>

namespace pyfleet {

enum class InitializerKind : uint32_t {
  kConstant = 1,         // a
  kUniform = 2,          // uniform in [a, b)
  kNormal = 3,           // mean a, standard deviation b
  kTruncatedNormal = 4,  // as kNormal, redrawn until within 2 b of a
};

struct InitializerConfig {
  InitializerKind kind = InitializerKind::kUniform;
  float a = -0.01f;
  float b = 0.01f;
};

// Fills out[0..n) with the initial values of key's row. Element j is drawn
// from a counter-based generator: u_j = Mix64(Mix64(key ^ Mix64(seed ^
// kInitSalt)) + golden * (j + 1)), so it depends on nothing but (seed, key, j).
void InitialValues(const InitializerConfig& cfg, uint64_t seed, uint64_t key,
                   float* out, size_t n);

}  // namespace pyfleet
