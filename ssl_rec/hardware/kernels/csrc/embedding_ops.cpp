// Compiled CPU kernels of ssl_rec.hardware: fused cache lookup + dequantize, fused
// training forward (cache admission with write-back), fused backward (per-row aggregation, optimizer, stochastic
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

// A hit reads the cache row; a miss costs three random accesses: the new row in the store, the victim's cache row and
// the victim's store row (write-back). Predict them a few ids ahead and request the lines.
inline void prefetch_miss(const Cache& c, int policy, const torch::Tensor& store, int64_t row,
                          int64_t dim) {
  const int64_t s = row % c.sets;
  const int64_t hit = c.find(row);
  if (hit >= 0) {
    prefetch_row(reinterpret_cast<const uint8_t*>(c.rows + hit * dim), dim * 4);
    return;
  }
  const int64_t rbytes = store.size(1) * store.element_size();
  prefetch_row(row_ptr(store, row), rbytes);
  const int way = victim(c, policy, s);
  const int64_t tag = c.tags[s * kWays + way];
  if (tag < 0) return;
  prefetch_row(reinterpret_cast<const uint8_t*>(c.rows + (s * kWays + way) * dim), dim * 4);
  prefetch_row(row_ptr(store, tag * c.sets + s), rbytes);
}

}  // namespace

namespace {

// One (sample, table) of the fused training forward: admit `row` (hit: touch; miss: evict
// the victim with SR write-back, load the row), copy its FP32 value to `o`, return the slot.
inline int64_t admit_row(Cache& c, int kind, int policy, bool sr, int64_t dim, int64_t offset,
                         int64_t stride, uint32_t key, const torch::Tensor& store, int64_t* st, int64_t row,
                         float* o) {
  const int64_t s = row % c.sets, q = row / c.sets;
  int64_t slot = c.find(row);
  if (slot >= 0) {
    st[0] += 1;
    touch(c, policy, s, static_cast<int>(slot % kWays), false);
  } else {
    st[1] += 1;
    const int way = victim(c, policy, s);
    slot = s * kWays + way;
    float* crow = c.rows + slot * dim;
    if (c.tags[slot] != -1) {
      const int64_t old = static_cast<int64_t>(c.tags[slot]) * c.sets + s;
      quant_row(kind, crow, dim, row_ptr(store, old), sr, row_key(key, offset + old * stride));
      st[2] += 1;
    }
    dequant_row(kind, row_ptr(store, row), dim, crow);
    c.tags[slot] = static_cast<int16_t>(q);
    touch(c, policy, s, way, true);
  }
  std::memcpy(o, c.rows + slot * dim, dim * sizeof(float));
  return slot;
}

// Everything train_forward needs about one table, read once per call.
struct TrainTable {
  Cache c;
  const torch::Tensor* store;
  uint8_t* base;
  int64_t rbytes, dim, offset, stride;  // global row = offset + local row * stride
  int kind, policy;
  bool sr;
  uint32_t key;
  int64_t* st;
};

inline void prefetch_admit(const TrainTable& t, int64_t row) {
  if (t.c.sets == 0) {
    prefetch_row(t.base + row * t.rbytes, t.rbytes);
    return;
  }
  prefetch_miss(t.c, t.policy, *t.store, row, t.dim);
}

// One (sample, table): admit and copy the value to `o`; returns the slot (-1: uncached).
inline int32_t admit_one(TrainTable& t, int64_t row, float* o) {
  if (t.c.sets == 0) {
    dequant_row(t.kind, t.base + row * t.rbytes, t.dim, o);
    return -1;
  }
  return static_cast<int32_t>(
      admit_row(t.c, t.kind, t.policy, t.sr, t.dim, t.offset, t.stride, t.key, *t.store, t.st, row, o));
}

// Training forward of tables [fb, fe): sample-major, so the output is written in order;
// each table's ids are still admitted in sample order (tables are independent).
void train_forward_range(std::vector<TrainTable>& ts, const int64_t* idp, int64_t B, int64_t F,
                         int64_t fb, int64_t fe, float* op, int32_t* slots) {
  const int64_t nf = fe - fb, dim = ts[fb].dim;
  int64_t ab = kAhead / nf, af = fb + kAhead % nf;  // the (sample, table) kAhead items on
  for (int64_t b = 0; b < B; ++b) {
    for (int64_t f = fb; f < fe; ++f) {
      if (ab < B) prefetch_admit(ts[af], idp[ab * F + af]);
      if (++af == fe) {
        af = fb;
        ++ab;
      }
      slots[b * F + f] = admit_one(ts[f], idp[b * F + f], op + (b * F + f) * dim);
    }
  }
}

}  // namespace

