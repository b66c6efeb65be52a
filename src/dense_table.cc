#include "pyfleet/dense_table.h"

#include <cmath>
#include <cstring>

#include "pyfleet/error.h"
#include "pyfleet/table_io.h"

namespace pyfleet {

DenseTable::DenseTable(size_t size, const OptimizerConfig& opt)
    : size_(size), opt_(opt), weights_(size, 0.f) {
  if (size == 0) ThrowInvalid("a dense table needs at least one element");
  ValidateOptimizer(opt);
  if (opt.lazy_row_width != 0 && size % opt.lazy_row_width != 0) {
    ThrowInvalid("a lazy Adam dense table of ", size, " weights is not whole rows of ",
                 opt.lazy_row_width);
  }
  state_.resize(OptimizerStateDim(opt, size));
  OptimizerInitState(opt_, state_.data(), size_);
}

void DenseTable::Set(const float* values) {
  std::lock_guard<std::mutex> lock(mu_);
  std::memcpy(weights_.data(), values, size_ * sizeof(float));
  OptimizerInitState(opt_, state_.data(), size_);
}

void DenseTable::Pull(float* out) const {
  std::lock_guard<std::mutex> lock(mu_);
  std::memcpy(out, weights_.data(), size_ * sizeof(float));
}

static void CheckFinite(const float* v, size_t n, const char* what) {
  const size_t i = FirstNonFinite(v, n);
  if (i < n) {
    ThrowInvalid(what, " rejected: element ", i, " is ", v[i],
                 " (non-finite values and values beyond +-1e18 are refused); nothing was changed");
  }
}

void DenseTable::Push(const float* grad) {
  CheckFinite(grad, size_, "dense push");
  std::lock_guard<std::mutex> lock(mu_);
  if (opt_.lazy_row_width != 0) {
    OptimizerUpdateLazyRows(opt_, weights_.data(), state_.data(), grad, size_);
  } else {
    OptimizerUpdate(opt_, weights_.data(), state_.data(), grad, size_);
  }
}

void DenseTable::AddDelta(const float* delta) {
  CheckFinite(delta, size_, "dense delta");
  std::lock_guard<std::mutex> lock(mu_);
  for (size_t i = 0; i < size_; ++i) weights_[i] += delta[i];
}

std::vector<float> DenseTable::State() const {
  std::lock_guard<std::mutex> lock(mu_);
  return state_;
}

size_t DenseTable::Save(const std::string& path) const {
  std::vector<float> w, s;
  {
    std::lock_guard<std::mutex> lock(mu_);
    w = weights_;
    s = state_;
  }
  FileWriter out(path);
  FileHeader hdr{};
  std::memcpy(hdr.magic, kFileMagic, sizeof(kFileMagic));
  hdr.format_version = kFormatVersion;
  hdr.table_kind = static_cast<uint32_t>(TableKind::kDense);
  hdr.optimizer_kind = static_cast<uint32_t>(opt_.kind);
  hdr.state_dim = static_cast<uint32_t>(s.size());
  hdr.dense_size = size_;
  out.Write(&hdr, sizeof(hdr));
  out.Write(w.data(), w.size() * sizeof(float));
  out.Write(s.data(), s.size() * sizeof(float));
  out.Finish(0, 0);
  return size_;
}

size_t DenseTable::Load(const std::string& path) {
  FileReader in(path);
  const FileHeader& h = in.header();
  if (h.table_kind != static_cast<uint32_t>(TableKind::kDense)) {
    ThrowInvalid(path, " holds a sparse table, not a dense one");
  }
  if (h.dense_size != size_) {
    ThrowInvalid(path, " holds ", h.dense_size, " weights, this dense table has ", size_);
  }
  if (h.optimizer_kind != static_cast<uint32_t>(opt_.kind) || h.state_dim != state_.size()) {
    ThrowInvalid(path, " holds ", OptimizerName(static_cast<OptimizerKind>(h.optimizer_kind)),
                 " state, this table uses ", OptimizerName(opt_.kind));
  }
  in.ExpectBody((size_ + state_.size()) * sizeof(float));
  std::vector<float> w(size_), s(state_.size());
  in.Read(w.data(), w.size() * sizeof(float));
  in.Read(s.data(), s.size() * sizeof(float));
  std::lock_guard<std::mutex> lock(mu_);
  weights_.swap(w);
  state_.swap(s);
  return size_;
}

}  // namespace pyfleet
