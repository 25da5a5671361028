// Products of a few activation rows with a quantized weight, read in its run-time layout, on the
// CPU: XLA FFI handlers (https://docs.jax.dev/en/latest/ffi.html) that maxjax registers with
// jax.ffi when the backend policy asks for them (see maxjax/backend/kernels/__init__.py).
//
// out[m, r] = sum_c x[m, c] * W[r, c], W dequantized on the fly and never written out, in
// float32 arithmetic (the activations are not quantized: the result is the float32 product of
// the file's values, up to summation order). XLA:CPU's own fused dequantize-and-dot unpacks at
// about 11 G values/s on two AVX-512 cores, below memory speed; this loop unpacks 16 values per
// instruction and splits the rows over XLA's intra-op thread pool.
//
// Layouts (maxjax/graph/quantization/arrays.py):
//   nibbles:  values uint8 [..., rows/2, cols], byte (i, j) = row 2i col j (low nibble) and row
//             2i+1 col j (high); scale (and offset) [..., rows, cols/32] float16 or float32.
//             W = scale * q + offset, or scale * (q - 8) without an offset (Q4_0).
//   unpacked: values int8 or uint8 [..., rows, cols]; scale (and offset) float32
//             [..., rows, cols/group], group 16 or 32. W = scale * q (+ offset).
//   mapped:   the file's own GGUF blocks, read where they lie in the mapped file: `file` uint8
//             [units, 32] (the whole file, adopted by JAX without a copy), the weight's rows
//             row-major at byte 32 * offsets[layer]. Q4_0 blocks (18 bytes: float16 d, 16 bytes
//             of nibbles, value j low, j + 16 high): W = d * (q - 8); Q8_0 (34 bytes: float16 d,
//             32 int8): W = d * q. Each lane sums in the column order of the layouts above, so a
//             weight's mapped, nibbles and unpacked products are bit-identical.
// Q4_0 x Q8_0 (the mapped kernel with `activations` 1): each activation row is quantized per
// 32-value block to Q8_0 (d = max |x| / 127, q = round-half-even(x / d) as int8; llama.cpp's
// quantize_row_q8_0, with a float32 d) and each block's product is an exact integer dot,
// sum_j (q4_j - 8) q8_j, scaled by d4 * d8 in float32: the arithmetic of llama.cpp's
// ggml_vec_dot_q4_0_q8_0, on the CPU's int8 dot instructions (AVX-512 VNNI / AVX-VNNI vpdpbusd;
// AVX2's vpmaddubsw, whose pair sums cannot saturate here: 2 * 15 * 127 < 32767).
// A leading layer axis is indexed by the `layer` operand (int32 scalar), so that a scan over
// stacked weights reads each layer in place instead of copying its slice first.
//
// Built for the host by the loader with -march=native: AVX-512 (F, BW) or AVX2 with FMA.
#include <immintrin.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <memory>
#include <string>
#include <type_traits>
#include <vector>

#include "parallel.h"
#include "xla/ffi/api/ffi.h"

namespace ffi = xla::ffi;
using maxjax_kernels::parallel_for;
using maxjax_kernels::kDefaultChunks;
using maxjax_kernels::kStreamChunks;

namespace {

// ---- 16 float32 lanes: one 512-bit register, or two 256-bit ones ---------------------------------
#if defined(__AVX512F__) && defined(__AVX512BW__)
struct V {
  __m512 v;
};
inline V vzero() { return {_mm512_setzero_ps()}; }
inline V vload(const float* p) { return {_mm512_loadu_ps(p)}; }
inline void vstore(float* p, V a) { _mm512_storeu_ps(p, a.v); }
inline V vbcast(float s) { return {_mm512_set1_ps(s)}; }
inline V vmul(V a, V b) { return {_mm512_mul_ps(a.v, b.v)}; }
inline V vadd(V a, V b) { return {_mm512_add_ps(a.v, b.v)}; }
inline V vfma(V a, V b, V c) { return {_mm512_fmadd_ps(a.v, b.v, c.v)}; }
inline float vsum(V a) { return _mm512_reduce_add_ps(a.v); }
// 16 bytes -> their low and high nibbles as floats
inline void nibbles16(const uint8_t* p, V& lo, V& hi) {
  __m512i b = _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
  lo = {_mm512_cvtepi32_ps(_mm512_and_si512(b, _mm512_set1_epi32(15)))};
  hi = {_mm512_cvtepi32_ps(_mm512_srli_epi32(b, 4))};
}
inline V bytes16(const uint8_t* p) {
  return {_mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))))};
}
inline V bytes16(const int8_t* p) {
  return {_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))))};
}
#elif defined(__AVX2__) && defined(__FMA__)
struct V {
  __m256 a, b;
};
inline V vzero() { return {_mm256_setzero_ps(), _mm256_setzero_ps()}; }
inline V vload(const float* p) { return {_mm256_loadu_ps(p), _mm256_loadu_ps(p + 8)}; }
inline void vstore(float* p, V a) { _mm256_storeu_ps(p, a.a), _mm256_storeu_ps(p + 8, a.b); }
inline V vbcast(float s) { return {_mm256_set1_ps(s), _mm256_set1_ps(s)}; }
inline V vmul(V x, V y) { return {_mm256_mul_ps(x.a, y.a), _mm256_mul_ps(x.b, y.b)}; }
inline V vadd(V x, V y) { return {_mm256_add_ps(x.a, y.a), _mm256_add_ps(x.b, y.b)}; }
inline V vfma(V x, V y, V z) { return {_mm256_fmadd_ps(x.a, y.a, z.a), _mm256_fmadd_ps(x.b, y.b, z.b)}; }
inline float vsum(V x) {
  __m256 s = _mm256_add_ps(x.a, x.b);
  __m128 h = _mm_add_ps(_mm256_castps256_ps128(s), _mm256_extractf128_ps(s, 1));
  h = _mm_add_ps(h, _mm_movehl_ps(h, h));
  h = _mm_add_ss(h, _mm_movehdup_ps(h));
  return _mm_cvtss_f32(h);
}
inline void nibbles16(const uint8_t* p, V& lo, V& hi) {
  __m128i raw = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
  __m256i b0 = _mm256_cvtepu8_epi32(raw), b1 = _mm256_cvtepu8_epi32(_mm_srli_si128(raw, 8));
  __m256i m = _mm256_set1_epi32(15);
  lo = {_mm256_cvtepi32_ps(_mm256_and_si256(b0, m)), _mm256_cvtepi32_ps(_mm256_and_si256(b1, m))};
  hi = {_mm256_cvtepi32_ps(_mm256_srli_epi32(b0, 4)), _mm256_cvtepi32_ps(_mm256_srli_epi32(b1, 4))};
}
inline V bytes16(const uint8_t* p) {
  __m128i raw = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
  return {_mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(raw)), _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_srli_si128(raw, 8)))};
}
inline V bytes16(const int8_t* p) {
  __m128i raw = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
  return {_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(raw)), _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128(raw, 8)))};
}
#else
#error "maxjax's CPU kernels need AVX-512 (F, BW) or AVX2 with FMA"
#endif

// Activation rows one pass over the weight serves (their accumulators stay in registers: 32
// vector registers with AVX-512, 16 with AVX2).
#if defined(__AVX512F__)
constexpr int kBatch = 8;
#else
constexpr int kBatch = 2;
#endif

// ---- scales and offsets ----------------------------------------------------------------------------
inline void to_float(const uint16_t* s, float* d, int64_t n) {  // float16 -> float32
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) _mm256_storeu_ps(d + i, _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(s + i))));
  for (; i < n; ++i) d[i] = _cvtsh_ss(s[i]);
}
inline void to_float(const float* s, float* d, int64_t n) { std::memcpy(d, s, n * sizeof(float)); }

// A nibbles pair's scales (and offsets) as float32, nb blocks each: s0, o0 of row 2p, s1, o1 of
// row 2p + 1 (the offsets only where the weight has them).
struct PairScales {
  std::vector<float> buf;
  float *s0, *s1, *o0, *o1;
  explicit PairScales(int64_t nb) : buf(4 * nb), s0(buf.data()), s1(s0 + nb), o0(s1 + nb), o1(o0 + nb) {}
  template <typename S, bool Offset>
  void load(const S* scale, const S* offset, int64_t p, int64_t nb) {
    to_float(scale + 2 * p * nb, s0, nb);
    to_float(scale + (2 * p + 1) * nb, s1, nb);
    if (Offset) {
      to_float(offset + 2 * p * nb, o0, nb);
      to_float(offset + (2 * p + 1) * nb, o1, nb);
    }
  }
};

// ---- Q8_0 activations -----------------------------------------------------------------------------
// Activation rows quantized per 32-value block: q int8 [m, cols], d float32 [m, cols / 32],
// c int32 [m, cols / 32, 8]: -8 * sum_j q_j in lane 0, zeros after (a block's dot with unsigned
// 4-bit values q4 starts from it, which makes it the dot with q4 - 8), and ds float32
// [m, cols / 32]: d * sum_j q_j (what a weight block's offset multiplies); with AVX-512, d8
// float32 [m, cols / 32, 8]: d eight times (two blocks' scales in one register's two halves).
struct Q8Rows {
  std::vector<int8_t> q;
  std::vector<float> d;
  std::vector<int32_t> c;
  std::vector<float> ds;
  std::vector<float> d8;
};

inline void quantize_q8(const float* x, int64_t m_rows, int64_t cols, Q8Rows& a) {
  const int64_t nb = cols / 32;
  a.q.resize(m_rows * cols), a.d.resize(m_rows * nb), a.c.assign(m_rows * nb * 8, 0), a.ds.resize(m_rows * nb);
  for (int64_t i = 0; i < m_rows * nb; ++i) {
    const float* xb = x + 32 * i;
    int8_t* qb = a.q.data() + 32 * i;
#if defined(__AVX512F__) && defined(__AVX512BW__)
    const __m512 x0 = _mm512_loadu_ps(xb), x1 = _mm512_loadu_ps(xb + 16);
    const float amax = _mm512_reduce_max_ps(_mm512_max_ps(_mm512_abs_ps(x0), _mm512_abs_ps(x1)));
    const float d = amax / 127.f, id = d != 0.f ? 1.f / d : 0.f;
    const __m512i q0 = _mm512_cvtps_epi32(_mm512_mul_ps(x0, _mm512_set1_ps(id)));  // round half to even
    const __m512i q1 = _mm512_cvtps_epi32(_mm512_mul_ps(x1, _mm512_set1_ps(id)));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(qb), _mm512_cvtepi32_epi8(q0));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(qb + 16), _mm512_cvtepi32_epi8(q1));
    const int32_t sum = _mm512_reduce_add_epi32(_mm512_add_epi32(q0, q1));
#else
    float amax = 0.f;
    for (int j = 0; j < 32; ++j) amax = std::max(amax, std::fabs(xb[j]));
    const float d = amax / 127.f, id = d != 0.f ? 1.f / d : 0.f;
    int32_t sum = 0;
    for (int j = 0; j < 32; ++j) {
      const int32_t v = int32_t(std::nearbyint(xb[j] * id));  // round half to even (the default mode)
      qb[j] = int8_t(v), sum += v;
    }
