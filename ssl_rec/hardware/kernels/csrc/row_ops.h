// Row primitives of one instruction-set variant: dequantize, quantize with stochastic
// rounding, and the FP32 row arithmetic of the fused optimizer. Included once per variant
// by simd_variants.cpp with SSL_LEVEL = 0 (portable C++), 1 (AVX2) or 2 (AVX-512) inside
// its own namespace; every variant performs the same IEEE operations on every element
// (no fused multiply-add, sums in the documented order), so all three are bit-identical to
// each other and to kernels/reference.py. Only the inference bag lookup uses FMA.

#include "small_rows.h"

// FP32 -> FP16 bits, rounded to nearest even: the F16C instruction in the x86 variants, c10's
// bit arithmetic in the portable one (the same bits for every finite value).
inline uint16_t float_to_half(float f) {
#if SSL_LEVEL >= 1
  return static_cast<uint16_t>(_cvtss_sh(f, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
#else
  return f2h(f);
#endif
}

// The smallest FP16 value >= x (Up) or the largest <= x: F16C's directed rounding in the
// x86 variants, the nearest value stepped once when on the wrong side in the portable one
// (the same value for every x that is not NaN, subnormals and overflow to infinity included).
template <bool Up>
inline float half_round(float x) {
#if SSL_LEVEL >= 1
  constexpr int kMode = Up ? _MM_FROUND_TO_POS_INF : _MM_FROUND_TO_NEG_INF;
  return half_to_float(static_cast<uint16_t>(_cvtss_sh(x, kMode)));
#else
  uint16_t b = float_to_half(x);
  const float near = half_to_float(b);
  if (Up ? near < x : near > x) b = half_step(b, Up);
  return half_to_float(b);
#endif
}

// FP16 bits of x rounded stochastically: up with probability (x - lo) / (hi - lo) for the
// FP16 neighbours lo <= x <= hi, given the uniform draw u in [0, 1).
inline uint16_t sr_half(float x, float u) {
  const uint16_t b = float_to_half(x);
  const float near = half_to_float(b);
  if (near == x) return b;
  const bool above = near > x;
  const uint16_t ob = half_step(b, !above);
  const float other = half_to_float(ob);
  const float lo = above ? other : near, hi = above ? near : other;
  const float p = (x - lo) / (hi - lo);
  const bool take_hi = u < p;
  return take_hi ? (above ? b : ob) : (above ? ob : b);
}

// Scale and bias of an integer row from its min and max (a -0.0 minimum counts as +0.0,
// so the stored bias never depends on which zero the reduction met first). INT4 and INT2
// keep both in FP16: the bias rounded down and the scale up, so every value stays in range.
inline void int_qparams(int bits, float lo, float hi, float& scale, float& bias) {
  lo = lo + 0.0f;
  const float levels = static_cast<float>((1 << bits) - 1);
  if (bits == 8) {
    scale = (hi - lo) / levels;
    bias = lo;
    return;
  }
  bias = half_round<false>(lo);
  scale = half_round<true>((hi - bias) / levels);
}

inline void min_max(const float* x, int64_t dim, float& lo, float& hi) {
  int64_t d = 0;
  lo = hi = x[0];
#if SSL_LEVEL == 2
  __m512 vl = _mm512_set1_ps(x[0]), vh = vl;
  for (; d + 16 <= dim; d += 16) {
    const __m512 v = _mm512_loadu_ps(x + d);
    vl = _mm512_min_ps(v, vl);
    vh = _mm512_max_ps(v, vh);
  }
  lo = _mm512_reduce_min_ps(vl);
  hi = _mm512_reduce_max_ps(vh);
#elif SSL_LEVEL == 1
  __m256 vl = _mm256_set1_ps(x[0]), vh = vl;
  for (; d + 8 <= dim; d += 8) {
    const __m256 v = _mm256_loadu_ps(x + d);
    vl = _mm256_min_ps(v, vl);
    vh = _mm256_max_ps(v, vh);
  }
  alignas(32) float l[8], h[8];
  _mm256_store_ps(l, vl);
  _mm256_store_ps(h, vh);
  for (int j = 0; j < 8; ++j) {
    lo = l[j] < lo ? l[j] : lo;
    hi = h[j] > hi ? h[j] : hi;
  }
#endif
  for (; d < dim; ++d) {
    lo = x[d] < lo ? x[d] : lo;
    hi = x[d] > hi ? x[d] : hi;
  }
  hi = hi + 0.0f;  // canonical zero, as the minimum in int_qparams
}

#if SSL_LEVEL == 2
// The 16 levels of columns d .. d + 15 (d a multiple of 16) as bytes: INT8 as stored, INT4's
// 8 bytes split into nibbles (low nibble = even column).
inline __m128i level_bytes16(int bits, const uint8_t* row, int64_t d) {
  if (bits == 8) return _mm_loadu_si128(reinterpret_cast<const __m128i*>(row + d));
  const __m128i low4 = _mm_set1_epi8(0x0F);
  const __m128i v = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(row + d / 2));
  return _mm_unpacklo_epi8(_mm_and_si128(v, low4), _mm_and_si128(_mm_srli_epi16(v, 4), low4));
}
#endif

// Columns [0, n) of an INT8 (bits 8) or INT4 row as value = q * scale + bias, two roundings
// (the reference's order), with the variant's vectors; n is the largest multiple of the
// vector width <= dim (0 in the portable variant). `Stream`: written with non-temporal stores,
// `out` then vector-aligned (see stream_row). Returns n.
template <bool Stream>
inline int64_t dequant_int_vectors(int bits, const uint8_t* row, int64_t dim, float scale,
                                   float bias, float* out) {
  int64_t d = 0;
#if SSL_LEVEL == 2
  const __m512 vs = _mm512_set1_ps(scale), vb = _mm512_set1_ps(bias);
  for (; d + 16 <= dim; d += 16) {
    const __m512 q = _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(level_bytes16(bits, row, d)));
    const __m512 v = _mm512_add_ps(_mm512_mul_ps(q, vs), vb);
    if (Stream) {
      _mm512_stream_ps(out + d, v);
    } else {
      _mm512_storeu_ps(out + d, v);
    }
  }
#elif SSL_LEVEL == 1
  const __m256 vs = _mm256_set1_ps(scale), vb = _mm256_set1_ps(bias);
  const __m128i low4 = _mm_set1_epi8(0x0F);
  for (; d + 8 <= dim; d += 8) {
    __m128i bytes;
    if (bits == 8) {
      bytes = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(row + d));
    } else {
      int32_t four;
      std::memcpy(&four, row + d / 2, 4);
      const __m128i v = _mm_cvtsi32_si128(four);
      bytes = _mm_unpacklo_epi8(_mm_and_si128(v, low4), _mm_and_si128(_mm_srli_epi16(v, 4), low4));
    }
    const __m256 q = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(bytes));
    const __m256 v = _mm256_add_ps(_mm256_mul_ps(q, vs), vb);
    if (Stream) {
      _mm256_stream_ps(out + d, v);
    } else {
      _mm256_storeu_ps(out + d, v);
    }
  }
