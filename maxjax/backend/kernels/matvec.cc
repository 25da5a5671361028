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
// A leading layer axis is indexed by the `layer` operand (int32 scalar), so that a scan over
// stacked weights reads each layer in place instead of copying its slice first.
//
// Built for the host by the loader with -march=native: AVX-512 (F, BW) or AVX2 with FMA.
#include <immintrin.h>

#include <algorithm>
#include <atomic>
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

namespace {

// ---- 16 float32 lanes: one 512-bit register, or two 256-bit ones ---------------------------------
#if defined(__AVX512F__) && defined(__AVX512BW__)
struct V {
  __m512 v;
};
inline V vzero() { return {_mm512_setzero_ps()}; }
inline V vload(const float* p) { return {_mm512_loadu_ps(p)}; }
inline V vbcast(float s) { return {_mm512_set1_ps(s)}; }
inline V vmul(V a, V b) { return {_mm512_mul_ps(a.v, b.v)}; }
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
inline V vbcast(float s) { return {_mm256_set1_ps(s), _mm256_set1_ps(s)}; }
inline V vmul(V x, V y) { return {_mm256_mul_ps(x.a, y.a), _mm256_mul_ps(x.b, y.b)}; }
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

// ---- prefetching ------------------------------------------------------------------------------------
// The loops read a weight once, front to back, each thread its own contiguous rows; asking for the
// cache line kPrefetch bytes ahead keeps more reads in flight than the hardware prefetcher does
// (2-core AVX-512 Xeon, one activation row, a Q4_0 [48, 8192, 2048] stack read layer by layer:
// 10.7 -> 13.0 GB/s, Q8_0 12.4 -> 16.4 GB/s; with 4 rows or more the loops are compute-bound and
// it changes nothing measurable).
constexpr int64_t kPrefetch = 2048;
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
  std::vector<float> buf(4 * nb);
  float *s0 = buf.data(), *s1 = s0 + nb, *o0 = s1 + nb, *o1 = o0 + nb;
  for (int64_t p = p0; p < p1; ++p) {
    const uint8_t* v = values + p * cols;
    to_float(scale + 2 * p * nb, s0, nb);
    to_float(scale + (2 * p + 1) * nb, s1, nb);
    if (Offset) {
      to_float(offset + 2 * p * nb, o0, nb);
      to_float(offset + (2 * p + 1) * nb, o1, nb);
    } else {
      for (int64_t b = 0; b < nb; ++b) o0[b] = -8.f * s0[b], o1[b] = -8.f * s1[b];
    }
    V acc0[MB], acc1[MB];
    for (int j = 0; j < MB; ++j) acc0[j] = acc1[j] = vzero();
    for (int64_t b = 0; b < nb; ++b) {
      if ((b & 1) == 0) prefetch(v + 32 * b);
      V lo_a, hi_a, lo_b, hi_b;
      nibbles16(v + 32 * b, lo_a, hi_a);
      nibbles16(v + 32 * b + 16, lo_b, hi_b);
      const V d0 = vbcast(s0[b]), d1 = vbcast(s1[b]), c0 = vbcast(o0[b]), c1 = vbcast(o1[b]);
      const V wa0 = vfma(lo_a, d0, c0), wb0 = vfma(lo_b, d0, c0), wa1 = vfma(hi_a, d1, c1), wb1 = vfma(hi_b, d1, c1);
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
                 int64_t rows, int64_t cols, float* out) {
  parallel_for(pool, rows / 2, rows * cols * m_rows, [&](int64_t p0, int64_t p1) {
    over_rows(m_rows, [&](int64_t m, auto mb) { nibble_pairs<S, Offset, decltype(mb)::value>(values, scale, offset, x, rows, cols, m, p0, p1, out); });
  });
}

ffi::Error NibblesMatmul(ffi::ThreadPool pool, ffi::Buffer<ffi::F32> x, ffi::Buffer<ffi::U8> values, ffi::AnyBuffer scale,
                         ffi::AnyBuffer offset, ffi::AnyBuffer layer, ffi::ResultBuffer<ffi::F32> out) {
  const auto vd = values.dimensions();
  const int64_t cols = x.dimensions().back(), m_rows = x.element_count() / cols;
  const int64_t rows = 2 * vd[vd.size() - 2];
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
      run_nibbles<uint16_t, true>(pool, x.typed_data(), m_rows, v, s, reinterpret_cast<const uint16_t*>(offset.untyped_data()) + l_off, rows, cols, o);
    else
      run_nibbles<uint16_t, false>(pool, x.typed_data(), m_rows, v, s, nullptr, rows, cols, o);
  } else if (scale.element_type() == ffi::F32) {
    const float* s = reinterpret_cast<const float*>(scale.untyped_data()) + l_off;
    if (has_offset)
      run_nibbles<float, true>(pool, x.typed_data(), m_rows, v, s, reinterpret_cast<const float*>(offset.untyped_data()) + l_off, rows, cols, o);
    else
      run_nibbles<float, false>(pool, x.typed_data(), m_rows, v, s, nullptr, rows, cols, o);
  } else {
    return ffi::Error::InvalidArgument("nibbles matmul: scales must be float16 or float32");
  }
  return ffi::Error::Success();
}

template <typename Q, bool Offset>
void run_bytes(ffi::ThreadPool& pool, const float* x, int64_t m_rows, const Q* values, const float* scale, const float* offset,
               int64_t rows, int64_t cols, int64_t group, float* out) {
  parallel_for(pool, rows, rows * cols * m_rows, [&](int64_t r0, int64_t r1) {
    over_rows(m_rows, [&](int64_t m, auto mb) { byte_rows<Q, Offset, decltype(mb)::value>(values, scale, offset, x, rows, cols, group, m, r0, r1, out); });
  });
}

ffi::Error UnpackedMatmul(ffi::ThreadPool pool, ffi::Buffer<ffi::F32> x, ffi::AnyBuffer values, ffi::Buffer<ffi::F32> scale,
                          ffi::AnyBuffer offset, ffi::AnyBuffer layer, ffi::ResultBuffer<ffi::F32> out) {
  const auto vd = values.dimensions();
  const auto sd = scale.dimensions();
  const int64_t cols = x.dimensions().back(), m_rows = x.element_count() / cols;
  const int64_t rows = vd[vd.size() - 2];
  if (vd.back() != cols || sd.back() <= 0) return ffi::Error::InvalidArgument("unpacked matmul: x and the weight disagree on columns");
  const int64_t group = cols / sd.back();
  if (group % 16 || group * sd.back() != cols) return ffi::Error::InvalidArgument("unpacked matmul: groups must be a multiple of 16 values");
  if (auto e = check_dims("unpacked matmul", cols, rows, out->dimensions().back(), group); e.failure()) return e;
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
      run_bytes<int8_t, true>(pool, x.typed_data(), m_rows, v, s, off, rows, cols, group, o);
    else
      run_bytes<int8_t, false>(pool, x.typed_data(), m_rows, v, s, off, rows, cols, group, o);
  } else if (values.element_type() == ffi::U8) {
    const uint8_t* v = reinterpret_cast<const uint8_t*>(values.untyped_data()) + l * nv;
    if (has_offset)
      run_bytes<uint8_t, true>(pool, x.typed_data(), m_rows, v, s, off, rows, cols, group, o);
    else
      run_bytes<uint8_t, false>(pool, x.typed_data(), m_rows, v, s, off, rows, cols, group, o);
  } else {
    return ffi::Error::InvalidArgument("unpacked matmul: values must be int8 or uint8");
  }
  return ffi::Error::Success();
}

}  // namespace

XLA_FFI_DEFINE_HANDLER_SYMBOL(maxjax_nibbles_matmul, NibblesMatmul,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::ThreadPool>()
                                  .Arg<ffi::Buffer<ffi::F32>>()  // x [..., cols]
                                  .Arg<ffi::Buffer<ffi::U8>>()   // values [layers?, rows / 2, cols]
                                  .Arg<ffi::AnyBuffer>()         // scale [layers?, rows, cols / 32] f16 | f32
                                  .Arg<ffi::AnyBuffer>()         // offset, like scale, or empty
                                  .Arg<ffi::AnyBuffer>()         // layer: int32 [] (or empty: no layer axis)
                                  .Ret<ffi::Buffer<ffi::F32>>()  // out [..., rows]
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
);
