// Kernels of the serving model, one instruction-set variant (included by simd_variants.cpp
// after bag_ops.h): the table-batched lookup of quantized tables and DLRM's pairwise dot
// interaction. Inference only: no cache, no gradient.

// Rows ids[b, f] of every table f for samples [b0, b1), written sample-major into
// out[b, f, :]. INT8 rows are dequantized as FBGEMM's row-wise inference ops do
// (fma(scale, q, bias) in the AVX2/AVX-512 variants), the other formats exactly, so the
// result equals torch.ops.quantized.embedding_bag_{byte,4bit,2bit}_rowwise_offsets with one
// id per bag (INT4/INT2: q * scale is exact, fused or not).
inline void serve_rows(const TableView* ts, const int64_t* ids, int64_t F, int64_t b0,
                       int64_t b1, float* out) {
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
      float* o = out + (b * F + f) * dim;
      if (t.kind == kInt8) {
        bag_add_int8(row, dim, o, true);
      } else {
        dequant_row(t.kind, row, dim, o);
      }
    }
  }
}

// Upper triangle (without the diagonal, row-major as torch.triu_indices) of V V^T for each
// sample b in [b0, b1), V = vectors[b] of N rows of `dim`: out[b, k] for the k-th pair
// (i < j). Each dot product is summed over d in order, one rounding per product and per
// sum, so every variant gives the same bits. The vectors are transposed into `scratch`
// (dim x np floats, np = N rounded up to 16, zero padded) so the inner loop runs over j in
// whole 16-lane blocks: acc[j] += v_i[d] * V^T[d, j] vectorizes without reassociation.
inline void interact(const float* vectors, int64_t N, int64_t dim, int64_t b0, int64_t b1,
                     float* scratch, float* out) {
  const int64_t np = (N + 15) / 16 * 16, pairs = N * (N - 1) / 2;
  float* vt = scratch;
  float* acc = scratch + dim * np;
  for (int64_t d = 0; d < dim; ++d)
    for (int64_t j = N; j < np; ++j) vt[d * np + j] = 0.0f;
  for (int64_t b = b0; b < b1; ++b) {
    const float* v = vectors + b * N * dim;
    for (int64_t i = 0; i < N; ++i)
      for (int64_t d = 0; d < dim; ++d) vt[d * np + i] = v[i * dim + d];
    float* o = out + b * pairs;
    for (int64_t i = 0; i + 1 < N; ++i) {
      const int64_t first = (i + 1) / 16 * 16;  // the 16-lane block holding column i + 1
      for (int64_t j = first; j < np; ++j) acc[j] = 0.0f;
      for (int64_t d = 0; d < dim; ++d) {
        const float s = v[i * dim + d];
        const float* t = vt + d * np;
        for (int64_t j = first; j < np; j += 16)
          for (int64_t l = 0; l < 16; ++l) acc[j + l] += s * t[j + l];
      }
      std::memcpy(o, acc + i + 1, (N - i - 1) * sizeof(float));
      o += N - i - 1;
    }
  }
}
