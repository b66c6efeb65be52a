// DenseTable: a contiguous block of float32 weights and its optimizer state.
//
// One mutex guards the block: dense pushes are whole-array and rare next to
// sparse traffic, and the lock makes every save a consistent copy.
#pragma once

#include <cstddef>
#include <cstdint>
#include <mutex>
#include <string>
#include <vector>

#include "pyfleet/optimizer.h"

namespace pyfleet {

class DenseTable {
 public:
  DenseTable(size_t size, const OptimizerConfig& opt);

  void Set(const float* values);     // weights := values; state reset
  void Pull(float* out) const;       // out := weights
  void Push(const float* grad);      // optimizer step; NaN/Inf -> invalid_argument
  void AddDelta(const float* delta); // weights += delta (geo mode)
  std::vector<float> State() const;

  size_t Save(const std::string& path) const;
  size_t Load(const std::string& path);

  size_t size() const { return size_; }
  size_t state_dim() const { return state_.size(); }
  size_t MemoryBytes() const { return (weights_.size() + state_.size()) * sizeof(float); }

 private:
  const size_t size_;
  const OptimizerConfig opt_;
  mutable std::mutex mu_;
  std::vector<float> weights_;
  std::vector<float> state_;
};

}  // namespace pyfleet
