// Compiled CPU kernels of ssl_rec.hardware: fused cache lookup + dequantize, cache
// prefetch with write-back, fused backward (per-row aggregation, optimizer, stochastic
// rounding) and the INT8/INT4 inference bag lookup. Every function mirrors
// ssl_rec/hardware/kernels/reference.py operation by operation (no FMA except in the
// inference lookup), so results are bit-identical to the reference.
#include <torch/extension.h>
#include <ATen/Parallel.h>
#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>

#include <algorithm>
#ifdef __AVX2__
#include <immintrin.h>
#endif
#include <cmath>
#include <cstring>
#include <vector>

#include "row_format.cpp"

namespace {

struct Cache {
  float* rows = nullptr;
  int16_t* tags = nullptr;
  uint8_t* state = nullptr;
  int64_t sets = 0;
  int64_t find(int64_t row) const {
    if (sets == 0) return -1;
    int64_t s = row % sets, q = row / sets;
    const int16_t* t = tags + s * kWays;
    for (int w = 0; w < kWays; ++w)
      if (t[w] == q) return s * kWays + w;
    return -1;
  }
};

Cache cache_of(const std::vector<torch::Tensor>& rows, const std::vector<torch::Tensor>& tags,
               const std::vector<torch::Tensor>* state, size_t i) {
  Cache c;
  c.sets = tags[i].size(0);
  if (c.sets > 0) {
    c.rows = rows[i].data_ptr<float>();
    c.tags = tags[i].data_ptr<int16_t>();
    if (state) c.state = (*state)[i].data_ptr<uint8_t>();
  }
  return c;
}

inline uint8_t* row_ptr(const torch::Tensor& store, int64_t row) {
  return static_cast<uint8_t*>(store.data_ptr()) + row * store.size(1) * store.element_size();
}

// Rows are gathered at random: ask for the lines of a row a few ids ahead so the DRAM
// latency overlaps the work on the current row (as FBGEMM's embedding kernels do).
constexpr int64_t kAhead = 8;
inline void prefetch_row(const uint8_t* p, int64_t bytes) {
  for (int64_t off = 0; off < bytes; off += 64) __builtin_prefetch(p + off);
}

}  // namespace

torch::Tensor forward(std::vector<torch::Tensor> stores, std::vector<torch::Tensor> cache_rows,
                      std::vector<torch::Tensor> cache_tags, torch::Tensor meta, torch::Tensor ids) {
  const int64_t B = ids.size(0), F = ids.size(1);
  auto m = meta.accessor<int64_t, 2>();
  const int64_t dim = F > 0 ? m[0][kDim] : 0;
  auto out = torch::empty({B, F, dim}, torch::kFloat32);
  std::vector<Cache> caches;
  for (int64_t f = 0; f < F; ++f) caches.push_back(cache_of(cache_rows, cache_tags, nullptr, f));
  const int64_t* idp = ids.data_ptr<int64_t>();
  float* op = out.data_ptr<float>();
  at::parallel_for(0, B * F, 1024, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) {
      int64_t f = i % F, row = idp[i];
      if (i + kAhead < end) {
        const int64_t fa = (i + kAhead) % F;
        prefetch_row(row_ptr(stores[fa], idp[i + kAhead]), stores[fa].size(1) * stores[fa].element_size());
      }
      float* o = op + i * dim;
      int64_t slot = caches[f].find(row);
      if (slot >= 0) {
        std::memcpy(o, caches[f].rows + slot * dim, dim * sizeof(float));
      } else {
        dequant_row(static_cast<int>(m[f][kKind]), row_ptr(stores[f], row), dim, o);
      }
    }
  });
  return out;
}