#else
  (void)bits, (void)row, (void)dim, (void)scale, (void)bias, (void)out;
#endif
  return d;
}

// value = q * scale + bias, two roundings (the reference's order).
inline void dequant_row(int kind, const uint8_t* row, int64_t dim, float* out) {
  if (kind == kFp32) {
    std::memcpy(out, row, dim * sizeof(float));
    return;
  }
  if (kind != kInt8 && kind != kInt4) {
    dequant_small(kind, row, dim, out);
    return;
  }
  const int bits = kind == kInt8 ? 8 : 4;
  float scale, bias;
  read_qparams(bits, row, data_bytes(bits, dim), scale, bias);
  for (int64_t d = dequant_int_vectors<false>(bits, row, dim, scale, bias, out); d < dim; ++d) {
    const int q = kind == kInt8 ? row[d] : (row[d / 2] >> ((d % 2) * 4)) & 15;
    out[d] = static_cast<float>(q) * scale + bias;
  }
}

#if SSL_LEVEL == 2
inline __m512i mix32v(__m512i x) {
  x = _mm512_xor_si512(x, _mm512_srli_epi32(x, 16));
  x = _mm512_mullo_epi32(x, _mm512_set1_epi32(0x7feb352d));
  x = _mm512_xor_si512(x, _mm512_srli_epi32(x, 15));
  x = _mm512_mullo_epi32(x, _mm512_set1_epi32(static_cast<int>(0x846ca68bU)));
  return _mm512_xor_si512(x, _mm512_srli_epi32(x, 16));
}
#elif SSL_LEVEL == 1
inline __m256i mix32v(__m256i x) {
  x = _mm256_xor_si256(x, _mm256_srli_epi32(x, 16));
  x = _mm256_mullo_epi32(x, _mm256_set1_epi32(0x7feb352d));
  x = _mm256_xor_si256(x, _mm256_srli_epi32(x, 15));
  x = _mm256_mullo_epi32(x, _mm256_set1_epi32(static_cast<int>(0x846ca68bU)));
  return _mm256_xor_si256(x, _mm256_srli_epi32(x, 16));
}
#endif

