// pyfleet._core's batch kernels (see include/pyfleet/batch_ops.h). Arguments
// are checked here, with a ValueError naming the argument, since these are
// called straight from Python without a wrapper.
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>

#include <string>
#include <vector>

#include "pyfleet/batch_ops.h"
#include "pyfleet/dense_layer.h"
#include "pyfleet/error.h"

namespace py = pybind11;
using pyfleet::ThrowInvalid;

namespace {

// obj as a C-contiguous array of T with ndim dimensions; a ValueError names
// `what` when obj is not a numpy array of exactly that dtype and rank (a
// non-contiguous array of the right dtype is copied).
template <typename T>
py::array_t<T, py::array::c_style> Require(const py::handle& obj, const char* what, int ndim) {
  if (!py::isinstance<py::array>(obj)) {
    ThrowInvalid(what, " must be a numpy array, got ",
                 std::string(py::str(py::type::handle_of(obj).attr("__name__"))));
  }
  auto a = py::reinterpret_borrow<py::array>(obj);
  const auto want = py::dtype::of<T>();
  if (!a.dtype().equal(want)) {
    ThrowInvalid(what, " must have dtype ", std::string(py::str(want)), ", got ",
                 std::string(py::str(a.dtype())));
  }
  if (a.ndim() != ndim) {
    ThrowInvalid(what, " must be ", ndim, "-D, got ", a.ndim(), "-D");
  }
  return py::array_t<T, py::array::c_style>::ensure(a);
}

// A 1-D array holding the first m elements of full (n >= m of them): full
// itself when m == n, else a compact copy so the unused tail is freed.
py::array_t<uint64_t> Shrunk(py::array_t<uint64_t> full, size_t m) {
  if (static_cast<size_t>(full.size()) == m) return full;
  py::array_t<uint64_t> a(static_cast<py::ssize_t>(m));
  if (m) std::memcpy(a.mutable_data(), full.data(), m * sizeof(uint64_t));
  return a;
}

// The distinct keys of a batch: with the inverse, and grouped by server.
void BindUniqueKeys(py::module_& m) {
  m.def("unique_inverse", [](py::object keys_obj) {
    auto keys = Require<uint64_t>(keys_obj, "keys", 1);
    const size_t n = static_cast<size_t>(keys.size());
    py::array_t<uint64_t> uniq(static_cast<py::ssize_t>(n));
    py::array_t<int64_t> inverse(static_cast<py::ssize_t>(n));
    const uint64_t* k = keys.data();
    uint64_t* u = uniq.mutable_data();
    int64_t* inv = inverse.mutable_data();
    size_t count;
    {
      py::gil_scoped_release release;
      count = pyfleet::UniqueInverse(k, n, u, inv);
    }
    return py::make_tuple(Shrunk(uniq, count), inverse);
  }, py::arg("keys"),
  "(uniq uint64[m], inverse int64[n]) with uniq[inverse] == keys: the distinct keys\n"
  "in first-occurrence order. Hash-based, O(n); releases the GIL.");
  m.def("unique_route", [](py::object keys_obj, int64_t num_servers) {
    auto keys = Require<uint64_t>(keys_obj, "keys", 1);
    if (num_servers < 1 || num_servers > (int64_t{1} << 31) - 1) {
      ThrowInvalid("num_servers must be in [1, 2^31), got ", num_servers);
    }
    const size_t n = static_cast<size_t>(keys.size());
    py::array_t<uint64_t> grouped(static_cast<py::ssize_t>(n));
    py::array_t<int64_t> inverse(static_cast<py::ssize_t>(n));
    py::array_t<int64_t> offsets(static_cast<py::ssize_t>(num_servers + 1));
    const uint64_t* k = keys.data();
    uint64_t* g = grouped.mutable_data();
    int64_t* inv = inverse.mutable_data();
    int64_t* off = offsets.mutable_data();
    size_t count;
    {
      py::gil_scoped_release release;
      count = pyfleet::UniqueRoute(k, n, static_cast<uint32_t>(num_servers), g, inv, off);
    }
    return py::make_tuple(Shrunk(grouped, count), inverse, offsets);
  }, py::arg("keys"), py::arg("num_servers"),
  "(grouped uint64[m], inverse int64[n], offsets int64[num_servers + 1]): the\n"
  "distinct keys grouped by owner (pyfleet.route), server s's keys being\n"
  "grouped[offsets[s]:offsets[s + 1]] in first-occurrence order, and\n"
  "grouped[inverse] == keys. One O(n) pass; releases the GIL.");
}

// Rows summed or gathered by an inverse (a batch's gradients, pulled rows).
void BindRowGathers(py::module_& m) {
  m.def("sum_rows", [](py::object values_obj, py::object inverse_obj, py::ssize_t count) {
    auto values = Require<float>(values_obj, "values", 2);
    auto inverse = Require<int64_t>(inverse_obj, "inverse", 1);
    if (count < 0) ThrowInvalid("m must be >= 0, got ", count);
    if (inverse.size() != values.shape(0)) {
      ThrowInvalid("inverse has ", inverse.size(), " entries for ", values.shape(0),
                   " rows of values");
    }
    const size_t n = static_cast<size_t>(values.shape(0));
    const size_t d = static_cast<size_t>(values.shape(1));
    py::array_t<float> out({count, static_cast<py::ssize_t>(d)});
    const float* v = values.data();
    const int64_t* inv = inverse.data();
    float* o = out.mutable_data();
    {
      py::gil_scoped_release release;
      pyfleet::SumRows(v, n, d, inv, static_cast<size_t>(count), o);
    }
    return out;
  }, py::arg("values"), py::arg("inverse"), py::arg("m"),
  "float32[m, d]: row k the sum of values[i] over every i with inverse[i] == k\n"
  "(added in input order). ValueError if an inverse entry is outside [0, m).");
  m.def("gather_rows", [](py::list pieces_obj, py::object inverse_obj, py::ssize_t dim) {
    auto inverse = Require<int64_t>(inverse_obj, "inverse", 1);
    if (dim < 1) ThrowInvalid("dim must be >= 1, got ", dim);
    std::vector<py::array_t<float, py::array::c_style>> keep;
    std::vector<const float*> pieces;
    std::vector<int64_t> starts{0};
    for (size_t j = 0; j < pieces_obj.size(); ++j) {
      auto p = Require<float>(pieces_obj[j], "each piece", 2);
      if (p.shape(1) != dim) {
        ThrowInvalid("piece ", j, " has rows of ", p.shape(1), " floats, expected ", dim);
      }
      pieces.push_back(p.data());
      starts.push_back(starts.back() + p.shape(0));
      keep.push_back(std::move(p));
    }
    const size_t n = static_cast<size_t>(inverse.size());
    py::array_t<float> out({static_cast<py::ssize_t>(n), dim});
    const int64_t* inv = inverse.data();
    float* o = out.mutable_data();
    {
      py::gil_scoped_release release;
      pyfleet::GatherRows(pieces.data(), starts.data(), pieces.size(),
                          static_cast<size_t>(dim), inv, n, o);
    }
    return out;
  }, py::arg("pieces"), py::arg("inverse"), py::arg("dim"),
  "float32[n, dim]: row i is row inverse[i] of the pieces' rows laid end to end\n"
  "(pieces: float32[m_j, dim] arrays). ValueError if an index is out of range.");
}

pyfleet::Activation ActivationOf(const std::string& act) {
  if (act == "relu") return pyfleet::Activation::kRelu;
  if (act.empty() || act == "none") return pyfleet::Activation::kNone;
  ThrowInvalid("act must be 'relu' or 'none', got '", act, "'");
  return pyfleet::Activation::kNone;  // not reached
}

// y a C-contiguous, writeable float32[rows, cols] array (never copied: the
// kernel writes it), or a ValueError naming it.
py::array_t<float> Writable2D(const py::handle& obj, const char* what) {
  auto a = Require<float>(obj, what, 2);
  if (!a.is(obj) || !a.writeable()) {
    ThrowInvalid(what, " must be a C-contiguous, writeable float32 array");
  }
  return a;
}

// A fully connected layer's elementwise work (pyfleet.fluid.fused_fc).
void BindDenseLayer(py::module_& m) {
  m.def("fc_bias_act", [](py::object y_obj, py::object bias_obj, const std::string& act) {
    auto y = Writable2D(y_obj, "y");
    auto bias = Require<float>(bias_obj, "bias", 1);
    if (bias.size() != y.shape(1)) {
      ThrowInvalid("bias has ", bias.size(), " entries for ", y.shape(1), " columns of y");
    }
    const auto a = ActivationOf(act);
    float* out = y.mutable_data();
    const float* b = bias.data();
    const size_t rows = static_cast<size_t>(y.shape(0)), cols = static_cast<size_t>(y.shape(1));
    {
      py::gil_scoped_release release;
      pyfleet::BiasActivate(out, b, rows, cols, a);
    }
  }, py::arg("y"), py::arg("bias"), py::arg("act"),
  "y = act(y + bias) in place (y: C-contiguous float32[rows, cols], bias: float32[cols];\n"
  "act: 'relu' or 'none'), numpy's arithmetic; releases the GIL.");
  m.def("fc_act_bias_grad", [](py::object g_obj, py::object y_obj, const std::string& act) {
    auto g = Require<float>(g_obj, "g", 2);
    auto y = Require<float>(y_obj, "y", 2);
    if (g.shape(0) != y.shape(0) || g.shape(1) != y.shape(1)) {
      ThrowInvalid("g has shape (", g.shape(0), ", ", g.shape(1), "), y (", y.shape(0), ", ",
                   y.shape(1), ")");
    }
    const auto a = ActivationOf(act);
    const py::ssize_t rows = g.shape(0), cols = g.shape(1);
    py::array_t<float> gbias(cols);
    const bool none = a == pyfleet::Activation::kNone;
    py::array_t<float> gz = none ? py::array_t<float>(g) : py::array_t<float>({rows, cols});
    const float* gp = g.data();
    const float* yp = y.data();
    float* zp = none ? nullptr : gz.mutable_data();
    float* bp = gbias.mutable_data();
    {
      py::gil_scoped_release release;
      pyfleet::ActivationBiasGrad(gp, yp, static_cast<size_t>(rows), static_cast<size_t>(cols),
                                  a, zp, bp);
    }
    return py::make_tuple(gz, gbias);
  }, py::arg("g"), py::arg("y"), py::arg("act"),
  "(gz float32[rows, cols], gbias float32[cols]) for a layer's output y = act(z) and\n"
  "the gradient g of it: gz = g * act'(y) (g itself with act 'none'), gbias =\n"
  "gz.sum(axis=0), as numpy computes them; releases the GIL.");
}

}  // namespace

void RegisterBatchOps(py::module_& m) {
  BindUniqueKeys(m);
  BindRowGathers(m);
  BindDenseLayer(m);
}