namespace {

inline uint8_t plru_touch(uint8_t bits, int way) {
  int node = 0;
  for (int level = 0; level < 3; ++level) {
    int right = (way >> (2 - level)) & 1;
    bits = static_cast<uint8_t>((bits & ~(1 << node)) | ((1 - right) << node));
    node = 2 * node + 1 + right;
  }
  return bits;
}
inline int plru_victim(uint8_t bits) {
  int node = 0, way = 0;
  for (int level = 0; level < 3; ++level) {
    int right = (bits >> node) & 1;
    way = (way << 1) | right;
    node = 2 * node + 1 + right;
  }
  return way;
}
inline void touch(Cache& c, int policy, int64_t s, int way, bool fresh) {
  if (policy == 0) {
    c.state[s] = plru_touch(c.state[s], way);
    return;
  }
  uint8_t* cnt = c.state + s * kWays;
  if (fresh) {
    cnt[way] = 1;
    return;
  }
  if (cnt[way] >= kLfuMax)
    for (int w = 0; w < kWays; ++w) cnt[w] = cnt[w] / 2;
  cnt[way] += 1;
}
inline int victim(const Cache& c, int policy, int64_t s) {
  const int16_t* t = c.tags + s * kWays;
  for (int w = 0; w < kWays; ++w)
    if (t[w] == -1) return w;
  if (policy == 0) return plru_victim(c.state[s]);
  const uint8_t* cnt = c.state + s * kWays;
  int best = 0;
  for (int w = 1; w < kWays; ++w)
    if (cnt[w] < cnt[best]) best = w;
  return best;
}

// A miss costs three random accesses: the new row in the store, the victim's cache row and
// the victim's store row (write-back). Predict them a few ids ahead and request the lines.
inline void prefetch_miss(const Cache& c, int policy, const torch::Tensor& store, int64_t row,
                          int64_t dim) {
  const int64_t s = row % c.sets;
  if (c.find(row) >= 0) return;
  const int64_t rbytes = store.size(1) * store.element_size();
  prefetch_row(row_ptr(store, row), rbytes);
  const int way = victim(c, policy, s);
  const int64_t tag = c.tags[s * kWays + way];
  if (tag < 0) return;
  prefetch_row(reinterpret_cast<const uint8_t*>(c.rows + (s * kWays + way) * dim), dim * 4);
  prefetch_row(row_ptr(store, tag * c.sets + s), rbytes);
}

}  // namespace

void prefetch(std::vector<torch::Tensor> stores, std::vector<torch::Tensor> cache_rows,
              std::vector<torch::Tensor> cache_tags, std::vector<torch::Tensor> cache_state,
              std::vector<torch::Tensor> stats, torch::Tensor meta, torch::Tensor ids, int64_t seed,
              int64_t step) {
  const int64_t B = ids.size(0), F = ids.size(1);
  auto m = meta.accessor<int64_t, 2>();
  const int64_t* idp = ids.data_ptr<int64_t>();
  at::parallel_for(0, F, 1, [&](int64_t fb, int64_t fe) {
    for (int64_t f = fb; f < fe; ++f) {
      Cache c = cache_of(cache_rows, cache_tags, &cache_state, f);
      if (c.sets == 0) continue;
      const int kind = static_cast<int>(m[f][kKind]), policy = static_cast<int>(m[f][kPolicy]);
      const bool sr = m[f][kStochastic] != 0;
      const int64_t dim = m[f][kDim], offset = m[f][kRowOffset];
      const uint32_t key = stream_key(seed, m[f][kStream], 1, step);
      int64_t* st = stats[f].data_ptr<int64_t>();
      for (int64_t b = 0; b < B; ++b) {
        int64_t row = idp[b * F + f], s = row % c.sets, q = row / c.sets;
        if (b + kAhead < B) prefetch_miss(c, policy, stores[f], idp[(b + kAhead) * F + f], dim);
        int64_t slot = c.find(row);
        if (slot >= 0) {
          st[0] += 1;
          touch(c, policy, s, static_cast<int>(slot % kWays), false);
          continue;
        }
        st[1] += 1;
        int way = victim(c, policy, s);
        slot = s * kWays + way;
        float* crow = c.rows + slot * dim;
        if (c.tags[slot] != -1) {
          int64_t old = static_cast<int64_t>(c.tags[slot]) * c.sets + s;
          quant_row(kind, crow, dim, row_ptr(stores[f], old), sr, row_key(key, old + offset));
          st[2] += 1;
        }
        dequant_row(kind, row_ptr(stores[f], row), dim, crow);
        c.tags[slot] = static_cast<int16_t>(q);
        touch(c, policy, s, way, true);
      }
    }
  });
}

