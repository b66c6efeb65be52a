// ShardSpill: a shard's part of a table's disk tier, its extents of the
// spill file (shard_log.h) and its queues of rows in RAM (spill_table.cc).
#pragma once

#include <cstddef>
#include <cstdint>
#include <deque>
#include <vector>

#include "pyfleet/internal/shard_log.h"
#include "pyfleet/internal/spill_file.h"

namespace pyfleet {

// A shard's part of a table's disk tier (its lock guards it).
struct ShardSpill {
  explicit ShardSpill(SpillFile* f) : file(f), log(f) {}
  SpillFile* file;      // the table's, shared by its shards
  ShardLog log;         // the shard's extents in it
  size_t shard = 0;     // which of the table's shards (the top bits of Mix64(key))
  size_t resident = 0;  // rows of the shard in RAM
  // The keys of the shard's rows in RAM, each in one of two FIFO queues
  // (with keys erased or spilled since they were queued, dropped at the
  // front): probation, for rows new or read back long after they left, and
  // ring, CLOCK's queue, for rows used again on probation or read back soon
  // after they left (spill_table.cc).
  std::deque<uint64_t> ring;
  std::deque<uint64_t> probation;
  uint64_t evictions = 0;  // rows the shard has sent to disk, ever
  // Keys queued on probation, ever: the front key is the
  // (probation_pushed - probation.size())-th. For each of the last calls
  // (slot call % kProbationCalls) that queued keys there, the call (its
  // number, SparseTable::CallCount) and the position its first key got, or
  // kNoCall: which rows came in within the last few calls, told by position
  // (the use byte's 5-bit epoch repeats every 32 calls).
  static constexpr size_t kProbationCalls = 4;
  static constexpr uint64_t kNoCall = ~uint64_t{0};
  uint64_t probation_pushed = 0;
  uint64_t probation_call[kProbationCalls] = {kNoCall, kNoCall, kNoCall, kNoCall};
  uint64_t probation_start[kProbationCalls] = {};
  // The budget's bookkeeping (spill_table.cc): this shard's bytes besides
  // its rows, as last added to the table's sum; the row store's limit epoch
  // it last moved its rows under; the keys of rows it was given at or above
  // the limit since then, or could not move below it then (only these are
  // looked at again until the limit moves: a pass over every key queued
  // took 26% of a table's CPU while its index grew and new rows landed
  // above the limit every few calls).
  size_t own = 0;
  uint64_t epoch_seen = 0;
  std::vector<uint64_t> above;
};

}  // namespace pyfleet
