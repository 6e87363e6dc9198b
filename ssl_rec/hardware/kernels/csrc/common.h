// Constants, row formats, counter-based random numbers and FP16 helpers shared by every
// instruction-set variant of the kernels; the twin of ssl_rec/hardware/precision.py,
// quantization.py and stochastic_rounding.py. Scalar code only (no intrinsics), so it is
// compiled once for the baseline target and inlined into every variant.
#pragma once
#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>

#include <cstdint>
#include <cstring>

namespace sslrec {

constexpr int kWays = 8;
constexpr int kLfuMax = 255;
constexpr int64_t kMaxDim = 2048;
// Samples the interaction kernel transposes at once (its scratch: this many dim x np blocks).
constexpr int64_t kInteractScratch = 8;
// Bytes of vectors serve_interaction gathers per chunk of samples (well inside L2).
constexpr int64_t kServeChunkBytes = 128 * 1024;
// Numbered as ssl_rec.hardware.precision.Precision.code (a test checks both sides agree).
enum Kind { kFp32 = 0, kFp16 = 1, kBf16 = 2, kInt8 = 3, kInt4 = 4, kInt2 = 5, kNumKinds = 6 };
// Column order of the int64[T, 10] table metadata (ssl_rec.hardware.kernels.table_meta.META_*).
enum Meta {
  kKind = 0, kPolicy, kOptimizer, kStochastic, kStream, kRowOffset, kRows, kDim, kRowStride,
  kAdmission, kMetaColumns
};
// Column order of the float32[T, 3] table hyperparameters
// (ssl_rec.hardware.kernels.table_meta.HPARAM_*).
enum HParam { kLr = 0, kEps, kWeightDecay, kHParamColumns };
// Largest admission count: a batch's samples of one row are counted in int32.
constexpr int64_t kMaxAdmission = 1 << 30;
enum Purpose { kPurposeUpdate = 0, kPurposeEvict = 1 };

inline uint32_t mix32(uint32_t x) {
  x ^= x >> 16;
  x *= 0x7feb352dU;
  x ^= x >> 15;
  x *= 0x846ca68bU;
  x ^= x >> 16;
  return x;
}
inline uint32_t stream_key(int64_t seed, int64_t stream, int purpose, int64_t step) {
  uint32_t k =
      mix32(static_cast<uint32_t>(seed) ^ mix32(static_cast<uint32_t>(stream * 2 + purpose)));
  return mix32(k + static_cast<uint32_t>(step));
}
inline uint32_t row_key(uint32_t key, int64_t row) {
  return mix32(key ^ mix32(static_cast<uint32_t>(row)));
}
inline uint32_t noise_bits(uint32_t rk, int64_t col) {
  return mix32(rk + static_cast<uint32_t>(col));
}
// 24 random bits as a float in [0, 1): exact, so every variant draws the same value.
inline float uniform24(uint32_t bits) {
  return static_cast<float>(static_cast<int32_t>(bits >> 8)) * (1.0f / 16777216.0f);
}

inline float h2f(uint16_t bits) {
  return static_cast<float>(c10::Half(bits, c10::Half::from_bits()));
}
inline uint16_t f2h(float f) { return c10::Half(f).x; }
inline float bf2f(uint16_t bits) {
  return static_cast<float>(c10::BFloat16(bits, c10::BFloat16::from_bits()));
}
inline uint16_t half_step(uint16_t bits, bool up) {
  const bool neg = bits & 0x8000;
  uint16_t mag = bits & 0x7FFF;
  if (mag == 0) return up ? 0x0001 : 0x8001;
  const bool inc = neg ? !up : up;
  mag = inc ? mag + 1 : mag - 1;
  return (neg ? 0x8000 : 0) | mag;
}
// Appends v to `yes` when c holds, else to `no`, without a branch: both lists get v at their
// end, and only the chosen one's length grows (the other's copy is overwritten next).
inline void append_either(bool c, int32_t v, int32_t* yes, int64_t& ny, int32_t* no,
                          int64_t& nn) {
  yes[ny] = v;
  no[nn] = v;
  ny += c;
  nn += !c;
}

inline bool is_int_kind(int64_t kind) { return kind >= kInt8 && kind < kNumKinds; }
inline int bits_of(int kind) { return kind == kInt8 ? 8 : kind == kInt4 ? 4 : 2; }
inline int64_t data_bytes(int bits, int64_t dim) {
  const int per = 8 / bits;
  return (dim + per - 1) / per;
}
inline int64_t row_bytes_of(int64_t kind, int64_t dim) {
  if (kind == kFp32) return dim * 4;
  if (kind == kFp16 || kind == kBf16) return dim * 2;
  const int bits = bits_of(static_cast<int>(kind));
  return data_bytes(bits, dim) + (bits == 8 ? 8 : 4);
}


}  // namespace sslrec
