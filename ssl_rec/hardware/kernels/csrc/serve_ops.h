// Kernels of the serving model, one instruction-set variant (included by simd_variants.cpp
// after bag_ops.h): the table-batched lookup of quantized tables and DLRM's pairwise dot
// interaction. Inference only: no cache, no gradient. Both write at a caller-given place in
// a caller-given buffer (per-sample stride), so the serving model lays the lookups and the
// interaction straight into the next stage's input instead of concatenating copies.

// Rows ids[b, f] of every table f for samples [b0, b1), written to
// out[b * out_stride + f * dim + d]. INT8 rows are dequantized as FBGEMM's row-wise
// inference ops do (fma(scale, q, bias) in the AVX2/AVX-512 variants), the other formats
// exactly, so the result equals torch.ops.quantized.embedding_bag_{byte,4bit,2bit}_rowwise_
// offsets with one id per bag (INT4/INT2: q * scale is exact, fused or not).
inline void serve_rows(const TableView* ts, const int64_t* ids, int64_t F, int64_t b0,
                       int64_t b1, float* out, int64_t out_stride) {
  constexpr int64_t kSampleAhead = 2;
  const int64_t dim = F ? ts[0].dim : 0;
  for (int64_t b = b0; b < b1; ++b) {
    if (b + kSampleAhead < b1) {
      const int64_t* next = ids + (b + kSampleAhead) * F;
      for (int64_t f = 0; f < F; ++f) {
        const uint8_t* row = ts[f].store_row(next[f]);
        __builtin_prefetch(row);
        __builtin_prefetch(row + ts[f].rbytes - 1);
      }
    }
    for (int64_t f = 0; f < F; ++f) {
      const TableView& t = ts[f];
      const uint8_t* row = t.store_row(ids[b * F + f]);
      float* o = out + b * out_stride + f * dim;
      if (t.kind == kInt8) {
        bag_add_int8(row, dim, o, true);
      } else {
        dequant_row(t.kind, row, dim, o);
      }
    }
  }
}

#if SSL_LEVEL == 2
// vt[d * np + i] = v[i * dim + d] for the N rows of one sample, rows N .. np - 1 zero; dim
// a multiple of 16. Each 16 x 16 tile moves through registers: 64 shuffles instead of 256
// scalar loads and stores (unpack pairs of rows, then pairs of pairs, then 128-bit lanes).
inline void transpose_tiles(const float* v, int64_t N, int64_t dim, int64_t np, float* vt) {
  for (int64_t r0 = 0; r0 < np; r0 += 16)
    for (int64_t d0 = 0; d0 < dim; d0 += 16) {
      __m512 r[16], t[16];
      for (int k = 0; k < 16; ++k)
        r[k] = r0 + k < N ? _mm512_loadu_ps(v + (r0 + k) * dim + d0) : _mm512_setzero_ps();
      for (int k = 0; k < 8; ++k) {
        t[2 * k] = _mm512_unpacklo_ps(r[2 * k], r[2 * k + 1]);
        t[2 * k + 1] = _mm512_unpackhi_ps(r[2 * k], r[2 * k + 1]);
      }
      // r[4g + c], lane k: rows 4g .. 4g + 3 at column 4k + c
      for (int g = 0; g < 4; ++g) {
        r[4 * g] = _mm512_shuffle_ps(t[4 * g], t[4 * g + 2], 0x44);
        r[4 * g + 1] = _mm512_shuffle_ps(t[4 * g], t[4 * g + 2], 0xEE);
        r[4 * g + 2] = _mm512_shuffle_ps(t[4 * g + 1], t[4 * g + 3], 0x44);
        r[4 * g + 3] = _mm512_shuffle_ps(t[4 * g + 1], t[4 * g + 3], 0xEE);
      }
      for (int c = 0; c < 4; ++c) {  // 4 x 4 transpose of the 128-bit lanes of r[c + 4g]
        const __m512 x0 = _mm512_shuffle_f32x4(r[c], r[c + 4], 0x44);
        const __m512 x1 = _mm512_shuffle_f32x4(r[c], r[c + 4], 0xEE);
        const __m512 x2 = _mm512_shuffle_f32x4(r[c + 8], r[c + 12], 0x44);
        const __m512 x3 = _mm512_shuffle_f32x4(r[c + 8], r[c + 12], 0xEE);
        float* o = vt + (d0 + c) * np + r0;
        _mm512_storeu_ps(o, _mm512_shuffle_f32x4(x0, x2, 0x88));
        _mm512_storeu_ps(o + 4 * np, _mm512_shuffle_f32x4(x0, x2, 0xDD));
        _mm512_storeu_ps(o + 8 * np, _mm512_shuffle_f32x4(x1, x3, 0x88));
        _mm512_storeu_ps(o + 12 * np, _mm512_shuffle_f32x4(x1, x3, 0xDD));
      }
    }
}

