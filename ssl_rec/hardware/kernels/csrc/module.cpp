// Python bindings of the compiled kernels (ssl_rec/hardware/kernels/dispatch.py wraps them
// behind the interface of kernels/reference.py). Every entry validates its inputs and runs
// without the GIL, so an admission may run on a helper thread beside the dense layers.
#include "ops.h"
#include "profile.h"

// The key of the sources and flags this binary was built from (build_spec.source_key), passed
// as -DSSL_REC_BUILD_KEY=<hex> so that a stale binary is recognised instead of used.
#ifndef SSL_REC_BUILD_KEY
#define SSL_REC_BUILD_KEY unknown
#endif
#define SSL_REC_STRINGIFY_(x) #x
#define SSL_REC_STRINGIFY(x) SSL_REC_STRINGIFY_(x)

namespace py = pybind11;
using sslrec::Plan;
using sslrec::Tables;
using sslrec::TableSet;
using sslrec::TensorList;

namespace {

std::shared_ptr<TableSet> table_set(TensorList stores, TensorList cache_rows,
                                    TensorList cache_tags, TensorList cache_state,
                                    TensorList stats, TensorList momentum, at::Tensor meta,
                                    at::Tensor hparams) {
  return std::make_shared<TableSet>(
      Tables{std::move(stores), std::move(cache_rows), std::move(cache_tags),
             std::move(cache_state), std::move(stats), std::move(momentum), std::move(meta),
             std::move(hparams)});
}

using PlanTuple = std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor>;

Plan plan_of(const PlanTuple& p) {
  return Plan{std::get<0>(p), std::get<1>(p), std::get<2>(p), std::get<3>(p)};
}

// Each entry copies its tensor handles while it holds the GIL and releases the GIL only
// around the kernel: copying or dropping a handle of a Python-owned tensor without the GIL
// makes PyTorch take the GIL for it, once per tensor.
PlanTuple admit(const TableSet& t, const at::Tensor& ids, int64_t seed, int64_t step,
                const std::vector<PlanTuple>& locks, bool parallel) {
  std::vector<Plan> lock_plans;
  for (const PlanTuple& p : locks) lock_plans.push_back(plan_of(p));
  Plan out;
  {
    py::gil_scoped_release nogil;
    t.note_admission_start();
    out = sslrec::admit(t.views(), ids, seed, step, lock_plans, parallel);
    t.note_admission(out);
  }
  return {out.rows, out.num_unique, out.inverse, out.slots};
}

at::Tensor gather(const TableSet& t, const PlanTuple& plan) {
  const Plan p = plan_of(plan);
  py::gil_scoped_release nogil;
  return sslrec::gather(t.views(), p);
}

void update(const TableSet& t, const PlanTuple& plan, const at::Tensor& grad, int64_t seed,
            int64_t step) {
  const Plan p = plan_of(plan);
  py::gil_scoped_release nogil;
  sslrec::update(t.views(), p, grad, seed, step, t.slots_current(p));
}

at::Tensor lookup(const TableSet& t, const at::Tensor& ids) {
  py::gil_scoped_release nogil;
  return sslrec::lookup(t.views(), ids);
}

at::Tensor serve_lookup(const TableSet& t, const at::Tensor& ids) {
  py::gil_scoped_release nogil;
  return sslrec::serve_lookup(t.views(), ids);
}

void serve_interaction(const TableSet& t, const at::Tensor& ids, const at::Tensor& first,
                       const at::Tensor& out, int64_t column) {
  py::gil_scoped_release nogil;
  sslrec::serve_interaction(t.views(), ids, first, out, column);
}

// Seconds per phase since the last reset; switches the counters on (or off with `on`).
py::dict phase_seconds(bool on, bool reset) {
  sslrec::Profile& p = sslrec::profile();
  py::dict out;
  for (int i = 0; i < sslrec::kNumPhases; ++i) {
    const int64_t ns = reset ? p.ns[i].exchange(0) : p.ns[i].load();
    out[sslrec::kPhaseNames[i]] = static_cast<double>(ns) * 1e-9;
  }
  p.on = on;
  return out;
}

int64_t row_bytes(int64_t kind, int64_t dim) {
  TORCH_CHECK_VALUE(kind >= 0 && kind < sslrec::kNumKinds, "row_bytes: unknown format ", kind);
  TORCH_CHECK_VALUE(dim > 0, "row_bytes: dim must be > 0, got ", dim);
  return sslrec::row_bytes_of(kind, dim);
}

}  // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  const auto nogil = py::call_guard<py::gil_scoped_release>();
  // module_local: builds of other sources (benchmarks/kernel_ab.py) load beside this one
  py::class_<TableSet, std::shared_ptr<TableSet>>(m, "TableSet", py::module_local(),
                                                  "validated tables passed to the kernels")
      .def(py::init(&table_set));
  m.def("admit", &admit, "cache admission of a batch; returns its plan");
  m.def("gather", &gather, "values of an admitted batch: float32[B, F, D]");
  m.def("update", &update, "fused backward: per-row gradient sum, optimizer, write");
  m.def("lookup", &lookup, "eval lookup (cache, else store) without side effects");
  m.def("serve_lookup", &serve_lookup, "inference lookup of uncached tables, FBGEMM's rounding");
  m.def("interaction", &sslrec::interaction, "upper triangle of V V^T per sample", nogil);
  m.def("serve_interaction", &serve_interaction,
        "interaction of [first, serve_lookup(ids)] per sample, into out[:, column:]");
  m.def("bag_lookup", &sslrec::bag_lookup, "INT8/INT4 sum-pooled inference lookup", nogil);
  m.def("int8_linear", &sslrec::int8_linear,
        "float32 rows times row-wise INT8 weights (scale, bias, relu), no input quantization",
        py::arg("x"), py::arg("weight"), py::arg("scale"), py::arg("bias"),
        py::arg("relu") = false, nogil);
  m.def("row_bytes", &row_bytes, "bytes of one stored row of format `kind` at `dim`");
  m.def("num_kinds", [] { return static_cast<int64_t>(sslrec::kNumKinds); });
  m.def("simd_level", &sslrec::simd_level, "0 portable, 1 AVX2, 2 AVX-512");
  m.def("max_simd_level", &sslrec::max_simd_level, "widest variant this CPU runs");
  m.def("set_simd_level", &sslrec::set_simd_level, "choose the variant; returns the previous");
  m.def("phase_seconds", &phase_seconds, "per-phase seconds; on: keep counting; reset: zero",
        py::arg("on") = true, py::arg("reset") = true);
  m.def("simd_name", [] { return std::string(sslrec::variant().name); });
  m.def("build_key", [] { return std::string(SSL_REC_STRINGIFY(SSL_REC_BUILD_KEY)); },
        "key of the sources and flags of this build");
}