#if SSL_LEVEL == 2
// Levels of columns d .. d + 15 holding x: clamp(floor((x - bias) / scale + u), 0, top) as
// bytes, u the column's uniform noise (stochastic) or 0.5 (nearest).
inline __m128i levels16(__m512 x, __m512 vb, __m512 vs, __m512 top, bool sr, uint32_t rk,
                        int64_t d) {
  __m512 u = _mm512_set1_ps(0.5f);
  if (sr) {
    const __m512i iota = _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
    const __m512i c = _mm512_add_epi32(_mm512_set1_epi32(static_cast<int>(rk + d)), iota);
    u = _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_srli_epi32(mix32v(c), 8)),
                      _mm512_set1_ps(1.0f / 16777216.0f));
  }
  __m512 v = _mm512_div_ps(_mm512_sub_ps(x, vb), vs);
  v = _mm512_roundscale_ps(_mm512_add_ps(v, u), _MM_FROUND_TO_NEG_INF | _MM_FROUND_NO_EXC);
  v = _mm512_min_ps(top, _mm512_max_ps(_mm512_setzero_ps(), v));
  return _mm512_cvtepi32_epi8(_mm512_cvttps_epi32(v));
}
#endif

// Levels q[d] = clamp(floor((x - bias) / scale + u), 0, levels), u the column's uniform
// noise (stochastic) or 0.5 (nearest).
inline void int_levels(const float* x, int64_t dim, float scale, float bias, int bits, bool sr,
                       uint32_t rk, uint8_t* q) {
  const float levels = static_cast<float>((1 << bits) - 1);
  int64_t d = 0;
#if SSL_LEVEL == 2
  const __m512 vb = _mm512_set1_ps(bias), vs = _mm512_set1_ps(scale);
  const __m512 top = _mm512_set1_ps(levels);
  for (; d + 16 <= dim; d += 16)
    _mm_storeu_si128(reinterpret_cast<__m128i*>(q + d),
                     levels16(_mm512_loadu_ps(x + d), vb, vs, top, sr, rk, d));
#elif SSL_LEVEL == 1
  const __m256 vb = _mm256_set1_ps(bias), vs = _mm256_set1_ps(scale);
  const __m256 top = _mm256_set1_ps(levels), zero = _mm256_setzero_ps();
  const __m256 half = _mm256_set1_ps(0.5f), unit = _mm256_set1_ps(1.0f / 16777216.0f);
  const __m256i iota = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
  for (; d + 8 <= dim; d += 8) {
    __m256 u = half;
    if (sr) {
      const __m256i c = _mm256_add_epi32(_mm256_set1_epi32(static_cast<int>(rk + d)), iota);
      u = _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_srli_epi32(mix32v(c), 8)), unit);
    }
    __m256 v = _mm256_div_ps(_mm256_sub_ps(_mm256_loadu_ps(x + d), vb), vs);
    v = _mm256_floor_ps(_mm256_add_ps(v, u));
    v = _mm256_min_ps(top, _mm256_max_ps(zero, v));
    const __m256i qi = _mm256_cvttps_epi32(v);
    const __m128i w =
        _mm_packus_epi32(_mm256_castsi256_si128(qi), _mm256_extracti128_si256(qi, 1));
    _mm_storel_epi64(reinterpret_cast<__m128i*>(q + d), _mm_packus_epi16(w, w));
  }