// Fused training forward over all tables: cache admission and `forward` in one pass, each output
// being the row's value right after its admission. Returns (float32[B, F, D] values,
// int32[B, F] cache slots, -1 for uncached tables) — the slots are backward's hints.
std::vector<torch::Tensor> train_forward(
    std::vector<torch::Tensor> stores, std::vector<torch::Tensor> cache_rows,
    std::vector<torch::Tensor> cache_tags, std::vector<torch::Tensor> cache_state,
    std::vector<torch::Tensor> stats, torch::Tensor meta, torch::Tensor ids, int64_t seed,
    int64_t step) {
  const int64_t B = ids.size(0), F = ids.size(1);
  auto m = meta.accessor<int64_t, 2>();
  const int64_t dim = F > 0 ? m[0][kDim] : 0;
  auto out = torch::empty({B, F, dim}, torch::kFloat32);
  auto slots = torch::empty({B, F}, torch::kInt32);
  const int64_t* idp = ids.data_ptr<int64_t>();
  float* op = out.data_ptr<float>();
  int32_t* sp = slots.data_ptr<int32_t>();
  std::vector<TrainTable> ts(F);
  for (int64_t f = 0; f < F; ++f) {
    TrainTable& t = ts[f];
    t.c = cache_of(cache_rows, cache_tags, &cache_state, f);
    t.store = &stores[f];
    t.base = static_cast<uint8_t*>(stores[f].data_ptr());
    t.rbytes = stores[f].size(1) * stores[f].element_size();
    t.dim = m[f][kDim];
    t.offset = m[f][kRowOffset];
    t.stride = m[f][kRowStride];
    t.kind = static_cast<int>(m[f][kKind]);
    t.policy = static_cast<int>(m[f][kPolicy]);
    t.sr = m[f][kStochastic] != 0;
    t.key = stream_key(seed, m[f][kStream], 1, step);
    t.st = stats[f].data_ptr<int64_t>();
  }
  at::parallel_for(0, F, 1, [&](int64_t fb, int64_t fe) {
    train_forward_range(ts, idp, B, F, fb, fe, op, sp);
  });
  return {out, slots};
}