#endif
    a.c[8 * i] = -8 * sum;
    a.d[i] = d;
    a.ds[i] = d * float(sum);
  }
#if defined(__AVX512F__) && defined(__AVX512BW__)
  a.d8.resize(m_rows * nb * 8);
  for (int64_t i = 0; i < m_rows * nb; ++i) _mm256_storeu_ps(a.d8.data() + 8 * i, _mm256_set1_ps(a.d[i]));
#endif
}

#if defined(__AVX512F__) && defined(__AVX512BW__)
// Two blocks at a time in 512-bit registers: 64 weight bytes against the 64 activation bytes of
// blocks b and b + 1 (16 int32 lanes, 8 per block), scaled by a register holding each block's
// scale in its half. A row's last block, when the row has an odd number, is read with masks
// (the second half zero), so nothing past a row or the activations is read.
inline __m512i dot2_u8s8(__m512i acc, __m512i u, __m512i s) {
#if defined(__AVX512VNNI__)
  return _mm512_dpbusd_epi32(acc, u, s);
#else
  return _mm512_add_epi32(acc, _mm512_madd_epi16(_mm512_maddubs_epi16(u, s), _mm512_set1_epi16(1)));
#endif
}
inline __m512 halves(float s0, float s1) {
  return _mm512_insertf32x8(_mm512_castps256_ps512(_mm256_set1_ps(s0)), _mm256_set1_ps(s1), 1);
}
// The quantized activations of row block ab (and ab + 1 unless `one`): bytes, the -8 starts, d's.
struct Act2 {
  __m512i q, c;
  __m512 d;
};
// acc's lanes plus sum_i p[i] * q[i], i < n, summed (a row's sums plus its offsets times the
// activations' d * sum q): one reduction per output.
inline float sum_with_dot(__m512 acc, const float* p, const float* q, int64_t n) {
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) acc = _mm512_fmadd_ps(_mm512_loadu_ps(p + i), _mm512_loadu_ps(q + i), acc);
  if (i < n) {
    const __mmask16 m = __mmask16((1u << (n - i)) - 1);
    acc = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(m, p + i), _mm512_maskz_loadu_ps(m, q + i), acc);
  }
  return _mm512_reduce_add_ps(acc);
}
inline Act2 act2(const Q8Rows& a, int64_t ab, bool one) {
  const __mmask64 bytes = one ? __mmask64(0xFFFFFFFFull) : ~__mmask64(0);
  const __mmask16 lanes = one ? __mmask16(0xFF) : __mmask16(0xFFFF);
  return {_mm512_maskz_loadu_epi8(bytes, a.q.data() + 32 * ab), _mm512_maskz_loadu_epi32(lanes, a.c.data() + 8 * ab),
          _mm512_maskz_loadu_ps(lanes, a.d8.data() + 8 * ab)};
}
#endif

// A GGUF block's scale: the float16 that leads it, widened.
inline float block_scale(const uint8_t* blk) {
  uint16_t h;
  std::memcpy(&h, blk, 2);
  return _cvtsh_ss(h);
}

// A Q4_0 block's 32 values q (0..15, before the -8) as bytes, in value order.
inline __m256i q4_bytes(const uint8_t* blk) {
  const __m128i raw = _mm_loadu_si128(reinterpret_cast<const __m128i*>(blk + 2));
  const __m256i both = _mm256_inserti128_si256(_mm256_castsi128_si256(raw), _mm_srli_epi16(raw, 4), 1);
  return _mm256_and_si256(both, _mm256_set1_epi8(15));
}

// acc + the dot products of u (unsigned bytes) and s (signed bytes), four bytes per int32 lane.
inline __m256i dot_u8s8(__m256i acc, __m256i u, __m256i s) {
#if defined(__AVX512VNNI__) && defined(__AVX512VL__)
  return _mm256_dpbusd_epi32(acc, u, s);
#elif defined(__AVXVNNI__)
  return _mm256_dpbusd_avx_epi32(acc, u, s);
#else
  return _mm256_add_epi32(acc, _mm256_madd_epi16(_mm256_maddubs_epi16(u, s), _mm256_set1_epi16(1)));
#endif
}

inline float hsum8(__m256 v) {
  __m128 h = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  h = _mm_add_ps(h, _mm_movehl_ps(h, h));
  h = _mm_add_ss(h, _mm_movehdup_ps(h));
  return _mm_cvtss_f32(h);
}

// ---- prefetching ------------------------------------------------------------------------------------
// The loops read a weight once, front to back, each thread its own contiguous rows; asking for the
// cache line kPrefetch bytes ahead keeps more reads in flight than the hardware prefetcher does
// (2-core AVX-512 Xeon, one activation row, a Q4_0 [48, 8192, 2048] stack read layer by layer:
// 10.7 -> 13.0 GB/s, Q8_0 12.4 -> 16.4 GB/s 2 KiB ahead; with 4 rows or more the loops are
// compute-bound and it changes nothing measurable). 2-core Zen 5 EPYC, one row, 16 x [2048, 8192]:
// Q4_1 nibbles 5.8-6.6 ms 2 KiB ahead, 5.4-6.1 ms 8 KiB ahead; Q8_0 unpacked 9.7-9.9 -> 8.1-8.5 ms
// (16 KiB: within noise of 8).
constexpr int64_t kPrefetch = 8192;
template <typename T>
inline void prefetch(const T* p) {
  _mm_prefetch(reinterpret_cast<const char*>(p) + kPrefetch, _MM_HINT_T0);
}

// ---- the loops ---------------------------------------------------------------------------------------
// Rows of a nibbles weight, pairs [p0, p1), times activation rows [m0, m0 + MB): each 16 values
// are dequantized once (scale * q + offset; scale * (q - 8), exact in float32, without an offset)
// and feed MB products. Each output is a sum over 16 lanes, each lane's running sum in column
// order, so the nibbles and unpacked layouts of a weight give bit-identical results.
template <typename S, bool Offset, int MB>
void nibble_pairs(const uint8_t* values, const S* scale, const S* offset, const float* x,
                  int64_t rows, int64_t cols, int64_t m0, int64_t p0, int64_t p1, float* out) {
  const int64_t nb = cols / 32;
  PairScales ps(nb);
  float *s0 = ps.s0, *s1 = ps.s1, *o0 = ps.o0, *o1 = ps.o1;
  for (int64_t p = p0; p < p1; ++p) {
    const uint8_t* v = values + p * cols;
    ps.load<S, Offset>(scale, offset, p, nb);
    if (!Offset)
      for (int64_t b = 0; b < nb; ++b) o0[b] = -8.f * s0[b], o1[b] = -8.f * s1[b];
    V acc0[MB], acc1[MB];
    for (int j = 0; j < MB; ++j) acc0[j] = acc1[j] = vzero();
    for (int64_t b = 0; b < nb; ++b) {
      if ((b & 1) == 0) prefetch(v + 32 * b);
#if defined(__AVX512F__) && defined(__AVX512BW__)
      // each row's 16 values scale * q + offset (q = 0..15) as a table, looked up by each nibble:
      // one permute per 16 values in place of a convert and an FMA, the same fma(q, d, c) values
      const __m512 kNibbles = _mm512_setr_ps(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
      const __m512 t0 = _mm512_fmadd_ps(kNibbles, _mm512_set1_ps(s0[b]), _mm512_set1_ps(o0[b]));
      const __m512 t1 = _mm512_fmadd_ps(kNibbles, _mm512_set1_ps(s1[b]), _mm512_set1_ps(o1[b]));
      const __m512i qa = _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(v + 32 * b)));
      const __m512i qb = _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(v + 32 * b + 16)));
      // (the permute reads an index's low 4 bits: the low nibble is row 2p's, the high row 2p + 1's)
      const V wa0 = {_mm512_permutexvar_ps(qa, t0)}, wb0 = {_mm512_permutexvar_ps(qb, t0)};
      const V wa1 = {_mm512_permutexvar_ps(_mm512_srli_epi32(qa, 4), t1)}, wb1 = {_mm512_permutexvar_ps(_mm512_srli_epi32(qb, 4), t1)};
#else
      V lo_a, hi_a, lo_b, hi_b;
      nibbles16(v + 32 * b, lo_a, hi_a);
      nibbles16(v + 32 * b + 16, lo_b, hi_b);
      const V d0 = vbcast(s0[b]), d1 = vbcast(s1[b]), c0 = vbcast(o0[b]), c1 = vbcast(o1[b]);
      const V wa0 = vfma(lo_a, d0, c0), wb0 = vfma(lo_b, d0, c0), wa1 = vfma(hi_a, d1, c1), wb1 = vfma(hi_b, d1, c1);
#endif
      for (int j = 0; j < MB; ++j) {
        const float* xm = x + (m0 + j) * cols + 32 * b;
        const V xa = vload(xm), xb = vload(xm + 16);
        acc0[j] = vfma(wb0, xb, vfma(wa0, xa, acc0[j]));
        acc1[j] = vfma(wb1, xb, vfma(wa1, xa, acc1[j]));
      }
    }
    for (int j = 0; j < MB; ++j) {
      out[(m0 + j) * rows + 2 * p] = vsum(acc0[j]);
      out[(m0 + j) * rows + 2 * p + 1] = vsum(acc1[j]);
    }
  }
}

// nibble_pairs with Q8_0 activations: each pair's 32 bytes of a block are its two rows' 4-bit
// values in column order (low nibbles: row 2p, high: row 2p + 1), each an integer dot with the
// block's quantized activations; W = scale * q + offset, or scale * (q - 8) without an offset
// (the -8 folded into the dot's start, Q8Rows::c), the offset times the block's d * sum q.
template <typename S, bool Offset, int MB>
void q8_nibble_pairs(const uint8_t* values, const S* scale, const S* offset, const Q8Rows& a,
                     int64_t rows, int64_t cols, int64_t m0, int64_t p0, int64_t p1, float* out) {
  const int64_t nb = cols / 32;
  PairScales ps(nb);
  const float *s0 = ps.s0, *s1 = ps.s1, *o0 = ps.o0, *o1 = ps.o1;
  const __m256i low4 = _mm256_set1_epi8(15);
  for (int64_t p = p0; p < p1; ++p) {
    const uint8_t* v = values + p * cols;
    ps.load<S, Offset>(scale, offset, p, nb);
    __m256 acc0[MB], acc1[MB];
    float off0[MB], off1[MB];
    for (int j = 0; j < MB; ++j) acc0[j] = acc1[j] = _mm256_setzero_ps(), off0[j] = off1[j] = 0.f;
    for (int64_t b = 0; b < nb; ++b) {
      if ((b & 1) == 0) prefetch(v + 32 * b);
      const __m256i raw = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(v + 32 * b));
      const __m256i q0 = _mm256_and_si256(raw, low4), q1 = _mm256_and_si256(_mm256_srli_epi16(raw, 4), low4);
      for (int j = 0; j < MB; ++j) {
        const int64_t ab = (m0 + j) * nb + b;
        const __m256i xq = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(a.q.data() + 32 * ab));
        const __m256i c = Offset ? _mm256_setzero_si256() : _mm256_loadu_si256(reinterpret_cast<const __m256i*>(a.c.data() + 8 * ab));
        const float dx = a.d[ab];
        acc0[j] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(dot_u8s8(c, q0, xq)), _mm256_set1_ps(s0[b] * dx), acc0[j]);
        acc1[j] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(dot_u8s8(c, q1, xq)), _mm256_set1_ps(s1[b] * dx), acc1[j]);
        if (Offset) off0[j] += o0[b] * a.ds[ab], off1[j] += o1[b] * a.ds[ab];
      }
    }
    for (int j = 0; j < MB; ++j) {
      out[(m0 + j) * rows + 2 * p] = hsum8(acc0[j]) + off0[j];
      out[(m0 + j) * rows + 2 * p + 1] = hsum8(acc1[j]) + off1[j];
    }
  }
}

