// Per-row loops of the training and lookup kernels, one instruction-set variant (included by
// simd_variants.cpp after row_ops.h). The loops walk lists known in full before they start
// (evictions, admissions, unique rows), so the rows they will touch are requested a fixed
// distance ahead: a miss costs random DRAM accesses whose latency then overlaps.

constexpr int64_t kAhead = 8;

inline void prefetch_bytes(const void* p, int64_t bytes) {
  const char* c = static_cast<const char*>(p);
  for (int64_t off = 0; off < bytes; off += 64) __builtin_prefetch(c + off);
  __builtin_prefetch(c + bytes - 1);
}
// The same, announcing a write (the line arrives exclusive: no second request to own it).
inline void prefetch_write(void* p, int64_t bytes) {
  char* c = static_cast<char*>(p);
  for (int64_t off = 0; off < bytes; off += 64) __builtin_prefetch(c + off, 1);
  __builtin_prefetch(c + bytes - 1, 1);
}

// Each admission: the victim's FP32 cache row is written back to its store row (stochastic
// rounding, purpose eviction), then the new row's store value fills the slot, in one pass so
// the slot's lines are read once. Evicted rows are cached and admitted rows are not, so no
// admission reads a store row another one writes.
inline void replace(const TableView& table, const Move* m, int64_t n, uint32_t key) {
  const TableView t = table;  // a local copy, as in update
  constexpr int64_t kMoveAhead = 4;  // a move touches up to 8 lines: 32 in flight
  for (int64_t i = 0; i < n; ++i) {
    if (i + kMoveAhead < n) {
      const Move& a = m[i + kMoveAhead];
      prefetch_write(t.cache_row(a.slot), t.dim * 4);
      if (a.victim >= 0) prefetch_write(t.store_row(a.victim), t.rbytes);
      prefetch_bytes(t.store_row(a.row), t.rbytes);
    }
    float* slot = t.cache_row(m[i].slot);
    if (m[i].victim >= 0)
      quant_row(t.kind, slot, t.dim, t.store_row(m[i].victim), t.sr,
                row_key(key, t.global_row(m[i].victim)));
    dequant_row(t.kind, t.store_row(m[i].row), t.dim, slot);
  }
}

// Where the value of each unique row is read from: its plan slot's FP32 cache row (valid
// while the plan is pending: its rows are locked) or its store row. Reads no cache tag, so it
// may run beside an admission.
inline void sources(const TableView& t, const int64_t* rows, const int32_t* slots, int64_t n,
                    const uint8_t** src) {
  for (int64_t u = 0; u < n; ++u)
    src[u] = slots[u] >= 0 ? reinterpret_cast<const uint8_t*>(t.cache_row(slots[u]))
                           : t.store_row(rows[u]);
}

// out[b, f] for the samples of a chunk split by where their rows live: cached[0, nc) copied
// from FP32 rows cache_row(b), stored[0, ns) read from store rows store_row(b) of format
// `kind` (rbytes each), dequantized straight into the output; rows requested kRowAhead
// samples ahead and written with non-temporal stores (call stream_fence() before the output
// is used). `work(j)` runs once per written row j = 0 .. nc + ns - 1, beside its stores: other
// work placed there overlaps with the output's write-back instead of waiting for it.
constexpr int64_t kRowAhead = 16;
struct NoWork {
  void operator()(int64_t) const {}
};
template <class CacheRow, class StoreRow, class Work = NoWork>
inline void write_rows(const int32_t* cached, int64_t nc, const int32_t* stored, int64_t ns,
                       int kind, int64_t rbytes, int64_t dim, int64_t F, int64_t f, float* out,
                       const CacheRow& cache_row, const StoreRow& store_row,
                       const Work& work = Work()) {
  alignas(64) float row[kMaxDim];
  for (int64_t i = 0; i < nc; ++i) {
    if (i + kRowAhead < nc) prefetch_bytes(cache_row(cached[i + kRowAhead]), dim * 4);
    const int64_t b = cached[i];
    stream_row(out + (b * F + f) * dim, cache_row(b), dim);
    work(i);
  }
  for (int64_t i = 0; i < ns; ++i) {
    if (i + kRowAhead < ns) prefetch_bytes(store_row(stored[i + kRowAhead]), rbytes);
    const int64_t b = stored[i];
    dequant_stream_row(kind, store_row(b), dim, out + (b * F + f) * dim, row);
    work(nc + i);
  }
}