namespace {

constexpr int64_t kGradAhead = 16;

// Per-thread scratch of the fused backward, grown on demand and reused across calls.
struct UpdateScratch {
  std::vector<int64_t> keys;   // open-addressing table of rows, -1 = empty
  std::vector<int32_t> value;  // unique index of each occupied position
  std::vector<int64_t> rows, pos;
  std::vector<int32_t> hint;
  std::vector<float> acc;
};

// Unique rows of table f in first-occurrence order with their gradients summed in sample
// order (acc[u] = 0 + g_first + g_second + ..., as the reference). Returns U.
int64_t aggregate(UpdateScratch& w, const int64_t* idp, const int32_t* slots, const float* gp,
                  int64_t B, int64_t F, int64_t f, int64_t dim) {
  int64_t cap = 16;
  while (cap < 2 * B) cap <<= 1;
  if (static_cast<int64_t>(w.keys.size()) < cap) {
    w.keys.assign(cap, -1);
    w.value.resize(cap);
  }
  if (static_cast<int64_t>(w.rows.size()) < B) {
    w.rows.resize(B);
    w.pos.resize(B);
    w.hint.resize(B);
  }
  if (static_cast<int64_t>(w.acc.size()) < B * dim) w.acc.resize(B * dim);
  const uint64_t mask = static_cast<uint64_t>(cap - 1);
  int shift = 64;
  for (int64_t c = cap; c > 1; c >>= 1) --shift;
  int64_t U = 0;
  for (int64_t b = 0; b < B; ++b) {
    // The gradient is read table by table, a 4*D-byte piece every 4*F*D bytes: a stride
    // the hardware prefetcher does not follow across pages, so request it ahead.
    if (b + kGradAhead < B)
      prefetch_row(reinterpret_cast<const uint8_t*>(gp + ((b + kGradAhead) * F + f) * dim),
                   dim * 4);
    const int64_t row = idp[b * F + f];
    uint64_t h = (static_cast<uint64_t>(row) * 0x9E3779B97F4A7C15ull) >> shift;
    while (w.keys[h] != -1 && w.keys[h] != row) h = (h + 1) & mask;
    const float* g = gp + (b * F + f) * dim;
    if (w.keys[h] == -1) {
      w.keys[h] = row;
      w.value[h] = static_cast<int32_t>(U);
      w.rows[U] = row;
      w.pos[U] = static_cast<int64_t>(h);
      w.hint[U] = slots ? slots[b * F + f] : -1;
      float* a = w.acc.data() + U * dim;
      for (int64_t d = 0; d < dim; ++d) a[d] = 0.0f + g[d];
      ++U;
      continue;
    }
    float* a = w.acc.data() + static_cast<int64_t>(w.value[h]) * dim;
    for (int64_t d = 0; d < dim; ++d) a[d] = a[d] + g[d];
  }
  for (int64_t u = 0; u < U; ++u) w.keys[w.pos[u]] = -1;  // leave the table empty
  return U;
}

// Slot of `row` now: the forward's slot when it still holds the row, else a search.
inline int64_t current_slot(const Cache& c, int64_t row, int32_t hint) {
  if (c.sets == 0) return -1;
  if (hint >= 0 && c.tags[hint] == row / c.sets) return hint;
  return c.find(row);
}

void update_table(const torch::Tensor& store, Cache c, float* mom, int64_t* st,
                  at::TensorAccessor<int64_t, 1> m, float lr, float eps, const int64_t* idp,
                  const int32_t* slots, const float* gp, int64_t B, int64_t F, int64_t f,
                  int64_t seed, int64_t step) {
  static thread_local UpdateScratch w;
  const int kind = static_cast<int>(m[kKind]);
  const int64_t dim = m[kDim], offset = m[kRowOffset], stride = m[kRowStride];
  const bool sr = m[kStochastic] != 0, adagrad = m[kOptimizer] == 1;
  const uint32_t key = stream_key(seed, m[kStream], 0, step);
  const int64_t U = aggregate(w, idp, slots, gp, B, F, f, dim);
  alignas(64) float tmp[kMaxDim];
  const int64_t rbytes = store.size(1) * store.element_size();
  for (int64_t u = 0; u < U; ++u) {
    const int64_t row = w.rows[u];
    if (u + kAhead < U) {
      const int64_t ahead = w.rows[u + kAhead];
      const int32_t hint = w.hint[u + kAhead];
      if (hint >= 0) {
        prefetch_row(reinterpret_cast<const uint8_t*>(c.rows + hint * dim), dim * 4);
      } else {
        prefetch_row(row_ptr(store, ahead), rbytes);
      }
      if (mom) __builtin_prefetch(mom + ahead);
    }
    const float* acc = w.acc.data() + u * dim;
    float mult = lr;
    if (adagrad) {
      float sumsq = 0.0f;
      for (int64_t d = 0; d < dim; ++d) sumsq = sumsq + acc[d] * acc[d];
      float mo = mom[row] + sumsq / static_cast<float>(dim);
      mom[row] = mo;
      mult = lr / (std::sqrt(mo) + eps);
    }
    const int64_t slot = current_slot(c, row, w.hint[u]);
    if (slot >= 0) {
      float* crow = c.rows + slot * dim;
      for (int64_t d = 0; d < dim; ++d) crow[d] = crow[d] - mult * acc[d];
      continue;
    }
    uint8_t* srow = row_ptr(store, row);
    if (kind == kFp32) {
      float* frow = reinterpret_cast<float*>(srow);
      for (int64_t d = 0; d < dim; ++d) frow[d] = frow[d] - mult * acc[d];
    } else {
      dequant_row(kind, srow, dim, tmp);
      for (int64_t d = 0; d < dim; ++d) tmp[d] = tmp[d] - mult * acc[d];
      quant_row(kind, tmp, dim, srow, sr, row_key(key, offset + row * stride));
    }
    st[3] += 1;
  }
}

}  // namespace

