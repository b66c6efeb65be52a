// What the four parts of SparseTable (sparse_table.cc: the table and its
// shards; sparse_table_pull.cc, sparse_table_push.cc, sparse_table_file.cc)
// share and no other file sees: a shard, its exclusive lock, a call's
// per-thread scratch.
#pragma once

#include <malloc.h>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <shared_mutex>
#include <vector>

#include "pyfleet/sparse_table.h"

namespace pyfleet {

inline constexpr size_t kPrefetch = 16;  // keys in flight ahead of the one being served

struct SparseTable::Shard {
  explicit Shard(SlabArena* arena) : index(arena), candidates(arena) {}
  mutable std::shared_mutex mu;
  KeyIndex index;                 // key -> row id
  KeyIndex candidates;            // key -> pull calls seen (entry policy)
  std::vector<uint64_t> dropped;  // keys erased since the last save
  std::unique_ptr<ShardSpill> spill;  // with a disk tier (spill_table.cc)
  // Counts the exclusive holds (ShardWriteLock), the only ones that move
  // rows or change index values: a row found under the shared lock, let go
  // and taken again is still where it was if this has not changed.
  uint64_t version = 0;
};

// A shard's lock held exclusively: every exclusive hold goes through this,
// so that Shard::version counts them.
struct ShardWriteLock {
  template <typename S>
  explicit ShardWriteLock(S& s) : lock(s.mu) {
    ++s.version;
  }
  std::unique_lock<std::shared_mutex> lock;
};

inline constexpr uint64_t kUnseen = ~uint64_t{0};  // Batch::seen: rows not looked up

// A pulled key without a row: its hash and its position in the call.
struct PullMiss {
  uint64_t h;
  uint32_t pos;
};

// Per-thread scratch for one batched call: the keys regrouped by shard.
struct SparseTable::Batch {
  std::vector<uint64_t> keys, h;
  std::vector<uint32_t> pos;      // index of keys[j] in the caller's array
  std::vector<uint32_t> rows;
  std::vector<uint32_t> dup_next; // push: next equal key after j, or kNone
  std::vector<uint8_t> is_dup;    // push: an earlier equal key carries this one
  std::vector<uint32_t> table;    // push: dedup hash table
  std::vector<PullMiss> misses;   // pull: keys without a row
  std::vector<PullMiss> deferred; // pull: keys of shards busy when it began
  std::vector<float> w, s, g;     // one row's private copy
  size_t starts[kShards + 1];
  uint64_t seen[kShards];  // push: the shard's version its rows were looked up at, or kUnseen
  size_t noted = 0;  // Bytes() after the last Note

  size_t Bytes() const {
    return (keys.capacity() + h.capacity()) * sizeof(uint64_t) +
           (pos.capacity() + rows.capacity() + dup_next.capacity() + table.capacity()) *
               sizeof(uint32_t) +
           is_dup.capacity() + (misses.capacity() + deferred.capacity()) * sizeof(PullMiss) +
           (w.capacity() + s.capacity() + g.capacity()) * sizeof(float);
  }
  // The working memory of a call (a thread's batches live as long as it
  // does), which a memory budget pays for (NoteCall). A call to a table
  // with a budget first gives back what an earlier, larger call left
  // (capacity over twice what this call holds).
  size_t Note() {
    bool shrunk = false;
    auto fit = [&](auto& v) {
      if (v.capacity() > 2 * v.size() + 4096) {
        v.shrink_to_fit();
        shrunk = true;
      }
    };
    fit(keys), fit(h), fit(pos), fit(rows), fit(dup_next), fit(is_dup), fit(table);
    fit(misses), fit(deferred);
    const size_t now = Bytes();
    // A buffer that grew or shrank left a block in the heap, where malloc
    // keeps it: its pages go back to the kernel (rare: calls of one size
    // neither grow nor shrink them).
    if (now > noted || shrunk) malloc_trim(0);
    noted = now;
    return now;
  }
};

}  // namespace pyfleet
