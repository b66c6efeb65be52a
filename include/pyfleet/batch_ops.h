// Batch kernels over key and row arrays that the Python layers call on every
// step: deduplication, routing and row sums. Each takes raw arrays, knows
// nothing about Python, and is called with the GIL released.
//
// All are pure functions of their inputs, safe from any number of threads at
// once (each thread keeps its own scratch), and O(n) expected: deduplication
// is an open-addressing hash set keyed by the salted Mix64 that routing uses.
#pragma once

#include <cstddef>
#include <cstdint>

namespace pyfleet {

// The distinct keys of keys[n] in first-occurrence order, written to uniq
// (room for n), and for each i the index into uniq of keys[i], written to
// inverse[n]: uniq[inverse[i]] == keys[i]. Returns the count of distinct keys.
size_t UniqueInverse(const uint64_t* keys, size_t n, uint64_t* uniq, int64_t* inverse);

// out[k, :] = sum of values[i, :] over every i with inverse[i] == k, for the
// m x d float32 out (overwritten), adding in input order. Throws
// std::invalid_argument naming the first inverse[i] outside [0, m).
void SumRows(const float* values, size_t n, size_t d, const int64_t* inverse, size_t m,
             float* out);

// Deduplication and routing in one pass. The distinct keys of keys[n] are
// written to grouped (room for n) grouped by owner, RouteKey(key,
// num_servers): server s's keys are grouped[offsets[s] : offsets[s + 1]],
// each group in first-occurrence order; offsets has num_servers + 1 entries.
// inverse[i] is the position of keys[i] in grouped. Returns the count of
// distinct keys (offsets[num_servers]). num_servers must be >= 1.
size_t UniqueRoute(const uint64_t* keys, size_t n, uint32_t num_servers, uint64_t* grouped,
                   int64_t* inverse, int64_t* offsets);

// out[i, :] = row inverse[i] of the m x d rows held in pieces: piece j holds
// rows [starts[j], starts[j + 1]) at pieces[j] (row-major, d floats a row);
// starts has num_pieces + 1 entries, starts[0] == 0, starts[num_pieces] == m.
// Throws std::invalid_argument naming the first inverse[i] outside [0, m).
void GatherRows(const float* const* pieces, const int64_t* starts, size_t num_pieces,
                size_t d, const int64_t* inverse, size_t n, float* out);

}  // namespace pyfleet