namespace {

void update_table(const torch::Tensor& store, Cache c, float* mom, int64_t* st,
                  at::TensorAccessor<int64_t, 1> m, float lr, float eps, const int64_t* idp,
                  const float* gp, int64_t B, int64_t F, int64_t f, int64_t seed, int64_t step) {
  const int kind = static_cast<int>(m[kKind]);
  const int64_t dim = m[kDim], offset = m[kRowOffset];
  const bool sr = m[kStochastic] != 0, adagrad = m[kOptimizer] == 1;
  const uint32_t key = stream_key(seed, m[kStream], 0, step);
  std::vector<int64_t> keys(B);
  for (int64_t b = 0; b < B; ++b) keys[b] = idp[b * F + f] * B + b;
  std::sort(keys.begin(), keys.end());
  std::vector<float> acc(dim), w(dim);
  const int64_t rbytes = store.size(1) * store.element_size();
  for (int64_t i = 0; i < B;) {
    const int64_t row = keys[i] / B;
    if (i + kAhead < B) {
      const int64_t ahead = keys[i + kAhead] / B;
      prefetch_row(row_ptr(store, ahead), rbytes);
      if (c.sets) __builtin_prefetch(c.tags + (ahead % c.sets) * kWays);
    }
    std::fill(acc.begin(), acc.end(), 0.0f);
    for (; i < B && keys[i] / B == row; ++i) {
      const float* g = gp + ((keys[i] % B) * F + f) * dim;
      for (int64_t d = 0; d < dim; ++d) acc[d] = acc[d] + g[d];
    }
    float mult = lr;
    if (adagrad) {
      float sumsq = 0.0f;
      for (int64_t d = 0; d < dim; ++d) sumsq = sumsq + acc[d] * acc[d];
      float mo = mom[row] + sumsq / static_cast<float>(dim);
      mom[row] = mo;
      mult = lr / (std::sqrt(mo) + eps);
    }
    int64_t slot = c.find(row);
    if (slot >= 0) {
      float* crow = c.rows + slot * dim;
      for (int64_t d = 0; d < dim; ++d) crow[d] = crow[d] - mult * acc[d];
      continue;
    }
    uint8_t* srow = row_ptr(store, row);
    dequant_row(kind, srow, dim, w.data());
    for (int64_t d = 0; d < dim; ++d) w[d] = w[d] - mult * acc[d];
    quant_row(kind, w.data(), dim, srow, sr, row_key(key, row + offset));
    st[3] += 1;
  }
}

}  // namespace

void update(std::vector<torch::Tensor> stores, std::vector<torch::Tensor> cache_rows,
            std::vector<torch::Tensor> cache_tags, std::vector<torch::Tensor> stats,
            std::vector<torch::Tensor> momentum, torch::Tensor meta, torch::Tensor hparams,
            torch::Tensor ids, torch::Tensor grad, int64_t seed, int64_t step) {
  const int64_t B = ids.size(0), F = ids.size(1);
  auto m = meta.accessor<int64_t, 2>();
  auto h = hparams.accessor<float, 2>();
  const int64_t* idp = ids.data_ptr<int64_t>();
  const float* gp = grad.data_ptr<float>();
  at::parallel_for(0, F, 1, [&](int64_t fb, int64_t fe) {
    for (int64_t f = fb; f < fe; ++f) {
      Cache c = cache_of(cache_rows, cache_tags, nullptr, f);
      float* mom = momentum[f].numel() ? momentum[f].data_ptr<float>() : nullptr;
      update_table(stores[f], c, mom, stats[f].data_ptr<int64_t>(), m[f], h[f][0], h[f][1], idp,
                   gp, B, F, f, seed, step);
    }
  });
}

