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
//   Q4_K: d f16, dmin f16, 12 bytes of 6-bit scales and mins, qs u8[128] (144 bytes, 256 values in
//         8 groups of 32: group 2c + n is the low (n = 0) or high (n = 1) nibbles of qs[32c..32c+31];
//         scale d * sc[g], offset -(dmin * m[g]), sc and m unpacked as llama.cpp's get_scale_min_k4)
//   Q6_K: ql u8[128], qh u8[64], scales i8[16], d f16 (210 bytes, 256 values in 16 groups of 16;
//         value 32g + t of group-of-32 g = 4h + r: low 4 bits from ql[64h + 32(r % 2) + t] (nibble
//         r / 2), high 2 bits from qh[32h + t] >> 2r, minus 32; scale d * scales[i] per 16 values)
// Each call converts output rows [first, first + count) of one layer; row r is read from source
// row ``row_index[r]`` (or r where row_index is null), ``row_bytes`` apart. Callers split a layer's
// rows over threads. Return value: 0, or 1 for an unknown kind, 2 for an odd row range (nibbles;
// not whole tiles of 16 rows for tiles).

#include <immintrin.h>

#include <cstdint>
#include <cstring>

namespace {

enum Kind : int32_t { kQ4_0 = 0, kQ4_1 = 1, kQ8_0 = 2, kQ4_K = 3, kQ6_K = 4 };

inline uint16_t load_u16(const uint8_t* p) {
  uint16_t v;
  std::memcpy(&v, p, 2);  // x86-64 is little-endian, as GGUF is
  return v;
}

inline float half_to_float(uint16_t h) { return _cvtsh_ss(h); }  // exact (F16C)

// The 256 values of a K-quant block (the bytes the unpacked layout stores: uint8 q for Q4_K,
// int8 q - 32 for Q6_K) and its groups' float32 scales (and offsets): the definitions of
// maxjax/graph/quantization/blocks.py (_unpack_q4_k, _unpack_q6_k), float operation for operation.
inline void decode_q4_k(const uint8_t* blk, uint8_t* q, float* scale, float* offset) {
  const float d = half_to_float(load_u16(blk)), dmin = half_to_float(load_u16(blk + 2));
  const uint8_t* s = blk + 4;
  for (int j = 0; j < 4; ++j) {
    const uint8_t sc_lo = s[j] & 63, mn_lo = s[j + 4] & 63;
    const uint8_t sc_hi = (s[j + 8] & 0x0F) | ((s[j] >> 2) & 0x30), mn_hi = (s[j + 8] >> 4) | ((s[j + 4] >> 2) & 0x30);
    scale[j] = d * static_cast<float>(sc_lo);
    scale[j + 4] = d * static_cast<float>(sc_hi);
    offset[j] = -(dmin * static_cast<float>(mn_lo));
    offset[j + 4] = -(dmin * static_cast<float>(mn_hi));
  }
  const uint8_t* qs = blk + 16;
  for (int c = 0; c < 4; ++c)
    for (int t = 0; t < 32; ++t) {
      q[64 * c + t] = qs[32 * c + t] & 15;
      q[64 * c + 32 + t] = qs[32 * c + t] >> 4;
    }
}

inline void decode_q6_k(const uint8_t* blk, uint8_t* q, float* scale) {
  const uint8_t *ql = blk, *qh = blk + 128;
  const int8_t* sc = reinterpret_cast<const int8_t*>(blk + 192);
  const float d = half_to_float(load_u16(blk + 208));
  for (int i = 0; i < 16; ++i) scale[i] = d * static_cast<float>(sc[i]);
  for (int g = 0; g < 8; ++g) {
    const int h = g / 4, r = g % 4;
    for (int t = 0; t < 32; ++t) {
      const int lo = (ql[64 * h + 32 * (r % 2) + t] >> (4 * (r / 2))) & 15, hi = (qh[32 * h + t] >> (2 * r)) & 3;
      q[32 * g + t] = static_cast<uint8_t>(static_cast<int8_t>((lo | hi << 4) - 32));
    }
  }
}

inline const uint8_t* source_row(const uint8_t* src, int64_t row_bytes, const int64_t* row_index, int64_t r) {
  return src + (row_index ? row_index[r] : r) * row_bytes;
}

}  // namespace