#endif
  for (; d < dim; ++d) {
    const float u = sr ? uniform24(noise_bits(rk, d)) : 0.5f;
    float v = std::floor((x[d] - bias) / scale + u);
    v = v < 0.0f ? 0.0f : v;
    v = v > levels ? levels : v;
    q[d] = static_cast<uint8_t>(static_cast<int32_t>(v));
  }
}

inline void pack_nibbles(const uint8_t* q, int64_t dim, uint8_t* row) {
  const int64_t nb = data_bytes(4, dim);
  int64_t j = 0;
#if SSL_LEVEL >= 1
  const __m128i low = _mm_set1_epi16(0x000F), high = _mm_set1_epi16(0x00F0);
  for (; 2 * j + 16 <= dim; j += 8) {  // 16 levels -> 8 bytes (even column in the low nibble)
    const __m128i w = _mm_loadu_si128(reinterpret_cast<const __m128i*>(q + 2 * j));
    const __m128i v = _mm_or_si128(_mm_and_si128(w, low), _mm_and_si128(_mm_srli_epi16(w, 4), high));
    _mm_storel_epi64(reinterpret_cast<__m128i*>(row + j), _mm_packus_epi16(v, v));
  }
#endif
  for (; j < nb; ++j) {
    const uint8_t hi = 2 * j + 1 < dim ? q[2 * j + 1] : 0;
    row[j] = static_cast<uint8_t>(q[2 * j] | (hi << 4));
  }
}

// Stores a row's scale and bias after its nb bytes of levels: an FP32 pair for INT8, an FP16
// pair for INT4 / INT2.
inline void write_qparams(int bits, uint8_t* row, int64_t nb, float scale, float bias) {
  if (bits == 8) {
    std::memcpy(row + nb, &scale, 4);
    std::memcpy(row + nb + 4, &bias, 4);
    return;
  }
  const uint16_t sb[2] = {float_to_half(scale), float_to_half(bias)};
  std::memcpy(row + nb, sb, 4);
}

inline void quant_int_row(int bits, const float* x, int64_t dim, uint8_t* row, bool sr,
                          uint32_t rk) {
  float lo, hi, scale, bias;
  min_max(x, dim, lo, hi);
  int_qparams(bits, lo, hi, scale, bias);
  alignas(64) uint8_t q[kMaxDim];
  if (scale > 0) {
    int_levels(x, dim, scale, bias, bits, sr, rk, q);
  } else {
    std::memset(q, 0, dim);
  }
  const int64_t nb = data_bytes(bits, dim);
  if (bits == 8) {
    std::memcpy(row, q, dim);
  } else if (bits == 4) {
    pack_nibbles(q, dim, row);
  } else {
    for (int64_t j = 0; j < nb; ++j) {
      uint8_t byte = 0;
      for (int k = 0; k < 4 && j * 4 + k < dim; ++k) byte |= q[j * 4 + k] << (k * 2);
      row[j] = byte;
    }
  }
  write_qparams(bits, row, nb, scale, bias);
}