// out[b, f] = value of src[f][inverse[f, b]] for samples [b0, b1) of a plan (`slots` and
// `inverse` int32[F, B]): cached rows copied, store rows dequantized on the way (a row a batch looks up
// once, the common uncached case, is then read once and never staged). Table by table, as
// FBGEMM's TBE forward runs: one table's hot rows and page translations stay in the CPU
// caches while its samples are served. Each chunk of samples is first split by where its
// rows live, so that neither loop takes a branch that a hit rate near one half would make
// unpredictable.
inline void gather(const TableView* ts, const uint8_t* const* const* src, const int32_t* slots,
                   const int32_t* inverse, int64_t B, int64_t F, int64_t b0, int64_t b1,
                   float* out) {
  constexpr int64_t kChunk = 256;
  const int64_t dim = F ? ts[0].dim : 0;
  int32_t cached[kChunk], stored[kChunk];
  for (int64_t f = 0; f < F; ++f) {
    const uint8_t* const* sf = src[f];
    const int32_t* slot = slots + f * B;
    const int32_t* inv = inverse + f * B;
    const auto src_of = [&](int64_t b) { return sf[inv[b]]; };
    for (int64_t c0 = b0; c0 < b1; c0 += kChunk) {
      const int64_t c1 = std::min(b1, c0 + kChunk);
      int64_t nc = 0, ns = 0;
      for (int64_t b = c0; b < c1; ++b) {
        append_either(slot[inv[b]] >= 0, static_cast<int32_t>(b), cached, nc, stored, ns);
      }
      write_rows(cached, nc, stored, ns, ts[f].kind, ts[f].rbytes, dim, F, f, out,
                 [&](int64_t b) { return reinterpret_cast<const float*>(src_of(b)); }, src_of);
    }
  }
  stream_fence();
}

// The samples of one chunk of a cached table split by where their rows live (see lookup).
constexpr int64_t kLookupChunk = 256;
struct LookupChunk {
  int64_t c0 = 0, n = 0, nc = 0, ns = 0;
  int64_t rows[kLookupChunk];
  int32_t slot[kLookupChunk], cached[kLookupChunk], stored[kLookupChunk];
  void start(int64_t first, int64_t count) {
    c0 = first;
    n = count;
    nc = ns = 0;
  }
  // Sample c0 + i: its row of table t (ids of table f, F per sample) searched in its set.
  void probe(const TableView& t, const int64_t* ids, int64_t F, int64_t f, int64_t i) {
    const int64_t row = ids[(c0 + i) * F + f];
    const int64_t s = t.find_in(t.set_of(row), row);
    rows[i] = row;
    slot[i] = static_cast<int32_t>(s);
    append_either(s >= 0, static_cast<int32_t>(c0 + i), cached, nc, stored, ns);
  }
};

// Eval lookup of samples [b0, b1): cached value, else the dequantized store row. Table by
// table, split by where each row lives and written with non-temporal stores, as the gather.
// An uncached table (FP32) skips the probe. A cached table's chunks are pipelined: the next
// chunk's samples are searched while the current one's rows are written, one per row, so the
// searches run while the output's write-back is the bottleneck rather than between writes.
inline void lookup(const TableView* ts, const int64_t* ids, int64_t F, int64_t b0, int64_t b1,
                   float* out) {
  if (b0 >= b1) return;
  const int64_t dim = F ? ts[0].dim : 0;
  LookupChunk chunks[2];
  for (int64_t f = 0; f < F; ++f) {
    const TableView t = ts[f];  // a local copy: the output's stores may alias its floats
    if (t.sets == 0) {
      int64_t* rows = chunks[0].rows;
      int32_t* stored = chunks[0].stored;
      for (int64_t c0 = b0; c0 < b1; c0 += kLookupChunk) {
        const int64_t n = std::min(b1 - c0, kLookupChunk);
        for (int64_t i = 0; i < n; ++i) {
          rows[i] = ids[(c0 + i) * F + f];
          stored[i] = static_cast<int32_t>(c0 + i);
        }
        write_rows(stored, 0, stored, n, t.kind, t.rbytes, dim, F, f, out,
                   [&](int64_t) { return static_cast<const float*>(nullptr); },
                   [&](int64_t b) {
                     return static_cast<const uint8_t*>(t.store_row(rows[b - c0]));
                   });
      }
      continue;
    }
    LookupChunk* cur = &chunks[0];
    LookupChunk* next = &chunks[1];
    cur->start(b0, std::min(b1 - b0, kLookupChunk));
    for (int64_t i = 0; i < cur->n; ++i) cur->probe(t, ids, F, f, i);
    while (cur->n > 0) {
      const int64_t c1 = cur->c0 + cur->n;
      next->start(c1, std::min(b1 - c1, kLookupChunk));
      // a chunk's rows cover the next chunk's samples: only the last chunk is shorter
      const auto probe_next = [&](int64_t j) {
        if (j < next->n) next->probe(t, ids, F, f, j);
      };
      const LookupChunk& c = *cur;
      const auto cache_row = [&](int64_t b) {
        return static_cast<const float*>(t.cache_row(c.slot[b - c.c0]));
      };
      const auto store_row = [&](int64_t b) {
        return static_cast<const uint8_t*>(t.store_row(c.rows[b - c.c0]));
      };
      write_rows(c.cached, c.nc, c.stored, c.ns, t.kind, t.rbytes, dim, F, f, out, cache_row,
                 store_row, probe_next);
      std::swap(cur, next);
    }
  }
  stream_fence();
}

