// GGUF blocks -> maxjax's run-time layouts (``nibbles``, ``unpacked``), on the host, in one pass.
//
// The definitions of both layouts are the jnp code of maxjax.graph.quantization (``arrays.py``:
// NibbleArray, UnpackedArray; ``blocks.py``: the block formats, after llama.cpp's
// ``ggml/src/ggml-quants.c``); these loops produce the same bytes (tests/test_host_layouts.py
// compares them bit for bit) without an XLA program to compile, reading the blocks straight out of
// a memory-mapped file. Block formats (little-endian, as GGUF stores them):
//   Q4_0: d f16, qs u8[16]        (18 bytes; value j < 16 in qs[j]'s low nibble, j + 16 in its high)
//   Q4_1: d f16, m f16, qs u8[16] (20 bytes)
//   Q8_0: d f16, qs i8[32]        (34 bytes)
// Each call converts output rows [first, first + count) of one layer; row r is read from source
// row ``row_index[r]`` (or r where row_index is null), ``row_bytes`` apart. Callers split a layer's
// rows over threads. Return value: 0, or 1 for an unknown kind, 2 for an odd row range (nibbles).

#include <immintrin.h>

#include <cstdint>
#include <cstring>

namespace {

enum Kind : int32_t { kQ4_0 = 0, kQ4_1 = 1, kQ8_0 = 2 };

inline uint16_t load_u16(const uint8_t* p) {
  uint16_t v;
  std::memcpy(&v, p, 2);  // x86-64 is little-endian, as GGUF is
  return v;
}

inline float half_to_float(uint16_t h) { return _cvtsh_ss(h); }  // exact (F16C)

inline const uint8_t* source_row(const uint8_t* src, int64_t row_bytes, const int64_t* row_index, int64_t r) {
  return src + (row_index ? row_index[r] : r) * row_bytes;
}

}  // namespace

extern "C" {

// NibbleArray: pairs uint8 [rows / 2, blocks * 32] (row 2i in the low nibble, 2i + 1 in the high;
// a block's values 0..15 in bytes 0..15, 16..31 in bytes 16..31), scale and offset float16 bits
// [rows, blocks] (the file's d and m; offset unused for Q4_0).
int maxjax_nibbles_from_blocks(const uint8_t* src, int64_t row_bytes, const int64_t* row_index, int64_t first,
                               int64_t count, int64_t blocks, int32_t kind, uint8_t* pairs, uint16_t* scale,
                               uint16_t* offset) {
  if (kind != kQ4_0 && kind != kQ4_1) return 1;
  if ((first | count) & 1) return 2;
  const int64_t bsize = kind == kQ4_0 ? 18 : 20, qs_at = kind == kQ4_0 ? 2 : 4, cols = blocks * 32;
  const __m128i low4 = _mm_set1_epi8(0x0F), high4 = _mm_set1_epi8(static_cast<char>(0xF0));
  for (int64_t r = first; r < first + count; r += 2) {
    const uint8_t* a = source_row(src, row_bytes, row_index, r);
    const uint8_t* b = source_row(src, row_bytes, row_index, r + 1);
    uint8_t* out = pairs + (r / 2) * cols;
    uint16_t* sa = scale + r * blocks;
    uint16_t* sb = sa + blocks;
    for (int64_t j = 0; j < blocks; ++j) {
      const uint8_t* ba = a + j * bsize;
      const uint8_t* bb = b + j * bsize;
      const __m128i qa = _mm_loadu_si128(reinterpret_cast<const __m128i*>(ba + qs_at));
      const __m128i qb = _mm_loadu_si128(reinterpret_cast<const __m128i*>(bb + qs_at));
      // values 0..15: a's low nibbles | b's low nibbles << 4 (masked first, so the 16-bit shift
      // moves no bits across bytes); values 16..31: a's high nibbles >> 4 | b's high nibbles
      const __m128i lo = _mm_or_si128(_mm_and_si128(qa, low4), _mm_slli_epi16(_mm_and_si128(qb, low4), 4));
      const __m128i hi = _mm_or_si128(_mm_and_si128(_mm_srli_epi16(qa, 4), low4), _mm_and_si128(qb, high4));
      _mm_storeu_si128(reinterpret_cast<__m128i*>(out + j * 32), lo);
      _mm_storeu_si128(reinterpret_cast<__m128i*>(out + j * 32 + 16), hi);
      sa[j] = load_u16(ba);
      sb[j] = load_u16(bb);
    }
    if (kind == kQ4_1) {
      uint16_t* oa = offset + r * blocks;
      uint16_t* ob = oa + blocks;
      for (int64_t j = 0; j < blocks; ++j) {
        oa[j] = load_u16(a + j * bsize + 2);
        ob[j] = load_u16(b + j * bsize + 2);
      }
    }
  }
  return 0;
}

// UnpackedArray: values [rows, blocks * 32] one byte each (int8 q - 8 for Q4_0, uint8 q for Q4_1,
// int8 q for Q8_0), scale and offset float32 [rows, blocks] (d and m widened; offset Q4_1 only).
int maxjax_unpacked_from_blocks(const uint8_t* src, int64_t row_bytes, const int64_t* row_index, int64_t first,
                                int64_t count, int64_t blocks, int32_t kind, uint8_t* values, float* scale,
                                float* offset) {
  if (kind != kQ4_0 && kind != kQ4_1 && kind != kQ8_0) return 1;
  const int64_t bsize = kind == kQ4_0 ? 18 : kind == kQ4_1 ? 20 : 34, cols = blocks * 32;
  const __m128i low4 = _mm_set1_epi8(0x0F), eight = _mm_set1_epi8(8);
  for (int64_t r = first; r < first + count; ++r) {
    const uint8_t* row = source_row(src, row_bytes, row_index, r);
    uint8_t* out = values + r * cols;
    float* s = scale + r * blocks;
    for (int64_t j = 0; j < blocks; ++j) {
      const uint8_t* blk = row + j * bsize;
      s[j] = half_to_float(load_u16(blk));
      if (kind == kQ8_0) {
        std::memcpy(out + j * 32, blk + 2, 32);
        continue;
      }
      const __m128i q = _mm_loadu_si128(reinterpret_cast<const __m128i*>(blk + (kind == kQ4_0 ? 2 : 4)));
      __m128i lo = _mm_and_si128(q, low4), hi = _mm_and_si128(_mm_srli_epi16(q, 4), low4);
      if (kind == kQ4_0) {
        lo = _mm_sub_epi8(lo, eight);
        hi = _mm_sub_epi8(hi, eight);
      } else {
        offset[r * blocks + j] = half_to_float(load_u16(blk + 2));
      }
      _mm_storeu_si128(reinterpret_cast<__m128i*>(out + j * 32), lo);
      _mm_storeu_si128(reinterpret_cast<__m128i*>(out + j * 32 + 16), hi);
    }
  }
  return 0;
}

}  // extern "C"
