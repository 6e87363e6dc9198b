// Rows of the 2-byte and 2-bit formats to FP32, one instruction-set variant (included by
// row_ops.h inside each variant's namespace, so no include guard). Every variant gives the
// same bits: FP16 and BF16 convert exactly, and an INT2 value q * scale is exact before
// its one rounding in + bias.

// FP16 -> FP32 (exact): the F16C instruction in the x86 variants, c10's bit arithmetic in the
// portable one (about 20 instructions, twice per INT4 row).
inline float half_to_float(uint16_t bits) {
#if SSL_LEVEL >= 1
  return _cvtsh_ss(bits);
#else
  return h2f(bits);
#endif
}

// Scale and bias of an INT8 (FP32 pair) or INT4 / INT2 (FP16 pair) row whose levels take nb
// bytes.
inline void read_qparams(int bits, const uint8_t* row, int64_t nb, float& scale, float& bias) {
  if (bits == 8) {
    std::memcpy(&scale, row + nb, 4);
    std::memcpy(&bias, row + nb + 4, 4);
    return;
  }
  uint16_t sb[2];
  std::memcpy(sb, row + nb, 4);
  scale = half_to_float(sb[0]);
  bias = half_to_float(sb[1]);
}

inline void dequant_small(int kind, const uint8_t* row, int64_t dim, float* out) {
  int64_t d = 0;
  if (kind == kFp16 || kind == kBf16) {  // exact conversions, vector or scalar alike
#if SSL_LEVEL == 2
    for (; d + 16 <= dim; d += 16) {
      const __m256i h = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(row + 2 * d));
      _mm512_storeu_ps(out + d, kind == kFp16 ? _mm512_cvtph_ps(h)
                                              : _mm512_castsi512_ps(_mm512_slli_epi32(
                                                    _mm512_cvtepu16_epi32(h), 16)));
    }
#elif SSL_LEVEL == 1
    for (; d + 8 <= dim; d += 8) {
      const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(row + 2 * d));
      _mm256_storeu_ps(out + d, kind == kFp16 ? _mm256_cvtph_ps(h)
                                              : _mm256_castsi256_ps(_mm256_slli_epi32(
                                                    _mm256_cvtepu16_epi32(h), 16)));
    }
#endif
    for (; d < dim; ++d) {
      uint16_t b;
      std::memcpy(&b, row + 2 * d, 2);
      out[d] = kind == kFp16 ? half_to_float(b) : bf2f(b);
    }
    return;
  }
  float scale, bias;
  read_qparams(2, row, data_bytes(2, dim), scale, bias);
#if SSL_LEVEL == 2
  const __m512 vs = _mm512_set1_ps(scale), vb = _mm512_set1_ps(bias);
  const __m512i shifts = _mm512_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26,
                                           28, 30);
  for (; d + 16 <= dim; d += 16) {  // 4 bytes -> 16 crumbs, lowest bits = lowest column
    uint32_t four;
    std::memcpy(&four, row + d / 4, 4);
    const __m512i q = _mm512_and_si512(_mm512_srlv_epi32(_mm512_set1_epi32(four), shifts),
                                       _mm512_set1_epi32(3));
    _mm512_storeu_ps(out + d, _mm512_add_ps(_mm512_mul_ps(_mm512_cvtepi32_ps(q), vs), vb));
  }
#elif SSL_LEVEL == 1
  const __m256 vs = _mm256_set1_ps(scale), vb = _mm256_set1_ps(bias);
  const __m256i shifts = _mm256_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14);
  for (; d + 8 <= dim; d += 8) {
    uint16_t two;
    std::memcpy(&two, row + d / 4, 2);
    const __m256i q = _mm256_and_si256(_mm256_srlv_epi32(_mm256_set1_epi32(two), shifts),
                                       _mm256_set1_epi32(3));
    _mm256_storeu_ps(out + d, _mm256_add_ps(_mm256_mul_ps(_mm256_cvtepi32_ps(q), vs), vb));
  }
#endif
  for (; d < dim; ++d) {
    const float q = static_cast<float>((row[d / 4] >> ((d % 4) * 2)) & 3);
    out[d] = q * scale + bias;
  }
}