// Rows i0 .. i0 + R - 1 of one sample against the 16 columns [blk, blk + 16): R dot
// products per column at once, each its own chain of in-order sums (R independent chains
// hide the add latency). v: the sample's [N, dim] rows; vt: its transpose (dim x np);
// o: the sample's first pair. Rows past N - 2 are clamped (computed, never stored).
template <int R>
inline void interact_rows(const float* v, const float* vt, int64_t N, int64_t dim, int64_t np,
                          int64_t i0, int64_t iend, int64_t blk, float* o) {
  __m512 a[R];
  const float* rows[R];
  for (int k = 0; k < R; ++k) {
    a[k] = _mm512_setzero_ps();
    rows[k] = v + std::min(i0 + k, iend - 1) * dim;
  }
  for (int64_t d = 0; d < dim; ++d) {
    const __m512 col = _mm512_loadu_ps(vt + d * np + blk);
    for (int k = 0; k < R; ++k)
      a[k] = _mm512_add_ps(a[k], _mm512_mul_ps(_mm512_set1_ps(rows[k][d]), col));
  }
  for (int k = 0; k < R && i0 + k < iend; ++k) {
    const int64_t i = i0 + k, lo = std::max(blk, i + 1), hi = std::min(blk + 16, N);
    const auto mask = static_cast<__mmask16>(((1u << (hi - lo)) - 1) << (lo - blk));
    // row i's pairs start at i * (2N - i - 1) / 2, column j at j - i - 1; lanes outside
    // [lo, hi) are masked off: neither written nor touched
    _mm512_mask_storeu_ps(o + i * (2 * N - i - 1) / 2 + (blk - i - 1), mask, a[k]);
  }
}
#endif

// Upper triangle (without the diagonal, row-major as torch.triu_indices) of V V^T for each
// sample b in [b0, b1), V = vectors[b] of N rows of `dim`: out[b * out_stride + k] for the
// k-th pair (i < j). Each dot product is summed over d in order, one rounding per product
// and per sum, so every variant gives the same bits. The AVX-512 variant transposes
// kInteractScratch samples into `scratch` (dim x np floats each, np = N rounded up to 16,
// zero padded) and computes 16 columns j of 8 rows i at once in registers, stored under a
// mask.
inline void interact(const float* vectors, int64_t N, int64_t dim, int64_t b0, int64_t b1,
                     float* scratch, float* out, int64_t out_stride) {
#if SSL_LEVEL == 2
  constexpr int kRows = 8;
  const int64_t np = (N + 15) / 16 * 16, size = dim * np;
  const bool tiles = dim % 16 == 0;
  for (int64_t g = 0; g < kInteractScratch && !tiles; ++g)
    for (int64_t d = 0; d < dim; ++d)
      for (int64_t j = N; j < np; ++j) scratch[g * size + d * np + j] = 0.0f;
  for (int64_t g0 = b0; g0 < b1; g0 += kInteractScratch) {
    const int64_t g1 = std::min(g0 + kInteractScratch, b1);
    for (int64_t b = g0; b < g1; ++b) {  // transposed first: no load waits on these stores
      const float* v = vectors + b * N * dim;
      float* vt = scratch + (b - g0) * size;
      if (tiles) {
        transpose_tiles(v, N, dim, np, vt);
        continue;
      }
      for (int64_t i = 0; i < N; ++i)
        for (int64_t d = 0; d < dim; ++d) vt[d * np + i] = v[i * dim + d];
    }
    for (int64_t b = g0; b < g1; ++b) {
      const float* v = vectors + b * N * dim;
      const float* vt = scratch + (b - g0) * size;
      for (int64_t blk = 0; blk < N; blk += 16) {
        const int64_t iend = std::min(N - 1, blk + 15);  // rows with a column j > i here
        int64_t i0 = 0;
        for (; i0 + kRows <= iend; i0 += kRows)
          interact_rows<kRows>(v, vt, N, dim, np, i0, iend, blk, out + b * out_stride);
        if (iend - i0 > kRows / 2) {
          interact_rows<kRows>(v, vt, N, dim, np, i0, iend, blk, out + b * out_stride);
        } else if (i0 < iend) {
          interact_rows<kRows / 2>(v, vt, N, dim, np, i0, iend, blk, out + b * out_stride);
        }
      }
    }
  }
#else
  (void)scratch;
  for (int64_t b = b0; b < b1; ++b) {
    const float* v = vectors + b * N * dim;
    float* o = out + b * out_stride;
    for (int64_t i = 0; i + 1 < N; ++i)
      for (int64_t j = i + 1; j < N; ++j) {
        float acc = 0.0f;
        for (int64_t d = 0; d < dim; ++d) acc += v[i * dim + d] * v[j * dim + d];
        *o++ = acc;
      }
  }
#endif
}

