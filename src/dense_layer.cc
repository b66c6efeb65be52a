// The elementwise kernels of a fully connected layer (include/pyfleet/dense_layer.h).
#include "pyfleet/dense_layer.h"

#include <cstring>

#ifdef __SSE2__
#include <emmintrin.h>
#endif

namespace pyfleet {

void BiasActivate(float* y, const float* bias, size_t rows, size_t cols, Activation act) {
  if (act == Activation::kRelu) {
    for (size_t r = 0; r < rows; ++r) {
      float* row = y + r * cols;
      for (size_t c = 0; c < cols; ++c) {
        const float z = row[c] + bias[c];
        row[c] = z < 0.0f ? 0.0f : z;  // np.maximum(z, 0): NaN stays NaN
      }
    }
    return;
  }
  for (size_t r = 0; r < rows; ++r) {
    float* row = y + r * cols;
    for (size_t c = 0; c < cols; ++c) row[c] += bias[c];
  }
}

namespace {

// zr = gr * (yr > 0), one row, as numpy computes it: a product with 1 or 0,
// so a NaN or infinite gradient under a closed unit still gives NaN. In
// SSE2 (the x86-64 baseline): left to itself GCC turns the product into a
// branch per element, which mispredicts on half the units of a relu layer
// (measured: 8x slower than numpy).
void ReluGradRow(const float* __restrict gr, const float* __restrict yr, float* __restrict zr,
                 size_t cols) {
  size_t c = 0;
#ifdef __SSE2__
  const __m128 zero = _mm_setzero_ps(), one = _mm_set1_ps(1.0f);
  for (; c + 4 <= cols; c += 4) {
    const __m128 unit = _mm_and_ps(_mm_cmpgt_ps(_mm_loadu_ps(yr + c), zero), one);
    _mm_storeu_ps(zr + c, _mm_mul_ps(_mm_loadu_ps(gr + c), unit));
  }
#endif
  for (; c < cols; ++c) zr[c] = gr[c] * (yr[c] > 0.0f ? 1.0f : 0.0f);
}

void AddRowTo(float* __restrict acc, const float* __restrict row, size_t cols) {
  for (size_t c = 0; c < cols; ++c) acc[c] += row[c];
}

}  // namespace

void ActivationBiasGrad(const float* g, const float* y, size_t rows, size_t cols,
                        Activation act, float* gz, float* gbias) {
  if (rows == 0) {
    std::memset(gbias, 0, cols * sizeof(float));
    return;
  }
  // numpy's sum over axis 0: the first row, then each later row added.
  const float* src = g;
  if (act == Activation::kRelu) {
    for (size_t r = 0; r < rows; ++r) {
      ReluGradRow(g + r * cols, y + r * cols, gz + r * cols, cols);
    }
    src = gz;
  }
  std::memcpy(gbias, src, cols * sizeof(float));
  for (size_t r = 1; r < rows; ++r) AddRowTo(gbias, src + r * cols, cols);
}

}  // namespace pyfleet
