// Inference sum-pooled lookup of INT8/INT4 fused rows, one instruction-set variant
// (included by simd_variants.cpp after row_ops.h). A row is added as
// a[d] = scale * q[d] + (bias + a[d]) (scale * q[d] + bias for the bag's first row: no zero
// fill, no bias pass), with fused multiply-add in the AVX2/AVX-512 variants, as FBGEMM does:
// results agree with the reference to rounding, not bit for bit.

#if SSL_LEVEL == 2
inline __m512 bag_base(const float* a, __m512 vb, bool first) {
  return first ? vb : _mm512_add_ps(vb, _mm512_loadu_ps(a));
}
#elif SSL_LEVEL == 1
inline __m256 bag_base(const float* a, __m256 vb, bool first) {
  return first ? vb : _mm256_add_ps(vb, _mm256_loadu_ps(a));
}
#endif

inline float bag_scalar(float scale, float q, float bias, float a, bool first) {
#if SSL_LEVEL >= 1
  return std::fma(scale, q, first ? bias : bias + a);
#else
  return scale * q + (first ? bias : bias + a);
#endif
}

inline void bag_add_int8(const uint8_t* __restrict row, int64_t dim, float* __restrict a,
                         bool first) {
  float scale, bias;
  read_qparams(8, row, dim, scale, bias);
  int64_t d = 0;
#if SSL_LEVEL == 2
  const __m512 vs = _mm512_set1_ps(scale), vb = _mm512_set1_ps(bias);
  for (; d + 16 <= dim; d += 16) {
    const __m128i bytes = _mm_loadu_si128(reinterpret_cast<const __m128i*>(row + d));
    const __m512 q = _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(bytes));
    _mm512_storeu_ps(a + d, _mm512_fmadd_ps(vs, q, bag_base(a + d, vb, first)));
  }
  if (d < dim) {  // the last dim % 16 columns under a mask: no scalar loop in the row's code
    const __mmask16 m = static_cast<__mmask16>((1u << (dim - d)) - 1);
    const __m512 q = _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm_maskz_loadu_epi8(m, row + d)));
    const __m512 sum = first ? vb : _mm512_add_ps(vb, _mm512_maskz_loadu_ps(m, a + d));
    _mm512_mask_storeu_ps(a + d, m, _mm512_fmadd_ps(vs, q, sum));
  }
#else
#if SSL_LEVEL == 1
  const __m256 vs = _mm256_set1_ps(scale), vb = _mm256_set1_ps(bias);
  for (; d + 8 <= dim; d += 8) {
    const __m128i bytes = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(row + d));
    const __m256 q = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(bytes));
    _mm256_storeu_ps(a + d, _mm256_fmadd_ps(vs, q, bag_base(a + d, vb, first)));
  }
#endif
  for (; d < dim; ++d) a[d] = bag_scalar(scale, static_cast<float>(row[d]), bias, a[d], first);
#endif
}

inline void bag_add_int4(const uint8_t* __restrict row, int64_t dim, float* __restrict a,
                         bool first) {
  float scale, bias;
  read_qparams(4, row, data_bytes(4, dim), scale, bias);
  int64_t d = 0;
#if SSL_LEVEL == 2
  const __m512 vs = _mm512_set1_ps(scale), vb = _mm512_set1_ps(bias);
  const __m128i low4 = _mm_set1_epi8(0x0F);
  for (; d + 32 <= dim; d += 32) {  // 16 bytes = 32 nibbles, low nibble = even column
    const __m128i v = _mm_loadu_si128(reinterpret_cast<const __m128i*>(row + d / 2));
    const __m128i lo = _mm_and_si128(v, low4), hi = _mm_and_si128(_mm_srli_epi16(v, 4), low4);
    const __m128i parts[2] = {_mm_unpacklo_epi8(lo, hi), _mm_unpackhi_epi8(lo, hi)};
    for (int p = 0; p < 2; ++p) {
      const __m512 q = _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(parts[p]));
      float* dst = a + d + 16 * p;
      _mm512_storeu_ps(dst, _mm512_fmadd_ps(vs, q, bag_base(dst, vb, first)));
    }
  }
#elif SSL_LEVEL == 1
  const __m256 vs = _mm256_set1_ps(scale), vb = _mm256_set1_ps(bias);
  const __m128i low4 = _mm_set1_epi8(0x0F);
  for (; d + 32 <= dim; d += 32) {
    const __m128i v = _mm_loadu_si128(reinterpret_cast<const __m128i*>(row + d / 2));
    const __m128i lo = _mm_and_si128(v, low4), hi = _mm_and_si128(_mm_srli_epi16(v, 4), low4);
    const __m128i parts[2] = {_mm_unpacklo_epi8(lo, hi), _mm_unpackhi_epi8(lo, hi)};
    for (int p = 0; p < 4; ++p) {
      const __m128i bytes = p & 1 ? _mm_srli_si128(parts[p / 2], 8) : parts[p / 2];
      const __m256 q = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(bytes));
      float* dst = a + d + 8 * p;
      _mm256_storeu_ps(dst, _mm256_fmadd_ps(vs, q, bag_base(dst, vb, first)));
    }
  }
#endif
  for (; d < dim; ++d) {
    const float q = static_cast<float>((row[d / 2] >> ((d % 2) * 4)) & 15);
    a[d] = bag_scalar(scale, q, bias, a[d], first);
  }
}

// Bags [begin, end) of the lookup, for one row format (the format is a template argument so
// that the per-row loop has no branch on it); rows are prefetched kBagAhead indices ahead
// (both lines a row may span), the per-row work being short.
constexpr int64_t kBagAhead = 32;
template <int Bits>
inline void bag_rows(const uint8_t* base, int64_t rb, int64_t dim, const int64_t* ix,
                     const int64_t* off, int64_t begin, int64_t end, float* op) {
  const int64_t last = off[end];
  for (int64_t b = begin; b < end; ++b) {
    float* o = op + b * dim;
    const int64_t i0 = off[b], i1 = off[b + 1];
    if (i0 == i1) std::memset(o, 0, dim * sizeof(float));
    for (int64_t i = i0; i < i1; ++i) {
      if (i + kBagAhead < last) {
        const uint8_t* p = base + ix[i + kBagAhead] * rb;
        __builtin_prefetch(p);
        __builtin_prefetch(p + rb - 1);
      }
      if constexpr (Bits == 8) {
        // D = 64 as a constant: the inlined row step has no column loop and no tail
        if (dim == 64) {
          bag_add_int8(base + ix[i] * rb, 64, o, i == i0);
        } else {
          bag_add_int8(base + ix[i] * rb, dim, o, i == i0);
        }
      } else {
        bag_add_int4(base + ix[i] * rb, dim, o, i == i0);
      }
    }
  }
}

inline void bag_range(int bits, const uint8_t* base, int64_t rb, int64_t dim, const int64_t* ix,
                      const int64_t* off, int64_t begin, int64_t end, float* op) {
  if (bits == 8) {
    bag_rows<8>(base, rb, dim, ix, off, begin, end, op);
  } else {
    bag_rows<4>(base, rb, dim, ix, off, begin, end, op);
  }
}

