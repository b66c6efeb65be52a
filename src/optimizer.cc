#include "pyfleet/optimizer.h"

#include <cmath>
#include <cstdint>
#include <cstring>

#include "pyfleet/error.h"

namespace pyfleet {

const char* OptimizerName(OptimizerKind kind) {
  switch (kind) {
    case OptimizerKind::kSGD: return "SGD";
    case OptimizerKind::kAdagrad: return "Adagrad";
    case OptimizerKind::kAdam: return "Adam";
    case OptimizerKind::kFTRL: return "FTRL";
  }
  return "unknown";
}

void ValidateOptimizer(const OptimizerConfig& c) {
  const uint32_t k = static_cast<uint32_t>(c.kind);
  if (k < 1 || k > 4) ThrowInvalid("unknown optimizer kind ", k);
  if (!(c.learning_rate > 0) || !std::isfinite(c.learning_rate)) {
    ThrowInvalid("learning_rate must be positive and finite, got ", c.learning_rate);
  }
  if (c.kind == OptimizerKind::kAdam) {
    if (!(c.beta1 >= 0 && c.beta1 < 1)) ThrowInvalid("beta1 must be in [0, 1), got ", c.beta1);
    if (!(c.beta2 >= 0 && c.beta2 < 1)) ThrowInvalid("beta2 must be in [0, 1), got ", c.beta2);
  }
  if (c.kind == OptimizerKind::kFTRL && !(c.lr_power <= 0)) {
    ThrowInvalid("lr_power must be <= 0, got ", c.lr_power);
  }
}

size_t OptimizerStateDim(const OptimizerConfig& c, size_t dim) {
  switch (c.kind) {
    case OptimizerKind::kSGD: return 0;
    case OptimizerKind::kAdagrad: return dim;
    case OptimizerKind::kAdam: return 2 * dim + 2;
    case OptimizerKind::kFTRL: return 2 * dim;
  }
  PYFLEET_ASSERT(false);
  return 0;
}

size_t OptimizerStateTail(const OptimizerConfig& c) {
  return c.kind == OptimizerKind::kAdam ? 2 : 0;
}

void OptimizerInitState(const OptimizerConfig& c, float* state, size_t dim) {
  switch (c.kind) {
    case OptimizerKind::kSGD:
      return;
    case OptimizerKind::kAdagrad:
      for (size_t i = 0; i < dim; ++i) state[i] = c.initial_accumulator_value;
      return;
    case OptimizerKind::kAdam:
      for (size_t i = 0; i < 2 * dim; ++i) state[i] = 0.f;
      state[2 * dim] = c.beta1;  // Fluid starts the powers at beta, not 1
      state[2 * dim + 1] = c.beta2;
      return;
    case OptimizerKind::kFTRL:
      for (size_t i = 0; i < 2 * dim; ++i) state[i] = 0.f;
      return;
  }
}

size_t FirstNonFinite(const float* v, size_t n) {
  // |v| above kMaxUpdate, or Inf, or NaN: as unsigned integers the magnitude
  // bits of floats order as the floats, and Inf and NaN lie above every finite.
  uint32_t limit;
  const float max_update = kMaxUpdate;
  std::memcpy(&limit, &max_update, sizeof(limit));
  uint32_t any = 0;
  for (size_t i = 0; i < n; ++i) {
    uint32_t bits;
    std::memcpy(&bits, v + i, sizeof(bits));
    any |= (bits & 0x7fffffffu) > limit;
  }
  if (!any) return n;
  for (size_t i = 0; i < n; ++i) {
    if (!(std::fabs(v[i]) <= kMaxUpdate)) return i;
  }
  return n;
}

namespace {

// The update loops are built for AVX2 as well as the baseline and picked at
// load time (GCC/Clang function multiversioning on x86-64 Linux). No FMA
// target: a contracted multiply-add would round differently from the plain
// baseline build and the numpy references. Not in sanitizer builds: their
// runtimes are not up yet when the loader runs the ifunc resolvers.
#if defined(__has_feature)
#if __has_feature(thread_sanitizer) || __has_feature(address_sanitizer)
#define PYFLEET_NO_MULTIVERSION 1
#endif
#endif
#if defined(__SANITIZE_THREAD__) || defined(__SANITIZE_ADDRESS__)
#define PYFLEET_NO_MULTIVERSION 1
#endif
// Needs glibc's ifunc, and GCC >= 6 or Clang >= 14.
#if defined(__clang__)
#define PYFLEET_CC_CLONES (__clang_major__ >= 14)
#elif defined(__GNUC__)
#define PYFLEET_CC_CLONES (__GNUC__ >= 6)
#else
#define PYFLEET_CC_CLONES 0
#endif
#if defined(__x86_64__) && defined(__linux__) && defined(__GLIBC__) && PYFLEET_CC_CLONES && \
    !defined(PYFLEET_NO_MULTIVERSION)
#define PYFLEET_MULTIVERSION __attribute__((target_clones("avx2", "default")))
#else
#define PYFLEET_MULTIVERSION
#endif

PYFLEET_MULTIVERSION
void Sgd(const OptimizerConfig& c, float* __restrict w, const float* __restrict g, size_t n) {
  const float lr = c.learning_rate;
  for (size_t i = 0; i < n; ++i) w[i] -= lr * g[i];
}

PYFLEET_MULTIVERSION
void Adagrad(const OptimizerConfig& c, float* __restrict w, float* __restrict acc,
             const float* __restrict g, size_t n) {
  const float lr = c.learning_rate, eps = c.epsilon;
  for (size_t i = 0; i < n; ++i) {
    acc[i] += g[i] * g[i];
    w[i] -= lr * g[i] / (std::sqrt(acc[i]) + eps);
  }
}

PYFLEET_MULTIVERSION
void Adam(const OptimizerConfig& c, float* __restrict w, float* __restrict s,
          const float* __restrict g, size_t n) {
  float* __restrict m = s;
  float* __restrict v = s + n;
  float& b1p = s[2 * n];
  float& b2p = s[2 * n + 1];
  const float b1 = c.beta1, b2 = c.beta2;
  const float lr = c.learning_rate * std::sqrt(1.f - b2p) / (1.f - b1p);
  const float eps = c.epsilon * std::sqrt(1.f - b2p);
  for (size_t i = 0; i < n; ++i) {
    m[i] = b1 * m[i] + (1.f - b1) * g[i];
    v[i] = b2 * v[i] + (1.f - b2) * g[i] * g[i];
    w[i] -= lr * (m[i] / (std::sqrt(v[i]) + eps));
  }
  b1p *= b1;
  b2p *= b2;
}

PYFLEET_MULTIVERSION
void Ftrl(const OptimizerConfig& c, float* __restrict w, float* __restrict s,
          const float* __restrict g, size_t n) {
  float* __restrict sq = s;
  float* __restrict lin = s + n;
  const float lr = c.learning_rate, l1 = c.l1, l2 = c.l2, p = c.lr_power;
  const bool half = p == -0.5f;
  for (size_t i = 0; i < n; ++i) {
    const float new_sq = sq[i] + g[i] * g[i];
    const float sigma = half ? (std::sqrt(new_sq) - std::sqrt(sq[i])) / lr
                             : (std::pow(new_sq, -p) - std::pow(sq[i], -p)) / lr;
    lin[i] += g[i] - sigma * w[i];
    const float y = (half ? std::sqrt(new_sq) : std::pow(new_sq, -p)) / lr + 2.f * l2;
    const float x = (lin[i] > 0 ? l1 : (lin[i] < 0 ? -l1 : 0.f)) - lin[i];
    w[i] = std::fabs(lin[i]) > l1 ? x / y : 0.f;
    sq[i] = new_sq;
  }
}

}  // namespace

void OptimizerUpdate(const OptimizerConfig& c, float* w, float* state, const float* g,
                     size_t dim) {
  switch (c.kind) {
    case OptimizerKind::kSGD: return Sgd(c, w, g, dim);
    case OptimizerKind::kAdagrad: return Adagrad(c, w, state, g, dim);
    case OptimizerKind::kAdam: return Adam(c, w, state, g, dim);
    case OptimizerKind::kFTRL: return Ftrl(c, w, state, g, dim);
  }
  PYFLEET_ASSERT(false);
}

}  // namespace pyfleet