// Fused backward over all tables. `slots` is train_forward's int32[B, F] (hints only; an
// empty tensor means "search the cache"): results do not depend on it.
void update(std::vector<torch::Tensor> stores, std::vector<torch::Tensor> cache_rows,
            std::vector<torch::Tensor> cache_tags, std::vector<torch::Tensor> stats,
            std::vector<torch::Tensor> momentum, torch::Tensor meta, torch::Tensor hparams,
            torch::Tensor ids, torch::Tensor grad, torch::Tensor slots, int64_t seed,
            int64_t step) {
  const int64_t B = ids.size(0), F = ids.size(1);
  auto m = meta.accessor<int64_t, 2>();
  auto h = hparams.accessor<float, 2>();
  const int64_t* idp = ids.data_ptr<int64_t>();
  const float* gp = grad.data_ptr<float>();
  const int32_t* sp = slots.numel() == B * F && B * F > 0 ? slots.data_ptr<int32_t>() : nullptr;
  at::parallel_for(0, F, 1, [&](int64_t fb, int64_t fe) {
    for (int64_t f = fb; f < fe; ++f) {
      Cache c = cache_of(cache_rows, cache_tags, nullptr, f);
      float* mom = momentum[f].numel() ? momentum[f].data_ptr<float>() : nullptr;
      update_table(stores[f], c, mom, stats[f].data_ptr<int64_t>(), m[f], h[f][0], h[f][1], idp,
                   sp, gp, B, F, f, seed, step);
    }
  });
}

namespace {

// One quantized row added to a bag: a[d] = scale * q[d] + (bias + a[d]), or
// scale * q[d] + bias for the bag's first row (no zero fill, no separate bias pass).
// With AVX2, 8 columns per FMA; 4-bit bytes are split into nibbles (low = even column) and
// re-interleaved in registers.
#ifdef __AVX2__
inline __m256 bag_base(const float* a, __m256 vb, bool first) {
  return first ? vb : _mm256_add_ps(vb, _mm256_loadu_ps(a));
}
#endif

inline void add_int8_row(const uint8_t* __restrict row, int64_t dim, float scale, float bias,
                         float* __restrict a, bool first) {
  int64_t d = 0;
#ifdef __AVX2__
  const __m256 vs = _mm256_set1_ps(scale), vb = _mm256_set1_ps(bias);
  for (; d + 8 <= dim; d += 8) {
    const __m128i bytes = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(row + d));
    const __m256 q = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(bytes));
    _mm256_storeu_ps(a + d, _mm256_fmadd_ps(vs, q, bag_base(a + d, vb, first)));
  }
#endif
  for (; d < dim; ++d)
    a[d] = std::fma(scale, static_cast<float>(row[d]), first ? bias : bias + a[d]);
}

inline void add_int4_row(const uint8_t* __restrict row, int64_t nb, float scale, float bias,
                         float* __restrict a, bool first) {
  int64_t j = 0;
#ifdef __AVX2__
  const __m256 vs = _mm256_set1_ps(scale), vb = _mm256_set1_ps(bias);
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
        _mm256_storeu_ps(dst, _mm256_fmadd_ps(vs, q, bag_base(dst, vb, first)));
      }
    }
  }
