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
#include <cmath>
#include <cstring>
#include <vector>

namespace {

constexpr int kWays = 8;
constexpr int kLfuMax = 255;
constexpr int64_t kMaxDim = 2048;
enum Kind { kFp32 = 0, kFp16 = 1, kBf16 = 2, kInt8 = 3, kInt4 = 4, kInt2 = 5 };
enum Meta { kKind = 0, kPolicy, kOptimizer, kStochastic, kStream, kRowOffset, kRows, kDim };

inline uint32_t mix32(uint32_t x) {
  x ^= x >> 16;
  x *= 0x7feb352dU;
  x ^= x >> 15;
  x *= 0x846ca68bU;
  x ^= x >> 16;
  return x;
}
inline uint32_t stream_key(int64_t seed, int64_t stream, int purpose, int64_t step) {
  uint32_t k = mix32(static_cast<uint32_t>(seed) ^ mix32(static_cast<uint32_t>(stream * 2 + purpose)));
  return mix32(k + static_cast<uint32_t>(step));
}
inline uint32_t row_key(uint32_t key, int64_t row) {
  return mix32(key ^ mix32(static_cast<uint32_t>(row)));
}
inline uint32_t noise_bits(uint32_t rk, int64_t col) {
  return mix32(rk + static_cast<uint32_t>(col));
}
inline float uniform(uint32_t rk, int64_t col) {
  return static_cast<float>(noise_bits(rk, col) >> 8) * (1.0f / 16777216.0f);
}

inline float h2f(uint16_t bits) { return static_cast<float>(c10::Half(bits, c10::Half::from_bits())); }
inline uint16_t f2h(float f) { return c10::Half(f).x; }
inline uint16_t half_step(uint16_t bits, bool up) {
  bool neg = bits & 0x8000;
  uint16_t mag = bits & 0x7FFF;
  if (mag == 0) return up ? 0x0001 : 0x8001;
  bool inc = neg ? !up : up;
  mag = inc ? mag + 1 : mag - 1;
  return (neg ? 0x8000 : 0) | mag;
}
inline float half_round_down(float x) {
  uint16_t b = f2h(x);
  if (h2f(b) > x) b = half_step(b, false);
  return h2f(b);
}
inline float half_round_up(float x) {
  uint16_t b = f2h(x);
  if (h2f(b) < x) b = half_step(b, true);
  return h2f(b);
}
inline uint16_t sr_half(float x, float u) {
  uint16_t b = f2h(x);
  float near = h2f(b);
  if (near == x) return b;
  bool above = near > x;
  uint16_t ob = half_step(b, !above);
  float other = h2f(ob);
  float lo = above ? other : near, hi = above ? near : other;
  float p = (x - lo) / (hi - lo);
  bool take_hi = u < p;
  return take_hi ? (above ? b : ob) : (above ? ob : b);
}

inline int bits_of(int kind) { return kind == kInt8 ? 8 : kind == kInt4 ? 4 : 2; }
inline int64_t data_bytes(int bits, int64_t dim) {
  int per = 8 / bits;
  return (dim + per - 1) / per;
}

void dequant_row(int kind, const uint8_t* row, int64_t dim, float* out) {
  if (kind == kFp32) {
    std::memcpy(out, row, dim * sizeof(float));
    return;
  }
  if (kind == kFp16 || kind == kBf16) {
    for (int64_t d = 0; d < dim; ++d) {
      uint16_t b;
      std::memcpy(&b, row + 2 * d, 2);
      out[d] = kind == kFp16 ? h2f(b) : static_cast<float>(c10::BFloat16(b, c10::BFloat16::from_bits()));
    }
    return;
  }
  int bits = bits_of(kind);
  int64_t nb = data_bytes(bits, dim);
  float scale, bias;
  if (bits == 8) {
    std::memcpy(&scale, row + nb, 4);
    std::memcpy(&bias, row + nb + 4, 4);
    for (int64_t d = 0; d < dim; ++d) out[d] = static_cast<float>(row[d]) * scale + bias;
    return;
  }
  uint16_t sb[2];
  std::memcpy(sb, row + nb, 4);
  scale = h2f(sb[0]);
  bias = h2f(sb[1]);
  int per = 8 / bits, mask = (1 << bits) - 1;
  for (int64_t d = 0; d < dim; ++d) {
    int q = (row[d / per] >> ((d % per) * bits)) & mask;
    out[d] = static_cast<float>(q) * scale + bias;
  }
}

inline void min_max(const float* x, int64_t dim, float& lo, float& hi) {
  // Eight independent lanes let the compiler vectorize; min/max do not depend on order.
  float l[8], h[8];
  for (int j = 0; j < 8; ++j) l[j] = h[j] = x[0];
  int64_t d = 0;
  for (; d + 8 <= dim; d += 8) {
    for (int j = 0; j < 8; ++j) {
      float v = x[d + j];
      l[j] = v < l[j] ? v : l[j];
      h[j] = v > h[j] ? v : h[j];
    }
  }
  for (; d < dim; ++d) {
    l[0] = x[d] < l[0] ? x[d] : l[0];
    h[0] = x[d] > h[0] ? x[d] : h[0];
  }
  lo = l[0];
  hi = h[0];
  for (int j = 1; j < 8; ++j) {
    lo = l[j] < lo ? l[j] : lo;
    hi = h[j] > hi ? h[j] : hi;
  }
}

void quant_int_row(int bits, const float* x, int64_t dim, uint8_t* row, bool stochastic,
                   uint32_t rk) {
  const int64_t nb = data_bytes(bits, dim);
  float lo, hi;
  min_max(x, dim, lo, hi);
  const float levels = static_cast<float>((1 << bits) - 1);
  float scale, bias;
  if (bits == 8) {
    scale = (hi - lo) / levels;
    bias = lo;
  } else {
    bias = half_round_down(lo);
    scale = half_round_up((hi - bias) / levels);
  }
  alignas(64) float u[kMaxDim];
  alignas(64) uint8_t q[kMaxDim];
  if (stochastic) {
    for (int64_t d = 0; d < dim; ++d)
      u[d] = static_cast<float>(static_cast<int32_t>(noise_bits(rk, d) >> 8)) * (1.0f / 16777216.0f);
  } else {
    for (int64_t d = 0; d < dim; ++d) u[d] = 0.5f;
  }
  if (scale > 0) {
    for (int64_t d = 0; d < dim; ++d) {
      float v = std::floor((x[d] - bias) / scale + u[d]);
      v = v < 0.0f ? 0.0f : v;
      v = v > levels ? levels : v;
      q[d] = static_cast<uint8_t>(static_cast<int32_t>(v));
    }
  } else {
    std::memset(q, 0, dim);
  }
  if (bits == 8) {
    std::memcpy(row, q, dim);
    std::memcpy(row + nb, &scale, 4);
    std::memcpy(row + nb + 4, &bias, 4);
    return;
  }
  const int per = 8 / bits;
  for (int64_t j = 0; j < nb; ++j) {
    uint8_t byte = 0;
    for (int k = 0; k < per && j * per + k < dim; ++k) byte |= q[j * per + k] << (k * bits);
    row[j] = byte;
  }
  uint16_t sb[2] = {f2h(scale), f2h(bias)};
  std::memcpy(row + nb, sb, 4);
}

void quant_row(int kind, const float* x, int64_t dim, uint8_t* row, bool stochastic, uint32_t rk) {
  if (kind == kFp32) {
    std::memcpy(row, x, dim * sizeof(float));
    return;
  }
  if (kind == kFp16 || kind == kBf16) {
    for (int64_t d = 0; d < dim; ++d) {
      uint16_t b;
      if (kind == kFp16) {
        b = stochastic ? sr_half(x[d], uniform(rk, d)) : f2h(x[d]);
      } else if (stochastic) {
        uint32_t fb;
        std::memcpy(&fb, &x[d], 4);
        b = static_cast<uint16_t>((fb + (noise_bits(rk, d) & 0xFFFFu)) >> 16);
      } else {
        b = c10::BFloat16(x[d]).x;
      }
      std::memcpy(row + 2 * d, &b, 2);
    }
    return;
  }
  quant_int_row(bits_of(kind), x, dim, row, stochastic, rk);
}

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
  for (int64_t i = 0; i < B;) {
    const int64_t row = keys[i] / B;
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
    std::vector<float> acc(dim);
    for (int64_t b = begin; b < end; ++b) {
      std::fill(acc.begin(), acc.end(), 0.0f);
      float* a = acc.data();
      for (int64_t i = off[b]; i < off[b + 1]; ++i) {
        const uint8_t* row = base + ix[i] * rb;
        float scale, bias;
        if (bits == 8) {
          std::memcpy(&scale, row + nb, 4);
          std::memcpy(&bias, row + nb + 4, 4);
          for (int64_t d = 0; d < dim; ++d) a[d] = std::fma(scale, static_cast<float>(row[d]), a[d] + bias);
        } else {
          uint16_t sb[2];
          std::memcpy(sb, row + nb, 4);
          scale = h2f(sb[0]);
          bias = h2f(sb[1]);
          for (int64_t j = 0; j < dim / 2; ++j) {
            a[2 * j] = std::fma(scale, static_cast<float>(row[j] & 15), a[2 * j] + bias);
            a[2 * j + 1] = std::fma(scale, static_cast<float>(row[j] >> 4), a[2 * j + 1] + bias);
          }
        }
      }
      std::memcpy(op + b * dim, a, dim * sizeof(float));
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
