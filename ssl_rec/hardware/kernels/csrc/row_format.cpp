// Row formats and counter-based stochastic rounding shared by the compiled kernels; the
// twin of ssl_rec/hardware/quantization.py and stochastic_rounding.py, operation by
// operation. Included by embedding_ops.cpp (kept as .cpp so it ships as package data).
#pragma once
#include <torch/extension.h>
#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#ifdef __AVX2__
#include <immintrin.h>
#endif

namespace {

constexpr int kWays = 8;
constexpr int kLfuMax = 255;
constexpr int64_t kMaxDim = 2048;
// Numbered as ssl_rec.hardware.precision.Precision.code (a test checks both sides agree).
enum Kind { kFp32 = 0, kFp16 = 1, kBf16 = 2, kInt8 = 3, kInt4 = 4, kInt2 = 5, kNumKinds = 6 };
// Column order of the int64[T, 9] table metadata (ssl_rec.hardware.kernels.layout.META_*).
enum Meta { kKind = 0, kPolicy, kOptimizer, kStochastic, kStream, kRowOffset, kRows, kDim, kRowStride };

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
inline int64_t row_bytes(int64_t kind, int64_t dim) {
  TORCH_CHECK(kind >= 0 && kind < kNumKinds, "row_bytes: unknown format ", kind);
  if (kind == kFp32) return dim * 4;
  if (kind == kFp16 || kind == kBf16) return dim * 2;
  const int bits = bits_of(static_cast<int>(kind));
  return data_bytes(bits, dim) + (bits == 8 ? 8 : 4);
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
  // Eight independent lanes (one AVX register); min/max do not depend on order.
  alignas(32) float l[8], h[8];
  for (int j = 0; j < 8; ++j) l[j] = h[j] = x[0];
  int64_t d = 0;
#ifdef __AVX2__
  __m256 vl = _mm256_set1_ps(x[0]), vh = vl;
  for (; d + 8 <= dim; d += 8) {
    const __m256 v = _mm256_loadu_ps(x + d);
    vl = _mm256_min_ps(v, vl);  // v < l ? v : l
    vh = _mm256_max_ps(v, vh);  // v > h ? v : h
  }
  _mm256_store_ps(l, vl);
  _mm256_store_ps(h, vh);
#endif
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
    int64_t d = 0;
#ifdef __AVX2__
    // Same operations as the scalar loop below, eight columns at a time.
    const __m256 vb = _mm256_set1_ps(bias), vs = _mm256_set1_ps(scale);
    const __m256 zero = _mm256_setzero_ps(), top = _mm256_set1_ps(levels);
    for (; d + 8 <= dim; d += 8) {
      __m256 v = _mm256_div_ps(_mm256_sub_ps(_mm256_loadu_ps(x + d), vb), vs);
      v = _mm256_floor_ps(_mm256_add_ps(v, _mm256_load_ps(u + d)));
      v = _mm256_min_ps(top, _mm256_max_ps(zero, v));
      const __m256i qi = _mm256_cvttps_epi32(v);
      const __m128i w = _mm_packus_epi32(_mm256_castsi256_si128(qi), _mm256_extracti128_si256(qi, 1));
      _mm_storel_epi64(reinterpret_cast<__m128i*>(q + d), _mm_packus_epi16(w, w));
    }
#endif
    for (; d < dim; ++d) {
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

}  // namespace
