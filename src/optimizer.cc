#include "pyfleet/optimizer.h"

#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

#include "pyfleet/error.h"

namespace pyfleet {

const char* OptimizerName(OptimizerKind kind) {
  switch (kind) {
    case OptimizerKind::kSGD: return "SGD";
    case OptimizerKind::kAdagrad: return "Adagrad";
    case OptimizerKind::kAdam: return "Adam";
    case OptimizerKind::kFTRL: return "FTRL";
    case OptimizerKind::kMomentum: return "Momentum";
    case OptimizerKind::kRMSProp: return "RMSProp";
  }
  return "unknown";
}

void ValidateOptimizer(const OptimizerConfig& c) {
  const uint32_t k = static_cast<uint32_t>(c.kind);
  if (k < 1 || k > 6) ThrowInvalid("unknown optimizer kind ", k);
  if (!(c.learning_rate > 0) || !std::isfinite(c.learning_rate)) {
    ThrowInvalid("learning_rate must be positive and finite, got ", c.learning_rate);
  }
  if (c.kind == OptimizerKind::kAdam) {
    if (!(c.beta1 >= 0 && c.beta1 < 1)) ThrowInvalid("beta1 must be in [0, 1), got ", c.beta1);
    if (!(c.beta2 >= 0 && c.beta2 < 1)) ThrowInvalid("beta2 must be in [0, 1), got ", c.beta2);
  }
  if (c.lazy_row_width != 0 && c.kind != OptimizerKind::kAdam) {
    ThrowInvalid("lazy_row_width is Adam's lazy mode; ", OptimizerName(c.kind), " has none");
  }
  if (c.kind == OptimizerKind::kFTRL && !(c.lr_power <= 0)) {
    ThrowInvalid("lr_power must be <= 0, got ", c.lr_power);
  }
  if ((c.kind == OptimizerKind::kMomentum || c.kind == OptimizerKind::kRMSProp) &&
      !(c.momentum >= 0 && std::isfinite(c.momentum))) {
    ThrowInvalid("momentum must be non-negative and finite, got ", c.momentum);
  }
  if (c.kind == OptimizerKind::kRMSProp) {
    if (!(c.rho >= 0 && c.rho < 1)) ThrowInvalid("rho must be in [0, 1), got ", c.rho);
    if (!(c.epsilon > 0 && std::isfinite(c.epsilon))) {
      ThrowInvalid("epsilon must be positive and finite, got ", c.epsilon);
    }
  }
  const uint32_t d = static_cast<uint32_t>(c.decay);
  if (d > 2) ThrowInvalid("unknown decay kind ", d);
  if (!std::isfinite(c.decay_coeff)) {
    ThrowInvalid("decay_coeff must be finite, got ", c.decay_coeff);
  }
}

size_t OptimizerStateDim(const OptimizerConfig& c, size_t dim) {
  switch (c.kind) {
    case OptimizerKind::kSGD: return 0;
    case OptimizerKind::kAdagrad: return dim;
    case OptimizerKind::kAdam: return 2 * dim + 2;
    case OptimizerKind::kFTRL: return 2 * dim;
    case OptimizerKind::kMomentum: return dim;
    case OptimizerKind::kRMSProp: return (c.centered ? 3 : 2) * dim;
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
    case OptimizerKind::kMomentum:
    case OptimizerKind::kRMSProp:
      // Fluid's accumulators (velocity; mean square, moment, mean grad) start at 0.
      for (size_t i = 0, n = OptimizerStateDim(c, dim); i < n; ++i) state[i] = 0.f;
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

// Fluid's momentum op: v = mu * v + g; w -= lr * v, or with Nesterov
// w -= lr * (g + mu * v) (v the updated velocity).
PYFLEET_MULTIVERSION
void Momentum(const OptimizerConfig& c, float* __restrict w, float* __restrict v,
              const float* __restrict g, size_t n) {
  const float lr = c.learning_rate, mu = c.momentum;
  if (c.use_nesterov) {
    for (size_t i = 0; i < n; ++i) {
      v[i] = mu * v[i] + g[i];
      w[i] -= (g[i] + mu * v[i]) * lr;
    }
  } else {
    for (size_t i = 0; i < n; ++i) {
      v[i] = mu * v[i] + g[i];
      w[i] -= lr * v[i];
    }
  }
}

// Fluid's rmsprop op: ms = rho * ms + (1 - rho) * g * g; centered: mg = rho *
// mg + (1 - rho) * g and mom = momentum * mom + lr * g / sqrt(ms - mg * mg +
// eps), else mom = momentum * mom + lr * g / sqrt(ms + eps); w -= mom.
PYFLEET_MULTIVERSION
void RmsProp(const OptimizerConfig& c, float* __restrict w, float* __restrict s,
             const float* __restrict g, size_t n) {
  float* __restrict ms = s;
  float* __restrict mom = s + n;
  const float lr = c.learning_rate, rho = c.rho, eps = c.epsilon, mu = c.momentum;
  const float one_rho = 1.f - rho;
  if (c.centered) {
    float* __restrict mg = s + 2 * n;
    for (size_t i = 0; i < n; ++i) {
      ms[i] = rho * ms[i] + one_rho * g[i] * g[i];
      mg[i] = rho * mg[i] + one_rho * g[i];
      mom[i] = mu * mom[i] + lr * g[i] / std::sqrt(ms[i] - mg[i] * mg[i] + eps);
      w[i] -= mom[i];
    }
  } else {
    for (size_t i = 0; i < n; ++i) {
      ms[i] = rho * ms[i] + one_rho * g[i] * g[i];
      mom[i] = mu * mom[i] + lr * g[i] / std::sqrt(ms[i] + eps);
      w[i] -= mom[i];
    }
  }
}

// out = g + coeff * w (L2) or g + coeff * sign(w) (L1): Fluid's regularizers.
PYFLEET_MULTIVERSION
void Decay(const OptimizerConfig& c, const float* __restrict w, const float* __restrict g,
           float* __restrict out, size_t n) {
  const float k = c.decay_coeff;
  if (c.decay == DecayKind::kL2) {
    for (size_t i = 0; i < n; ++i) out[i] = g[i] + k * w[i];
  } else {
    for (size_t i = 0; i < n; ++i) {
      const float sign = w[i] > 0.f ? 1.f : (w[i] < 0.f ? -1.f : 0.f);
      out[i] = g[i] + k * sign;
    }
  }
}

bool AllPositiveZero(const float* g, size_t n) {
  uint32_t bits = 0;
  for (size_t i = 0; i < n; ++i) {
    uint32_t b;
    std::memcpy(&b, g + i, sizeof(b));
    bits |= b;
  }
  return bits == 0;
}

}  // namespace

void OptimizerUpdateLazyRows(const OptimizerConfig& c, float* w, float* state,
                             const float* g, size_t size) {
  const size_t width = c.lazy_row_width;
  PYFLEET_ASSERT(c.kind == OptimizerKind::kAdam && width != 0 && size % width == 0);
  float* m = state;
  float* v = state + size;
  float& b1p = state[2 * size];
  float& b2p = state[2 * size + 1];
  const float b1 = c.beta1, b2 = c.beta2;
  const float lr = c.learning_rate * std::sqrt(1.f - b2p) / (1.f - b1p);
  const float eps = c.epsilon * std::sqrt(1.f - b2p);
  const bool decay = c.decay != DecayKind::kNone && c.decay_coeff != 0.f;
  std::vector<float> decayed(decay ? width : 0);
  for (size_t r = 0; r < size; r += width) {
    const float* gr = g + r;
    if (AllPositiveZero(gr, width)) continue;
    if (decay) {
      Decay(c, w + r, gr, decayed.data(), width);
      gr = decayed.data();
    }
    for (size_t j = 0; j < width; ++j) {
      const size_t i = r + j;
      m[i] = b1 * m[i] + (1.f - b1) * gr[j];
      v[i] = b2 * v[i] + (1.f - b2) * gr[j] * gr[j];
      w[i] -= lr * (m[i] / (std::sqrt(v[i]) + eps));
    }
  }
  b1p *= b1;
  b2p *= b2;
}

void OptimizerUpdate(const OptimizerConfig& c, float* w, float* state, const float* g,
                     size_t dim) {
  if (c.decay != DecayKind::kNone && c.decay_coeff != 0.f) {
    thread_local std::vector<float> decayed;
    decayed.resize(dim);
    Decay(c, w, g, decayed.data(), dim);
    g = decayed.data();
  }
  switch (c.kind) {
    case OptimizerKind::kSGD: return Sgd(c, w, g, dim);
    case OptimizerKind::kAdagrad: return Adagrad(c, w, state, g, dim);
    case OptimizerKind::kAdam: return Adam(c, w, state, g, dim);
    case OptimizerKind::kFTRL: return Ftrl(c, w, state, g, dim);
    case OptimizerKind::kMomentum: return Momentum(c, w, state, g, dim);
    case OptimizerKind::kRMSProp: return RmsProp(c, w, state, g, dim);
  }
  PYFLEET_ASSERT(false);
}

}  // namespace pyfleet
