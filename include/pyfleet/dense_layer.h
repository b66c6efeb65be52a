// The elementwise half of a fully connected layer over one batch: the bias
// and the activation forward, the activation's and the bias's gradients
// backward, each one pass over the layer's rows. The matrix products stay
// the caller's (numpy's BLAS): these replace the temporaries and the
// per-op dispatch around them (pyfleet.fluid.fused_fc).
//
// Each reproduces numpy's arithmetic on the same float32 arrays: relu as
// np.maximum(z, 0) (a NaN stays NaN), its gradient as g * (y > 0) (a NaN
// or infinite g times a false mask is NaN), the bias gradient as numpy's
// g.sum(axis=0) on a C-contiguous array (rows added in order). Pure
// functions of their arguments, safe from any number of threads at once;
// called with the GIL released.
#pragma once

#include <cstddef>

namespace pyfleet {

enum class Activation { kNone = 0, kRelu = 1 };

// y[r, c] = act(y[r, c] + bias[c]) in place, for the rows x cols row-major y.
void BiasActivate(float* y, const float* bias, size_t rows, size_t cols, Activation act);

// For the layer's output y and the gradient g of it (rows x cols, row-major):
// gz = g * act'(y) (the gradient before the activation; with kNone gz may be
// g itself and is not written), gbias[c] = sum over r of gz[r, c].
void ActivationBiasGrad(const float* g, const float* y, size_t rows, size_t cols,
                        Activation act, float* gz, float* gbias);

}  // namespace pyfleet
