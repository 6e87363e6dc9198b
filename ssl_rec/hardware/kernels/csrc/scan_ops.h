// Branch-free scans of the kernels' input checks (checks.cpp), one instruction-set variant
// (included by simd_variants.cpp): they only say whether something is wrong, at the
// variant's vector width; the checks then name the bad value in a plain loop.

// Whether some x[i] lies outside [lo, hi) (hi - lo <= 2^63): with u = x - lo and top = hi -
// lo - 1 as unsigned, u | (top - u) has its sign bit set exactly when u > top (wrapped), so
// one OR-reduction without branches decides it, at this variant's vector width. The input
// checks of every lookup run it over the ids; they name the bad value only when it fails.
inline bool outside(const int64_t* x, int64_t n, int64_t lo, int64_t hi) {
  if (n <= 0) return false;
  if (hi <= lo) return true;
  const uint64_t first = static_cast<uint64_t>(lo), top = static_cast<uint64_t>(hi - lo - 1);
  uint64_t acc = 0;
  for (int64_t i = 0; i < n; ++i) {
    const uint64_t u = static_cast<uint64_t>(x[i]) - first;
    acc |= u | (top - u);
  }
  return (acc >> 63) != 0;
}

// Whether some step off[b + 1] - off[b] of the nb offsets is negative, for offsets already
// known to lie in [0, 2^63) (then no step wraps), at this variant's vector width.
inline bool descends(const int64_t* off, int64_t nb) {
  uint64_t acc = 0;
  for (int64_t b = 0; b + 1 < nb; ++b)
    acc |= static_cast<uint64_t>(off[b + 1]) - static_cast<uint64_t>(off[b]);
  return (acc >> 63) != 0;
}