// Fused optimizer step of unique rows [u0, u1) of table f: the gradient rows of each unique
// row summed in sample order (the first one taken as is), rows whose sum is exactly zero
// skipped, with `Decay` the L2 term wd * w of the row's current value w added to that sum
// (FBGEMM's weight_decay_mode L2, lazily: only rows this batch touches decay), then SGD or
// row-wise Adagrad into the cache row (exact) or the store row (dequantize, step, stochastic
// rounding). Where a row lives is its plan slot when `slots_current` (no admission since the
// plan's: its locked rows kept their slots and no other row of it was admitted), else looked
// up again by tag. Returns the number of store writes.
template <bool Decay>
inline int64_t update_rows(const TableView& table, const int64_t* rows, const int32_t* slots,
                           Groups g, const float* grad, int64_t F, int64_t f, int64_t u0,
                           int64_t u1, uint32_t key, bool slots_current) {
  // A local copy: the row writes below may alias any object reached through a pointer, which
  // would make every row reload the table's fields.
  const TableView t = table;
  constexpr int64_t kGradAhead = 12;  // gradient rows, in the order they are summed
  const int64_t dim = t.dim, stride = F * dim;
  const float* gf = grad + f * dim;
  const int32_t last = g.start[u1];
  alignas(64) float acc[kMaxDim];
  alignas(64) float tmp[kMaxDim];
  int64_t writes = 0;
  for (int32_t j = g.start[u0]; j < g.start[u0] + kGradAhead && j < last; ++j)
    prefetch_bytes(gf + g.order[j] * stride, dim * 4);
  for (int64_t u = u0; u < u1; ++u) {
    if (u + kAhead < u1) {
      const int64_t ahead = u + kAhead, hint = slots[ahead];
      prefetch_bytes(hint >= 0 ? static_cast<const void*>(t.cache_row(hint))
                               : static_cast<const void*>(t.store_row(rows[ahead])),
                     hint >= 0 ? dim * 4 : t.rbytes);
      if (t.mom) __builtin_prefetch(t.mom + rows[ahead]);
      // the tag current_slot reads: the hint's, or the set's that find searches
      if (t.sets && !slots_current)
        __builtin_prefetch(t.tags + (hint >= 0 ? hint : t.set_of(rows[ahead]) * kWays));
    }
    const float* a = gf + g.order[g.start[u]] * stride;
    if (g.start[u] + kGradAhead < last)
      prefetch_bytes(gf + g.order[g.start[u] + kGradAhead] * stride, dim * 4);
    if (g.start[u + 1] - g.start[u] > 1) {
      copy_row(acc, a, dim);
      for (int32_t j = g.start[u] + 1; j < g.start[u + 1]; ++j) {
        if (j + kGradAhead < last)
          prefetch_bytes(gf + g.order[j + kGradAhead] * stride, dim * 4);
        add_row(acc, gf + g.order[j] * stride, dim);
      }
      a = acc;
    }
    if (all_zero(a, dim)) continue;
    const int64_t row = rows[u];
    // (an uncached table's plan slots are all -1: check_plan allows no other value)
    const int64_t slot = slots_current ? slots[u] : t.current_slot(row, slots[u]);
    if (Decay) {
      // The row's value: its cache row, its FP32 store row, or its store row dequantized
      // into tmp (which the step below then updates and quantizes back).
      const float* w = tmp;
      if (slot >= 0) {
        w = t.cache_row(slot);
      } else if (t.kind == kFp32) {
        w = reinterpret_cast<const float*>(t.store_row(row));
      } else {
        dequant_row(t.kind, t.store_row(row), dim, tmp);
      }
      if (a != acc) copy_row(acc, a, dim);
      add_scaled(acc, t.wd, w, dim);
      a = acc;
    }
    float mult = t.lr;
    if (t.optimizer == 1) {
      const float mo = t.mom[row] + sum_squares(a, dim) / static_cast<float>(dim);
      t.mom[row] = mo;
      mult = t.lr / (std::sqrt(mo) + t.eps);
    }
    if (slot >= 0) {
      sub_scaled(t.cache_row(slot), mult, a, dim);
    } else if (t.kind == kFp32) {
      sub_scaled(reinterpret_cast<float*>(t.store_row(row)), mult, a, dim);
      ++writes;
    } else if (Decay) {
      sub_scaled(tmp, mult, a, dim);
      quant_row(t.kind, tmp, dim, t.store_row(row), t.sr, row_key(key, t.global_row(row)));
      ++writes;
    } else {
      step_store_row(t.kind, t.store_row(row), dim, mult, a, t.sr,
                     row_key(key, t.global_row(row)), tmp);
      ++writes;
    }
  }
  return writes;
}

// update_rows with or without weight decay, chosen once per call: the rows' loop of a table
// without decay is the same code as before decay existed.
inline int64_t update(const TableView& table, const int64_t* rows, const int32_t* slots,
                      Groups g, const float* grad, int64_t F, int64_t f, int64_t u0, int64_t u1,
                      uint32_t key, bool slots_current) {
  if (table.wd != 0.0f)
    return update_rows<true>(table, rows, slots, g, grad, F, f, u0, u1, key, slots_current);
  return update_rows<false>(table, rows, slots, g, grad, F, f, u0, u1, key, slots_current);
}