#if defined(__AVX512F__) && defined(__AVX512BW__)
// q8_nibble_pairs two blocks at a time: a pair's 64 bytes of blocks b and b + 1 are its rows'
// values for both (low nibbles: row 2p); with 8 activation rows, 4 integer dots, converts,
// multiplies and FMAs per row and 64 values, where the 256-bit form took 8 of each (2-core Zen 5
// EPYC, SmolLM2 Q4_1 decode steps at 16 rows: 0.77x float32 activations' speed, 0.95x so).
template <typename S, bool Offset, int MB>
void q8_nibble_pairs512(const uint8_t* values, const S* scale, const S* offset, const Q8Rows& a,
                        int64_t rows, int64_t cols, int64_t m0, int64_t p0, int64_t p1, float* out) {
  const int64_t nb = cols / 32;
  PairScales ps(nb);
  const float *s0 = ps.s0, *s1 = ps.s1, *o0 = ps.o0, *o1 = ps.o1;
  const __m512i low4 = _mm512_set1_epi8(15);
  for (int64_t p = p0; p < p1; ++p) {
    const uint8_t* v = values + p * cols;
    ps.load<S, Offset>(scale, offset, p, nb);
    __m512 acc0[MB], acc1[MB];
    for (int j = 0; j < MB; ++j) acc0[j] = acc1[j] = _mm512_setzero_ps();
    for (int64_t b = 0; b < nb; b += 2) {
      const bool one = b + 1 == nb;
      prefetch(v + 32 * b);
      const __m512i raw = _mm512_maskz_loadu_epi8(one ? __mmask64(0xFFFFFFFFull) : ~__mmask64(0), v + 32 * b);
      const __m512i q0 = _mm512_and_si512(raw, low4), q1 = _mm512_and_si512(_mm512_srli_epi16(raw, 4), low4);
      const __m512 d0 = halves(s0[b], one ? 0.f : s0[b + 1]), d1 = halves(s1[b], one ? 0.f : s1[b + 1]);
      for (int j = 0; j < MB; ++j) {
        const Act2 x = act2(a, (m0 + j) * nb + b, one);
        const __m512i c = Offset ? _mm512_setzero_si512() : x.c;
        acc0[j] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(dot2_u8s8(c, q0, x.q)), _mm512_mul_ps(d0, x.d), acc0[j]);
        acc1[j] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(dot2_u8s8(c, q1, x.q)), _mm512_mul_ps(d1, x.d), acc1[j]);
      }
    }
    for (int j = 0; j < MB; ++j) {
      const float* ds = a.ds.data() + (m0 + j) * nb;
      out[(m0 + j) * rows + 2 * p] = Offset ? sum_with_dot(acc0[j], o0, ds, nb) : _mm512_reduce_add_ps(acc0[j]);
      out[(m0 + j) * rows + 2 * p + 1] = Offset ? sum_with_dot(acc1[j], o1, ds, nb) : _mm512_reduce_add_ps(acc1[j]);
    }
  }
}
#endif

// Rows [r0, r1) of an unpacked weight (one byte per value) times activation rows [m0, m0 + MB),
// as nibble_pairs computes them.
template <typename Q, bool Offset, int MB>
void byte_rows(const Q* values, const float* scale, const float* offset, const float* x, int64_t rows,
               int64_t cols, int64_t group, int64_t m0, int64_t r0, int64_t r1, float* out) {
  const int64_t ng = cols / group;
  for (int64_t r = r0; r < r1; ++r) {
    const Q* v = values + r * cols;
    V acc[MB];
    for (int j = 0; j < MB; ++j) acc[j] = vzero();
    for (int64_t g = 0; g < ng; ++g) {
      const V d = vbcast(scale[r * ng + g]), c = vbcast(Offset ? offset[r * ng + g] : 0.f);
      for (int64_t k = g * group; k < (g + 1) * group; k += 16) {
        if ((k & 63) == 0) prefetch(v + k);
        const V w = Offset ? vfma(bytes16(v + k), d, c) : vmul(bytes16(v + k), d);
        for (int j = 0; j < MB; ++j) acc[j] = vfma(w, vload(x + (m0 + j) * cols + k), acc[j]);
      }
    }
    for (int j = 0; j < MB; ++j) out[(m0 + j) * rows + r] = vsum(acc[j]);
  }
}

// byte_rows with Q8_0 activations, for weights in groups of 32 values: each group's integer dot
// with the block's quantized activations (int8 values: |w| times x with w's sign, as vpdpbusd
// multiplies unsigned by signed bytes), times scale * d; plus the offset times d * sum q.
template <typename Q, bool Offset, int MB>
void q8_byte_rows(const Q* values, const float* scale, const float* offset, const Q8Rows& a, int64_t rows, int64_t cols,
                  int64_t m0, int64_t r0, int64_t r1, float* out) {
  const int64_t nb = cols / 32;
  for (int64_t r = r0; r < r1; ++r) {
    const Q* v = values + r * cols;
    __m256 acc[MB];
    float off[MB];
    for (int j = 0; j < MB; ++j) acc[j] = _mm256_setzero_ps(), off[j] = 0.f;
    for (int64_t b = 0; b < nb; ++b) {
      if ((b & 1) == 0) prefetch(v + 32 * b);
      const __m256i w = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(v + 32 * b));
      const __m256i u = std::is_signed<Q>::value ? _mm256_abs_epi8(w) : w;
      const float d = scale[r * nb + b];
      for (int j = 0; j < MB; ++j) {
        const int64_t ab = (m0 + j) * nb + b;
        __m256i xq = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(a.q.data() + 32 * ab));
        if (std::is_signed<Q>::value) xq = _mm256_sign_epi8(xq, w);
        acc[j] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(dot_u8s8(_mm256_setzero_si256(), u, xq)), _mm256_set1_ps(d * a.d[ab]), acc[j]);
        if (Offset) off[j] += offset[r * nb + b] * a.ds[ab];
      }
    }
    for (int j = 0; j < MB; ++j) out[(m0 + j) * rows + r] = hsum8(acc[j]) + off[j];
  }
}

#if defined(__AVX512F__) && defined(__AVX512BW__)
// q8_byte_rows two blocks at a time (as q8_nibble_pairs512): int8 values as |w| with the
// activations negated where w < 0.
template <typename Q, bool Offset, int MB>
void q8_byte_rows512(const Q* values, const float* scale, const float* offset, const Q8Rows& a, int64_t rows, int64_t cols,
                     int64_t m0, int64_t r0, int64_t r1, float* out) {
  constexpr bool kSigned = std::is_signed<Q>::value;
  const int64_t nb = cols / 32;
  for (int64_t r = r0; r < r1; ++r) {
    const Q* v = values + r * cols;
    const float* sc = scale + r * nb;
    __m512 acc[MB];
    for (int j = 0; j < MB; ++j) acc[j] = _mm512_setzero_ps();
    for (int64_t b = 0; b < nb; b += 2) {
      const bool one = b + 1 == nb;
      prefetch(v + 32 * b);
      const __m512i w = _mm512_maskz_loadu_epi8(one ? __mmask64(0xFFFFFFFFull) : ~__mmask64(0), v + 32 * b);
      const __m512i u = kSigned ? _mm512_abs_epi8(w) : w;
      const __mmask64 neg = kSigned ? _mm512_movepi8_mask(w) : 0;
      const __m512 d = halves(sc[b], one ? 0.f : sc[b + 1]);
      for (int j = 0; j < MB; ++j) {
        const Act2 x = act2(a, (m0 + j) * nb + b, one);
        const __m512i xq = kSigned ? _mm512_mask_sub_epi8(x.q, neg, _mm512_setzero_si512(), x.q) : x.q;
        acc[j] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(dot2_u8s8(_mm512_setzero_si512(), u, xq)), _mm512_mul_ps(d, x.d), acc[j]);
      }
    }
    for (int j = 0; j < MB; ++j)
      out[(m0 + j) * rows + r] = Offset ? sum_with_dot(acc[j], offset + r * nb, a.ds.data() + (m0 + j) * nb, nb) : _mm512_reduce_add_ps(acc[j]);
  }
}
#endif

// Activation rows go kBatch at a time (each dequantized weight value feeds kBatch products),
// the rest 4, 2 and 1 at a time: rows(m, std::integral_constant<int, MB>) runs rows [m, m + MB).
template <typename Rows>
void over_rows(int64_t m_rows, Rows rows) {
  int64_t m = 0;
  for (; m + kBatch <= m_rows; m += kBatch) rows(m, std::integral_constant<int, kBatch>());
  if (kBatch > 4 && m + 4 <= m_rows) rows(m, std::integral_constant<int, 4>()), m += 4;
  if (kBatch > 2 && m + 2 <= m_rows) rows(m, std::integral_constant<int, 2>()), m += 2;
  for (; m < m_rows; ++m) rows(m, std::integral_constant<int, 1>());
}

// Layers of a weight with values `dims` (1 without a layer axis).
template <typename Dims>
int64_t layers_of(const Dims& dims) {
  int64_t layers = 1;
  for (size_t i = 0; i + 2 < dims.size(); ++i) layers *= dims[i];
  return layers;
}

// The layer a scan step reads (clamped into [0, layers), as XLA's dynamic-slice clamps); 0 for
// a weight without a layer axis (an empty `layer` operand).
template <typename Dims>
int64_t layer_of(ffi::AnyBuffer layer, const Dims& dims) {
  if (layer.element_count() == 0) return 0;
  const int64_t layers = layers_of(dims);
  const int64_t l = *reinterpret_cast<const int32_t*>(layer.untyped_data());
  return std::min<int64_t>(std::max<int64_t>(l, 0), layers - 1);
}

// The `activations` attribute: 0 (float32) or 1 (Q8_0).
ffi::Error check_activations(const char* what, int64_t activations) {
  if (activations != 0 && activations != 1)
    return ffi::Error::InvalidArgument(std::string(what) + ": activations must be 0 (float32) or 1 (Q8_0)");
  return ffi::Error::Success();
}

