// SparseTable's rows out and in: Export for the caller, Save and Load of
// the table file (table_io.h), with the delta and the shards' routing.
#include "pyfleet/sparse_table.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstring>
#include <mutex>

#include "pyfleet/error.h"
#include "pyfleet/hash.h"
#include "pyfleet/internal/row_q8.h"
#include "row_copy.h"
#include "sparse_table_shard.h"
#include "pyfleet/table_io.h"

namespace pyfleet {

namespace {

constexpr size_t kLoadEvictSlack = 16;   // Load: rows over a shard's share before it evicts

}  // namespace

RowExport SparseTable::Export(const uint64_t* keys, size_t n, bool with_state) const {
  RowExport e;
  std::vector<float> w(dim_), st(state_dim_);
  std::vector<char> rec(budget_ != 0 ? spill_slot_bytes() : 0);
  RowMeta spilled_meta;
  for (size_t i = 0; i < n; ++i) {
    const uint64_t h = Mix64(keys[i]);
    const Shard& s = *shards_[ShardOf(h)];
    std::shared_lock lock(s.mu);
    const uint32_t row = s.index.Find(keys[i], h);
    if (row == KeyIndex::kEmpty) continue;
    e.keys.push_back(keys[i]);
    RowMeta* meta;
    if (Spilled(row)) {  // read where it lies, left on disk
      ReadSpilled(*s.spill, row, rec.data());
      ReadRecord(rec.data(), w.data(), with_state ? st.data() : nullptr);
      std::memcpy(&spilled_meta, rec.data(), sizeof(RowMeta));
      meta = &spilled_meta;
    } else {
      ReadRow(row, w.data(), with_state ? st.data() : nullptr);
      meta = rows_.Meta(row);
    }
    e.weights.insert(e.weights.end(), w.begin(), w.end());
    if (with_state) e.state.insert(e.state.end(), st.begin(), st.end());
    e.update_count.push_back(LoadField(&meta->update_count));
    e.show.push_back(LoadField(&meta->show));
    e.click.push_back(LoadField(&meta->click));
    e.unseen_passes.push_back(LoadField(&meta->unseen_passes));
  }
  return e;
}

FileHeader SparseTable::SaveHeader(bool delta) const {
  FileHeader hdr{};
  std::memcpy(hdr.magic, kFileMagic, sizeof(kFileMagic));
  hdr.format_version = kFormatVersion;
  hdr.table_kind = static_cast<uint32_t>(TableKind::kSparse);
  hdr.dim = static_cast<uint32_t>(dim_);
  hdr.optimizer_kind = static_cast<uint32_t>(opt_.kind);
  hdr.state_dim = static_cast<uint32_t>(state_dim_);
  hdr.flags = (delta ? kFileDelta : 0) | kFileBf16State;
  hdr.seed = seed_;
  hdr.meta_bytes = sizeof(RowMeta);
  hdr.storage = static_cast<uint32_t>(layout_.storage);
  return hdr;
}

size_t SparseTable::Save(const std::string& path, bool delta) {
  if (delta && delta_invalid_.load()) {
    ThrowInvalid("cannot write a delta to ", path,
                 ": a previous save of this table failed, so rows changed before it would be "
                 "missing; take a full save first");
  }
  const size_t wb = layout_.weight_bytes(), sb = layout_.state_bytes();
  const size_t rec = sizeof(uint64_t) + sizeof(RowMeta) + wb + sb;
  size_t rows = 0;
  std::vector<uint64_t> dropped;
  try {
    FileWriter out(path);
    const FileHeader hdr = SaveHeader(delta);
    out.Write(&hdr, sizeof(hdr));
    std::string buf;
    for (const auto& sp : shards_) {
      Shard& s = *sp;
      buf.clear();
      // One record: key, meta (its dirty flag cleared), then the payload the
      // caller copies to the returned address (weights, then state).
      auto append = [&](uint64_t key, RowMeta* m) {
        m->flags &= static_cast<uint16_t>(~kRowDirty);
        const size_t at = buf.size();
        buf.resize(at + rec);
        char* p = buf.data() + at;
        std::memcpy(p, &key, sizeof(key));
        std::memcpy(p + 8, m, sizeof(RowMeta));
        return p + 8 + sizeof(RowMeta);
      };
      {
        // Exclusive: no push is half-way through a row while it is copied.
        ShardWriteLock lock(s);
        s.index.ForEach([&](uint64_t key, uint32_t row) {
          if (Spilled(row)) return;
          RowMeta* m = rows_.Meta(row);
          if (delta && !(m->flags & kRowDirty)) return;
          char* payload = append(key, m);
          std::memcpy(payload, rows_.WeightBytes(row), wb);
          std::memcpy(payload + wb, rows_.StateBytes(row), sb);
        });
        if (s.spill) {
          // Spilled rows go to the file in pieces, still under the lock, so
          // that a save needs no RAM for a shard's spilled rows.
          ForEachSpilledLocked(s.index, *s.spill, [&](uint64_t key, RowMeta* m, const char* r) {
            const bool dirty = m->flags & kRowDirty;
            if (delta && !dirty) return false;
            std::memcpy(append(key, m), r + sizeof(RowMeta), wb + sb);
            if (buf.size() >= (size_t{8} << 20)) {
              out.Write(buf.data(), buf.size());
              rows += buf.size() / rec;
              buf.clear();
            }
            return dirty;
          });
        }
        dropped.insert(dropped.end(), s.dropped.begin(), s.dropped.end());
        s.dropped.clear();
        s.dropped.shrink_to_fit();
      }
      out.Write(buf.data(), buf.size());
      rows += buf.size() / rec;
    }
    if (delta) out.Write(dropped.data(), dropped.size() * sizeof(uint64_t));
    out.Finish(rows, delta ? dropped.size() : 0);
  } catch (...) {
    delta_invalid_.store(true);
    throw;
  }
  delta_invalid_.store(false);
  return rows;
}

size_t SparseTable::Load(const std::string& path, uint32_t num_servers, uint32_t server_index) {
  FileReader in(path);
  const FileHeader& h = in.header();
  CheckLoadHeader(path, h);
  if (budget_ != 0) RaisePendingSpillError();
  // The file's rows as they are laid out; converted when they differ from ours.
  RowLayout fl = TableRowLayout(static_cast<StorageKind>(h.storage), dim_, opt_);
  fl.fp16_state = fl.storage == StorageKind::kFP16 && !(h.flags & kFileBf16State);
  const bool convert = fl.storage != layout_.storage || fl.fp16_state;
  const size_t fwb = fl.weight_bytes(), fsb = fl.state_bytes();
  std::vector<float> cw(dim_), cs(state_dim_ + 1);
  const size_t rec = sizeof(uint64_t) + sizeof(RowMeta) + fwb + fsb;
  const uint64_t num_rows = in.trailer().num_rows, num_dropped = in.trailer().num_dropped;
  in.ExpectBody(num_rows * rec + num_dropped * sizeof(uint64_t));
  constexpr size_t kBatchRows = 4096;
  std::vector<char> buf(kBatchRows * rec);
  size_t loaded = 0;
  for (uint64_t done = 0; done < num_rows;) {
    const size_t take = static_cast<size_t>(std::min<uint64_t>(kBatchRows, num_rows - done));
    in.Read(buf.data(), take * rec);
    done += take;
    for (size_t r = 0; r < take; ++r) {
      const char* p = buf.data() + r * rec;
      uint64_t key;
      std::memcpy(&key, p, sizeof(key));
      if (num_servers > 0 && RouteKey(key, num_servers) != server_index) continue;
      const uint64_t hk = Mix64(key);
      Shard& s = *shards_[ShardOf(hk)];
      ShardWriteLock lock(s);
      const uint32_t row = LoadedRowLocked(s, key, hk);
      StoreLoadedRow(fl, convert, p + sizeof(key), row, cw.data(), cs.data());
      if (s.spill) EvictLocked(s.index, *s.spill, kLoadEvictSlack, /*spare=*/false);
      ++loaded;
    }
  }
  std::vector<uint64_t> dropped(num_dropped);
  in.Read(dropped.data(), dropped.size() * sizeof(uint64_t));
  for (uint64_t key : dropped) {
    if (num_servers > 0 && RouteKey(key, num_servers) != server_index) continue;
    const uint64_t hk = Mix64(key);
    Shard& s = *shards_[ShardOf(hk)];
    ShardWriteLock lock(s);
    const uint32_t row = s.index.Erase(key, hk);
    if (row != KeyIndex::kEmpty) FreeValueLocked(s.spill.get(), row);
  }
  for (const auto& sp : shards_) {
    if (!sp->spill) break;
    ShardWriteLock lock(*sp);
    EvictLocked(sp->index, *sp->spill);
  }
  return loaded;
}

void SparseTable::CheckLoadHeader(const std::string& path, const FileHeader& h) const {
  if (h.table_kind != static_cast<uint32_t>(TableKind::kSparse)) {
    ThrowInvalid(path, " holds a dense table, not a sparse one");
  }
  if (h.dim != dim_) ThrowInvalid(path, " holds rows of dim ", h.dim, ", this table has dim ", dim_);
  if (h.optimizer_kind != static_cast<uint32_t>(opt_.kind) || h.state_dim != state_dim_) {
    ThrowInvalid(path, " holds ", OptimizerName(static_cast<OptimizerKind>(h.optimizer_kind)),
                 " state (", h.state_dim, " floats a row); this table uses ",
                 OptimizerName(opt_.kind), " (", state_dim_, " floats a row)");
  }
  if (h.meta_bytes != sizeof(RowMeta)) {
    ThrowRuntime(path, " has row metadata of ", h.meta_bytes, " bytes, expected ",
                 sizeof(RowMeta));
  }
  if (h.storage > kMaxStorageKind) {
    ThrowRuntime(path, " holds rows of unknown storage kind ", h.storage);
  }
}

uint32_t SparseTable::LoadedRowLocked(Shard& s, uint64_t key, uint64_t hk) {
  uint32_t row = s.index.Find(key, hk);
  if (row == KeyIndex::kEmpty) {
    row = rows_.Allocate();
    s.index.Insert(key, hk, row);
    s.candidates.Erase(key, hk);
    // CLOCK's queue, as before probation existed: a load evicts every
    // few rows, and all of them are of one call.
    ResidentAdded(s.spill.get(), row, key, /*probation=*/false);
  } else if (Spilled(row)) {  // replaced: the new row is made in RAM
    FreeValueLocked(s.spill.get(), row);
    row = rows_.Allocate();
    *s.index.FindValue(key, hk) = row;
    ResidentAdded(s.spill.get(), row, key, /*probation=*/false);
  }
  return row;
}

void SparseTable::StoreLoadedRow(const RowLayout& fl, bool convert, const char* rec, uint32_t row,
                                 float* cw, float* cs) {
  const size_t fwb = fl.weight_bytes(), fsb = fl.state_bytes();
  RowMeta* m = rows_.Meta(row);
  std::memcpy(m, rec, sizeof(RowMeta));
  m->flags = 0;
  const char* fw = rec + sizeof(RowMeta);
  const char* fs = fw + fwb;
  if (!convert) {
    std::memcpy(rows_.WeightBytes(row), fw, fwb);
    std::memcpy(rows_.StateBytes(row), fs, fsb);
    return;
  }
  if (fl.compact()) {
    LoadCompactRow(fl, fw, fs, cw, cs);
    if (fl.q8()) Q8DerivedTail(opt_, m->update_count, cs + fl.state_head());
  } else {
    std::memcpy(cw, fw, fwb);
    std::memcpy(cs, fs, fsb);
  }
  if (layout_.compact()) {
    StoreCompactRowNearest(layout_, cw, cs, rows_.WeightBytes(row), rows_.StateBytes(row));
  } else {
    std::memcpy(rows_.WeightBytes(row), cw, dim_ * sizeof(float));
    std::memcpy(rows_.StateBytes(row), cs, state_dim_ * sizeof(float));
  }
}

}  // namespace pyfleet
