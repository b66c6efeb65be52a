// pyfleet.serving._front: the native front end (serving_front.h) for Python.
// Its threads run without the GIL; the step and adopt callbacks take it.
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include "serving_front.h"

namespace py = pybind11;
using pyfleet::serving::Front;
using pyfleet::serving::FrontMetrics;
using pyfleet::serving::FrontOptions;
using pyfleet::serving::StepError;
using pyfleet::serving::StepIn;
using pyfleet::serving::StepOut;

namespace {

template <typename T>
py::array_t<T> array_of(const std::vector<T>& v, std::vector<py::ssize_t> shape) {
  py::array_t<T> a(shape);
  std::copy(v.begin(), v.end(), a.mutable_data());
  return a;
}

// step(text, raw, text_ends, raw_ends, info) ->
//   (prob float64[], counts int64[n], [(index, status, status_line, text, kind)],
//    prefix, suffix, header)
void call_step(const py::object& fn, const StepIn& in, StepOut& out) {
  py::gil_scoped_acquire gil;
  py::ssize_t n = static_cast<py::ssize_t>(in.text_ends.size());
  py::tuple r = fn(py::bytes(in.text), py::bytes(in.raw), array_of(in.text_ends, {n}),
                   array_of(in.raw_ends, {n}), array_of(in.info, {n, 5}));
  if (!r[0].is_none()) {
    auto prob = py::array_t<double, py::array::c_style | py::array::forcecast>(r[0]);
    out.prob.assign(prob.data(), prob.data() + prob.size());
  }
  auto counts = py::array_t<int64_t, py::array::c_style | py::array::forcecast>(r[1]);
  out.counts.assign(counts.data(), counts.data() + counts.size());
  for (auto item : r[2].cast<py::list>()) {
    auto t = item.cast<py::tuple>();
    out.errors.push_back(StepError{t[0].cast<size_t>(), t[1].cast<int>(),
                                   t[2].cast<std::string>(), t[3].cast<std::string>(),
                                   t[4].cast<std::string>()});
  }
  out.prefix = r[3].cast<std::string>();
  out.suffix = r[4].cast<std::string>();
  out.header = r[5].cast<std::string>();
}

// A Front dropped without stop() (an error while starting): its threads may wait
// for the GIL, so it is stopped without it.
struct StopWithoutGil {
  void operator()(Front* f) const {
    if (PyGILState_Check()) {
      py::gil_scoped_release nogil;
      delete f;
    } else {
      delete f;
    }
  }
};
using FrontHolder = std::unique_ptr<Front, StopWithoutGil>;

FrontHolder make_front(std::vector<int> fds, py::object step, py::object adopt, double batch_wait,
                                  int64_t max_batch_rows, int64_t max_fast_body,
                                  double read_timeout, double keepalive_timeout,
                                  int64_t max_concurrent, std::vector<double> bounds) {
  FrontOptions o;
  o.batch_wait = batch_wait;
  o.max_batch_rows = max_batch_rows;
  o.max_fast_body = max_fast_body;
  o.read_timeout = read_timeout;
  o.keepalive_timeout = keepalive_timeout;
  o.max_concurrent = max_concurrent;
  o.latency_bounds = std::move(bounds);
  // The callbacks are Python objects held by C++ threads: freed with the GIL held.
  auto s = std::shared_ptr<py::object>(new py::object(std::move(step)), [](py::object* p) {
    py::gil_scoped_acquire gil;
    delete p;
  });
  auto a = std::shared_ptr<py::object>(new py::object(std::move(adopt)), [](py::object* p) {
    py::gil_scoped_acquire gil;
    delete p;
  });
  return FrontHolder(new Front(
      std::move(fds), [s](const StepIn& in, StepOut& out) { call_step(*s, in, out); },
      [a](int fd, const std::string& data) {
        py::gil_scoped_acquire gil;
        (*a)(fd, py::bytes(data));
      },
      std::move(o)));
}


py::dict metrics_of(Front& f) {
  FrontMetrics m = f.metrics();
  py::dict requests, errors;
  for (auto& [k, v] : m.requests) requests[py::int_(k)] = v;
  for (auto& [k, v] : m.errors) errors[py::str(k)] = v;
  py::dict d;
  d["requests"] = requests;
  d["errors"] = errors;
  d["latency_counts"] = m.latency_counts;
  d["latency_sum"] = m.latency_sum;
  return d;
}

}  // namespace

PYBIND11_MODULE(_front, m) {
  m.doc() = "The native HTTP front end of pyfleet serve (see pyfleet/serving/native.py).";
  py::class_<Front, FrontHolder>(m, "Front")
      .def(py::init(&make_front), py::arg("fds"), py::arg("step"), py::arg("adopt"),
           py::arg("batch_wait"), py::arg("max_batch_rows"), py::arg("max_fast_body"),
           py::arg("read_timeout"), py::arg("keepalive_timeout"), py::arg("max_concurrent"),
           py::arg("latency_bounds"))
      .def("start", &Front::start)
      .def("stop", &Front::stop, py::arg("within"), py::call_guard<py::gil_scoped_release>())
      .def("set_schema", &Front::set_schema, py::arg("n_dense"), py::arg("n_slots"),
           py::arg("generation"))
      .def("try_acquire", &Front::try_acquire)
      .def("release", &Front::release)
      .def("in_flight", &Front::in_flight)
      .def("open_connections", &Front::open_connections)
      .def("metrics", &metrics_of);
  m.def("json_to_tsv", [](const std::string& body, int n_dense, int n_slots) -> py::object {
    std::string out;
    int rows = 0;
    if (!pyfleet::serving::json_to_tsv(body, n_dense, n_slots, out, rows)) return py::none();
    return py::bytes(out);
  });
  m.def("repr_of", [](double v) {
    std::string s;
    pyfleet::serving::append_repr(s, v);
    return s;
  });
}
