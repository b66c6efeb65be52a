// An open-addressing (linear probing) map from uint64 key to a uint32 value,
// used as a shard's key -> row id index and as its admission-count map.
//
// Slots are 12 bytes (key, value) packed; an empty slot has value kEmpty, so
// every uint64 (0 and 2^64-1 included) is a valid key. The caller passes
// h = Mix64(key) so that a batch hashes each key once; the home slot is h's
// low bits (a power-of-two capacity), or for a compact index h's low 32
// bits scaled to the capacity (multiply-high), so that its capacity need not
// be a power of two; either is independent of the high bits that chose the
// shard. Deletion shifts the following run back (no tombstones).
// Grows by doubling past a load of 3/4 (loads 3/8..3/4: short probes for
// the all-in-RAM table), or, once SetCompact(), by 1.25x past a load of 4/5
// (loads 0.64..0.8: 15-19 bytes a key instead of 16-32, for a table with a
// memory budget, where every byte of index is a byte less of rows).
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
    size_t capacity;
    size_t mask;  // capacity - 1 of a doubling index (a power of two), else 0

    size_t Home(uint64_t h) const { return KeyIndex::Home(h, capacity, mask); }
    void Prefetch(uint64_t h) const { __builtin_prefetch(&slots[Home(h)]); }
    // Also the line of the next slot: a probe reads 1.75 slots on average at
    // the 0.6 load of a grown index, so a run often crosses into that line.
    void PrefetchRun(uint64_t h) const {
      const IndexSlot* p = &slots[Home(h)];
      __builtin_prefetch(p);
      __builtin_prefetch(reinterpret_cast<const char*>(p) + 2 * sizeof(IndexSlot) - 1);
    }
    uint32_t Find(uint64_t key, uint64_t h) const {
      size_t i = Home(h);
      for (;;) {
        const IndexSlot& s = slots[i];
        if (s.value == kEmpty) return kEmpty;
        if (s.key == key) return s.value;
        if (++i == capacity) i = 0;
      }
    }
  };
  View view() const { return {slots_, capacity_, mask_}; }

  // h's home slot in an array of `capacity` (< 2^32) slots: h's low bits if
  // the capacity is a power of two (mask = capacity - 1), else its low 32
  // bits scaled to the capacity. A doubling index keeps the mask: the
  // multiply measured 8-15% slower pulls of hot keys in the all-in-RAM table.
  static size_t Home(uint64_t h, size_t capacity, size_t mask) {
    if (mask != 0) return h & mask;
    return static_cast<size_t>(((h & 0xFFFFFFFFu) * capacity) >> 32);
  }

  // The value stored for key, or kEmpty.
  uint32_t Find(uint64_t key, uint64_t h) const { return view().Find(key, h); }

  // A pointer to key's value (valid until the next insert or erase), or null.
  uint32_t* FindValue(uint64_t key, uint64_t h) {
    size_t i = Home(h, capacity_, mask_);
    for (;;) {
      IndexSlot& s = slots_[i];
      if (s.value == kEmpty) return nullptr;
      if (s.key == key) return &s.value;
      if (++i == capacity_) i = 0;
    }
  }

  void Prefetch(uint64_t h) const { view().Prefetch(h); }

  // Adds key -> value; key must be absent and value != kEmpty.
  void Insert(uint64_t key, uint64_t h, uint32_t value);

  // Removes key; returns its value, or kEmpty if it was absent.
  uint32_t Erase(uint64_t key, uint64_t h);

  // Drops every entry and shrinks back to the minimum capacity.
  void Clear();

  // From now on grows by 1.25x at a load of 4/5 (see the top).
  void SetCompact();

  size_t size() const { return size_; }
  size_t capacity() const { return capacity_; }
  // The next insert past grow_at() entries grows the array to
  // next_capacity() slots; it grew into this one at about
  // grow_at() * capacity() / next_capacity().
  size_t grow_at() const { return grow_at_; }
  size_t next_capacity() const { return NextCapacity(capacity_); }
  // As mapped: a slot array of 2 MiB or more sits on whole huge pages. An
  // array in the arena counts 0 here (the arena counts its slabs).
  size_t MemoryBytes() const;

  // Calls f(key, value) for every entry, in slot order.
  template <typename F>
  void ForEach(F&& f) const {
    for (size_t i = 0; i < capacity_; ++i) {
      if (slots_[i].value != kEmpty) f(slots_[i].key, slots_[i].value);
    }
  }

 private:
  void Rehash(size_t new_capacity);
  // The array in use, and what follows from its capacity (mask_, grow_at_).
  void SetSlots(IndexSlot* slots, size_t capacity);
  size_t NextCapacity(size_t capacity) const;
  size_t GrowAt(size_t capacity) const;
  IndexSlot* AllocSlots(size_t capacity);
  void FreeSlots(IndexSlot* slots, size_t capacity);
  bool InArena(size_t capacity) const;

  SlabArena* arena_;
  IndexSlot* slots_ = nullptr;
  size_t capacity_ = 0;
  size_t mask_ = 0;  // see Home
  size_t grow_at_ = 0;
  size_t size_ = 0;
  bool compact_ = false;
};

}  // namespace pyfleet
