// Raw views of the tables and of an admission plan, and the function table of one
// instruction-set variant. Plain structs of pointers: the variant code never sees a tensor.
#pragma once
#include <cstdint>
#if defined(__SSE2__)
#include <emmintrin.h>
#endif

#include "common.h"

namespace sslrec {

// One table, read once per kernel call (after validation, see checks.cpp).
struct TableView {
  uint8_t* store = nullptr;
  int64_t rbytes = 0, rows = 0, dim = 0, offset = 0, stride = 1, stream = 0;
  int kind = 0, policy = 0, optimizer = 0;
  int32_t admission = 1;  // samples of a missed row in its batch that admit it
  bool sr = false;
  float* cache = nullptr;
  int16_t* tags = nullptr;
  uint8_t* state = nullptr;
  int64_t sets = 0;
  int64_t* stats = nullptr;
  float* mom = nullptr;
  float lr = 0.0f, eps = 0.0f;
  float wd = 0.0f;  // L2 weight decay of the fused optimizer (touched rows only)

  uint64_t set_magic = 0;  // floor(2^64 / sets) + 1 when rows < 2^32 and sets > 1, else 0
  int set_shift = -1;      // log2(sets) when sets is a power of two (1 included), else -1

  uint8_t* store_row(int64_t row) const { return store + row * rbytes; }
  // Global row of local `row` (row-wise shards hold rows offset, offset + stride, ...): the
  // stochastic-rounding key, so a sharded table draws the numbers of the unsharded one.
  int64_t global_row(int64_t row) const { return offset + row * stride; }
  float* cache_row(int64_t slot) const { return cache + slot * dim; }
  // Cache set and tag of a row (row % sets, row / sets) without a division: a mask and a
  // shift when sets is a power of two (a small table's single set among them), else a
  // multiply (Lemire et al., "Faster remainder by direct computation", 2019; exact below 2^32).
  void set_magic_from_sets() {
    set_shift = sets > 0 && (sets & (sets - 1)) == 0 ? __builtin_ctzll(sets) : -1;
    const bool fits = set_shift < 0 && sets > 1 && rows <= 0xFFFFFFFFll;
    set_magic = fits ? ~uint64_t{0} / static_cast<uint64_t>(sets) + 1 : 0;
  }
  int64_t set_of(int64_t row) const {
    if (set_shift >= 0) return row & (sets - 1);
    if (set_magic == 0) return row % sets;
    const uint64_t low = set_magic * static_cast<uint64_t>(row);
    return static_cast<int64_t>((static_cast<unsigned __int128>(low) * sets) >> 64);
  }
  int64_t tag_of(int64_t row) const {
    if (set_shift >= 0) return row >> set_shift;
    if (set_magic == 0) return row / sets;
    return static_cast<int64_t>((static_cast<unsigned __int128>(set_magic) * row) >> 64);
  }
  // The ways of set s whose tag is `tag` in bits 0-7 (bit w: way w) and its empty ways (tag -1)
  // in bits 8-15, from one read of the set's tags. SSE2 (part of x86-64) compares the 8 tags
  // at once: no branch per way.
  uint32_t ways_tagged_and_empty(int64_t s, int16_t tag) const {
    const int16_t* t = tags + s * kWays;
#if defined(__SSE2__)
    static_assert(kWays == 8, "one 16-byte compare per set");
    const __m128i v = _mm_loadu_si128(reinterpret_cast<const __m128i*>(t));
    const __m128i eq = _mm_cmpeq_epi16(v, _mm_set1_epi16(tag));
    const __m128i empty = _mm_cmpeq_epi16(v, _mm_set1_epi16(-1));
    return static_cast<uint32_t>(_mm_movemask_epi8(_mm_packs_epi16(eq, empty)));
#else
    uint32_t ways = 0;
    for (int w = 0; w < kWays; ++w) {
      ways |= static_cast<uint32_t>(t[w] == tag) << w;
      ways |= static_cast<uint32_t>(t[w] == -1) << (w + 8);
    }
    return ways;
#endif
  }
  int64_t find(int64_t row) const {
    if (sets == 0) return -1;
    return find_in(set_of(row), row);
  }
  // find's search, given the row's set s = set_of(row) (of a table with a cache): the first
  // way whose tag is the row's, from one compare of the set's tags (no empty-way test).
  int64_t find_in(int64_t s, int64_t row) const {
    const int16_t tag = static_cast<int16_t>(tag_of(row));
#if defined(__SSE2__)
    const __m128i v = _mm_loadu_si128(reinterpret_cast<const __m128i*>(tags + s * kWays));
    const __m128i eq = _mm_cmpeq_epi16(v, _mm_set1_epi16(tag));
    const uint32_t pairs = static_cast<uint32_t>(_mm_movemask_epi8(eq));  // 2 bits a way
    // Without a branch: hits and misses alternate unpredictably where about half the rows
    // are cached, and a mispredicted branch per row cost more than the rest of the search.
    const int64_t slot = s * kWays + __builtin_ctz(pairs | 0x10000u) / 2;
    const int64_t hit = -static_cast<int64_t>(pairs != 0);  // all ones on a hit, else 0
    return (slot & hit) | ~hit;
#else
    const uint32_t ways = ways_tagged_and_empty(s, tag) & 0xFF;
    return ways ? s * kWays + __builtin_ctz(ways) : -1;
#endif
  }
  // Slot holding `row` now: the plan's `hint` when it still holds the row, else a search.
  int64_t current_slot(int64_t row, int64_t hint) const {
    if (sets == 0) return -1;
    if (hint >= 0 && tags[hint] == tag_of(row)) return hint;
    return find(row);
  }
};

// An admission: `row` enters cache slot `slot`, whose previous row `victim` (-1: the slot
// was empty) is written back first.
struct Move {
  int64_t slot, victim, row;
};

// Samples of one table grouped by unique row, in sample order (CSR): the samples of unique
// row u are order[start[u] .. start[u + 1]).
struct Groups {
  const int32_t* start;
  const int32_t* order;
};

struct Variant {
  const char* name;
  void (*dequant_row)(int kind, const uint8_t* row, int64_t dim, float* out);
  void (*quant_row)(int kind, const float* x, int64_t dim, uint8_t* row, bool sr, uint32_t rk);
  void (*replace)(const TableView& t, const Move* m, int64_t n, uint32_t key);
  void (*sources)(const TableView& t, const int64_t* rows, const int32_t* slots, int64_t n,
                  const uint8_t** src);
  void (*gather)(const TableView* ts, const uint8_t* const* const* src, const int32_t* slots,
                 const int32_t* inverse, int64_t B, int64_t F, int64_t b0, int64_t b1,
                 float* out);
  void (*lookup)(const TableView* ts, const int64_t* ids, int64_t F, int64_t b0, int64_t b1,
                 float* out);
  int64_t (*update)(const TableView& t, const int64_t* rows, const int32_t* slots, Groups g,
                    const float* grad, int64_t F, int64_t f, int64_t u0, int64_t u1,
                    uint32_t key, bool slots_current);
  void (*bag)(int bits, const uint8_t* base, int64_t rb, int64_t dim, const int64_t* ix,
              const int64_t* off, int64_t begin, int64_t end, float* op);
  void (*serve_rows)(const TableView* ts, const int64_t* ids, int64_t F, int64_t b0, int64_t b1,
                     float* out, int64_t out_stride);
  void (*interact)(const float* vectors, int64_t N, int64_t dim, int64_t b0, int64_t b1,
                   float* scratch, float* out, int64_t out_stride);
  void (*int8_linear)(const float* x, int64_t R, int64_t K, const int8_t* w, const float* scale,
                      const float* bias, int64_t n0, int64_t n1, bool relu, float* y, int64_t N);
  bool (*outside)(const int64_t* x, int64_t n, int64_t lo, int64_t hi);
  bool (*descends)(const int64_t* off, int64_t nb);
};

// The variant in use: AVX-512 or AVX2 when the CPU has it, else portable; see simd_level.
const Variant& variant();
// 0 portable, 1 AVX2, 2 AVX-512; set_simd_level fails for a level the CPU lacks.
int64_t simd_level();
int64_t max_simd_level();
int64_t set_simd_level(int64_t level);

}  // namespace sslrec