extern "C" {

// NibbleArray: pairs uint8 [rows / 2, cols] (row 2i in the low nibble, 2i + 1 in the high), scale
// and offset [rows, cols / 32]: Q4_0/Q4_1 float16 bits (the file's d and m; offset unused for
// Q4_0), Q4_K float32 (d * sc, -(dmin * m)).
int maxjax_nibbles_from_blocks(const uint8_t* src, int64_t row_bytes, const int64_t* row_index, int64_t first,
                               int64_t count, int64_t blocks, int32_t kind, uint8_t* pairs, void* scale_out,
                               void* offset_out) {
  if (kind != kQ4_0 && kind != kQ4_1 && kind != kQ4_K) return 1;
  if ((first | count) & 1) return 2;
  if (kind == kQ4_K) {  // float32 scale and offset [rows, blocks * 8]
    float* scale = static_cast<float*>(scale_out);
    float* offset = static_cast<float*>(offset_out);
    const int64_t cols = blocks * 256;
    uint8_t qa[256], qb[256];
    for (int64_t r = first; r < first + count; r += 2) {
      const uint8_t* a = source_row(src, row_bytes, row_index, r);
      const uint8_t* b = source_row(src, row_bytes, row_index, r + 1);
      uint8_t* out = pairs + (r / 2) * cols;
      for (int64_t j = 0; j < blocks; ++j) {
        decode_q4_k(a + j * 144, qa, scale + r * blocks * 8 + 8 * j, offset + r * blocks * 8 + 8 * j);
        decode_q4_k(b + j * 144, qb, scale + (r + 1) * blocks * 8 + 8 * j, offset + (r + 1) * blocks * 8 + 8 * j);
        for (int t = 0; t < 256; ++t) out[256 * j + t] = qa[t] | (qb[t] << 4);
      }
    }
    return 0;
  }
  uint16_t* scale = static_cast<uint16_t*>(scale_out);
  uint16_t* offset = static_cast<uint16_t*>(offset_out);
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

// UnpackedArray: values [rows, cols] one byte each (int8 q - 8 for Q4_0, uint8 q for Q4_1 and
// Q4_K, int8 q for Q8_0, int8 q - 32 for Q6_K), scale and offset float32 [rows, cols / group]
// (d and m widened, or the K-quants' group scales; offset for Q4_1 and Q4_K only).
int maxjax_unpacked_from_blocks(const uint8_t* src, int64_t row_bytes, const int64_t* row_index, int64_t first,
                                int64_t count, int64_t blocks, int32_t kind, uint8_t* values, float* scale,
                                float* offset) {
  if (kind != kQ4_0 && kind != kQ4_1 && kind != kQ8_0 && kind != kQ4_K && kind != kQ6_K) return 1;
  if (kind == kQ4_K || kind == kQ6_K) {  // 256 values a block: 8 groups of 32 (Q4_K) or 16 of 16 (Q6_K)
    const int64_t bsize = kind == kQ4_K ? 144 : 210, groups = kind == kQ4_K ? 8 : 16, cols = blocks * 256;
    for (int64_t r = first; r < first + count; ++r) {
      const uint8_t* row = source_row(src, row_bytes, row_index, r);
      for (int64_t j = 0; j < blocks; ++j) {
        uint8_t* q = values + r * cols + 256 * j;
        float* s = scale + (r * blocks + j) * groups;
        if (kind == kQ4_K)
          decode_q4_k(row + j * bsize, q, s, offset + (r * blocks + j) * groups);
        else
          decode_q6_k(row + j * bsize, q, s);
      }
    }
    return 0;
  }
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

// TiledArray (Q4_0, Q4_1): 16 rows at a time. Tile t (rows 16t..16t+15), block j: 256 bytes of values
// at values + (t * blocks + j) * 256, four chunks of 64 bytes; byte 4r + i of chunk c holds row
// 16t + r's value 8c + i of the block in its low nibble and 8c + 4 + i in its high (i < 4); the
// file's float16 d of row 16t + r's block j at scale + (t * blocks + j) * 16 + r (Q4_1's m at the
// same place of offset). So one 64-byte
// load gives, per 32-bit lane (a row), four consecutive values: vpdpbusd multiplies all sixteen
// rows by the same four activations. Rows [first, first + count): whole tiles (2 otherwise).
int maxjax_tiles_from_blocks(const uint8_t* src, int64_t row_bytes, const int64_t* row_index, int64_t first, int64_t count,
                             int64_t blocks, int32_t kind, uint8_t* values, void* scale_out, void* offset_out) {
  if (kind != kQ4_0 && kind != kQ4_1) return 1;
  if ((first | count) & 15) return 2;
  const int64_t bsize = kind == kQ4_0 ? 18 : 20, qs_at = kind == kQ4_0 ? 2 : 4;
  uint16_t* scale = static_cast<uint16_t*>(scale_out);
  uint16_t* offset = static_cast<uint16_t*>(offset_out);
  for (int64_t t = first / 16; t < (first + count) / 16; ++t) {
    const uint8_t* rows[16];
    for (int r = 0; r < 16; ++r) rows[r] = source_row(src, row_bytes, row_index, 16 * t + r);
    for (int64_t j = 0; j < blocks; ++j) {
      uint8_t* out = values + (t * blocks + j) * 256;
      uint16_t* d = scale + (t * blocks + j) * 16;
      for (int r = 0; r < 16; ++r) {
        const uint8_t* blk = rows[r] + j * bsize;
        d[r] = load_u16(blk);
        if (kind == kQ4_1) offset[(t * blocks + j) * 16 + r] = load_u16(blk + 2);
        // qs byte k holds value k (low nibble) and k + 16 (high): as four 32-bit words w0..w3 (bytes
        // 0-3, 4-7, 8-11, 12-15), chunk c's word for row r holds values 8c + i low and 8c + 4 + i high
        uint32_t w[4];
        std::memcpy(w, blk + qs_at, 16);
        constexpr uint32_t kLow = 0x0F0F0F0Fu, kHigh = 0xF0F0F0F0u;
        const uint32_t chunk[4] = {(w[0] & kLow) | ((w[1] & kLow) << 4), (w[2] & kLow) | ((w[3] & kLow) << 4),
                                   ((w[0] >> 4) & kLow) | (w[1] & kHigh), ((w[2] >> 4) & kLow) | (w[3] & kHigh)};
        for (int c = 0; c < 4; ++c) std::memcpy(out + 64 * c + 4 * r, &chunk[c], 4);
      }
    }
  }
  return 0;
}

}  // extern "C"
