// Concurrency stress of the core, without Python, for sanitizer builds:
//   cmake -S . -B build/tsan -DPYFLEET_SANITIZE=thread -DPYFLEET_BUILD_STRESS=ON
//   cmake --build build/tsan --target pyfleet_stress && build/tsan/pyfleet_stress
// Threads pull and push overlapping and disjoint keys while another thread
// shrinks and saves (one table with a disk tier at its smallest budget, so
// rows move between RAM and its spill file throughout, and a thread
// prefetches keys the others pull and push); afterwards every key
// is present once and every value is finite. Exits non-zero on a failed check (sanitizers report on their own).
#include <atomic>
#include <cmath>
#include <cstdio>
#include <random>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "pyfleet/sparse_table.h"

using namespace pyfleet;

static int Fail(const char* what) {
  std::fprintf(stderr, "stress: FAILED: %s\n", what);
  return 1;
}

int main(int argc, char** argv) {
  const int steps = argc > 1 ? std::atoi(argv[1]) : 200;
  const std::string dir = argc > 2 ? argv[2] : "/tmp";
  OptimizerConfig opt;
  opt.kind = OptimizerKind::kAdam;
  opt.learning_rate = 0.01f;
  InitializerConfig init;
  EntryConfig entry;
  SparseTable table(8, opt, init, 1, entry);
  EntryConfig counted;
  counted.kind = EntryKind::kCountFilter;
  counted.count = 2;
  SparseTable filtered(4, opt, init, 1, counted);
  // Compact rows: the same Hogwild update through 16-bit loads and stores.
  SparseTable half(8, opt, init, 1, entry, StorageKind::kFP16);
  // And 8-bit state: Adam's moments in words of codes and scales.
  SparseTable q8(16, opt, init, 1, entry, StorageKind::kBF16Q8);  // full blocks
  // And a disk tier at its smallest budget: rows move between RAM and the
  // spill file under every call.
  SparseTable spilled(8, opt, init, 1, entry);
  spilled.EnableSpill(spilled.MinMemoryBudget(), dir);
  // And one whose index grows into its budget (8 MiB; 262k fresh keys): the
  // row limit falls again and again, and each shard moves its rows above it,
  // found by the keys beside them, while the other shards make and free rows.
  SparseTable growing(8, opt, init, 1, entry);
  growing.EnableSpill(8 << 20, dir);

  std::atomic<int> workers_done{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      std::mt19937_64 rng(t);
      std::vector<uint64_t> keys(256);
      std::vector<float> out(256 * 16), grads(256 * 16);  // q8 rows: dim 16
      for (int s = 0; s < steps; ++s) {
        for (size_t i = 0; i < keys.size(); ++i) {
          keys[i] = (i % 2 == 0) ? rng() % 1000 : 1000000 * (t + 1) + rng() % 5000;
        }
        for (float& g : grads) g = static_cast<float>(rng() % 1000) / 1000.f - 0.5f;
        table.Pull(keys.data(), keys.size(), out.data());
        table.Push(keys.data(), keys.size(), grads.data());
        filtered.Pull(keys.data(), keys.size() / 2, out.data());
        filtered.Push(keys.data(), keys.size() / 2, grads.data());
        half.Pull(keys.data(), keys.size(), out.data());
        half.Push(keys.data(), keys.size(), grads.data());
        q8.Pull(keys.data(), keys.size(), out.data());
        q8.Push(keys.data(), keys.size(), grads.data());
        spilled.Pull(keys.data(), keys.size(), out.data());
        spilled.Push(keys.data(), keys.size(), grads.data());
        spilled.Pull(keys.data(), keys.size() / 4, out.data(), false);
        growing.Pull(keys.data(), keys.size(), out.data());
        growing.Push(keys.data(), keys.size(), grads.data());
        std::vector<float> shows(keys.size(), 1.f);
        spilled.AddShowClick(keys.data(), keys.size(), shows.data(), shows.data());
      }
      workers_done.fetch_add(1);
    });
  }
  // Prefetches of the keys the threads above pull and push (and of keys
  // without a row, which it must not make): its reads under the shared lock
  // race their moves of rows between RAM and the file.
  threads.emplace_back([&] {
    std::mt19937_64 rng(99);
    std::vector<uint64_t> keys(256);
    while (workers_done.load() < 4) {
      for (size_t i = 0; i < keys.size(); ++i) {
        keys[i] = (i % 2 == 0) ? rng() % 1000 : 1000000 * (1 + rng() % 5) + rng() % 5000;
      }
      spilled.Prefetch(keys.data(), keys.size());
    }
  });
  // Fresh keys meanwhile: every shard's index grows past SlabArena::kMinBytes,
  // so the shards' arrays move between huge-page slabs concurrently.
  threads.emplace_back([&] {
    std::vector<uint64_t> fresh(4096);
    std::vector<float> out(fresh.size() * 8);
    for (uint64_t b = 0; b < 64; ++b) {
      for (size_t i = 0; i < fresh.size(); ++i) fresh[i] = (uint64_t{1} << 40) + b * 4096 + i;
      table.Pull(fresh.data(), fresh.size(), out.data());
      growing.Pull(fresh.data(), fresh.size(), out.data());
    }
  });
  threads.emplace_back([&] {
    for (int s = 0; s < 10; ++s) {
      table.Shrink(3, 0, -INFINITY, 1.f);
      filtered.Shrink(-1, 0, -INFINITY, 1.f);
      half.Shrink(3, 0, -INFINITY, 1.f);
      half.Save(dir + "/pyfleet_stress_half.bin", s % 2 == 1);
      half.Export(nullptr, 0, true);
      q8.Shrink(3, 0, -INFINITY, 1.f);
      q8.Save(dir + "/pyfleet_stress_q8.bin", s % 2 == 1);
      table.Save(dir + "/pyfleet_stress.bin", s % 2 == 1);
      table.Stats();
      table.Keys();
      spilled.Shrink(3, 0, -INFINITY, 0.9f);
      spilled.Save(dir + "/pyfleet_stress_spilled.bin", s % 2 == 1);
      const std::vector<uint64_t> sk = spilled.Keys();
      spilled.Export(sk.data(), sk.size() / 8, true);
      if (s == 5) spilled.Load(dir + "/pyfleet_stress_spilled.bin", 0, 0);
    }
  });
  for (auto& th : threads) th.join();

  const std::vector<uint64_t> keys = table.Keys();
  if (std::set<uint64_t>(keys.begin(), keys.end()).size() != keys.size()) return Fail("duplicate key");
  if (keys.size() != table.Size()) return Fail("size mismatch");
  RowExport e = table.Export(keys.data(), keys.size(), true);
  for (float v : e.weights) if (!std::isfinite(v)) return Fail("non-finite weight");
  for (float v : e.state) if (!std::isfinite(v)) return Fail("non-finite state");
  SparseTable copy(8, opt, init, 1, entry);
  table.Save(dir + "/pyfleet_stress_full.bin", false);
  copy.Load(dir + "/pyfleet_stress_full.bin", 0, 0);
  if (copy.Size() != table.Size()) return Fail("reload size");
  const std::vector<uint64_t> hkeys = half.Keys();
  RowExport he = half.Export(hkeys.data(), hkeys.size(), true);
  for (float v : he.weights) if (!std::isfinite(v)) return Fail("non-finite fp16 weight");
  for (float v : he.state) if (!std::isfinite(v)) return Fail("non-finite fp16 state");
  SparseTable half_copy(8, opt, init, 1, entry, StorageKind::kFP16);
  half.Save(dir + "/pyfleet_stress_half_full.bin", false);
  half_copy.Load(dir + "/pyfleet_stress_half_full.bin", 0, 0);
  if (half_copy.Size() != half.Size()) return Fail("fp16 reload size");
  const std::vector<uint64_t> qkeys = q8.Keys();
  RowExport qe = q8.Export(qkeys.data(), qkeys.size(), true);
  for (float v : qe.weights) if (!std::isfinite(v)) return Fail("non-finite q8 weight");
  for (float v : qe.state) if (!std::isfinite(v)) return Fail("non-finite q8 state");
  SparseTable q8_copy(16, opt, init, 1, entry, StorageKind::kBF16Q8);
  q8.Save(dir + "/pyfleet_stress_q8_full.bin", false);
  q8_copy.Load(dir + "/pyfleet_stress_q8_full.bin", 0, 0);
  if (q8_copy.Size() != q8.Size()) return Fail("q8 reload size");
  const std::vector<uint64_t> skeys = spilled.Keys();
  if (std::set<uint64_t>(skeys.begin(), skeys.end()).size() != skeys.size()) {
    return Fail("duplicate spilled key");
  }
  // (the last shrinks may drop every row once the pushes are over)
  if (spilled.Stats().spill_writes == 0) return Fail("nothing spilled");
  if (spilled.Stats().prefetched_rows == 0) return Fail("nothing prefetched");
  if (growing.Stats().relocated_rows == 0) return Fail("no row moved below the row limit");
  if (growing.Size() < 64 * 4096) return Fail("growing: fresh keys missing");
  RowExport se = spilled.Export(skeys.data(), skeys.size(), true);
  if (se.keys.size() != skeys.size()) return Fail("spilled export size");
  for (float v : se.weights) if (!std::isfinite(v)) return Fail("non-finite spilled weight");
  for (float v : se.state) if (!std::isfinite(v)) return Fail("non-finite spilled state");
  SparseTable spilled_copy(8, opt, init, 1, entry);
  spilled.Save(dir + "/pyfleet_stress_spilled_full.bin", false);
  spilled_copy.Load(dir + "/pyfleet_stress_spilled_full.bin", 0, 0);
  if (spilled_copy.Size() != spilled.Size()) return Fail("spilled reload size");
  std::printf("stress: ok, %zu rows, %zu filtered rows\n", table.Size(), filtered.Size());
  return 0;
}