inline void quant_row(int kind, const float* x, int64_t dim, uint8_t* row, bool sr, uint32_t rk) {
  if (kind == kFp32) {
    std::memcpy(row, x, dim * sizeof(float));
    return;
  }
  if (kind == kFp16 || kind == kBf16) {
    for (int64_t d = 0; d < dim; ++d) {
      uint16_t b;
      if (kind == kFp16) {
        b = sr ? sr_half(x[d], uniform24(noise_bits(rk, d))) : float_to_half(x[d]);
      } else if (sr) {
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
  quant_int_row(bits_of(kind), x, dim, row, sr, rk);
}

// acc[d] = acc[d] + g[d]
inline void add_row(float* __restrict acc, const float* __restrict g, int64_t dim) {
  int64_t d = 0;
#if SSL_LEVEL == 2
  for (; d + 16 <= dim; d += 16)
    _mm512_storeu_ps(acc + d, _mm512_add_ps(_mm512_loadu_ps(acc + d), _mm512_loadu_ps(g + d)));
#elif SSL_LEVEL == 1
  for (; d + 8 <= dim; d += 8)
    _mm256_storeu_ps(acc + d, _mm256_add_ps(_mm256_loadu_ps(acc + d), _mm256_loadu_ps(g + d)));
#endif
  for (; d < dim; ++d) acc[d] = acc[d] + g[d];
}

// acc[d] = acc[d] + wd * w[d] (the product rounded, then the sum): L2 weight decay
inline void add_scaled(float* __restrict acc, float wd, const float* __restrict w, int64_t dim) {
  int64_t d = 0;
#if SSL_LEVEL == 2
  const __m512 m = _mm512_set1_ps(wd);
  for (; d + 16 <= dim; d += 16) {
    const __m512 decay = _mm512_mul_ps(m, _mm512_loadu_ps(w + d));
    _mm512_storeu_ps(acc + d, _mm512_add_ps(_mm512_loadu_ps(acc + d), decay));
  }
#elif SSL_LEVEL == 1
  const __m256 m = _mm256_set1_ps(wd);
  for (; d + 8 <= dim; d += 8) {
    const __m256 decay = _mm256_mul_ps(m, _mm256_loadu_ps(w + d));
    _mm256_storeu_ps(acc + d, _mm256_add_ps(_mm256_loadu_ps(acc + d), decay));
  }
#endif
  for (; d < dim; ++d) acc[d] = acc[d] + wd * w[d];
}

// w[d] = w[d] - mult * a[d] (the product rounded, then the difference)
inline void sub_scaled(float* __restrict w, float mult, const float* __restrict a, int64_t dim) {
  int64_t d = 0;
#if SSL_LEVEL == 2
  const __m512 m = _mm512_set1_ps(mult);
  for (; d + 16 <= dim; d += 16) {
    const __m512 step = _mm512_mul_ps(m, _mm512_loadu_ps(a + d));
    _mm512_storeu_ps(w + d, _mm512_sub_ps(_mm512_loadu_ps(w + d), step));
  }
#elif SSL_LEVEL == 1
  const __m256 m = _mm256_set1_ps(mult);
  for (; d + 8 <= dim; d += 8) {
    const __m256 step = _mm256_mul_ps(m, _mm256_loadu_ps(a + d));
    _mm256_storeu_ps(w + d, _mm256_sub_ps(_mm256_loadu_ps(w + d), step));
  }
#endif
  for (; d < dim; ++d) w[d] = w[d] - mult * a[d];
}

#if SSL_LEVEL == 2
// The optimizer step of one INT8 or INT4 store row of N * 16 columns with the row held in N
// registers: dequantize, w - mult * a, min / max, quantize (stochastic rounding) and store,
// the same operations in the same order as dequant_row, sub_scaled and quant_int_row, with
// no pass through memory in between.
template <int Bits, int N>
inline void step_int_row_n(uint8_t* row, float mult, const float* a, bool sr, uint32_t rk) {
  constexpr int64_t dim = 16 * N, nb = Bits == 8 ? dim : dim / 2;
  float scale, bias;
  read_qparams(Bits, row, nb, scale, bias);
  const __m512 vs = _mm512_set1_ps(scale), vb = _mm512_set1_ps(bias), m = _mm512_set1_ps(mult);
  __m512 w[N];
  for (int i = 0; i < N; ++i) {
    const __m512 q = _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(level_bytes16(Bits, row, 16 * i)));
    const __m512 x = _mm512_add_ps(_mm512_mul_ps(q, vs), vb);
    w[i] = _mm512_sub_ps(x, _mm512_mul_ps(m, _mm512_loadu_ps(a + 16 * i)));
  }
  __m512 vl = _mm512_broadcastss_ps(_mm512_castps512_ps128(w[0])), vh = vl;
  for (int i = 0; i < N; ++i) {
    vl = _mm512_min_ps(w[i], vl);
    vh = _mm512_max_ps(w[i], vh);
  }
  float new_scale, new_bias;
  int_qparams(Bits, _mm512_reduce_min_ps(vl), _mm512_reduce_max_ps(vh) + 0.0f, new_scale,
              new_bias);
  // INT8 levels go straight to the row; INT4's are packed two per byte afterwards
  alignas(64) uint8_t q[dim];
  uint8_t* levels = Bits == 8 ? row : q;
  if (new_scale > 0) {
    const __m512 nb_v = _mm512_set1_ps(new_bias), ns_v = _mm512_set1_ps(new_scale);
    const __m512 top = _mm512_set1_ps(static_cast<float>((1 << Bits) - 1));
    for (int i = 0; i < N; ++i)
      _mm_storeu_si128(reinterpret_cast<__m128i*>(levels + 16 * i),
                       levels16(w[i], nb_v, ns_v, top, sr, rk, 16 * i));
  } else {
    std::memset(levels, 0, dim);
  }
  if (Bits == 4) pack_nibbles(q, dim, row);
  write_qparams(Bits, row, nb, new_scale, new_bias);
}

template <int Bits>
inline bool step_int_row(uint8_t* row, int64_t dim, float mult, const float* a, bool sr,
                         uint32_t rk) {
  switch (dim) {
    case 16: step_int_row_n<Bits, 1>(row, mult, a, sr, rk); return true;
    case 32: step_int_row_n<Bits, 2>(row, mult, a, sr, rk); return true;
    case 48: step_int_row_n<Bits, 3>(row, mult, a, sr, rk); return true;
    case 64: step_int_row_n<Bits, 4>(row, mult, a, sr, rk); return true;
    case 128: step_int_row_n<Bits, 8>(row, mult, a, sr, rk); return true;
    default: return false;
  }
}
#endif

// row = quantize(dequantize(row) - mult * a) for a store row of format `kind`: on AVX-512
// the register path for INT8 / INT4 rows of 16, 32, 48, 64 or 128 columns, else through
// `tmp` (float[dim]).
inline void step_store_row(int kind, uint8_t* row, int64_t dim, float mult, const float* a,
                           bool sr, uint32_t rk, float* tmp) {
#if SSL_LEVEL == 2
  if (kind == kInt8 && step_int_row<8>(row, dim, mult, a, sr, rk)) return;
  if (kind == kInt4 && step_int_row<4>(row, dim, mult, a, sr, rk)) return;
#endif
  dequant_row(kind, row, dim, tmp);
  sub_scaled(tmp, mult, a, dim);
  quant_row(kind, tmp, dim, row, sr, rk);
}

// Sum of squares in a fixed order: lane j (0..15) sums columns j, j + 16, ... in column
// order, then lanes are added pairwise (j + 8, then + 4, + 2, + 1).
inline float sum_squares(const float* a, int64_t dim) {
  alignas(64) float lane[16];
  int64_t d = 0;
#if SSL_LEVEL == 2
  __m512 s = _mm512_setzero_ps();
  for (; d + 16 <= dim; d += 16) {
    const __m512 v = _mm512_loadu_ps(a + d);
    s = _mm512_add_ps(s, _mm512_mul_ps(v, v));
  }
  _mm512_store_ps(lane, s);
#elif SSL_LEVEL == 1
  __m256 s0 = _mm256_setzero_ps(), s1 = s0;
  for (; d + 16 <= dim; d += 16) {
    const __m256 v0 = _mm256_loadu_ps(a + d), v1 = _mm256_loadu_ps(a + d + 8);
    s0 = _mm256_add_ps(s0, _mm256_mul_ps(v0, v0));
    s1 = _mm256_add_ps(s1, _mm256_mul_ps(v1, v1));
  }
  _mm256_store_ps(lane, s0);
  _mm256_store_ps(lane + 8, s1);
#else
  for (int j = 0; j < 16; ++j) lane[j] = 0.0f;
  for (; d + 16 <= dim; d += 16)
    for (int j = 0; j < 16; ++j) lane[j] = lane[j] + a[d + j] * a[d + j];
#endif
  for (int j = 0; d < dim; ++d, ++j) lane[j] = lane[j] + a[d] * a[d];
  for (int width = 8; width >= 1; width /= 2)
    for (int j = 0; j < width; ++j) lane[j] = lane[j] + lane[j + width];
  return lane[0];
}

inline bool all_zero(const float* a, int64_t dim) {
  int64_t d = 0;
#if SSL_LEVEL == 2
  for (; d + 16 <= dim; d += 16)
    if (_mm512_cmpneq_ps_mask(_mm512_loadu_ps(a + d), _mm512_setzero_ps())) return false;
#endif
  for (; d < dim; ++d)
    if (a[d] != 0.0f) return false;
  return true;
}

inline void copy_row(float* __restrict dst, const float* __restrict src, int64_t dim) {
  int64_t d = 0;
#if SSL_LEVEL == 2
  for (; d + 16 <= dim; d += 16) _mm512_storeu_ps(dst + d, _mm512_loadu_ps(src + d));
#elif SSL_LEVEL == 1
  for (; d + 8 <= dim; d += 8) _mm256_storeu_ps(dst + d, _mm256_loadu_ps(src + d));
#endif
  for (; d < dim; ++d) dst[d] = src[d];
}

// copy_row into an output nobody reads back in this kernel: non-temporal stores when dst is
// vector-aligned (the lines go to memory without first being read for ownership, which
// halves the memory traffic of a gather). Call stream_fence() before the output is used.
inline void stream_row(float* __restrict dst, const float* __restrict src, int64_t dim) {
#if SSL_LEVEL == 2
  if ((reinterpret_cast<uintptr_t>(dst) & 63) == 0 && dim % 16 == 0) {
    for (int64_t d = 0; d < dim; d += 16) _mm512_stream_ps(dst + d, _mm512_loadu_ps(src + d));
    return;
  }
#elif SSL_LEVEL == 1
  if ((reinterpret_cast<uintptr_t>(dst) & 31) == 0 && dim % 8 == 0) {
    for (int64_t d = 0; d < dim; d += 8) _mm256_stream_ps(dst + d, _mm256_loadu_ps(src + d));
    return;
  }
#endif
  copy_row(dst, src, dim);
}

inline void stream_fence() {
#if SSL_LEVEL >= 1
  _mm_sfence();
#endif
}

// dequant_row into an output nobody reads back in this kernel (see stream_row): FP32 rows
// copied, INT8 / INT4 rows of whole vectors at a vector-aligned `out` dequantized from
// registers straight to memory (no staging row), other rows through `tmp` (float[dim]). The
// same values as dequant_row. Call stream_fence() before the output is used.
inline void dequant_stream_row(int kind, const uint8_t* row, int64_t dim, float* __restrict out,
                               float* __restrict tmp) {
  if (kind == kFp32) {
    stream_row(out, reinterpret_cast<const float*>(row), dim);
    return;
  }
#if SSL_LEVEL >= 1
  constexpr int64_t kWidth = SSL_LEVEL == 2 ? 16 : 8;
  if ((kind == kInt8 || kind == kInt4) && dim % kWidth == 0 &&
      (reinterpret_cast<uintptr_t>(out) & (4 * kWidth - 1)) == 0) {
    const int bits = kind == kInt8 ? 8 : 4;
    float scale, bias;
    read_qparams(bits, row, data_bytes(bits, dim), scale, bias);
    dequant_int_vectors<true>(bits, row, dim, scale, bias, out);
    return;
  }
#endif
  dequant_row(kind, row, dim, tmp);
  stream_row(out, tmp, dim);
}
