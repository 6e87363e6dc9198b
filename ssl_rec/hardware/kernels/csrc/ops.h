// The kernels' tensor-level entry points and the validation every one of them runs first
// (bad input raises ValueError / IndexError / TypeError in Python, never crashes).
#pragma once
#include <ATen/Parallel.h>
#include <torch/extension.h>

#include <atomic>
#include <mutex>
#include <vector>

#include "tables.h"

namespace sslrec {

using TensorList = std::vector<at::Tensor>;

// The tables as passed by ssl_rec.hardware.kernels.table_meta.TableTensors.
struct Tables {
  TensorList stores, cache_rows, cache_tags, cache_state, stats, momentum;
  at::Tensor meta, hparams;
};

// An admission plan: the unique rows of each table's ids, each sample's index among them,
// and the cache slot each unique row got (-1: uncached). Row f of `rows` / `slots` holds
// table f's num_unique[f] entries first.
struct Plan {
  at::Tensor rows;        // int64[F, B]
  at::Tensor num_unique;  // int64[F]
  at::Tensor inverse;     // int32[F, B]
  at::Tensor slots;       // int32[F, B]
};

std::vector<TableView> table_views(const Tables& t);

// The tables, validated once and kept between kernel calls (Python holds it as a handle):
// converting and validating every table's tensors on each call costs more than a small
// batch's kernels. views() compares each tensor's address, dtype, shape and strides and the
// metadata with what was validated, validates again when anything moved, and re-reads the
// learning rates, so no kernel ever runs on unchecked memory.
class TableSet {
 public:
  explicit TableSet(Tables tables);
  std::vector<TableView> views() const;
  // Admission bookkeeping: admit() calls note_admission before and after each admission,
  // slots_current(p) is true while p is the last plan admitted anywhere in the process and
  // no cache tag tensor was written in place (load_state_dict, fill_) since.
  void note_admission_start() const;
  void note_admission(const Plan& p) const;
  bool slots_current(const Plan& p) const;

 private:
  // What validation depended on: each tensor's address, dtype, shape, strides; the metadata.
  void fingerprint(std::vector<int64_t>& out) const;
  int64_t tags_version() const;
  mutable const void* last_inverse_ = nullptr;
  mutable int64_t last_count_ = -1, last_tags_version_ = -1;
  Tables tables_;
  mutable std::mutex mutex_;
  mutable std::vector<TableView> views_;
  mutable std::vector<int64_t> fingerprint_, scratch_;
};
void check_ids(const at::Tensor& ids, const std::vector<TableView>& ts);
void check_plan(const Plan& p, const std::vector<TableView>& ts, const char* what);
void check_grad(const at::Tensor& grad, const Plan& p, const std::vector<TableView>& ts);
void check_bag(const at::Tensor& store, int64_t bits, const at::Tensor& indices,
               const at::Tensor& offsets, int64_t dim);
void check_vectors(const at::Tensor& vectors);
void check_int8_linear(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& scale,
                       const c10::optional<at::Tensor>& bias);
void check_serve_interaction(const at::Tensor& ids, const std::vector<TableView>& ts,
                             const at::Tensor& first, const at::Tensor& out, int64_t column);

at::Tensor lookup(const std::vector<TableView>& ts, const at::Tensor& ids);
Plan admit(const std::vector<TableView>& ts, const at::Tensor& ids, int64_t seed, int64_t step,
           const std::vector<Plan>& locks, bool parallel);
at::Tensor gather(const std::vector<TableView>& ts, const Plan& p);
// slots_current: no admission ran since p's and no cache tag was written in place, so p's
// slots still say where its rows live (else each row's slot is looked up again).
void update(const std::vector<TableView>& ts, const Plan& p, const at::Tensor& grad,
            int64_t seed, int64_t step, bool slots_current = false);
at::Tensor bag_lookup(const at::Tensor& store, int64_t bits, const at::Tensor& indices,
                      const at::Tensor& offsets, int64_t dim);
at::Tensor serve_lookup(const std::vector<TableView>& ts, const at::Tensor& ids);
at::Tensor interaction(const at::Tensor& vectors);
// x [R, K] float32 times row-wise INT8 weights [N, K] (scale [N], optional bias [N]), as
// the variants' int8_linear: float32 [R, N], max(0, .) when `relu`.
at::Tensor int8_linear(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& scale,
                       const c10::optional<at::Tensor>& bias, bool relu);
// DLRM's lookup and interaction in one pass: for each sample b, the interaction of the
// 1 + T vectors first[b], serve_lookup(ids)[b] is written into out[b, column : column + P]
// (P = (1 + T) T / 2); the [B, 1 + T, D] vectors exist only a chunk of samples at a time.
void serve_interaction(const std::vector<TableView>& ts, const at::Tensor& ids,
                       const at::Tensor& first, const at::Tensor& out, int64_t column);

// Runs fn(order[i]) for i in [0, n), spread over the intra-op threads with dynamic
// scheduling when `parallel` (results never depend on which thread runs a task).
template <class Fn>
void run_tasks(int64_t n, const std::vector<int64_t>& order, bool parallel, const Fn& fn) {
  if (!parallel || n <= 1 || at::get_num_threads() == 1 || at::in_parallel_region()) {
    for (int64_t i = 0; i < n; ++i) fn(order[i]);
    return;
  }
  std::atomic<int64_t> next{0};
  at::parallel_for(0, at::get_num_threads(), 1, [&](int64_t, int64_t) {
    for (int64_t i = next++; i < n; i = next++) fn(order[i]);
  });
}

}  // namespace sslrec
