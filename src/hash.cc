#include "pyfleet/hash.h"

#include <cmath>
#include <cstring>

#include "pyfleet/initializer.h"

namespace pyfleet {

void Route(const uint64_t* keys, size_t n, uint32_t num_servers, int32_t* out) {
  for (size_t i = 0; i < n; ++i) out[i] = static_cast<int32_t>(RouteKey(keys[i], num_servers));
}

namespace {
constexpr uint64_t kP1 = 0x9E3779B185EBCA87ULL;
constexpr uint64_t kP2 = 0xC2B2AE3D27D4EB4FULL;
inline uint64_t Rotl(uint64_t x, int r) { return (x << r) | (x >> (64 - r)); }
inline uint64_t Lane(uint64_t acc, uint64_t w) { return Rotl(acc + w * kP2, 31) * kP1; }
}  // namespace

void Checksum::Round(const uint64_t* w) {
  for (int i = 0; i < 4; ++i) lanes_[i] = Lane(lanes_[i], w[i]);
}

void Checksum::Update(const void* data, size_t n) {
  const unsigned char* p = static_cast<const unsigned char*>(data);
  total_ += n;
  if (tail_len_ > 0) {
    const size_t take = std::min(n, sizeof(tail_) - tail_len_);
    std::memcpy(tail_ + tail_len_, p, take);
    tail_len_ += take;
    p += take;
    n -= take;
    if (tail_len_ < sizeof(tail_)) return;
    uint64_t w[4];
    std::memcpy(w, tail_, sizeof(w));
    Round(w);
    tail_len_ = 0;
  }
  while (n >= 32) {
    uint64_t w[4];
    std::memcpy(w, p, sizeof(w));
    Round(w);
    p += 32;
    n -= 32;
  }
  std::memcpy(tail_, p, n);
  tail_len_ = n;
}

uint64_t Checksum::Digest() const {
  uint64_t h = Rotl(lanes_[0], 1) + Rotl(lanes_[1], 7) + Rotl(lanes_[2], 12) + Rotl(lanes_[3], 18);
  h ^= total_ * kP1;
  for (size_t i = 0; i < tail_len_; ++i) h = Mix64(h ^ tail_[i]) + i;
  return Mix64(h);
}

namespace {
constexpr uint64_t kGolden = 0x9E3779B97F4A7C15ULL;

// Uniform in [0, 1) from the top 24 bits: exactly representable in float.
inline float Unit(uint64_t r) { return static_cast<float>(r >> 40) * (1.0f / 16777216.0f); }

// A standard normal from one 64-bit draw (Box-Muller on its two halves).
inline double StdNormal(uint64_t r) {
  const double u1 = (static_cast<double>(r >> 32) + 0.5) / 4294967296.0;
  const double u2 = static_cast<double>(r & 0xFFFFFFFFu) / 4294967296.0;
  return std::sqrt(-2.0 * std::log(u1)) * std::cos(6.283185307179586 * u2);
}
}  // namespace

void InitialValues(const InitializerConfig& cfg, uint64_t seed, uint64_t key, float* out,
                   size_t n) {
  const uint64_t base = Mix64(key ^ Mix64(seed ^ kInitSalt));
  switch (cfg.kind) {
    case InitializerKind::kConstant:
      for (size_t j = 0; j < n; ++j) out[j] = cfg.a;
      return;
    case InitializerKind::kUniform:
      for (size_t j = 0; j < n; ++j) {
        out[j] = cfg.a + (cfg.b - cfg.a) * Unit(Mix64(base + kGolden * (j + 1)));
      }
      return;
    case InitializerKind::kNormal:
      for (size_t j = 0; j < n; ++j) {
        out[j] = static_cast<float>(cfg.a + cfg.b * StdNormal(Mix64(base + kGolden * (j + 1))));
      }
      return;
    case InitializerKind::kTruncatedNormal:
      for (size_t j = 0; j < n; ++j) {
        uint64_t r = Mix64(base + kGolden * (j + 1));
        double z = StdNormal(r);
        while (std::fabs(z) > 2.0) {
          r = Mix64(r + kGolden);
          z = StdNormal(r);
        }
        out[j] = static_cast<float>(cfg.a + cfg.b * z);
      }
      return;
  }
  // An unknown kind was refused when the table was built.
  for (size_t j = 0; j < n; ++j) out[j] = 0.f;
}

}  // namespace pyfleet