namespace {

// One 4-bit row: a[d] += scale * q[d] (low nibble = even column). With AVX2, 16 bytes are
// split into nibbles and re-interleaved in registers, 8 columns per FMA.
inline void accumulate_int4(const uint8_t* __restrict row, int64_t nb, float scale,
                            float* __restrict a) {
  int64_t j = 0;
#ifdef __AVX2__
  const __m256 vs = _mm256_set1_ps(scale);
  const __m128i mask = _mm_set1_epi8(0x0F);
  for (; j + 16 <= nb; j += 16) {
    const __m128i v = _mm_loadu_si128(reinterpret_cast<const __m128i*>(row + j));
    const __m128i lo = _mm_and_si128(v, mask);
    const __m128i hi = _mm_and_si128(_mm_srli_epi16(v, 4), mask);
    const __m128i parts[2] = {_mm_unpacklo_epi8(lo, hi), _mm_unpackhi_epi8(lo, hi)};
    for (int p = 0; p < 2; ++p) {
      for (int h = 0; h < 2; ++h) {
        const __m128i bytes = h ? _mm_srli_si128(parts[p], 8) : parts[p];
        const __m256 q = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(bytes));
        float* dst = a + 2 * j + 16 * p + 8 * h;
        _mm256_storeu_ps(dst, _mm256_fmadd_ps(vs, q, _mm256_loadu_ps(dst)));
      }
    }
  }
#endif
  for (; j < nb; ++j) {
    a[2 * j] = std::fma(scale, static_cast<float>(row[j] & 15), a[2 * j]);
    a[2 * j + 1] = std::fma(scale, static_cast<float>(row[j] >> 4), a[2 * j + 1]);
  }
}

inline void accumulate_row(const uint8_t* __restrict row, int64_t bits, int64_t nb, int64_t dim,
                           float* __restrict a, float& bias_sum) {
  float scale, bias;
  if (bits == 8) {
    std::memcpy(&scale, row + nb, 4);
    std::memcpy(&bias, row + nb + 4, 4);
    for (int64_t d = 0; d < dim; ++d) a[d] = std::fma(scale, static_cast<float>(row[d]), a[d]);
  } else {
    uint16_t sb[2];
    std::memcpy(sb, row + nb, 4);
    scale = h2f(sb[0]);
    bias = h2f(sb[1]);
    accumulate_int4(row, nb, scale, a);
  }
  bias_sum += bias;
}

}  // namespace

torch::Tensor bag_lookup(torch::Tensor store, int64_t bits, torch::Tensor indices,
                         torch::Tensor offsets, int64_t dim) {
  const int64_t nbags = offsets.numel() - 1, rb = store.size(1);
  const int64_t nb = data_bytes(static_cast<int>(bits), dim);
  auto out = torch::empty({nbags, dim}, torch::kFloat32);
  const int64_t* ix = indices.data_ptr<int64_t>();
  const int64_t* off = offsets.data_ptr<int64_t>();
  const uint8_t* base = store.data_ptr<uint8_t>();
  float* op = out.data_ptr<float>();
  at::parallel_for(0, nbags, 64, [&](int64_t begin, int64_t end) {
    for (int64_t b = begin; b < end; ++b) {
      float* o = op + b * dim;
      std::fill(o, o + dim, 0.0f);
      float bias_sum = 0.0f;
      for (int64_t i = off[b]; i < off[b + 1]; ++i) {
        if (i + kAhead < off[end]) prefetch_row(base + ix[i + kAhead] * rb, rb);
        accumulate_row(base + ix[i] * rb, bits, nb, dim, o, bias_sum);
      }
      for (int64_t d = 0; d < dim; ++d) o[d] += bias_sum;
    }
  });
  return out;
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("forward", &forward, "fused cache lookup + dequantize over all tables");
  m.def("prefetch", &prefetch, "admit rows into the caches, write evicted rows back");
  m.def("update", &update, "fused backward: aggregate, optimizer step, cache/store write");
  m.def("bag_lookup", &bag_lookup, "INT8/INT4 sum-pooled inference lookup");
}
