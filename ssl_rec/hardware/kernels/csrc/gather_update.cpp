// Lookup of an admitted batch (gather), the fused backward (update), the eval lookup and
// the inference bag lookup: validation, then the work spread over the intra-op threads by
// table, unique-row chunk or sample range. Every task owns its outputs, so results do not
// depend on the number of threads.
#include <algorithm>

#include "ops.h"
#include "profile.h"

namespace sslrec {

namespace {

std::vector<int64_t> iota(int64_t n) {
  std::vector<int64_t> v(n);
  for (int64_t i = 0; i < n; ++i) v[i] = i;
  return v;
}

int64_t sample_grain(int64_t B) {
  return std::max<int64_t>(32, B / (4 * std::max<int64_t>(1, at::get_num_threads())));
}

// Samples of table f grouped by unique row, in sample order (counting sort of inverse).
void group_samples(const int32_t* inverse, int64_t B, int64_t U, std::vector<int32_t>& start,
                   std::vector<int32_t>& order) {
  start.assign(U + 1, 0);
  order.resize(B);
  for (int64_t b = 0; b < B; ++b) ++start[inverse[b] + 1];
  for (int64_t u = 0; u < U; ++u) start[u + 1] += start[u];
  std::vector<int32_t> next(start.begin(), start.end() - 1);
  for (int64_t b = 0; b < B; ++b) order[next[inverse[b]]++] = static_cast<int32_t>(b);
}

}  // namespace

at::Tensor gather(const std::vector<TableView>& ts, const Plan& p) {
  PhaseTimer timer(kGather);
  check_plan(p, ts, "plan");
  const int64_t F = static_cast<int64_t>(ts.size()), B = p.inverse.size(1);
  const int64_t dim = F ? ts[0].dim : 0;
  auto out = at::empty({B, F, dim}, at::kFloat);
  const int64_t* nu = p.num_unique.data_ptr<int64_t>();
  const int32_t* slots = p.slots.data_ptr<int32_t>();
  std::vector<std::vector<const uint8_t*>> src(F);
  std::vector<const uint8_t* const*> src_of(F);
  for (int64_t f = 0; f < F; ++f) {
    src[f].resize(nu[f]);
    src_of[f] = src[f].data();
  }
  run_tasks(F, iota(F), true, [&](int64_t f) {
    variant().sources(ts[f], p.rows.data_ptr<int64_t>() + f * B, slots + f * B, nu[f],
                      src[f].data());
  });
  const int32_t* inv = p.inverse.data_ptr<int32_t>();
  float* op = out.data_ptr<float>();
  at::parallel_for(0, B, sample_grain(B), [&](int64_t b0, int64_t b1) {
    variant().gather(ts.data(), src_of.data(), slots, inv, B, F, b0, b1, op);
  });
  return out;
}

void update(const std::vector<TableView>& ts, const Plan& p, const at::Tensor& grad,
            int64_t seed, int64_t step, bool slots_current) {
  check_plan(p, ts, "plan");
  check_grad(grad, p, ts);
  const int64_t F = static_cast<int64_t>(ts.size()), B = p.inverse.size(1);
  const int64_t* nu = p.num_unique.data_ptr<int64_t>();
  const int32_t* inv = p.inverse.data_ptr<int32_t>();
  std::vector<std::vector<int32_t>> start(F), order(F);
  {
    PhaseTimer timer(kGroup);
    run_tasks(F, iota(F), true,
              [&](int64_t f) { group_samples(inv + f * B, B, nu[f], start[f], order[f]); });
  }
  PhaseTimer timer(kUpdate);
  // Chunks of unique rows: distinct rows, so chunks of one table run on any thread.
  constexpr int64_t kChunk = 256;
  std::vector<int64_t> chunk_table, chunk_begin;
  for (int64_t f = 0; f < F; ++f)
    for (int64_t u = 0; u < nu[f]; u += kChunk) {
      chunk_table.push_back(f);
      chunk_begin.push_back(u);
    }
  const int64_t n = static_cast<int64_t>(chunk_table.size());
  const float* gp = grad.data_ptr<float>();
  run_tasks(n, iota(n), true, [&](int64_t c) {
    const int64_t f = chunk_table[c], u0 = chunk_begin[c], u1 = std::min(u0 + kChunk, nu[f]);
    const TableView& t = ts[f];
    const uint32_t key = stream_key(seed, t.stream, kPurposeUpdate, step);
    const int64_t writes =
        variant().update(t, p.rows.data_ptr<int64_t>() + f * B, p.slots.data_ptr<int32_t>() + f * B,
                         Groups{start[f].data(), order[f].data()}, gp, F, f, u0, u1, key,
                         slots_current);
    __atomic_fetch_add(t.stats + 3, writes, __ATOMIC_RELAXED);
  });
}

at::Tensor lookup(const std::vector<TableView>& ts, const at::Tensor& ids) {
  check_ids(ids, ts);
  const int64_t B = ids.size(0), F = ids.size(1), dim = F ? ts[0].dim : 0;
  auto out = at::empty({B, F, dim}, at::kFloat);
  const int64_t* idp = ids.data_ptr<int64_t>();
  float* op = out.data_ptr<float>();
  at::parallel_for(0, B, sample_grain(B), [&](int64_t b0, int64_t b1) {
    variant().lookup(ts.data(), idp, F, b0, b1, op);
  });
  return out;
}

at::Tensor bag_lookup(const at::Tensor& store, int64_t bits, const at::Tensor& indices,
                      const at::Tensor& offsets, int64_t dim) {
  check_bag(store, bits, indices, offsets, dim);
  const int64_t nbags = offsets.numel() - 1, rb = store.size(1);
  auto out = at::empty({nbags, dim}, at::kFloat);
  const int64_t* ix = indices.data_ptr<int64_t>();
  const int64_t* off = offsets.data_ptr<int64_t>();
  const uint8_t* base = store.data_ptr<uint8_t>();
  float* op = out.data_ptr<float>();
  const Variant& v = variant();
  // One thread (or a small batch): run inline, no parallel-region setup.
  if (at::get_num_threads() == 1 || nbags < 256) {
    v.bag(static_cast<int>(bits), base, rb, dim, ix, off, 0, nbags, op);
  } else {
    at::parallel_for(0, nbags, 256, [&](int64_t b0, int64_t b1) {
      v.bag(static_cast<int>(bits), base, rb, dim, ix, off, b0, b1, op);
    });
  }
  return out;
}

namespace {

// The serving checks: ids in range, no cache.
void check_serve(const std::vector<TableView>& ts, const at::Tensor& ids) {
  check_ids(ids, ts);
  for (size_t f = 0; f < ts.size(); ++f)
    TORCH_CHECK_VALUE(ts[f].sets == 0, "serve_lookup: table ", f, " has a cache");
}

void serve_rows_into(const std::vector<TableView>& ts, const at::Tensor& ids, float* out,
                     int64_t out_stride) {
  const int64_t B = ids.size(0), F = ids.size(1);
  const int64_t* idp = ids.data_ptr<int64_t>();
  at::parallel_for(0, B, sample_grain(B), [&](int64_t b0, int64_t b1) {
    variant().serve_rows(ts.data(), idp, F, b0, b1, out, out_stride);
  });
}

}  // namespace

at::Tensor serve_lookup(const std::vector<TableView>& ts, const at::Tensor& ids) {
  check_serve(ts, ids);
  const int64_t B = ids.size(0), F = ids.size(1), dim = F ? ts[0].dim : 0;
  auto out = at::empty({B, F, dim}, at::kFloat);
  serve_rows_into(ts, ids, out.data_ptr<float>(), F * dim);
  return out;
}

void serve_interaction(const std::vector<TableView>& ts, const at::Tensor& ids,
                       const at::Tensor& first, const at::Tensor& out, int64_t column) {
  check_serve(ts, ids);
  check_serve_interaction(ids, ts, first, out, column);
  const int64_t B = ids.size(0), F = ids.size(1), N = F + 1, dim = first.size(1);
  if (B == 0 || N < 2) return;
  const int64_t stride = out.size(1), np = (N + 15) / 16 * 16;
  // Samples per chunk: their vectors stay in the L2 cache between lookup and products.
  const int64_t chunk = std::clamp<int64_t>(kServeChunkBytes / (N * dim * 4), 1, 64);
  const int64_t* idp = ids.data_ptr<int64_t>();
  const float* fp = first.data_ptr<float>();
  float* op = out.data_ptr<float>() + column;
  const Variant& v = variant();
  at::parallel_for(0, B, sample_grain(B), [&](int64_t b0, int64_t b1) {
    std::vector<float> vectors(chunk * N * dim), scratch(kInteractScratch * dim * np);
    for (int64_t c0 = b0; c0 < b1; c0 += chunk) {
      const int64_t n = std::min(chunk, b1 - c0);
      for (int64_t b = 0; b < n; ++b)
        std::memcpy(vectors.data() + b * N * dim, fp + (c0 + b) * dim, dim * sizeof(float));
      v.serve_rows(ts.data(), idp + c0 * F, F, 0, n, vectors.data() + dim, N * dim);
      v.interact(vectors.data(), N, dim, 0, n, scratch.data(), op + c0 * stride, stride);
    }
  });
}

at::Tensor interaction(const at::Tensor& vectors) {
  check_vectors(vectors);
  const int64_t B = vectors.size(0), N = vectors.size(1), dim = vectors.size(2);
  const int64_t pairs = N * (N - 1) / 2;
  auto out = at::empty({B, pairs}, at::kFloat);
  if (B == 0 || N < 2) return out;
  const float* vp = vectors.data_ptr<float>();
  float* op = out.data_ptr<float>();
  const int64_t scratch = kInteractScratch * dim * ((N + 15) / 16 * 16);
  at::parallel_for(0, B, sample_grain(B), [&](int64_t b0, int64_t b1) {
    std::vector<float> buffer(scratch);
    variant().interact(vp, N, dim, b0, b1, buffer.data(), op, pairs);
  });
  return out;
}

at::Tensor int8_linear(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& scale,
                       const c10::optional<at::Tensor>& bias, bool relu) {
  check_int8_linear(x, weight, scale, bias);
  const int64_t R = x.size(0), N = weight.size(0), K = weight.size(1);
  auto out = at::empty({R, N}, at::kFloat);
  if (R == 0 || N == 0) return out;
  const float* xp = x.data_ptr<float>();
  const int8_t* wp = weight.data_ptr<int8_t>();
  const float* sp = scale.data_ptr<float>();
  const float* bp = bias.has_value() ? bias->data_ptr<float>() : nullptr;
  float* op = out.data_ptr<float>();
  // threads split the outputs; a call under ~64k multiply-adds a thread stays on one
  const int64_t grain = std::max<int64_t>(16, (1 << 16) / std::max<int64_t>(1, R * K));
  at::parallel_for(0, N, grain, [&](int64_t n0, int64_t n1) {
    variant().int8_linear(xp, R, K, wp, sp, bp, n0, n1, relu, op, N);
  });
  return out;
}

}  // namespace sslrec