// y[r * N + n] = scale[n] * sum_k w[n * K + k] * x[r * K + k] + bias[n] (then max(0, .) when
// `relu`) for outputs n in [n0, n1) of rows r < R: a Linear layer of row-wise INT8 weights
// multiplying FP32 inputs as they are (no input quantization), for the one row of a serving
// call (more rows are served one at a time). Each weight byte is read once per row and
// widened in registers, a quarter of the bytes an FP32 layer reads; `Outs` outputs at once,
// so each loaded input vector serves several. Sums run in vector lanes, then across them:
// each variant rounds in its own order (differences of float32 rounding, not of the product).
template <int Outs>
inline void int8_linear_outputs(const float* x, int64_t K, const int8_t* w, const float* scale,
                                const float* bias, int64_t n, bool relu, float* y) {
  float sum[Outs] = {};
  int64_t k = 0;
#if SSL_LEVEL == 2
  __m512 acc[Outs];
  for (int o = 0; o < Outs; ++o) acc[o] = _mm512_setzero_ps();
  const auto step = [&](int64_t at, __mmask16 m) {
    const __m512 xv = _mm512_maskz_loadu_ps(m, x + at);
    for (int o = 0; o < Outs; ++o) {
      const __m512 wv = _mm512_cvtepi32_ps(
          _mm512_cvtepi8_epi32(_mm_maskz_loadu_epi8(m, w + (n + o) * K + at)));
      acc[o] = _mm512_fmadd_ps(wv, xv, acc[o]);
    }
  };
  for (; k + 16 <= K; k += 16) step(k, static_cast<__mmask16>(0xFFFF));
  if (k < K) step(k, static_cast<__mmask16>((1u << (K - k)) - 1));
  k = K;
  for (int o = 0; o < Outs; ++o) sum[o] = _mm512_reduce_add_ps(acc[o]);
#elif SSL_LEVEL == 1
  __m256 acc[Outs];
  for (int o = 0; o < Outs; ++o) acc[o] = _mm256_setzero_ps();
  for (; k + 8 <= K; k += 8) {
    const __m256 xv = _mm256_loadu_ps(x + k);
    for (int o = 0; o < Outs; ++o) {
      const __m128i bytes = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(w + (n + o) * K + k));
      acc[o] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(bytes)), xv, acc[o]);
    }
  }
  for (int o = 0; o < Outs; ++o) {
    alignas(32) float lanes[8];
    _mm256_store_ps(lanes, acc[o]);
    for (float v : lanes) sum[o] += v;
  }
#endif
  for (; k < K; ++k)
    for (int o = 0; o < Outs; ++o) sum[o] += static_cast<float>(w[(n + o) * K + k]) * x[k];
  for (int o = 0; o < Outs; ++o) {
    const float v = scale[n + o] * sum[o] + (bias ? bias[n + o] : 0.0f);
    y[n + o] = relu && v < 0.0f ? 0.0f : v;
  }
}

inline void int8_linear(const float* x, int64_t R, int64_t K, const int8_t* w,
                        const float* scale, const float* bias, int64_t n0, int64_t n1, bool relu,
                        float* y, int64_t N) {
  constexpr int kOuts = 4;
  for (int64_t r = 0; r < R; ++r) {
    const float* xr = x + r * K;
    float* yr = y + r * N;
    int64_t n = n0;
    for (; n + kOuts <= n1; n += kOuts)
      int8_linear_outputs<kOuts>(xr, K, w, scale, bias, n, relu, yr);
    for (; n < n1; ++n) int8_linear_outputs<1>(xr, K, w, scale, bias, n, relu, yr);
  }
}