ffi::Error check_dims(const char* what, int64_t cols, int64_t rows, int64_t out_rows, int64_t group) {
  if (cols <= 0 || cols % group || cols % 16 || rows <= 0 || rows != out_rows)
    return ffi::Error::InvalidArgument(std::string(what) + ": inconsistent shapes");
  return ffi::Error::Success();
}

// Every layer's scales (and offsets, when given) must be there: `per_layer` values each, for as
// many layers as the values have. Nothing is read past a buffer.
// The offsets, when given, must have the scales' element type (`scale_type`).
template <typename Scale>
ffi::Error check_scales(const char* what, int64_t layers, int64_t per_layer, const Scale& scale, ffi::DataType scale_type,
                        const ffi::AnyBuffer& offset) {
  const int64_t want = layers * per_layer;
  const bool has_offset = offset.element_count() != 0;
  if (int64_t(scale.element_count()) != want || (has_offset && (int64_t(offset.element_count()) != want || offset.element_type() != scale_type)))
    return ffi::Error::InvalidArgument(std::string(what) + ": scales or offsets of the wrong size or type");
  return ffi::Error::Success();
}

template <typename S, bool Offset>
void run_nibbles(ffi::ThreadPool& pool, const float* x, int64_t m_rows, const uint8_t* values, const S* scale, const S* offset,
                 int64_t rows, int64_t cols, float* out, bool q8) {
  if (q8) {
    Q8Rows a;
    quantize_q8(x, m_rows, cols, a);
    parallel_for(pool, rows / 2, rows * cols * m_rows, [&](int64_t p0, int64_t p1) {
      over_rows(m_rows, [&](int64_t m, auto mb) {
#if defined(__AVX512F__) && defined(__AVX512BW__)
        q8_nibble_pairs512<S, Offset, decltype(mb)::value>(values, scale, offset, a, rows, cols, m, p0, p1, out);
#else
        q8_nibble_pairs<S, Offset, decltype(mb)::value>(values, scale, offset, a, rows, cols, m, p0, p1, out);
#endif
      });
    }, kStreamChunks);
    return;
  }
  parallel_for(pool, rows / 2, rows * cols * m_rows, [&](int64_t p0, int64_t p1) {
    over_rows(m_rows, [&](int64_t m, auto mb) { nibble_pairs<S, Offset, decltype(mb)::value>(values, scale, offset, x, rows, cols, m, p0, p1, out); });
  }, kStreamChunks);
}

ffi::Error NibblesMatmul(ffi::ThreadPool pool, ffi::Buffer<ffi::F32> x, ffi::Buffer<ffi::U8> values, ffi::AnyBuffer scale,
                         ffi::AnyBuffer offset, ffi::AnyBuffer layer, ffi::ResultBuffer<ffi::F32> out, int64_t activations) {
  const auto vd = values.dimensions();
  const int64_t cols = x.dimensions().back(), m_rows = x.element_count() / cols;
  const int64_t rows = 2 * vd[vd.size() - 2];
  if (auto e = check_activations("nibbles matmul", activations); e.failure()) return e;
  const bool q8 = activations == 1;
  if (vd.back() != cols) return ffi::Error::InvalidArgument("nibbles matmul: x and the weight disagree on columns");
  if (auto e = check_dims("nibbles matmul", cols, rows, out->dimensions().back(), 32); e.failure()) return e;
  if (int64_t(out->element_count()) != m_rows * rows) return ffi::Error::InvalidArgument("nibbles matmul: the output's shape");
  if (auto e = check_scales("nibbles matmul", layers_of(vd), rows * (cols / 32), scale, scale.element_type(), offset); e.failure()) return e;
  const int64_t l = layer_of(layer, vd);
  const uint8_t* v = values.typed_data() + l * (rows / 2) * cols;
  const int64_t ns = rows * (cols / 32), l_off = l * ns;
  const bool has_offset = offset.element_count() != 0;
  float* o = out->typed_data();
  if (scale.element_type() == ffi::F16) {
    const uint16_t* s = reinterpret_cast<const uint16_t*>(scale.untyped_data()) + l_off;
    if (has_offset)
      run_nibbles<uint16_t, true>(pool, x.typed_data(), m_rows, v, s, reinterpret_cast<const uint16_t*>(offset.untyped_data()) + l_off, rows, cols, o, q8);
    else
      run_nibbles<uint16_t, false>(pool, x.typed_data(), m_rows, v, s, nullptr, rows, cols, o, q8);
  } else if (scale.element_type() == ffi::F32) {
    const float* s = reinterpret_cast<const float*>(scale.untyped_data()) + l_off;
    if (has_offset)
      run_nibbles<float, true>(pool, x.typed_data(), m_rows, v, s, reinterpret_cast<const float*>(offset.untyped_data()) + l_off, rows, cols, o, q8);
    else
      run_nibbles<float, false>(pool, x.typed_data(), m_rows, v, s, nullptr, rows, cols, o, q8);
  } else {
    return ffi::Error::InvalidArgument("nibbles matmul: scales must be float16 or float32");
  }
  return ffi::Error::Success();
}

template <typename Q, bool Offset>
void run_bytes(ffi::ThreadPool& pool, const float* x, int64_t m_rows, const Q* values, const float* scale, const float* offset,
               int64_t rows, int64_t cols, int64_t group, float* out, bool q8) {
  if (q8) {  // group 32 (checked)
    Q8Rows a;
    quantize_q8(x, m_rows, cols, a);
    parallel_for(pool, rows, rows * cols * m_rows, [&](int64_t r0, int64_t r1) {
      over_rows(m_rows, [&](int64_t m, auto mb) {
#if defined(__AVX512F__) && defined(__AVX512BW__)
        q8_byte_rows512<Q, Offset, decltype(mb)::value>(values, scale, offset, a, rows, cols, m, r0, r1, out);
#else
        q8_byte_rows<Q, Offset, decltype(mb)::value>(values, scale, offset, a, rows, cols, m, r0, r1, out);
#endif
      });
    }, kStreamChunks);
    return;
  }
  parallel_for(pool, rows, rows * cols * m_rows, [&](int64_t r0, int64_t r1) {
    over_rows(m_rows, [&](int64_t m, auto mb) { byte_rows<Q, Offset, decltype(mb)::value>(values, scale, offset, x, rows, cols, group, m, r0, r1, out); });
  }, kStreamChunks);
}

ffi::Error UnpackedMatmul(ffi::ThreadPool pool, ffi::Buffer<ffi::F32> x, ffi::AnyBuffer values, ffi::Buffer<ffi::F32> scale,
                          ffi::AnyBuffer offset, ffi::AnyBuffer layer, ffi::ResultBuffer<ffi::F32> out, int64_t activations) {
  const auto vd = values.dimensions();
  const auto sd = scale.dimensions();
  if (auto e = check_activations("unpacked matmul", activations); e.failure()) return e;
  const bool q8 = activations == 1;
  const int64_t cols = x.dimensions().back(), m_rows = x.element_count() / cols;
  const int64_t rows = vd[vd.size() - 2];
  if (vd.back() != cols || sd.back() <= 0) return ffi::Error::InvalidArgument("unpacked matmul: x and the weight disagree on columns");
  const int64_t group = cols / sd.back();
  if (group % 16 || group * sd.back() != cols) return ffi::Error::InvalidArgument("unpacked matmul: groups must be a multiple of 16 values");
  if (auto e = check_dims("unpacked matmul", cols, rows, out->dimensions().back(), group); e.failure()) return e;
  if (q8 && group != 32) return ffi::Error::InvalidArgument("unpacked matmul: Q8_0 activations need groups of 32 values");
  if (int64_t(out->element_count()) != m_rows * rows) return ffi::Error::InvalidArgument("unpacked matmul: the output's shape");
  if (auto e = check_scales("unpacked matmul", layers_of(vd), rows * sd.back(), scale, ffi::F32, offset); e.failure()) return e;
  const int64_t l = layer_of(layer, vd);
  const int64_t nv = rows * cols, ns = rows * sd.back();
  const float* s = scale.typed_data() + l * ns;
  const bool has_offset = offset.element_count() != 0;
  const float* off = has_offset ? reinterpret_cast<const float*>(offset.untyped_data()) + l * ns : nullptr;
  float* o = out->typed_data();
  if (values.element_type() == ffi::S8) {
    const int8_t* v = reinterpret_cast<const int8_t*>(values.untyped_data()) + l * nv;
    if (has_offset)
      run_bytes<int8_t, true>(pool, x.typed_data(), m_rows, v, s, off, rows, cols, group, o, q8);
    else
      run_bytes<int8_t, false>(pool, x.typed_data(), m_rows, v, s, off, rows, cols, group, o, q8);
  } else if (values.element_type() == ffi::U8) {
    const uint8_t* v = reinterpret_cast<const uint8_t*>(values.untyped_data()) + l * nv;
    if (has_offset)
      run_bytes<uint8_t, true>(pool, x.typed_data(), m_rows, v, s, off, rows, cols, group, o, q8);
    else
      run_bytes<uint8_t, false>(pool, x.typed_data(), m_rows, v, s, off, rows, cols, group, o, q8);
  } else {
    return ffi::Error::InvalidArgument("unpacked matmul: values must be int8 or uint8");
  }
  return ffi::Error::Success();
}

// ---- GGUF blocks read in place ------------------------------------------------------------------
enum class Kind : int64_t { kQ4_0 = 0, kQ8_0 = 2 };  // layouts.cc's numbering

// bytes of a block of 32 values: a float16 scale, then 16 bytes of nibbles (Q4_0) or 32 int8 (Q8_0)
template <Kind K>
constexpr int64_t kBlockBytes = K == Kind::kQ4_0 ? 18 : 34;

// bytes of a row of `cols` values
inline int64_t mapped_row_bytes(int64_t kind, int64_t cols) {
  return cols / 32 * (kind == int64_t(Kind::kQ4_0) ? kBlockBytes<Kind::kQ4_0> : kBlockBytes<Kind::kQ8_0>);
}

// A block's 32 values at scale `d`, as float32 w0 (the first 16) and w1: Q4_0 d * (q - 8), exact,
// as fma(q, d, c) with c = -8 d; Q8_0 d * q (c unused).
template <Kind K>
inline void decode_block(const uint8_t* blk, float d, float c, V& w0, V& w1) {
  const V vd = vbcast(d);
  if (K == Kind::kQ4_0) {
    V lo, hi;
    nibbles16(blk + 2, lo, hi);
    const V vc = vbcast(c);
    w0 = vfma(lo, vd, vc), w1 = vfma(hi, vd, vc);
  } else {
    w0 = vmul(bytes16(reinterpret_cast<const int8_t*>(blk + 2)), vd);
    w1 = vmul(bytes16(reinterpret_cast<const int8_t*>(blk + 18)), vd);
  }
}

