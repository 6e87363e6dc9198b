// The row-level kernels compiled three times: portable C++, AVX2 and AVX-512, each in its
// own namespace and with its own target attributes, so one binary runs on any x86-64 CPU
// and uses the widest vectors the CPU has (chosen once at load, see simd_level). Other
// CPUs (e.g. aarch64) get the portable variant only.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <stdexcept>
#include <string>

#include "tables.h"

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#define SSL_X86_VARIANTS 1
#include <immintrin.h>
#else
#define SSL_X86_VARIANTS 0
#endif

namespace sslrec {

#define SSL_VARIANT_TABLE(ns, label)                                                          \
  const Variant& table() {                                                                    \
    static const Variant v{label,  &dequant_row, &quant_row, &replace,                        \
                           &sources, &gather,    &lookup,    &update, &bag_range,             \
                           &serve_rows, &interact, &int8_linear, &outside, &descends};        \
    return v;                                                                                 \
  }

namespace portable {
#define SSL_LEVEL 0
#include "row_ops.h"
#include "bag_ops.h"
#include "scan_ops.h"
#include "table_ops.h"
#include "serve_ops.h"
#undef SSL_LEVEL
SSL_VARIANT_TABLE(portable, "portable")
}  // namespace portable

#if SSL_X86_VARIANTS
#if defined(__clang__)
#pragma clang attribute push(__attribute__((target("avx2,fma,f16c"))), apply_to = function)
#else
#pragma GCC push_options
#pragma GCC target("avx2,fma,f16c")
#endif
namespace avx2 {
#define SSL_LEVEL 1
#include "row_ops.h"
#include "bag_ops.h"
#include "scan_ops.h"
#include "table_ops.h"
#include "serve_ops.h"
#undef SSL_LEVEL
SSL_VARIANT_TABLE(avx2, "avx2")
}  // namespace avx2
#if defined(__clang__)
#pragma clang attribute pop
#pragma clang attribute push(__attribute__((target("avx512f,avx512bw,avx512dq,avx512vl,avx2,fma,f16c"))), apply_to = function)
#else
#pragma GCC pop_options
#pragma GCC push_options
#pragma GCC target("avx512f,avx512bw,avx512dq,avx512vl,avx2,fma,f16c")
#endif
namespace avx512 {
#define SSL_LEVEL 2
#include "row_ops.h"
#include "bag_ops.h"
#include "scan_ops.h"
#include "table_ops.h"
#include "serve_ops.h"
#undef SSL_LEVEL
SSL_VARIANT_TABLE(avx512, "avx512")
}  // namespace avx512
#if defined(__clang__)
#pragma clang attribute pop
#else
#pragma GCC pop_options
#endif
#endif

namespace {

int64_t detect_level() {
#if SSL_X86_VARIANTS
  __builtin_cpu_init();
  if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
      __builtin_cpu_supports("avx512dq") && __builtin_cpu_supports("avx512vl"))
    return 2;
  // F16C comes with every AVX2 CPU (Intel Haswell and AMD Zen on).
  if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) return 1;
#endif
  return 0;
}

const Variant* by_level(int64_t level) {
#if SSL_X86_VARIANTS
  if (level == 2) return &avx512::table();
  if (level == 1) return &avx2::table();
#endif
  return &portable::table();
}

struct Current {
  int64_t max_level = detect_level();
  int64_t level = max_level;
  const Variant* v = by_level(max_level);
};

Current& current() {
  static Current c;
  return c;
}

}  // namespace

const Variant& variant() { return *current().v; }
int64_t simd_level() { return current().level; }
int64_t max_simd_level() { return current().max_level; }

int64_t set_simd_level(int64_t level) {
  Current& c = current();
  if (level < 0 || level > c.max_level)
    throw std::invalid_argument("simd level " + std::to_string(level) +
                                " is not available on this CPU (0 .. " +
                                std::to_string(c.max_level) + ")");
  const int64_t previous = c.level;
  c.level = level;
  c.v = by_level(level);
  return previous;
}

}  // namespace sslrec