#endif
  for (; j < nb; ++j) {
    for (int k = 0; k < 2; ++k) {
      const float q = static_cast<float>(k ? row[j] >> 4 : row[j] & 15);
      a[2 * j + k] = std::fma(scale, q, first ? bias : bias + a[2 * j + k]);
    }
  }
}

template <int Bits>
inline void add_row(const uint8_t* row, int64_t nb, int64_t dim, float* a, bool first) {
  float scale, bias;
  if (Bits == 8) {
    std::memcpy(&scale, row + nb, 4);
    std::memcpy(&bias, row + nb + 4, 4);
    add_int8_row(row, dim, scale, bias, a, first);
  } else {
    uint16_t sb[2];
    std::memcpy(sb, row + nb, 4);
    add_int4_row(row, nb, h2f(sb[0]), h2f(sb[1]), a, first);
  }
}

// Bags [begin, end): rows are prefetched kBagAhead indices ahead (both lines a row may
// span); the per-row work is short, so the distance is longer than the training kernels'.
constexpr int64_t kBagAhead = 16;
template <int Bits>
void bag_range(const uint8_t* base, int64_t rb, int64_t nb, int64_t dim, const int64_t* ix,
               const int64_t* off, int64_t begin, int64_t end, float* op) {
  const int64_t last = off[end];
  for (int64_t b = begin; b < end; ++b) {
    float* o = op + b * dim;
    if (off[b] == off[b + 1]) std::fill(o, o + dim, 0.0f);
    for (int64_t i = off[b]; i < off[b + 1]; ++i) {
      if (i + kBagAhead < last) {
        const uint8_t* p = base + ix[i + kBagAhead] * rb;
        __builtin_prefetch(p);
        __builtin_prefetch(p + rb - 1);
      }
      add_row<Bits>(base + ix[i] * rb, nb, dim, o, i == off[b]);
    }
  }
}

}  // namespace

torch::Tensor bag_lookup(torch::Tensor store, int64_t bits, torch::Tensor indices,
                         torch::Tensor offsets, int64_t dim) {
  TORCH_CHECK(bits == 8 || bits == 4, "bag_lookup: bits must be 8 or 4, got ", bits);
  const int64_t nbags = offsets.numel() - 1, rb = store.size(1);
  const int64_t nb = data_bytes(static_cast<int>(bits), dim);
  auto out = torch::empty({nbags, dim}, torch::kFloat32);
  const int64_t* ix = indices.data_ptr<int64_t>();
  const int64_t* off = offsets.data_ptr<int64_t>();
  const uint8_t* base = store.data_ptr<uint8_t>();
  float* op = out.data_ptr<float>();
  auto body = [&](int64_t begin, int64_t end) {
    if (bits == 8) {
      bag_range<8>(base, rb, nb, dim, ix, off, begin, end, op);
    } else {
      bag_range<4>(base, rb, nb, dim, ix, off, begin, end, op);
    }
  };
  // One thread (or a small batch): run inline, no parallel-region setup.
  if (at::get_num_threads() == 1 || nbags < 256) {
    body(0, nbags);
  } else {
    at::parallel_for(0, nbags, 256, body);
  }
  return out;
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("forward", &forward, "fused cache lookup + dequantize over all tables");
  m.def("train_forward", &train_forward, "fused admission + lookup, returns values and slots");
  m.def("update", &update, "fused backward: aggregate, optimizer step, cache/store write");
  m.def("bag_lookup", &bag_lookup, "INT8/INT4 sum-pooled inference lookup");
  m.def("row_bytes", &row_bytes, "bytes of one stored row of format `kind` at `dim`");
  m.def("num_kinds", [] { return static_cast<int64_t>(kNumKinds); }, "number of formats");
}
