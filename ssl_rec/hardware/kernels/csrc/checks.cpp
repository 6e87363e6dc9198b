// Validation of every kernel input: dtypes, shapes, layouts, id and offset ranges. The
// kernels trust nothing they did not check here.
#include <string>

#include "ops.h"

namespace sslrec {

namespace {

std::string shape_of(const at::Tensor& x) {
  return x.defined() ? c10::str(x.scalar_type(), x.sizes()) : std::string("undefined");
}

void expect(const at::Tensor& x, at::ScalarType dtype, int64_t dims, const std::string& what) {
  TORCH_CHECK_TYPE(x.defined() && x.scalar_type() == dtype, what, " must be ",
                   c10::toString(dtype), ", got ", shape_of(x));
  TORCH_CHECK_VALUE(x.dim() == dims, what, " must have ", dims, " dimensions, got ",
                    shape_of(x));
  TORCH_CHECK_VALUE(x.is_contiguous() && x.device().is_cpu(), what,
                    " must be a contiguous CPU tensor");
}

void expect_shape(const at::Tensor& x, at::IntArrayRef shape, const std::string& what) {
  TORCH_CHECK_VALUE(x.sizes() == shape, what, " must have shape ", shape, ", got ",
                    shape_of(x));
}

at::ScalarType store_dtype(int64_t kind) {
  if (kind == kFp32) return at::kFloat;
  if (kind == kFp16) return at::kHalf;
  if (kind == kBf16) return at::kBFloat16;
  return at::kByte;
}

TableView view_of(const Tables& t, int64_t f) {
  const std::string name = "table " + std::to_string(f) + ": ";
  auto m = t.meta.accessor<int64_t, 2>()[f];
  TableView v;
  TORCH_CHECK_VALUE(m[kKind] >= 0 && m[kKind] < kNumKinds, name, "unknown format ", m[kKind]);
  TORCH_CHECK_VALUE(m[kPolicy] == 0 || m[kPolicy] == 1, name, "unknown policy ", m[kPolicy]);
  TORCH_CHECK_VALUE(m[kOptimizer] == 0 || m[kOptimizer] == 1, name, "unknown optimizer ",
                    m[kOptimizer]);
  TORCH_CHECK_VALUE(m[kRows] > 0, name, "rows must be > 0, got ", m[kRows]);
  TORCH_CHECK_VALUE(m[kAdmission] >= 1 && m[kAdmission] <= kMaxAdmission, name,
                    "admission count must be in [1, ", kMaxAdmission, "], got ", m[kAdmission]);
  TORCH_CHECK_VALUE(m[kDim] > 0 && m[kDim] <= kMaxDim, name, "dim must be in [1, ", kMaxDim,
                    "], got ", m[kDim]);
  v.kind = static_cast<int>(m[kKind]);
  v.policy = static_cast<int>(m[kPolicy]);
  v.admission = static_cast<int32_t>(m[kAdmission]);
  v.optimizer = static_cast<int>(m[kOptimizer]);
  v.sr = m[kStochastic] != 0;
  v.stream = m[kStream];
  v.offset = m[kRowOffset];
  v.stride = m[kRowStride];
  TORCH_CHECK_VALUE(v.stride >= 1, name, "row stride must be >= 1, got ", v.stride);
  v.rows = m[kRows];
  v.dim = m[kDim];
  if (is_int_kind(v.kind))
    TORCH_CHECK_VALUE(v.dim % (8 / bits_of(v.kind)) == 0, name, "dim ", v.dim,
                      " does not pack into whole bytes");
  const int64_t width = v.kind <= kBf16 ? v.dim : row_bytes_of(v.kind, v.dim);
  expect(t.stores[f], store_dtype(v.kind), 2, name + "store");
  expect_shape(t.stores[f], {v.rows, width}, name + "store");
  v.store = static_cast<uint8_t*>(t.stores[f].data_ptr());
  v.rbytes = row_bytes_of(v.kind, v.dim);
  expect(t.cache_tags[f], at::kShort, 2, name + "cache tags");
  v.sets = t.cache_tags[f].size(0);
  expect_shape(t.cache_tags[f], {v.sets, kWays}, name + "cache tags");
  expect(t.cache_rows[f], at::kFloat, 2, name + "cache rows");
  expect_shape(t.cache_rows[f], {v.sets * kWays, v.dim}, name + "cache rows");
  expect(t.cache_state[f], at::kByte, 2, name + "cache state");
  expect_shape(t.cache_state[f], {v.sets, v.policy == 0 ? 1 : kWays}, name + "cache state");
  TORCH_CHECK_VALUE(v.sets == 0 || (v.rows - 1) / v.sets <= 32767, name,
                    "cache has too few sets for int16 tags");
  expect(t.stats[f], at::kLong, 1, name + "stats");
  expect_shape(t.stats[f], {4}, name + "stats");
  expect(t.momentum[f], at::kFloat, 1, name + "momentum");
  if (v.optimizer == 1) expect_shape(t.momentum[f], {v.rows}, name + "momentum");
  v.set_magic_from_sets();
  if (v.sets > 0) {
    v.cache = t.cache_rows[f].data_ptr<float>();
    v.tags = t.cache_tags[f].data_ptr<int16_t>();
    v.state = t.cache_state[f].data_ptr<uint8_t>();
  }
  v.stats = t.stats[f].data_ptr<int64_t>();
  v.mom = v.optimizer == 1 ? t.momentum[f].data_ptr<float>() : nullptr;
  const auto hp = t.hparams.accessor<float, 2>();
  v.lr = hp[f][kLr];
  v.eps = hp[f][kEps];
  v.wd = hp[f][kWeightDecay];
  return v;
}

}  // namespace

std::vector<TableView> table_views(const Tables& t) {
  expect(t.meta, at::kLong, 2, "meta");
  TORCH_CHECK_VALUE(t.meta.size(1) == kMetaColumns, "meta must be int64[T, ", kMetaColumns,
                    "], got ", shape_of(t.meta));
  const int64_t F = t.meta.size(0);
  expect(t.hparams, at::kFloat, 2, "hparams");
  expect_shape(t.hparams, {F, kHParamColumns}, "hparams");
  const TensorList* lists[] = {&t.stores, &t.cache_rows, &t.cache_tags,
                               &t.cache_state, &t.stats, &t.momentum};
  for (const TensorList* l : lists)
    TORCH_CHECK_VALUE(static_cast<int64_t>(l->size()) == F, "got ", l->size(),
                      " tensors in a table list for ", F, " tables");
  std::vector<TableView> views;
  for (int64_t f = 0; f < F; ++f) views.push_back(view_of(t, f));
  for (int64_t f = 1; f < F; ++f)
    TORCH_CHECK_VALUE(views[f].dim == views[0].dim, "table ", f, ": dim ", views[f].dim,
                      " differs from table 0's ", views[0].dim);
  return views;
}

namespace {

// Appends what validation depends on: address, dtype, shape and strides.
void append_layout(const at::Tensor& x, std::vector<int64_t>& out) {
  out.push_back(x.defined() ? reinterpret_cast<int64_t>(x.data_ptr()) : 0);
  if (!x.defined()) return;
  out.push_back(static_cast<int64_t>(x.scalar_type()));
  out.push_back(x.dim());
  for (int64_t d = 0; d < x.dim(); ++d) {
    out.push_back(x.size(d));
    out.push_back(x.stride(d));
  }
}

}  // namespace

TableSet::TableSet(Tables tables) : tables_(std::move(tables)) {
  views_ = table_views(tables_);
  fingerprint(fingerprint_);
}

void TableSet::fingerprint(std::vector<int64_t>& out) const {
  out.clear();
  const TensorList* lists[] = {&tables_.stores, &tables_.cache_rows, &tables_.cache_tags,
                               &tables_.cache_state, &tables_.stats, &tables_.momentum};
  for (const TensorList* l : lists)
    for (const at::Tensor& x : *l) append_layout(x, out);
  append_layout(tables_.hparams, out);
  append_layout(tables_.meta, out);
  if (tables_.meta.defined() && tables_.meta.scalar_type() == at::kLong &&
      tables_.meta.is_contiguous()) {
    const int64_t* m = tables_.meta.data_ptr<int64_t>();
    out.insert(out.end(), m, m + tables_.meta.numel());
  }
}

namespace {
// Admissions started or finished anywhere in the process (each counts twice).
std::atomic<int64_t> g_admissions{0};
}  // namespace

int64_t TableSet::tags_version() const {
  int64_t sum = 0;
  for (const at::Tensor& x : tables_.cache_tags) {
    if (!x.defined() || x.is_inference()) return -1;  // no version counter: unknown
    sum += static_cast<int64_t>(x.unsafeGetTensorImpl()->version_counter().current_version());
  }
  return sum;
}

void TableSet::note_admission_start() const { ++g_admissions; }

void TableSet::note_admission(const Plan& p) const {
  const int64_t count = ++g_admissions;
  std::lock_guard<std::mutex> lock(mutex_);
  last_inverse_ = p.inverse.data_ptr();
  last_count_ = count;
  last_tags_version_ = tags_version();
}

bool TableSet::slots_current(const Plan& p) const {
  std::lock_guard<std::mutex> lock(mutex_);
  // p's inverse is still alive, so no later plan can have reused its memory: equal
  // addresses mean p is the plan noted last.
  return last_inverse_ != nullptr && p.inverse.defined() && p.inverse.data_ptr() == last_inverse_ &&
         g_admissions.load() == last_count_ && last_tags_version_ >= 0 &&
         tags_version() == last_tags_version_;
}

std::vector<TableView> TableSet::views() const {
  std::lock_guard<std::mutex> lock(mutex_);
  fingerprint(scratch_);  // into a kept buffer: no allocation per call
  if (scratch_ != fingerprint_) {
    views_ = table_views(tables_);  // throws (and keeps the old state) when now invalid
    fingerprint_.swap(scratch_);
  }
  const float* hp = tables_.hparams.data_ptr<float>();
  for (size_t f = 0; f < views_.size(); ++f) {
    views_[f].lr = hp[kHParamColumns * f + kLr];
    views_[f].eps = hp[kHParamColumns * f + kEps];
    views_[f].wd = hp[kHParamColumns * f + kWeightDecay];
  }
  return views_;
}

void check_ids(const at::Tensor& ids, const std::vector<TableView>& ts) {
  const int64_t F = static_cast<int64_t>(ts.size());
  expect(ids, at::kLong, 2, "ids");
  TORCH_CHECK_VALUE(ids.size(1) == F, "ids must be int64[B, ", F, "], got ", shape_of(ids));
  const int64_t* p = ids.data_ptr<int64_t>();
  const int64_t B = ids.size(0);
  if (F == 0) return;
  // A branch-free scan first (the trick of scan_ops.h's outside, one limit per table);
  // the loop that names the bad id only on failure.
  std::vector<uint64_t> top(F);
  for (int64_t f = 0; f < F; ++f) top[f] = static_cast<uint64_t>(ts[f].rows) - 1;
  uint64_t acc = 0;
  for (int64_t b = 0; b < B; ++b)
    for (int64_t f = 0; f < F; ++f) {
      const uint64_t u = static_cast<uint64_t>(p[b * F + f]);
      acc |= u | (top[f] - u);
    }
  if (!(acc >> 63)) return;
  for (int64_t b = 0; b < B; ++b)
    for (int64_t f = 0; f < F; ++f) {
      const int64_t id = p[b * F + f];
      TORCH_CHECK_INDEX(id >= 0 && id < ts[f].rows, "table ", f, ": id ", id,
                        " out of range [0, ", ts[f].rows, ") at sample ", b);
    }
}

void check_plan(const Plan& p, const std::vector<TableView>& ts, const char* what) {
  const int64_t F = static_cast<int64_t>(ts.size());
  const std::string w(what);
  expect(p.inverse, at::kInt, 2, w + " inverse");
  const int64_t B = p.inverse.size(1);
  expect_shape(p.inverse, {F, B}, w + " inverse");
  expect(p.rows, at::kLong, 2, w + " rows");
  expect_shape(p.rows, {F, B}, w + " rows");
  expect(p.slots, at::kInt, 2, w + " slots");
  expect_shape(p.slots, {F, B}, w + " slots");
  expect(p.num_unique, at::kLong, 1, w + " num_unique");
  expect_shape(p.num_unique, {F}, w + " num_unique");
  const int64_t* nu = p.num_unique.data_ptr<int64_t>();
  const int64_t* rows = p.rows.data_ptr<int64_t>();
  const int32_t* slots = p.slots.data_ptr<int32_t>();
  const int32_t* inv = p.inverse.data_ptr<int32_t>();
  for (int64_t f = 0; f < F; ++f) {
    TORCH_CHECK_VALUE(nu[f] >= 0 && nu[f] <= B, w, ": table ", f, " has ", nu[f],
                      " unique rows for ", B, " samples");
    // Slots in [-1, sets * ways): slot + 1 below sets * ways + 1, compared unsigned.
    const uint32_t slot_end = static_cast<uint32_t>(ts[f].sets * kWays + 1);
    bool bad_slot = false;
    for (int64_t u = 0; u < nu[f]; ++u)
      bad_slot |= static_cast<uint32_t>(slots[f * B + u]) + 1u >= slot_end;
    if (!bad_slot && !variant().outside(rows + f * B, nu[f], 0, ts[f].rows)) continue;
    for (int64_t u = 0; u < nu[f]; ++u) {
      TORCH_CHECK_INDEX(rows[f * B + u] >= 0 && rows[f * B + u] < ts[f].rows, w, ": table ", f,
                        ": row ", rows[f * B + u], " out of range [0, ", ts[f].rows, ")");
      TORCH_CHECK_INDEX(slots[f * B + u] >= -1 && slots[f * B + u] < ts[f].sets * kWays, w,
                        ": table ", f, ": slot ", slots[f * B + u], " out of range");
    }
  }
  for (int64_t f = 0; f < F; ++f) {
    const int32_t* col = inv + f * B;
    const uint32_t limit = static_cast<uint32_t>(nu[f]);
    bool bad = false;
    for (int64_t b = 0; b < B; ++b) bad |= static_cast<uint32_t>(col[b]) >= limit;
    if (!bad) continue;
    for (int64_t b = 0; b < B; ++b)
      TORCH_CHECK_INDEX(col[b] >= 0 && col[b] < nu[f], w, ": sample ", b, " of table ", f,
                        " points at unique row ", col[b], " of ", nu[f]);
  }
}

void check_grad(const at::Tensor& grad, const Plan& p, const std::vector<TableView>& ts) {
  const int64_t F = static_cast<int64_t>(ts.size());
  expect(grad, at::kFloat, 3, "grad");
  expect_shape(grad, {p.inverse.size(1), F, F ? ts[0].dim : 0}, "grad");
}

void check_bag(const at::Tensor& store, int64_t bits, const at::Tensor& indices,
               const at::Tensor& offsets, int64_t dim) {
  TORCH_CHECK_VALUE(bits == 8 || bits == 4, "bag_lookup: bits must be 8 or 4, got ", bits);
  expect(store, at::kByte, 2, "store");
  TORCH_CHECK_VALUE(dim > 0 && dim <= kMaxDim && dim % (8 / bits) == 0 &&
                        store.size(1) == row_bytes_of(bits == 8 ? kInt8 : kInt4, dim),
                    "store rows of ", store.size(1), " bytes do not hold ", bits,
                    "-bit rows of dim ", dim);
  expect(indices, at::kLong, 1, "indices");
  expect(offsets, at::kLong, 1, "offsets");
  const int64_t n = indices.numel(), rows = store.size(0), nb = offsets.numel();
  TORCH_CHECK_VALUE(nb >= 1, "offsets must hold B + 1 >= 1 bag boundaries");
  const int64_t* off = offsets.data_ptr<int64_t>();
  TORCH_CHECK_VALUE(off[0] == 0, "offsets[0] must be 0, got ", off[0]);
  TORCH_CHECK_VALUE(off[nb - 1] == n, "offsets[-1] must equal the number of indices ", n,
                    ", got ", off[nb - 1]);
  // Offsets in [0, n] (so no step wraps) with non-negative steps are non-decreasing.
  const Variant& v = variant();
  bool bad = v.outside(off, nb, 0, n + 1) || v.descends(off, nb);
  for (int64_t b = 0; bad && b + 1 < nb; ++b)
    TORCH_CHECK_VALUE(off[b] <= off[b + 1], "offsets must be non-decreasing: offsets[", b,
                      "] = ", off[b], " > offsets[", b + 1, "] = ", off[b + 1]);
  const int64_t* ix = indices.data_ptr<int64_t>();
  bad = v.outside(ix, n, 0, rows);
  for (int64_t i = 0; bad && i < n; ++i)
    TORCH_CHECK_INDEX(ix[i] >= 0 && ix[i] < rows, "indices[", i, "] = ", ix[i],
                      " out of range [0, ", rows, ")");
}

void check_int8_linear(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& scale,
                       const c10::optional<at::Tensor>& bias) {
  expect(x, at::kFloat, 2, "int8_linear input");
  expect(weight, at::kChar, 2, "int8_linear weight");
  const int64_t N = weight.size(0), K = weight.size(1);
  TORCH_CHECK_VALUE(x.size(1) == K, "int8_linear input must have ", K, " columns, got ",
                    shape_of(x));
  expect(scale, at::kFloat, 1, "int8_linear scale");
  expect_shape(scale, {N}, "int8_linear scale");
  if (bias.has_value()) {
    expect(*bias, at::kFloat, 1, "int8_linear bias");
    expect_shape(*bias, {N}, "int8_linear bias");
  }
}

void check_vectors(const at::Tensor& vectors) {
  expect(vectors, at::kFloat, 3, "interaction vectors");
  TORCH_CHECK_VALUE(vectors.size(2) > 0 && vectors.size(2) <= kMaxDim,
                    "interaction vectors: dim must be in [1, ", kMaxDim, "], got ",
                    vectors.size(2));
  TORCH_CHECK_VALUE(vectors.size(1) <= 4096, "interaction vectors: at most 4096 per sample, got ",
                    vectors.size(1));
}

namespace {

// Buffers a kernel reads and writes in one pass must not share bytes.
void expect_disjoint(const at::Tensor& a, const at::Tensor& b, const char* what) {
  const auto* a0 = static_cast<const char*>(a.data_ptr());
  const auto* b0 = static_cast<const char*>(b.data_ptr());
  const bool apart = a0 + a.nbytes() <= b0 || b0 + b.nbytes() <= a0;
  TORCH_CHECK_VALUE(a.nbytes() == 0 || b.nbytes() == 0 || apart, what);
}

}  // namespace

void check_serve_interaction(const at::Tensor& ids, const std::vector<TableView>& ts,
                             const at::Tensor& first, const at::Tensor& out, int64_t column) {
  const int64_t B = ids.size(0), N = ids.size(1) + 1, pairs = N * (N - 1) / 2;
  expect(first, at::kFloat, 2, "serve_interaction first vectors");
  const int64_t dim = ts.empty() ? first.size(1) : ts[0].dim;
  TORCH_CHECK_VALUE(first.size(0) == B && first.size(1) == dim && dim > 0 && dim <= kMaxDim,
                    "serve_interaction first vectors: float32[", B, ", ", dim,
                    "] expected, got ", shape_of(first));
  TORCH_CHECK_VALUE(N <= 4096, "serve_interaction: at most 4095 tables, got ", N - 1);
  expect(out, at::kFloat, 2, "serve_interaction out");
  TORCH_CHECK_VALUE(out.size(0) == B, "serve_interaction out: ", B, " samples expected, got ",
                    shape_of(out));
  TORCH_CHECK_VALUE(column >= 0 && column + pairs <= out.size(1), "serve_interaction out: ",
                    pairs, " pairs from column ", column, " do not fit in ", shape_of(out));
  expect_disjoint(out, first, "serve_interaction out must not share memory with first");
  expect_disjoint(out, ids, "serve_interaction out must not share memory with the ids");
}

}  // namespace sslrec
