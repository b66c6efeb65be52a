// Optimizer rules applied where a row lives. Each rule is small: how many
// floats of state a row of `dim` weights carries, how that state starts, and
// one update over spans. The Python config classes in pyfleet/optimizer.py
// carry the same names and fields.
//
// State layouts (floats after the weights of a row):
//   SGD      []
//   Adagrad  [acc[dim]]
//   Adam     [m[dim] | v[dim] | beta1_pow | beta2_pow]
//   FTRL     [squared[dim] | linear[dim]]
//   Momentum [velocity[dim]]
//   RMSProp  [mean_square[dim] | moment[dim]]                    (centered = false)
//            [mean_square[dim] | moment[dim] | mean_grad[dim]]   (centered = true)
//
// A weight decay (Fluid's regularizers, applied where the row lives) is part
// of the rule: with `decay` set, every update first adds coeff * w (L2) or
// coeff * sign(w) (L1) to the gradient of the elements it updates, w taken
// before the update, so a sparse row is decayed once per update that touches
// it (one per push; one per step in sync mode, on the merged gradient).
#pragma once

#include <cstddef>
#include <cstdint>

namespace pyfleet {

enum class OptimizerKind : uint32_t {
  kSGD = 1, kAdagrad = 2, kAdam = 3, kFTRL = 4, kMomentum = 5, kRMSProp = 6
};

enum class DecayKind : uint32_t { kNone = 0, kL1 = 1, kL2 = 2 };

struct OptimizerConfig {
  OptimizerKind kind = OptimizerKind::kSGD;
  float learning_rate = 0.01f;
  float beta1 = 0.9f;                     // Adam
  float beta2 = 0.999f;                   // Adam
  float epsilon = 1e-8f;                  // Adam, Adagrad
  float initial_accumulator_value = 0.f;  // Adagrad
  float l1 = 0.f;                         // FTRL
  float l2 = 0.f;                         // FTRL
  float lr_power = -0.5f;                 // FTRL
  float momentum = 0.f;                   // Momentum (mu), RMSProp
  bool use_nesterov = false;              // Momentum
  float rho = 0.95f;                      // RMSProp
  bool centered = false;                  // RMSProp
  DecayKind decay = DecayKind::kNone;     // weight decay added to the gradient
  float decay_coeff = 0.f;
  // Adam on a dense table of rows this wide (0: off): Fluid's lazy_mode for a
  // row-sparse gradient (see OptimizerUpdateLazyRows).
  uint32_t lazy_row_width = 0;
};

const char* OptimizerName(OptimizerKind kind);

// Throws std::invalid_argument for an unknown kind or a value out of range.
void ValidateOptimizer(const OptimizerConfig& cfg);

size_t OptimizerStateDim(const OptimizerConfig& cfg, size_t dim);

// The trailing state floats that a compact (16-bit) row keeps in fp32:
// Adam's two beta powers (near 1, where 16 bits cannot follow their decay
// and the bias correction would be wrong); none for the other rules.
size_t OptimizerStateTail(const OptimizerConfig& cfg);

// Writes the starting state of a row of `dim` weights.
void OptimizerInitState(const OptimizerConfig& cfg, float* state, size_t dim);

// The largest gradient (or geo delta) magnitude a push may carry: 1e18,
// whose square (1e36) leaves every optimizer's squared-gradient state
// (Adagrad, Adam, FTRL) far from float32's overflow at 3.4e38. A larger
// value is no gradient but a diverged model; accepted, it would make Adam's
// second moment Inf and freeze that element for good.
constexpr float kMaxUpdate = 1e18f;

// The index of the first NaN, Inf or value of magnitude above kMaxUpdate in
// v[0..n), or n: one branch-free pass that vectorizes, then the search only
// when there is one.
size_t FirstNonFinite(const float* v, size_t n);

// One step: w[0..dim) and state are updated in place from grad[0..dim)
// (plus the decay, if any). Works on private copies: the table loads a row,
// calls this, stores it back.
void OptimizerUpdate(const OptimizerConfig& cfg, float* w, float* state,
                     const float* grad, size_t dim);

// Fluid's lazy Adam over a dense block of `size` weights in rows of
// cfg.lazy_row_width: a row whose gradient is all +0.0 (bit for bit) is not
// touched, the others take the Adam step (and the decay) on their elements;
// the block's beta powers advance once. The caller marks a row the gradient
// holds (Fluid's SelectedRows row) whose values are all zero with -0.0, which
// takes the same step as +0.0 would.
void OptimizerUpdateLazyRows(const OptimizerConfig& cfg, float* w, float* state,
                             const float* grad, size_t size);

}  // namespace pyfleet