// Two rows are read at once, two streams: each is read ahead, 12 KiB of Q4_0 (680 blocks) and
// 16 KiB of Q8_0 (2-core AVX-512 Xeon, one activation row, Q4_0 stacks of 32 x [2048, 8192],
// 32 x [8192, 2048] and 64 x [2048, 2048]: 0.79, 1.0 and 1.0x the nibbles kernel's speed 2 KiB
// ahead, 1.15, 1.05 and 1.05x 8 KiB ahead; 1 KiB ahead was slower still. 2-core Zen 5 EPYC, one
// row, 16 x [2048, 8192]: Q8_0 12.6-14.7 ms 8 KiB ahead, 7.1-7.5 ms 16 KiB ahead, 7.3-7.4 ms
// 32 KiB ahead; Q4_0 5.1-5.2, 5.2-5.5 and 5.8-6.0 ms. With each scale read alone, Q4_0 16 x
// [2048, 8192] and 16 x [8192, 2048]: 8 KiB 5.1-5.6 and 5.6-5.9 ms, 12 KiB 5.0-5.2 and 5.4, 16 KiB
// 5.1-5.6 and 5.8-6.2 ms)
template <Kind K>
constexpr int64_t kMappedPrefetch = K == Kind::kQ4_0 ? 12288 : 16384;

// d[i] = the float16 at p + i * stride, i < n, widened (each block's scale leads the block).
inline void gather_half(const uint8_t* p, int64_t stride, int64_t n, float* d) {
  for (int64_t i = 0; i < n; ++i) d[i] = block_scale(p + i * stride);
}

// Whether mapped_pass reads each block's scale alone rather than gathering 16 blocks' scales at
// once (vpgatherdd): with AVX-512. On a 2-core Zen 5 EPYC, one activation row, two threads, the
// gather cost Q4_0 10-17%: 16 x [2048, 8192] 5.65-5.92 -> 4.90-5.28 ms, [128256, 2048]
// 5.35-6.03 -> 4.94-4.98 ms, Llama-3.2-1B-shaped Q4_0 decode 33.3-34.0 -> 35.8-37.5 tokens/s;
// Q8_0 (memory-bound) within noise.
constexpr bool kScalarScale =
#if defined(__AVX512F__) && defined(__AVX512BW__)
    true;
#else
    false;
#endif

// Rows [r, r + R) of a mapped weight (`rows` row-major, `bpr` bytes each, at `w`) times
// activation rows [m0, m0 + MB): R sums in flight per activation row.
template <Kind K, int MB, int R>
void mapped_pass(const uint8_t* w, int64_t bpr, const float* x, int64_t rows, int64_t cols, int64_t m0, int64_t r, float* out) {
  constexpr int64_t kBlock = kBlockBytes<K>;
  constexpr int64_t kScales = 16;  // blocks whose scales are gathered at once
  const int64_t nb = cols / 32;
  // Without AVX-512, the scales of the next 16 blocks are gathered and widened together, from
  // lines the prefetch has already asked for (one float16 widened and broadcast per block kept
  // the shuffle port busier than the arithmetic on a 2-core AVX-512 Xeon; a pass over the row's
  // scales first waits on memory instead). With AVX-512 each block's scale is read alone
  // (kScalarScale).
  alignas(64) float d[R][kScales], c[R][kScales];
#if defined(__AVX512F__) && defined(__AVX512BW__)
  const __m512 kCentered = _mm512_setr_ps(-8, -7, -6, -5, -4, -3, -2, -1, 0, 1, 2, 3, 4, 5, 6, 7);
#endif
  const uint8_t* p[R];
  for (int i = 0; i < R; ++i) p[i] = w + (r + i) * bpr;
  // Stream i reads rows r + i, r + i + R, ... (one row per pass): its prefetch runs the distance
  // ahead along that sequence, from the end of a row on to its next row. (A plain address
  // ahead lands in row r + i + 1 once rows are as long as the distance, which the other stream
  // is reading: 8B's [14336, 4096] Q4_0 layers then streamed at half the nibbles kernel's speed.)
  const uint8_t* ahead[R];
  int64_t left[R];  // bytes from `ahead` to the end of its row
  for (int i = 0; i < R; ++i) {
    const int64_t k = kMappedPrefetch<K> / bpr, off = kMappedPrefetch<K> % bpr;
    ahead[i] = w + (r + i + R * k) * bpr + off;
    left[i] = bpr - off;
  }
  V acc[R][MB];
  for (int i = 0; i < R; ++i)
    for (int j = 0; j < MB; ++j) acc[i][j] = vzero();
  for (int64_t s = 0; s < nb; s += kScales) {
    const int64_t n = std::min(kScales, nb - s);
    if (!kScalarScale) {
      for (int i = 0; i < R; ++i) {
        gather_half(p[i] + s * kBlock, kBlock, n, d[i]);
        for (int64_t k = 0; k < n; ++k) c[i][k] = -8.f * d[i][k];  // decode_block's Q4_0 offset
      }
    }
    for (int64_t k = 0; k < n; ++k) {
      const int64_t b = s + k;
      V w0[R], w1[R];
      for (int i = 0; i < R; ++i) {
        const uint8_t* blk = p[i] + b * kBlock;
        if (K == Kind::kQ8_0 || (b & 1) == 0) _mm_prefetch(reinterpret_cast<const char*>(ahead[i]), _MM_HINT_T0);  // a line or less apart
        ahead[i] += kBlock, left[i] -= kBlock;
        if (left[i] <= 0) ahead[i] += (R - 1) * bpr, left[i] += bpr;  // on into the stream's next row
        const float dk = kScalarScale ? block_scale(blk) : d[i][k];
#if defined(__AVX512F__) && defined(__AVX512BW__)
        if (K == Kind::kQ4_0) {
          // the block's 16 values d * (q - 8) (exact) as a table, looked up by each nibble: one
          // permute per 16 values in place of a convert and an FMA
          const __m512 table = _mm512_mul_ps(kCentered, _mm512_set1_ps(dk));
          const __m512i q = _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(blk + 2)));
          w0[i] = {_mm512_permutexvar_ps(q, table)};  // the permute reads an index's low 4 bits
          w1[i] = {_mm512_permutexvar_ps(_mm512_srli_epi32(q, 4), table)};
          continue;
        }
#endif
        decode_block<K>(blk, dk, K == Kind::kQ4_0 ? c[i][k] : 0.f, w0[i], w1[i]);  // (Q4_0 here: no AVX-512)
      }
      for (int j = 0; j < MB; ++j) {
        const float* xm = x + (m0 + j) * cols + 32 * b;
        const V xa = vload(xm), xb = vload(xm + 16);
        for (int i = 0; i < R; ++i) acc[i][j] = vfma(w1[i], xb, vfma(w0[i], xa, acc[i][j]));
      }
    }
  }
  for (int i = 0; i < R; ++i)
    for (int j = 0; j < MB; ++j) out[(m0 + j) * rows + r + i] = vsum(acc[i][j]);
}

// Rows [r, r + R) of a mapped Q4_0 weight times quantized activation rows [m0, m0 + MB): each
// block's 32 values are unpacked to bytes once and feed MB integer dots. Unlike mapped_pass, each
// block's scale is read alone (gathering 16 at once cost a quarter of the time on a 2-core Zen 5
// EPYC), and each stream asks for the line kQ8Prefetch bytes ahead of its block at every block.
// 2-core Zen 5 EPYC, one activation row, two threads: a Q4_0 [128256, 2048] weight 3.65 ms
// (40 GB/s; the float32 mapped_pass 5.4 ms), a 16 x [8192, 2048] stack 4.2 ms (6.1 ms), an
// 8 x [14336, 4096] stack 6.2 ms; 4 KiB ahead 4.0, 4.8 and 7.4 ms; 16 KiB within noise of 12.
constexpr int64_t kQ8Prefetch = 12288;

template <Kind K, int MB, int R>
void q8_pass(const uint8_t* w, int64_t bpr, const Q8Rows& a, int64_t rows, int64_t cols, int64_t m0, int64_t r, float* out) {
  constexpr int64_t kBlock = kBlockBytes<K>;
  const int64_t nb = cols / 32;
  const uint8_t* p[R];
  for (int i = 0; i < R; ++i) p[i] = w + (r + i) * bpr;
  __m256 acc[R][MB];
  for (int i = 0; i < R; ++i)
    for (int j = 0; j < MB; ++j) acc[i][j] = _mm256_setzero_ps();
  for (int64_t b = 0; b < nb; ++b) {
    __m256i wq[R], ws[R];  // unsigned values; Q8_0: their signs (ws: the values)
    float d[R];
    for (int i = 0; i < R; ++i) {
      const uint8_t* blk = p[i] + b * kBlock;
      _mm_prefetch(reinterpret_cast<const char*>(blk + kQ8Prefetch), _MM_HINT_T0);
      d[i] = block_scale(blk);
      if (K == Kind::kQ4_0) {
        wq[i] = q4_bytes(blk);
      } else {
        ws[i] = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk + 2));
        wq[i] = _mm256_abs_epi8(ws[i]);
      }
    }
    for (int j = 0; j < MB; ++j) {
      const int64_t ab = (m0 + j) * nb + b;
      const __m256i xq = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(a.q.data() + 32 * ab));
      const __m256i c = K == Kind::kQ4_0 ? _mm256_loadu_si256(reinterpret_cast<const __m256i*>(a.c.data() + 8 * ab)) : _mm256_setzero_si256();
      const float dx = a.d[ab];
      for (int i = 0; i < R; ++i) {
        const __m256i sx = K == Kind::kQ4_0 ? xq : _mm256_sign_epi8(xq, ws[i]);  // w * x = |w| * (x with w's sign)
        acc[i][j] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(dot_u8s8(c, wq[i], sx)), _mm256_set1_ps(d[i] * dx), acc[i][j]);
      }
    }
  }
  for (int i = 0; i < R; ++i)
    for (int j = 0; j < MB; ++j) out[(m0 + j) * rows + r + i] = hsum8(acc[i][j]);
}

