#include "pyfleet/key_index.h"

#include "pyfleet/error.h"
#include "pyfleet/hash.h"
#include "pyfleet/row_store.h"
#include "pyfleet/slab_arena.h"

namespace pyfleet {

namespace {
constexpr size_t kMinCapacity = 16;

}  // namespace

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

KeyIndex::KeyIndex(SlabArena* arena)
    : arena_(arena), slots_(AllocSlots(kMinCapacity)), mask_(kMinCapacity - 1) {}

KeyIndex::~KeyIndex() { FreeSlots(slots_, capacity()); }

size_t KeyIndex::MemoryBytes() const {
  return InArena(capacity()) ? 0 : MappedBytes(capacity() * sizeof(IndexSlot), true);
}

void KeyIndex::Insert(uint64_t key, uint64_t h, uint32_t value) {
  PYFLEET_ASSERT(value != kEmpty);
  if ((size_ + 1) * 4 > capacity() * 3) Rehash(capacity() * 2);
  size_t i = h & mask_;
  while (slots_[i].value != kEmpty) {
    PYFLEET_ASSERT(slots_[i].key != key);
    i = (i + 1) & mask_;
  }
  slots_[i].key = key;
  slots_[i].value = value;
  ++size_;
}

uint32_t KeyIndex::Erase(uint64_t key, uint64_t h) {
  size_t i = h & mask_;
  for (;;) {
    if (slots_[i].value == kEmpty) return kEmpty;
    if (slots_[i].key == key) break;
    i = (i + 1) & mask_;
  }
  const uint32_t value = slots_[i].value;
  // Backward-shift: pull later members of the run into the hole when their
  // home slot does not lie cyclically in (hole, j].
  size_t j = i;
  for (;;) {
    j = (j + 1) & mask_;
    if (slots_[j].value == kEmpty) break;
    const size_t home = Mix64(slots_[j].key) & mask_;
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
  slots_ = AllocSlots(kMinCapacity);
  mask_ = kMinCapacity - 1;
  size_ = 0;
}

void KeyIndex::Rehash(size_t new_capacity) {
  IndexSlot* old = slots_;
  const size_t old_capacity = capacity();
  slots_ = AllocSlots(new_capacity);
  mask_ = new_capacity - 1;
  for (size_t k = 0; k < old_capacity; ++k) {
    if (old[k].value == kEmpty) continue;
    size_t i = Mix64(old[k].key) & mask_;
    while (slots_[i].value != kEmpty) i = (i + 1) & mask_;
    slots_[i] = old[k];
  }
  FreeSlots(old, old_capacity);
}

}  // namespace pyfleet
