// An open-addressing (linear probing) map from uint64 key to a uint32 value,
// used as a shard's key -> row id index and as its admission-count map.
//
// Slots are 12 bytes (key, value) packed; an empty slot has value kEmpty, so
// every uint64 (0 and 2^64-1 included) is a valid key. The caller passes
// h = Mix64(key) so that a batch hashes each key once; the slot is h's low
// bits (the shard was chosen from the high bits). Grows by doubling past a
// load of 3/4; deletion shifts the following run back (no tombstones).
// Slot arrays of SlabArena::kMinBytes or more come from the arena given at
// construction (a table's shards share one), others from the kernel directly.
// Not thread-safe: the owning shard's lock guards it.
#pragma once

#include <cstddef>
#include <cstdint>

namespace pyfleet {

class SlabArena;

#pragma pack(push, 4)
struct IndexSlot {
  uint64_t key;
  uint32_t value;
};
#pragma pack(pop)
static_assert(sizeof(IndexSlot) == 12, "index slots are packed to 12 bytes");

class KeyIndex {
 public:
  static constexpr uint32_t kEmpty = 0xFFFFFFFFu;

  explicit KeyIndex(SlabArena* arena = nullptr);
  ~KeyIndex();
  KeyIndex(const KeyIndex&) = delete;
  KeyIndex& operator=(const KeyIndex&) = delete;

  // The slot array as it is now, for a batch of lookups: valid until the
  // next insert or erase (the owning shard's shared lock keeps it so). A
  // batch keeps one per shard at hand instead of reaching each through its
  // shard and index.
  struct View {
    const IndexSlot* slots;
    size_t mask;

    void Prefetch(uint64_t h) const { __builtin_prefetch(&slots[h & mask]); }
    // Also the line of the next slot: a probe reads 1.75 slots on average at
    // the 0.6 load of a grown index, so a run often crosses into that line.
    void PrefetchRun(uint64_t h) const {
      const IndexSlot* p = &slots[h & mask];
      __builtin_prefetch(p);
      __builtin_prefetch(reinterpret_cast<const char*>(p) + 2 * sizeof(IndexSlot) - 1);
    }
    uint32_t Find(uint64_t key, uint64_t h) const {
      size_t i = h & mask;
      for (;;) {
        const IndexSlot& s = slots[i];
        if (s.value == kEmpty) return kEmpty;
        if (s.key == key) return s.value;
        i = (i + 1) & mask;
      }
    }
  };
  View view() const { return {slots_, mask_}; }

  // The value stored for key, or kEmpty.
  uint32_t Find(uint64_t key, uint64_t h) const { return view().Find(key, h); }

  // A pointer to key's value (valid until the next insert or erase), or null.
  uint32_t* FindValue(uint64_t key, uint64_t h) {
    size_t i = h & mask_;
    for (;;) {
      IndexSlot& s = slots_[i];
      if (s.value == kEmpty) return nullptr;
      if (s.key == key) return &s.value;
      i = (i + 1) & mask_;
    }
  }

  void Prefetch(uint64_t h) const { view().Prefetch(h); }

  // Adds key -> value; key must be absent and value != kEmpty.
  void Insert(uint64_t key, uint64_t h, uint32_t value);

  // Removes key; returns its value, or kEmpty if it was absent.
  uint32_t Erase(uint64_t key, uint64_t h);

  // Drops every entry and shrinks back to the minimum capacity.
  void Clear();

  size_t size() const { return size_; }
  size_t capacity() const { return mask_ + 1; }
  // As mapped: a slot array of 2 MiB or more sits on whole huge pages. An
  // array in the arena counts 0 here (the arena counts its slabs).
  size_t MemoryBytes() const;

  // Calls f(key, value) for every entry, in slot order.
  template <typename F>
  void ForEach(F&& f) const {
    for (size_t i = 0; i <= mask_; ++i) {
      if (slots_[i].value != kEmpty) f(slots_[i].key, slots_[i].value);
    }
  }

 private:
  void Rehash(size_t new_capacity);
  IndexSlot* AllocSlots(size_t capacity);
  void FreeSlots(IndexSlot* slots, size_t capacity);
  bool InArena(size_t capacity) const;

  SlabArena* arena_;
  IndexSlot* slots_ = nullptr;
  size_t mask_ = 0;
  size_t size_ = 0;
};

}  // namespace pyfleet