#if defined(__AVX512F__) && defined(__AVX512BW__)
// q8_pass two blocks at a time (as q8_nibble_pairs512): Q4_0 blocks' nibbles or Q8_0 blocks'
// bytes of blocks b and b + 1 gathered into one register.
template <Kind K, int MB, int R>
void q8_pass512(const uint8_t* w, int64_t bpr, const Q8Rows& a, int64_t rows, int64_t cols, int64_t m0, int64_t r, float* out) {
  constexpr int64_t kBlock = kBlockBytes<K>;
  const int64_t nb = cols / 32;
  const uint8_t* p[R];
  for (int i = 0; i < R; ++i) p[i] = w + (r + i) * bpr;
  __m512 acc[R][MB];
  for (int i = 0; i < R; ++i)
    for (int j = 0; j < MB; ++j) acc[i][j] = _mm512_setzero_ps();
  for (int64_t b = 0; b < nb; b += 2) {
    const bool one = b + 1 == nb;
    __m512i u[R];
    __mmask64 neg[R];
    __m512 d[R];
    for (int i = 0; i < R; ++i) {
      const uint8_t* b0 = p[i] + b * kBlock;
      const uint8_t* b1 = one ? b0 : b0 + kBlock;  // (its values are masked off)
      _mm_prefetch(reinterpret_cast<const char*>(b0 + kQ8Prefetch), _MM_HINT_T0);
      _mm_prefetch(reinterpret_cast<const char*>(b1 + kQ8Prefetch), _MM_HINT_T0);
      d[i] = halves(block_scale(b0), one ? 0.f : block_scale(b1));
      if (K == Kind::kQ4_0) {
        u[i] = _mm512_inserti64x4(_mm512_castsi256_si512(q4_bytes(b0)), q4_bytes(b1), 1);
        neg[i] = 0;
      } else {
        const __m256i y0 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b0 + 2)), y1 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b1 + 2));
        const __m512i v = _mm512_inserti64x4(_mm512_castsi256_si512(y0), y1, 1);
        u[i] = _mm512_abs_epi8(v);
        neg[i] = _mm512_movepi8_mask(v);
      }
    }
    for (int j = 0; j < MB; ++j) {
      const Act2 x = act2(a, (m0 + j) * nb + b, one);
      const __m512i c = K == Kind::kQ4_0 ? x.c : _mm512_setzero_si512();
      for (int i = 0; i < R; ++i) {
        const __m512i xq = K == Kind::kQ4_0 ? x.q : _mm512_mask_sub_epi8(x.q, neg[i], _mm512_setzero_si512(), x.q);
        acc[i][j] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(dot2_u8s8(c, u[i], xq)), _mm512_mul_ps(d[i], x.d), acc[i][j]);
      }
    }
  }
  for (int i = 0; i < R; ++i)
    for (int j = 0; j < MB; ++j) out[(m0 + j) * rows + r + i] = _mm512_reduce_add_ps(acc[i][j]);
}
#endif

// Rows [r0, r1) of a mapped weight times activation rows [m0, m0 + MB): two rows a pass (two
// sums in flight; four, or one row with two sums, were slower: 2-core AVX-512 Xeon with AMX, a
// Q4_0 [48, 8192, 2048] stack at one activation row, when the loop still gathered its scales),
// the last one alone; four rows a pass at one activation row with AVX-512 and no AMX (kFourRows:
// 2-core Zen 5 EPYC, Q4_0 16 x [2048, 8192] 4.99-5.16 -> 4.49-4.70 ms, 16 x [8192, 2048]
// 5.19-5.21 -> 4.71-4.90 ms, Llama-3.2-1B-shaped decode 34.9-35.1 -> 38.5-39.1 tokens/s; two and
// four activation rows no faster; Q8_0, memory-bound, within noise). Each 16 values are dequantized once, exactly
// (d * (q - 8) as fma(q, d, -8 d), or a table lookup; d * q).
template <int MB>
constexpr bool kFourRows =
#if defined(__AVX512F__) && defined(__AVX512BW__) && !defined(__AMX_TILE__)
    MB == 1;
#else
    false;
#endif

template <Kind K, int MB>
void mapped_rows(const uint8_t* w, int64_t bpr, const float* x, int64_t rows, int64_t cols, int64_t m0, int64_t r0, int64_t r1,
                 float* out) {
  int64_t r = r0;
  if (kFourRows<MB>)
    for (; r + 4 <= r1; r += 4) mapped_pass<K, MB, 4>(w, bpr, x, rows, cols, m0, r, out);
  for (; r + 2 <= r1; r += 2) mapped_pass<K, MB, 2>(w, bpr, x, rows, cols, m0, r, out);
  for (; r < r1; ++r) mapped_pass<K, MB, 1>(w, bpr, x, rows, cols, m0, r, out);
}

template <Kind K>
void run_mapped_q8(ffi::ThreadPool& pool, const float* x, int64_t m_rows, const uint8_t* w, int64_t rows, int64_t cols, float* out) {
  const int64_t bpr = mapped_row_bytes(int64_t(K), cols);
  Q8Rows a;
  quantize_q8(x, m_rows, cols, a);
  parallel_for(pool, (rows + 1) / 2, rows * cols * m_rows, [&](int64_t p0, int64_t p1) {
    const int64_t r0 = 2 * p0, r1 = std::min(rows, 2 * p1);
    over_rows(m_rows, [&](int64_t m, auto mb) {
      constexpr int MB = decltype(mb)::value;
      int64_t r = r0;
#if defined(__AVX512F__) && defined(__AVX512BW__)
      for (; r + 2 <= r1; r += 2) q8_pass512<K, MB, 2>(w, bpr, a, rows, cols, m, r, out);
      for (; r < r1; ++r) q8_pass512<K, MB, 1>(w, bpr, a, rows, cols, m, r, out);
#else
      for (; r + 2 <= r1; r += 2) q8_pass<K, MB, 2>(w, bpr, a, rows, cols, m, r, out);
      for (; r < r1; ++r) q8_pass<K, MB, 1>(w, bpr, a, rows, cols, m, r, out);
#endif
    });
  }, kStreamChunks);
}

template <Kind K>
void run_mapped(ffi::ThreadPool& pool, const float* x, int64_t m_rows, const uint8_t* w, int64_t rows, int64_t cols, float* out) {
  const int64_t bpr = mapped_row_bytes(int64_t(K), cols);
  // tasks of whole pairs of rows
  parallel_for(pool, (rows + 1) / 2, rows * cols * m_rows, [&](int64_t p0, int64_t p1) {
    const int64_t r0 = 2 * p0, r1 = std::min(rows, 2 * p1);
    over_rows(m_rows, [&](int64_t m, auto mb) { mapped_rows<K, decltype(mb)::value>(w, bpr, x, rows, cols, m, r0, r1, out); });
  }, kStreamChunks);
}

// The first byte of a mapped weight's layer (`layer` clamped into the offsets' range, as XLA's
// dynamic-slice clamps) plus `skip` bytes, with `nbytes` of it inside the file: nothing is read
// past the file.
ffi::Error mapped_bytes(const char* what, const ffi::Buffer<ffi::U8>& file, const ffi::Buffer<ffi::S32>& offsets,
                        const ffi::AnyBuffer& layer, int64_t kind, int64_t skip, int64_t nbytes, const uint8_t*& w) {
  if (kind != int64_t(Kind::kQ4_0) && kind != int64_t(Kind::kQ8_0))
    return ffi::Error::InvalidArgument(std::string(what) + ": the blocks must be Q4_0 or Q8_0");
  if (offsets.element_count() == 0) return ffi::Error::InvalidArgument(std::string(what) + ": no offset");
  int64_t l = 0;
  if (layer.element_count() != 0) {
    l = *reinterpret_cast<const int32_t*>(layer.untyped_data());
    l = std::min<int64_t>(std::max<int64_t>(l, 0), int64_t(offsets.element_count()) - 1);
  }
  const int64_t first = int64_t(offsets.typed_data()[l]) * 32 + skip;
  if (skip < 0 || first < 0 || first + nbytes > int64_t(file.element_count()))
    return ffi::Error::InvalidArgument(std::string(what) + ": the weight's bytes are outside the file");
  w = file.typed_data() + first;
  return ffi::Error::Success();
}

ffi::Error MappedMatmul(ffi::ThreadPool pool, ffi::Buffer<ffi::F32> x, ffi::Buffer<ffi::U8> file, ffi::Buffer<ffi::S32> offsets,
                        ffi::AnyBuffer layer, ffi::ResultBuffer<ffi::F32> out, int64_t kind, int64_t activations) {
  const int64_t cols = x.dimensions().back(), m_rows = x.element_count() / cols;
  if (auto e = check_activations("mapped matmul", activations); e.failure()) return e;
  const int64_t rows = out->dimensions().back();
  if (auto e = check_dims("mapped matmul", cols, rows, rows, 32); e.failure()) return e;
  if (int64_t(out->element_count()) != m_rows * rows) return ffi::Error::InvalidArgument("mapped matmul: the output's shape");
  const uint8_t* w;
  if (auto e = mapped_bytes("mapped matmul", file, offsets, layer, kind, 0, rows * mapped_row_bytes(kind, cols), w); e.failure()) return e;
  if (activations == 1 && kind == int64_t(Kind::kQ4_0))
    run_mapped_q8<Kind::kQ4_0>(pool, x.typed_data(), m_rows, w, rows, cols, out->typed_data());
  else if (activations == 1)
    run_mapped_q8<Kind::kQ8_0>(pool, x.typed_data(), m_rows, w, rows, cols, out->typed_data());
  else if (kind == int64_t(Kind::kQ4_0))
    run_mapped<Kind::kQ4_0>(pool, x.typed_data(), m_rows, w, rows, cols, out->typed_data());
  else
    run_mapped<Kind::kQ8_0>(pool, x.typed_data(), m_rows, w, rows, cols, out->typed_data());
  return ffi::Error::Success();
}


// Rows [start, start + count) of a mapped weight's layer as float32 [count, cols] (a prompt's
// product dequantizes the weight a block of rows at a time for XLA's GEMM): the same values as
// the product's, written 16 at a time.
template <Kind K>
void dequantize_rows(ffi::ThreadPool& pool, const uint8_t* w, int64_t bpr, int64_t count, int64_t cols, float* out) {
  const int64_t nb = cols / 32;
  parallel_for(pool, count, count * cols, [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) {
      const uint8_t* p = w + r * bpr;
      float* o = out + r * cols;
      for (int64_t b = 0; b < nb; ++b) {
        const uint8_t* blk = p + b * kBlockBytes<K>;
        const float d = block_scale(blk);
        V w0, w1;
        decode_block<K>(blk, d, -8.f * d, w0, w1);
        vstore(o + 32 * b, w0);
        vstore(o + 32 * b + 16, w1);
      }
    }
  }, kStreamChunks);
}

ffi::Error MappedDequantize(ffi::ThreadPool pool, ffi::Buffer<ffi::U8> file, ffi::Buffer<ffi::S32> offsets, ffi::AnyBuffer layer,
                            ffi::Buffer<ffi::S32> start, ffi::ResultBuffer<ffi::F32> out, int64_t kind) {
  const auto od = out->dimensions();
  if (od.size() != 2) return ffi::Error::InvalidArgument("mapped dequantize: the output must be [rows, cols]");
  const int64_t count = od[0], cols = od[1];
  if (cols <= 0 || cols % 32) return ffi::Error::InvalidArgument("mapped dequantize: columns must be whole 32-value blocks");
  if (start.element_count() != 1) return ffi::Error::InvalidArgument("mapped dequantize: no start");
  const int64_t bpr = mapped_row_bytes(kind, cols);
  const uint8_t* w;
  if (auto e = mapped_bytes("mapped dequantize", file, offsets, layer, kind, int64_t(start.typed_data()[0]) * bpr, count * bpr, w); e.failure())
    return e;
  if (kind == int64_t(Kind::kQ4_0))
    dequantize_rows<Kind::kQ4_0>(pool, w, bpr, count, cols, out->typed_data());
  else
    dequantize_rows<Kind::kQ8_0>(pool, w, bpr, count, cols, out->typed_data());
  return ffi::Error::Success();
}


