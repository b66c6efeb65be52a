// 64-bit mixing, and the routing rule that says which server owns a key.
#pragma once

#include <cstddef>
#include <cstdint>

namespace pyfleet {

// The splitmix64 finalizer: a bijection on uint64 whose every output bit
// depends on every input bit.
inline uint64_t Mix64(uint64_t x) {
  x ^= x >> 30;
  x *= 0xbf58476d1ce4e5b9ULL;
  x ^= x >> 27;
  x *= 0x94d049bb133111ebULL;
  x ^= x >> 31;
  return x;
}

// Salts keep the three uses of the hash (routing across servers, sharding
// inside a table, initial values) independent of each other: keys routed to
// one server still spread over all of its shards.
inline constexpr uint64_t kRouteSalt = 0x5bd1e9955bd1e995ULL;
inline constexpr uint64_t kInitSalt = 0x2545f4914f6cdd1dULL;

// Which of num_servers owns key: multiply-shift of a salted mix, uniform over
// [0, num_servers) and never key % n of the raw id.
// RouteHash(h, n) is the owner given h = RouteMix(key), for callers that
// already hashed the key (deduplication hashes with the same mix).
inline uint64_t RouteMix(uint64_t key) { return Mix64(key ^ kRouteSalt); }
inline uint32_t RouteHash(uint64_t h, uint32_t num_servers) {
  return static_cast<uint32_t>((static_cast<unsigned __int128>(h) * num_servers) >> 64);
}
inline uint32_t RouteKey(uint64_t key, uint32_t num_servers) {
  return RouteHash(RouteMix(key), num_servers);
}

void Route(const uint64_t* keys, size_t n, uint32_t num_servers, int32_t* out);

// A streaming 64-bit checksum over bytes (four independent lanes of
// multiply-rotate rounds, folded at the end). Not cryptographic: it catches
// truncation, bit flips and misplaced blocks in checkpoint files.
class Checksum {
 public:
  void Update(const void* data, size_t n);
  uint64_t Digest() const;

 private:
  void Round(const uint64_t* words);
  uint64_t lanes_[4] = {0x9E3779B185EBCA87ULL, 0xC2B2AE3D27D4EB4FULL,
                        0x165667B19E3779F9ULL, 0x85EBCA77C2B2AE63ULL};
  unsigned char tail_[32];
  size_t tail_len_ = 0;
  uint64_t total_ = 0;
};

}  // namespace pyfleet
