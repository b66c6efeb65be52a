// The pybind11 module pyfleet._core: a thin layer that turns numpy buffers
// into pointers, checks their sizes, releases the GIL and makes one core call.
// Argument validation with friendly messages lives in pyfleet/table.py; the
// checks here only keep a wrong call from reading out of bounds.
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include "pyfleet/dense_table.h"
#include "pyfleet/entry.h"
#include "pyfleet/error.h"
#include "pyfleet/hash.h"
#include "pyfleet/initializer.h"
#include "pyfleet/optimizer.h"
#include "pyfleet/row_encoding.h"
#include "pyfleet/sparse_table.h"
#include "pyfleet/table_io.h"

namespace py = pybind11;
using pyfleet::ThrowInvalid;

namespace {

using Keys = py::array_t<uint64_t, py::array::c_style>;
using Floats = py::array_t<float, py::array::c_style>;

template <typename T>
py::array_t<T> ToArray(const std::vector<T>& v) {
  py::array_t<T> a(static_cast<py::ssize_t>(v.size()));
  if (!v.empty()) std::memcpy(a.mutable_data(), v.data(), v.size() * sizeof(T));
  return a;
}

void CheckSize(const char* what, size_t got, size_t want) {
  if (got != want) ThrowInvalid(what, " has ", got, " elements, expected ", want);
}

// SparseTable.stats() as a dict; the disk tier's counters only with a budget.
py::dict StatsDict(const pyfleet::SparseTable& t) {
  pyfleet::SparseTableStats s;
  {
    py::gil_scoped_release release;
    s = t.Stats();
  }
  py::dict d;
  d["rows"] = s.rows;
  d["pull_calls"] = s.pull_calls;
  d["pull_keys"] = s.pull_keys;
  d["push_calls"] = s.push_calls;
  d["push_keys"] = s.push_keys;
  d["inserted_rows"] = s.inserted_rows;
  d["candidate_pulls"] = s.candidate_pulls;
  d["dropped_push_keys"] = s.dropped_push_keys;
  d["rejected_pushes"] = s.rejected_pushes;
  d["shrunk_rows"] = s.shrunk_rows;
  d["candidates"] = s.candidates;
  d["memory_bytes"] = s.memory_bytes;
  if (t.memory_budget() != 0) {
    d["memory_budget"] = t.memory_budget();
    d["spilled_rows"] = s.spilled_rows;
    d["spill_file_bytes"] = s.spill_file_bytes;
    d["spill_reads"] = s.spill_reads;
    d["spill_writes"] = s.spill_writes;
    d["spill_clean_reads"] = s.spill_clean_reads;
    d["spill_clean_moves"] = s.spill_clean_moves;
    d["spill_slot_bytes"] = s.spill_slot_bytes;
    d["spill_extent_bytes"] = s.spill_extent_bytes;
    d["relocated_rows"] = s.relocated_rows;
    d["prefetch_calls"] = s.prefetch_calls;
    d["prefetched_rows"] = s.prefetched_rows;
    d["spill_ghost_hits"] = s.spill_ghost_hits;
  }
  d["dim"] = t.dim();
  d["state_dim"] = t.state_dim();
  d["storage"] = pyfleet::StorageName(t.storage());
  return d;
}

// SparseTable.export(): the rows of keys that exist, column by column.
py::dict ExportDict(const pyfleet::SparseTable& t, Keys keys, bool with_state) {
  pyfleet::RowExport e;
  {
    const uint64_t* k = keys.data();
    const size_t n = keys.size();
    py::gil_scoped_release release;
    e = t.Export(k, n, with_state);
  }
  py::dict d;
  const auto rows = static_cast<py::ssize_t>(e.keys.size());
  d["keys"] = ToArray(e.keys);
  d["weights"] = ToArray(e.weights).reshape({rows, static_cast<py::ssize_t>(t.dim())});
  if (with_state) {
    d["state"] = ToArray(e.state).reshape({rows, static_cast<py::ssize_t>(t.state_dim())});
  }
  d["update_count"] = ToArray(e.update_count);
  d["show"] = ToArray(e.show);
  d["click"] = ToArray(e.click);
  d["unseen_passes"] = ToArray(e.unseen_passes);
  return d;
}

using SparseClass = py::class_<pyfleet::SparseTable>;

// The module's parts, one concept each: the optimizer, initializer and entry
// configurations, the row encodings, routing, the two tables.
void BindOptimizer(py::module_& m) {
  py::enum_<pyfleet::OptimizerKind>(m, "OptimizerKind")
      .value("SGD", pyfleet::OptimizerKind::kSGD)
      .value("Adagrad", pyfleet::OptimizerKind::kAdagrad)
      .value("Adam", pyfleet::OptimizerKind::kAdam)
      .value("FTRL", pyfleet::OptimizerKind::kFTRL)
      .value("Momentum", pyfleet::OptimizerKind::kMomentum)
      .value("RMSProp", pyfleet::OptimizerKind::kRMSProp);
  py::enum_<pyfleet::DecayKind>(m, "DecayKind")
      .value("none", pyfleet::DecayKind::kNone)
      .value("L1", pyfleet::DecayKind::kL1)
      .value("L2", pyfleet::DecayKind::kL2);
  py::class_<pyfleet::OptimizerConfig>(m, "OptimizerConfig")
      .def(py::init<>())
      .def_readwrite("kind", &pyfleet::OptimizerConfig::kind)
      .def_readwrite("learning_rate", &pyfleet::OptimizerConfig::learning_rate)
      .def_readwrite("beta1", &pyfleet::OptimizerConfig::beta1)
      .def_readwrite("beta2", &pyfleet::OptimizerConfig::beta2)
      .def_readwrite("epsilon", &pyfleet::OptimizerConfig::epsilon)
      .def_readwrite("initial_accumulator_value",
                     &pyfleet::OptimizerConfig::initial_accumulator_value)
      .def_readwrite("l1", &pyfleet::OptimizerConfig::l1)
      .def_readwrite("l2", &pyfleet::OptimizerConfig::l2)
      .def_readwrite("lr_power", &pyfleet::OptimizerConfig::lr_power)
      .def_readwrite("momentum", &pyfleet::OptimizerConfig::momentum)
      .def_readwrite("use_nesterov", &pyfleet::OptimizerConfig::use_nesterov)
      .def_readwrite("rho", &pyfleet::OptimizerConfig::rho)
      .def_readwrite("centered", &pyfleet::OptimizerConfig::centered)
      .def_readwrite("decay", &pyfleet::OptimizerConfig::decay)
      .def_readwrite("decay_coeff", &pyfleet::OptimizerConfig::decay_coeff)
      .def_readwrite("lazy_row_width", &pyfleet::OptimizerConfig::lazy_row_width);
  m.def("optimizer_state_dim", [](const pyfleet::OptimizerConfig& c, size_t dim) {
    pyfleet::ValidateOptimizer(c);
    return pyfleet::OptimizerStateDim(c, dim);
  });
}

void BindInitializer(py::module_& m) {
  py::enum_<pyfleet::InitializerKind>(m, "InitializerKind")
      .value("Constant", pyfleet::InitializerKind::kConstant)
      .value("Uniform", pyfleet::InitializerKind::kUniform)
      .value("Normal", pyfleet::InitializerKind::kNormal)
      .value("TruncatedNormal", pyfleet::InitializerKind::kTruncatedNormal);
  py::class_<pyfleet::InitializerConfig>(m, "InitializerConfig")
      .def(py::init<>())
      .def_readwrite("kind", &pyfleet::InitializerConfig::kind)
      .def_readwrite("a", &pyfleet::InitializerConfig::a)
      .def_readwrite("b", &pyfleet::InitializerConfig::b);
  m.def("initial_values", [](const pyfleet::InitializerConfig& c, uint64_t seed, uint64_t key,
                             Floats out) {
    pyfleet::InitialValues(c, seed, key, out.mutable_data(), static_cast<size_t>(out.size()));
  }, py::arg("config"), py::arg("seed"), py::arg("key"), py::arg("out").noconvert());
}

void BindEntry(py::module_& m) {
  py::enum_<pyfleet::EntryKind>(m, "EntryKind")
      .value("All", pyfleet::EntryKind::kAll)
      .value("CountFilter", pyfleet::EntryKind::kCountFilter)
      .value("Probability", pyfleet::EntryKind::kProbability);
  py::class_<pyfleet::EntryConfig>(m, "EntryConfig")
      .def(py::init<>())
      .def_readwrite("kind", &pyfleet::EntryConfig::kind)
      .def_readwrite("count", &pyfleet::EntryConfig::count)
      .def_readwrite("probability", &pyfleet::EntryConfig::probability);
}

void BindStorage(py::module_& m) {
  py::enum_<pyfleet::StorageKind>(m, "StorageKind")
      .value("fp32", pyfleet::StorageKind::kFP32)
      .value("fp16", pyfleet::StorageKind::kFP16)
      .value("bf16", pyfleet::StorageKind::kBF16)
      .value("fp16_q8", pyfleet::StorageKind::kFP16Q8)
      .value("bf16_q8", pyfleet::StorageKind::kBF16Q8);
  // The rounding rule itself, for tests and tools: values -> 16-bit patterns,
  // stochastically with the given random bits, or to nearest even without them.
  m.def("storage_round", [](pyfleet::StorageKind kind, Floats values, py::object random_bits) {
    pyfleet::ValidateStorage(kind);
    if (kind == pyfleet::StorageKind::kFP32) ThrowInvalid("storage_round needs fp16 or bf16");
    const size_t n = static_cast<size_t>(values.size());
    py::array_t<uint16_t> out(static_cast<py::ssize_t>(n));
    const float* v = values.data();
    uint16_t* o = out.mutable_data();
    if (random_bits.is_none()) {
      for (size_t i = 0; i < n; ++i) o[i] = pyfleet::NarrowNearest(kind, v[i]);
    } else {
      // 16 bits per element (row_encoding.h); a wider array is refused, not truncated.
      if (!py::isinstance<py::array_t<uint16_t>>(random_bits)) {
        ThrowInvalid("random_bits must be a uint16 array (16 random bits per element)");
      }
      auto r = random_bits.cast<py::array_t<uint16_t, py::array::c_style>>();
      CheckSize("random_bits", r.size(), n);
      pyfleet::NarrowStochasticN(kind, v, r.data(), n, o);
    }
    return out;
  }, py::arg("kind"), py::arg("values").noconvert(), py::arg("random_bits") = py::none());
  m.def("storage_widen", [](pyfleet::StorageKind kind,
                            py::array_t<uint16_t, py::array::c_style> bits) {
    pyfleet::ValidateStorage(kind);
    if (kind == pyfleet::StorageKind::kFP32) ThrowInvalid("storage_widen needs fp16 or bf16");
    const size_t n = static_cast<size_t>(bits.size());
    py::array_t<float> out(static_cast<py::ssize_t>(n));
    pyfleet::WidenN(kind, bits.data(), n, out.mutable_data());
    return out;
  }, py::arg("kind"), py::arg("bits").noconvert());
}

void BindRouting(py::module_& m) {
  m.def("route", [](Keys keys, uint32_t num_servers, py::array_t<int32_t, py::array::c_style> out) {
    if (num_servers == 0) ThrowInvalid("num_servers must be >= 1");
    CheckSize("out", out.size(), keys.size());
    const uint64_t* k = keys.data();
    int32_t* o = out.mutable_data();
    const size_t n = keys.size();
    py::gil_scoped_release release;
    pyfleet::Route(k, n, num_servers, o);
  }, py::arg("keys").noconvert(), py::arg("num_servers"), py::arg("out").noconvert());
}

// The batched calls on keys (numpy in, the GIL released around the core call).
void BindSparseCalls(SparseClass& c) {
  using pyfleet::SparseTable;
  c.def("pull", [](SparseTable& t, Keys keys, Floats out, bool create) {
        CheckSize("out", out.size(), keys.size() * t.dim());
        const uint64_t* k = keys.data();
        float* o = out.mutable_data();
        const size_t n = keys.size();
        py::gil_scoped_release release;
        t.Pull(k, n, o, create);
      }, py::arg("keys").noconvert(), py::arg("out").noconvert(), py::arg("create") = true)
      .def("prefetch", [](SparseTable& t, Keys keys) {
        const uint64_t* k = keys.data();
        const size_t n = keys.size();
        py::gil_scoped_release release;
        t.Prefetch(k, n);
      }, py::arg("keys").noconvert())
      .def("push", [](SparseTable& t, Keys keys, Floats grads, bool add_delta) {
        CheckSize("grads", grads.size(), keys.size() * t.dim());
        const uint64_t* k = keys.data();
        const float* g = grads.data();
        const size_t n = keys.size();
        py::gil_scoped_release release;
        t.Push(k, n, g, add_delta);
      }, py::arg("keys").noconvert(), py::arg("grads").noconvert(), py::arg("add_delta") = false)
      .def("add_show_click", [](SparseTable& t, Keys keys, Floats shows, Floats clicks) {
        CheckSize("shows", shows.size(), keys.size());
        CheckSize("clicks", clicks.size(), keys.size());
        const uint64_t* k = keys.data();
        const float* sh = shows.data();
        const float* cl = clicks.data();
        const size_t n = keys.size();
        py::gil_scoped_release release;
        t.AddShowClick(k, n, sh, cl);
      }, py::arg("keys").noconvert(), py::arg("shows").noconvert(), py::arg("clicks").noconvert())
      .def("initial_values", [](const SparseTable& t, Keys keys, Floats out) {
        CheckSize("out", out.size(), keys.size() * t.dim());
        const uint64_t* k = keys.data();
        float* o = out.mutable_data();
        const size_t n = keys.size();
        py::gil_scoped_release release;
        t.InitialValues(k, n, o);
      }, py::arg("keys").noconvert(), py::arg("out").noconvert());
}

// Everything else: size, keys, rows out, counters, the disk tier, files.
void BindSparseState(SparseClass& c) {
  using pyfleet::SparseTable;
  c.def("size", &SparseTable::Size, py::call_guard<py::gil_scoped_release>())
      .def("memory_bytes", &SparseTable::MemoryBytes, py::call_guard<py::gil_scoped_release>())
      .def("keys", [](const SparseTable& t) {
        std::vector<uint64_t> k;
        {
          py::gil_scoped_release release;
          k = t.Keys();
        }
        return ToArray(k);
      })
      .def("export", &ExportDict, py::arg("keys").noconvert(), py::arg("with_state"))
      .def("stats", &StatsDict)
      .def("enable_spill", &SparseTable::EnableSpill, py::arg("memory_budget"),
           py::arg("spill_dir"), py::call_guard<py::gil_scoped_release>())
      .def("min_memory_budget", &SparseTable::MinMemoryBudget)
      .def("save", &SparseTable::Save, py::call_guard<py::gil_scoped_release>())
      .def("load", &SparseTable::Load, py::call_guard<py::gil_scoped_release>())
      .def("shrink", &SparseTable::Shrink, py::call_guard<py::gil_scoped_release>())
      .def_property_readonly("dim", &SparseTable::dim)
      .def_property_readonly("state_dim", &SparseTable::state_dim)
      .def_property_readonly("storage", &SparseTable::storage);
}

void BindSparseTable(py::module_& m) {
  using pyfleet::SparseTable;
  SparseClass c(m, "SparseTable");
  c.def(py::init<size_t, const pyfleet::OptimizerConfig&, const pyfleet::InitializerConfig&,
                 uint64_t, const pyfleet::EntryConfig&, pyfleet::StorageKind>(),
        py::arg("dim"), py::arg("optimizer"), py::arg("initializer"), py::arg("seed"),
        py::arg("entry"), py::arg("storage") = pyfleet::StorageKind::kFP32);
  BindSparseCalls(c);
  BindSparseState(c);
}

void BindDenseTable(py::module_& m) {
  using pyfleet::DenseTable;
  py::class_<DenseTable>(m, "DenseTable")
      .def(py::init<size_t, const pyfleet::OptimizerConfig&>())
      .def("set", [](DenseTable& t, Floats v) {
        CheckSize("values", v.size(), t.size());
        const float* p = v.data();
        py::gil_scoped_release release;
        t.Set(p);
      }, py::arg("values").noconvert())
      .def("pull", [](const DenseTable& t, Floats out) {
        CheckSize("out", out.size(), t.size());
        float* p = out.mutable_data();
        py::gil_scoped_release release;
        t.Pull(p);
      }, py::arg("out").noconvert())
      .def("push", [](DenseTable& t, Floats g) {
        CheckSize("grad", g.size(), t.size());
        const float* p = g.data();
        py::gil_scoped_release release;
        t.Push(p);
      }, py::arg("grad").noconvert())
      .def("add_delta", [](DenseTable& t, Floats g) {
        CheckSize("delta", g.size(), t.size());
        const float* p = g.data();
        py::gil_scoped_release release;
        t.AddDelta(p);
      }, py::arg("delta").noconvert())
      .def("state", [](const DenseTable& t) { return ToArray(t.State()); })
      .def("memory_bytes", &DenseTable::MemoryBytes)
      .def("save", &DenseTable::Save, py::call_guard<py::gil_scoped_release>())
      .def("load", &DenseTable::Load, py::call_guard<py::gil_scoped_release>())
      .def_property_readonly("size", &DenseTable::size);
}

}  // namespace

void RegisterBatchOps(py::module_& m);  // src/bindings_batch.cc

PYBIND11_MODULE(_core, m) {
  m.doc() = "pyfleet's C++ core: sparse and dense tables, optimizers, routing.";
  m.attr("FORMAT_VERSION") = pyfleet::kFormatVersion;
  RegisterBatchOps(m);
  BindOptimizer(m);
  BindInitializer(m);
  BindEntry(m);
  BindStorage(m);
  BindRouting(m);
  BindSparseTable(m);
  BindDenseTable(m);
}