// ---- 16-bit float weights (bfloat16, float16), widened exactly ------------------------------------
// Every bfloat16 and float16 value is a float32 value: widening is exact (a bfloat16 is a float32's
// high half: a shift; float16 with F16C's vcvtph2ps), and the product is the float32 product of
// the weight's values (x is not rounded). 16 values from 32 bytes.
enum class Half { kBF16, kF16 };

template <Half H>
inline V widen16(const uint16_t* p) {
#if defined(__AVX512F__) && defined(__AVX512BW__)
  const __m256i raw = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
  if (H == Half::kF16) return {_mm512_cvtph_ps(raw)};
  return {_mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(raw), 16))};
#else
  const __m128i a = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
  const __m128i b = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p + 8));
  if (H == Half::kF16) return {_mm256_cvtph_ps(a), _mm256_cvtph_ps(b)};
  return {_mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(a), 16)),
          _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(b), 16))};
#endif
}

// Weight rows per pass, by activation rows: each widened value feeds MB products, and R rows a
// pass reuse each activation load R times; at most 16 accumulators (AVX-512's 32 registers;
// AVX2 takes 1 or 2 activation rows a pass). Each (weight row, activation row) keeps kChains
// interleaved sums whatever MB is, so a row's result does not depend on the rows multiplied
// beside it (a sentence alone and in a batch give the same numbers).
#if defined(__AVX512F__) && defined(__AVX512BW__)
template <int MB>
constexpr int kRowsPerPass = MB >= 8 ? 1 : (MB >= 4 ? 2 : 4);
#else
template <int MB>
constexpr int kRowsPerPass = MB >= 2 ? 1 : 2;
#endif
template <int MB>
constexpr int kChains = 2;

// Rows [r, r + R) of a 16-bit weight (row-major, `cols` values each) times activation rows
// [m0, m0 + MB). Each stream prefetches its own row kPrefetch bytes ahead, or where a row is
// shorter than that, the same place R rows on (the row it reads in the next pass).
template <Half H, int MB, int R>
void half_pass(const uint16_t* w, const float* x, int64_t rows, int64_t cols, int64_t m0, int64_t r, float* out) {
  constexpr int C = kChains<MB>;
  const uint16_t* v[R];
  for (int i = 0; i < R; ++i) v[i] = w + (r + i) * cols;
  const int64_t ahead = R == 1 || 2 * cols >= kPrefetch ? 0 : R * cols - kPrefetch / 2;  // values, on top of prefetch()'s distance
  V acc[R][C][MB];
  for (int i = 0; i < R; ++i)
    for (int c = 0; c < C; ++c)
      for (int j = 0; j < MB; ++j) acc[i][c][j] = vzero();
  for (int64_t k = 0; k < cols; k += 16 * C) {  // cols is a multiple of 64 >= 16 * C (checked)
    for (int c = 0; c < C; ++c) {
      const int64_t kc = k + 16 * c;
      V wv[R];
      for (int i = 0; i < R; ++i) {
        if ((kc & 31) == 0) prefetch(v[i] + kc + ahead);  // each 64-byte line once
        wv[i] = widen16<H>(v[i] + kc);
      }
      for (int j = 0; j < MB; ++j) {
        const V xv = vload(x + (m0 + j) * cols + kc);
        for (int i = 0; i < R; ++i) acc[i][c][j] = vfma(wv[i], xv, acc[i][c][j]);
      }
    }
  }
  for (int i = 0; i < R; ++i)
    for (int j = 0; j < MB; ++j) {
      V sum = acc[i][0][j];
      for (int c = 1; c < C; ++c) sum = vadd(sum, acc[i][c][j]);
      out[(m0 + j) * rows + r + i] = vsum(sum);
    }
}

// Rows [r0, r1) of a 16-bit weight times activation rows [m0, m0 + MB), R at a time, the rest
// one by one.
template <Half H, int MB>
void half_rows(const uint16_t* w, const float* x, int64_t rows, int64_t cols, int64_t m0, int64_t r0, int64_t r1, float* out) {
  constexpr int R = kRowsPerPass<MB>;
  int64_t r = r0;
  for (; r + R <= r1; r += R) half_pass<H, MB, R>(w, x, rows, cols, m0, r, out);
  for (; r < r1; ++r) half_pass<H, MB, 1>(w, x, rows, cols, m0, r, out);
}

// The weight's 16-bit float type, or an error naming what it got.
ffi::Error half_type(const char* what, const ffi::AnyBuffer& values, Half& h) {
  if (values.element_type() == ffi::BF16) {
    h = Half::kBF16;
  } else if (values.element_type() == ffi::F16) {
    h = Half::kF16;
  } else {
    return ffi::Error::InvalidArgument(std::string(what) + ": the weight must be bfloat16 or float16 [layers?, rows, cols]");
  }
  if (values.dimensions().size() < 2) return ffi::Error::InvalidArgument(std::string(what) + ": the weight must be [layers?, rows, cols]");
  return ffi::Error::Success();
}

template <Half H>
void run_half(ffi::ThreadPool& pool, const float* x, int64_t m_rows, const uint16_t* w, int64_t rows, int64_t cols, float* out) {
  parallel_for(pool, rows, rows * cols * m_rows, [&](int64_t r0, int64_t r1) {
    over_rows(m_rows, [&](int64_t m, auto mb) { half_rows<H, decltype(mb)::value>(w, x, rows, cols, m, r0, r1, out); });
  }, kStreamChunks);
}

ffi::Error WidenedMatmul(ffi::ThreadPool pool, ffi::Buffer<ffi::F32> x, ffi::AnyBuffer values, ffi::AnyBuffer layer,
                         ffi::ResultBuffer<ffi::F32> out) {
  Half h;
  if (auto e = half_type("widened matmul", values, h); e.failure()) return e;
  const auto vd = values.dimensions();
  const int64_t cols = x.dimensions().back(), m_rows = x.element_count() / cols;
  const int64_t rows = vd[vd.size() - 2];
  if (vd.back() != cols) return ffi::Error::InvalidArgument("widened matmul: x and the weight disagree on columns");
  if (auto e = check_dims("widened matmul", cols, rows, out->dimensions().back(), 64); e.failure()) return e;
  if (int64_t(out->element_count()) != m_rows * rows) return ffi::Error::InvalidArgument("widened matmul: the output's shape");
  const uint16_t* w = reinterpret_cast<const uint16_t*>(values.untyped_data()) + layer_of(layer, vd) * rows * cols;
  if (h == Half::kBF16)
    run_half<Half::kBF16>(pool, x.typed_data(), m_rows, w, rows, cols, out->typed_data());
  else
    run_half<Half::kF16>(pool, x.typed_data(), m_rows, w, rows, cols, out->typed_data());
  return ffi::Error::Success();
}

// Rows [start, start + count) of a 16-bit weight's layer widened to float32 [count, cols] (a
// prompt's product widens the weight, whole or a block of rows at a time, for XLA's GEMM).
ffi::Error WidenedRows(ffi::ThreadPool pool, ffi::AnyBuffer values, ffi::AnyBuffer layer, ffi::Buffer<ffi::S32> start,
                       ffi::ResultBuffer<ffi::F32> out) {
  Half h;
  if (auto e = half_type("widened rows", values, h); e.failure()) return e;
  const auto vd = values.dimensions();
  const auto od = out->dimensions();
  if (od.size() != 2 || od[1] != vd.back() || vd.back() % 16)
    return ffi::Error::InvalidArgument("widened rows: cols must be a multiple of 16 and the output float32 [count, cols]");
  if (start.element_count() != 1) return ffi::Error::InvalidArgument("widened rows: no start");
  const int64_t rows = vd[vd.size() - 2], cols = vd.back(), count = od[0], first = start.typed_data()[0];
  if (first < 0 || first + count > rows) return ffi::Error::InvalidArgument("widened rows: rows outside the weight");
  const uint16_t* w = reinterpret_cast<const uint16_t*>(values.untyped_data()) + (layer_of(layer, vd) * rows + first) * cols;
  float* o = out->typed_data();
  parallel_for(pool, count, count * cols, [&](int64_t r0, int64_t r1) {
    if (h == Half::kBF16)
      for (int64_t i = r0 * cols; i < r1 * cols; i += 16) vstore(o + i, widen16<Half::kBF16>(w + i));
    else
      for (int64_t i = r0 * cols; i < r1 * cols; i += 16) vstore(o + i, widen16<Half::kF16>(w + i));
  }, kStreamChunks);
  return ffi::Error::Success();
}

// ---- the tiles layout: Q4_0 in tiles of 16 rows, Q8_0 activations ----------------------------------
// (layouts.cc: maxjax_tiles_from_blocks) A block of a tile is 256 bytes of nibbles, four 64-byte
// chunks whose 32-bit lanes are the tile's 16 rows, each with four consecutive values in its low
// nibbles and the next four in its high; and the rows' 16 float16 scales. One vpdpbusd multiplies
// 16 rows by four activations at once, every sum stays in its row's lane (no reduction across
// lanes), and a tile's outputs are 16 consecutive floats: 2-core Zen 5 EPYC, one activation row,
// 77 Llama-3.2-1B-shaped [8192, 2048] weights in turn, 0.20 ms each (48 GB/s, the two threads'
// read bandwidth), where the mapped layout's Q8_0 kernel takes 0.24 ms and its float32 0.26 ms; 8
// rows at once 0.27 ms (495 GMAC/s).
#if defined(__AVX512F__) && defined(__AVX512BW__)
constexpr bool kTiles = true;
constexpr int64_t kTileBlockBytes = 256, kTilePrefetch = 4096;

