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
  for (int64_t g = 0; g < kInteractScratch; ++g)
    for (int64_t d = 0; d < dim; ++d)
      for (int64_t j = N; j < np; ++j) scratch[g * size + d * np + j] = 0.0f;
  for (int64_t g0 = b0; g0 < b1; g0 += kInteractScratch) {
    const int64_t g1 = std::min(g0 + kInteractScratch, b1);
    for (int64_t b = g0; b < g1; ++b) {  // transposed first: no load waits on these stores
      const float* v = vectors + b * N * dim;
      float* vt = scratch + (b - g0) * size;
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
