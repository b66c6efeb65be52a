#include "pyfleet/internal/key_index.h"

#include "pyfleet/error.h"
#include "pyfleet/hash.h"
#include "pyfleet/internal/row_store.h"
#include "pyfleet/internal/slab_arena.h"

namespace pyfleet {

namespace {
constexpr size_t kMinCapacity = 16;
// Home() maps 32 bits of the hash onto the slots.
constexpr size_t kMaxCapacity = size_t{1} << 32;

}  // namespace

size_t KeyIndex::NextCapacity(size_t capacity) const {
  if (!compact_) return 2 * capacity;
  // A multiple of 16 slots (192 bytes, whole cache lines), so that every
  // shard of a table walks the same sizes and the arena packs their arrays.
  return (capacity + capacity / 4 + 15) / 16 * 16;
}

size_t KeyIndex::GrowAt(size_t capacity) const {
  // Linear probing's probes grow as 1/(1-load)^2 for a miss (an insert):
  // about 13 slots at 4/5, 23 at 0.85, 50 at 0.9; 4/5 keeps a lookup of a
  // key present within 3 slots on average.
  return compact_ ? capacity * 4 / 5 : capacity * 3 / 4;
}

void KeyIndex::SetCompact() {
  compact_ = true;
  Rehash(capacity_);  // slots by the multiply from now on
}

bool KeyIndex::InArena(size_t capacity) const {
  return arena_ != nullptr && capacity * sizeof(IndexSlot) >= SlabArena::kMinBytes;
}

IndexSlot* KeyIndex::AllocSlots(size_t capacity) {
  const size_t bytes = capacity * sizeof(IndexSlot);
  auto* slots = static_cast<IndexSlot*>(InArena(capacity) ? arena_->Allocate(bytes)
                                                          : PageAlloc(bytes, /*huge=*/true));
  for (size_t i = 0; i < capacity; ++i) slots[i].value = KeyIndex::kEmpty;
  return slots;
}

void KeyIndex::FreeSlots(IndexSlot* slots, size_t capacity) {
  const size_t bytes = capacity * sizeof(IndexSlot);
  if (InArena(capacity)) {
    arena_->Free(slots, bytes);
  } else {
    PageFree(slots, bytes, true);
  }
}

KeyIndex::KeyIndex(SlabArena* arena) : arena_(arena) {
  SetSlots(AllocSlots(kMinCapacity), kMinCapacity);
}

void KeyIndex::SetSlots(IndexSlot* slots, size_t capacity) {
  slots_ = slots;
  capacity_ = capacity;
  mask_ = compact_ ? 0 : capacity - 1;
  grow_at_ = GrowAt(capacity);
}

KeyIndex::~KeyIndex() { FreeSlots(slots_, capacity()); }

size_t KeyIndex::MemoryBytes() const {
  return InArena(capacity()) ? 0 : MappedBytes(capacity() * sizeof(IndexSlot), true);
}

void KeyIndex::Insert(uint64_t key, uint64_t h, uint32_t value) {
  PYFLEET_ASSERT(value != kEmpty);
  if (size_ + 1 > grow_at_) Rehash(NextCapacity(capacity_));
  size_t i = Home(h, capacity_, mask_);
  while (slots_[i].value != kEmpty) {
    PYFLEET_ASSERT(slots_[i].key != key);
    if (++i == capacity_) i = 0;
  }
  slots_[i].key = key;
  slots_[i].value = value;
  ++size_;
}

uint32_t KeyIndex::Erase(uint64_t key, uint64_t h) {
  size_t i = Home(h, capacity_, mask_);
  for (;;) {
    if (slots_[i].value == kEmpty) return kEmpty;
    if (slots_[i].key == key) break;
    if (++i == capacity_) i = 0;
  }
  const uint32_t value = slots_[i].value;
  // Backward-shift: pull later members of the run into the hole when their
  // home slot does not lie cyclically in (hole, j].
  size_t j = i;
  for (;;) {
    if (++j == capacity_) j = 0;
    if (slots_[j].value == kEmpty) break;
    const size_t home = Home(Mix64(slots_[j].key), capacity_, mask_);
    const bool stays = (i <= j) ? (i < home && home <= j) : (i < home || home <= j);
    if (stays) continue;
    slots_[i] = slots_[j];
    i = j;
  }
  slots_[i].value = kEmpty;
  --size_;
  return value;
}

void KeyIndex::Clear() {
  FreeSlots(slots_, capacity());
  SetSlots(AllocSlots(kMinCapacity), kMinCapacity);
  size_ = 0;
}

void KeyIndex::Rehash(size_t new_capacity) {
  if (new_capacity > kMaxCapacity) ThrowRuntime("a table shard holds at most 2^32 index slots");
  IndexSlot* old = slots_;
  const size_t old_capacity = capacity_;
  SetSlots(AllocSlots(new_capacity), new_capacity);
  for (size_t k = 0; k < old_capacity; ++k) {
    if (old[k].value == kEmpty) continue;
    size_t i = Home(Mix64(old[k].key), capacity_, mask_);
    while (slots_[i].value != kEmpty) {
      if (++i == capacity_) i = 0;
    }
    slots_[i] = old[k];
  }
  FreeSlots(old, old_capacity);
}

}  // namespace pyfleet