// Tiles [t0, t1) of one layer (values, scale, and Q4_1's offset) times quantized activation rows
// [m0, m0 + MB): per block, in int32, sum q4 * q plus, for Q4_0, Q8Rows::c (-8 * sum q: so sum
// (q4 - 8) * q), times d_w * d_x; for Q4_1 plus m_w * (d_x * sum q) (Q8Rows::ds); summed over the
// blocks in order in float32 (llama.cpp's ggml_vec_dot_q4_0_q8_0 and _q4_1_q8_1 arithmetic).
template <bool Offset, int MB>
void tile_rows(const uint8_t* values, const uint16_t* scale, const uint16_t* offset, const Q8Rows& a, int64_t nb, int64_t rows,
               int64_t m0, int64_t t0, int64_t t1, float* out) {
  const __m512i low4 = _mm512_set1_epi8(15);
  for (int64_t t = t0; t < t1; ++t) {
    __m512 acc[MB];
    for (int j = 0; j < MB; ++j) acc[j] = _mm512_setzero_ps();
    const uint8_t* v = values + t * nb * kTileBlockBytes;
    const uint16_t* d = scale + t * nb * 16;
    const uint16_t* mo = Offset ? offset + t * nb * 16 : nullptr;
    for (int64_t b = 0; b < nb; ++b, v += kTileBlockBytes, d += 16) {
      for (int c = 0; c < 4; ++c) _mm_prefetch(reinterpret_cast<const char*>(v + kTilePrefetch + 64 * c), _MM_HINT_T0);
      if ((b & 1) == 0) _mm_prefetch(reinterpret_cast<const char*>(d) + kTilePrefetch / 8, _MM_HINT_T0);
      const __m512 dw = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(d)));
      __m512 mw = _mm512_setzero_ps();
      if (Offset) {
        if ((b & 1) == 0) _mm_prefetch(reinterpret_cast<const char*>(mo + 16 * b) + kTilePrefetch / 8, _MM_HINT_T0);
        mw = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(mo + 16 * b)));
      }
      __m512i lo[4], hi[4];
      for (int c = 0; c < 4; ++c) {
        const __m512i q = _mm512_loadu_si512(v + 64 * c);
        lo[c] = _mm512_and_si512(q, low4);
        hi[c] = _mm512_and_si512(_mm512_srli_epi16(q, 4), low4);
      }
      for (int j = 0; j < MB; ++j) {
        const int64_t ab = (m0 + j) * nb + b;
        int32_t x4[8];  // the block's 32 activations, four to a 32-bit word
        std::memcpy(x4, a.q.data() + 32 * ab, 32);
        __m512i s = Offset ? _mm512_setzero_si512() : _mm512_set1_epi32(a.c[8 * ab]);
        for (int c = 0; c < 4; ++c) {
          s = dot2_u8s8(s, lo[c], _mm512_set1_epi32(x4[2 * c]));
          s = dot2_u8s8(s, hi[c], _mm512_set1_epi32(x4[2 * c + 1]));
        }
        acc[j] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(s), _mm512_mul_ps(dw, _mm512_set1_ps(a.d[ab])), acc[j]);
        if (Offset) acc[j] = _mm512_fmadd_ps(mw, _mm512_set1_ps(a.ds[ab]), acc[j]);
      }
    }
    for (int j = 0; j < MB; ++j) _mm512_storeu_ps(out + (m0 + j) * rows + 16 * t, acc[j]);
  }
}

template <bool Offset>
void run_tiles(ffi::ThreadPool& pool, const float* x, int64_t m_rows, const uint8_t* values, const uint16_t* scale,
               const uint16_t* offset, int64_t rows, int64_t cols, float* out) {
  Q8Rows a;
  quantize_q8(x, m_rows, cols, a);
  const int64_t nb = cols / 32;
  // each tile's blocks stay in the core's caches while every activation row passes over them
  parallel_for(pool, rows / 16, rows * cols * m_rows, [&](int64_t t0, int64_t t1) {
    if (m_rows == 1) return tile_rows<Offset, 1>(values, scale, offset, a, nb, rows, 0, t0, t1, out);
    for (int64_t t = t0; t < t1; ++t)
      over_rows(m_rows, [&](int64_t m, auto mb) { tile_rows<Offset, decltype(mb)::value>(values, scale, offset, a, nb, rows, m, t, t + 1, out); });
  }, m_rows <= kBatch ? kStreamChunks : kDefaultChunks);
}
#else
constexpr bool kTiles = false;
#endif

ffi::Error TilesMatmul(ffi::ThreadPool pool, ffi::Buffer<ffi::F32> x, ffi::Buffer<ffi::U8> values, ffi::AnyBuffer scale,
                       ffi::AnyBuffer offset, ffi::AnyBuffer layer, ffi::ResultBuffer<ffi::F32> out) {
  if (!kTiles) return ffi::Error::InvalidArgument("tiles matmul: built without AVX-512");
  const auto vd = values.dimensions();
  const auto sd = scale.dimensions();
  const int64_t cols = x.dimensions().back(), m_rows = x.element_count() / cols;
  const int64_t rows = out->dimensions().back(), nb = cols / 32;
  if (vd.size() < 2 || cols % 32 || rows % 16 || vd[vd.size() - 2] != rows / 16 || vd.back() != nb * 256)
    return ffi::Error::InvalidArgument("tiles matmul: x, the values and the output disagree on shapes");
  if (scale.element_type() != ffi::F16 || sd.size() != vd.size() || sd[sd.size() - 2] != rows / 16 || sd.back() != nb * 16)
    return ffi::Error::InvalidArgument("tiles matmul: the scales must be float16 [..., rows / 16, cols / 2]");
  for (size_t i = 0; i + 2 < vd.size(); ++i)
    if (sd[i] != vd[i]) return ffi::Error::InvalidArgument("tiles matmul: the values and scales have different layers");
  const bool has_offset = offset.element_count() != 0;
  if (has_offset && (offset.element_type() != ffi::F16 || offset.element_count() != scale.element_count()))
    return ffi::Error::InvalidArgument("tiles matmul: the offsets must be float16 like the scales, or empty");
  if (int64_t(out->element_count()) != m_rows * rows) return ffi::Error::InvalidArgument("tiles matmul: the output's shape");
#if defined(__AVX512F__) && defined(__AVX512BW__)
  const int64_t l = layer_of(layer, vd);
  const uint8_t* v = values.typed_data() + l * rows * cols / 2;
  const uint16_t* s = reinterpret_cast<const uint16_t*>(scale.untyped_data()) + l * rows * nb;
  if (has_offset)
    run_tiles<true>(pool, x.typed_data(), m_rows, v, s, reinterpret_cast<const uint16_t*>(offset.untyped_data()) + l * rows * nb, rows, cols, out->typed_data());
  else
    run_tiles<false>(pool, x.typed_data(), m_rows, v, s, nullptr, rows, cols, out->typed_data());
#endif
  return ffi::Error::Success();
}

}  // namespace

// 1 where the tiles layout's product is built (AVX-512), else 0: kernels.tiles_built()
extern "C" int maxjax_tiles_built() { return kTiles ? 1 : 0; }

XLA_FFI_DEFINE_HANDLER_SYMBOL(maxjax_tiles_matmul, TilesMatmul,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::ThreadPool>()
                                  .Arg<ffi::Buffer<ffi::F32>>()  // x [..., cols]
                                  .Arg<ffi::Buffer<ffi::U8>>()   // values [layers?, rows / 16, cols * 8]
                                  .Arg<ffi::AnyBuffer>()         // scale [layers?, rows / 16, cols / 2] f16
                                  .Arg<ffi::AnyBuffer>()         // offset (Q4_1's m), like scale, or empty
                                  .Arg<ffi::AnyBuffer>()         // layer: int32 [] (or empty: no layer axis)
                                  .Ret<ffi::Buffer<ffi::F32>>()  // out [..., rows]
);

XLA_FFI_DEFINE_HANDLER_SYMBOL(maxjax_nibbles_matmul, NibblesMatmul,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::ThreadPool>()
                                  .Arg<ffi::Buffer<ffi::F32>>()  // x [..., cols]
                                  .Arg<ffi::Buffer<ffi::U8>>()   // values [layers?, rows / 2, cols]
                                  .Arg<ffi::AnyBuffer>()         // scale [layers?, rows, cols / 32] f16 | f32
                                  .Arg<ffi::AnyBuffer>()         // offset, like scale, or empty
                                  .Arg<ffi::AnyBuffer>()         // layer: int32 [] (or empty: no layer axis)
                                  .Ret<ffi::Buffer<ffi::F32>>()  // out [..., rows]
                                  .Attr<int64_t>("activations")  // 0 float32, 1 Q8_0
);

XLA_FFI_DEFINE_HANDLER_SYMBOL(maxjax_unpacked_matmul, UnpackedMatmul,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::ThreadPool>()
                                  .Arg<ffi::Buffer<ffi::F32>>()  // x [..., cols]
                                  .Arg<ffi::AnyBuffer>()         // values [layers?, rows, cols] s8 | u8
                                  .Arg<ffi::Buffer<ffi::F32>>()  // scale [layers?, rows, cols / group]
                                  .Arg<ffi::AnyBuffer>()         // offset, like scale, or empty
                                  .Arg<ffi::AnyBuffer>()         // layer: int32 [] (or empty)
                                  .Ret<ffi::Buffer<ffi::F32>>()  // out [..., rows]
                                  .Attr<int64_t>("activations")  // 0 float32, 1 Q8_0 (groups of 32)
);

XLA_FFI_DEFINE_HANDLER_SYMBOL(maxjax_mapped_matmul, MappedMatmul,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::ThreadPool>()
                                  .Arg<ffi::Buffer<ffi::F32>>()  // x [..., cols]
                                  .Arg<ffi::Buffer<ffi::U8>>()   // file [units, 32]: the mapped file
                                  .Arg<ffi::Buffer<ffi::S32>>()  // offsets [layers?]: each layer's first byte / 32
                                  .Arg<ffi::AnyBuffer>()         // layer: int32 [] (or empty: no layer axis)
                                  .Ret<ffi::Buffer<ffi::F32>>()  // out [..., rows]
                                  .Attr<int64_t>("kind")         // 0 Q4_0, 2 Q8_0
                                  .Attr<int64_t>("activations")  // 0 float32, 1 Q8_0
);

XLA_FFI_DEFINE_HANDLER_SYMBOL(maxjax_mapped_dequantize, MappedDequantize,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::ThreadPool>()
                                  .Arg<ffi::Buffer<ffi::U8>>()   // file [units, 32]
                                  .Arg<ffi::Buffer<ffi::S32>>()  // offsets [layers?]
                                  .Arg<ffi::AnyBuffer>()         // layer: int32 [] (or empty)
                                  .Arg<ffi::Buffer<ffi::S32>>()  // start: int32 [], the first row
                                  .Ret<ffi::Buffer<ffi::F32>>()  // out [rows, cols]
                                  .Attr<int64_t>("kind")         // 0 Q4_0, 2 Q8_0
);

XLA_FFI_DEFINE_HANDLER_SYMBOL(maxjax_widened_matmul, WidenedMatmul,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::ThreadPool>()
                                  .Arg<ffi::Buffer<ffi::F32>>()  // x [..., cols]
                                  .Arg<ffi::AnyBuffer>()         // values bf16 | f16 [layers?, rows, cols]
                                  .Arg<ffi::AnyBuffer>()         // layer: int32 [] (or empty: no layer axis)
                                  .Ret<ffi::Buffer<ffi::F32>>()  // out [..., rows]
);

XLA_FFI_DEFINE_HANDLER_SYMBOL(maxjax_widened_rows, WidenedRows,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::ThreadPool>()
                                  .Arg<ffi::AnyBuffer>()         // values bf16 | f16 [layers?, rows, cols]
                                  .Arg<ffi::AnyBuffer>()         // layer: int32 [] (or empty)
                                  .Arg<ffi::Buffer<ffi::S32>>()  // start: int32 [], the first row
                                  .Ret<ffi::Buffer<ffi::F32>>()  // out [count, cols]
);
