// What the disk tier's two files (spill_table.cc: the budget, the row
// limit, reading rows back; spill_evict.cc: choosing victims and writing
// them out) share: a spilled index value's bit, a slot's trailer, the use
// byte of a row in RAM.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>

namespace pyfleet {

inline constexpr uint32_t kSpilledBit = 0x80000000u;
// A slot's trailer after the row's record (spill_file.h): the row's key,
// then `left`, its shard's ShardSpill::evictions when it went to disk.
inline constexpr size_t kTrailerBytes = 2 * sizeof(uint64_t);
inline constexpr size_t kLeftInTrailer = sizeof(uint64_t);

inline uint8_t LoadUsed(const uint8_t* p) {
  return std::atomic_ref<uint8_t>(*const_cast<uint8_t*>(p)).load(std::memory_order_relaxed);
}
inline void StoreUsed(uint8_t* p, uint8_t v) {
  std::atomic_ref<uint8_t>(*p).store(v, std::memory_order_relaxed);
}

}  // namespace pyfleet
