// float32 products on the CPU's AMX tiles, in four bfloat16 passes: an XLA FFI handler
// (https://docs.jax.dev/en/latest/ffi.html) that maxjax registers with jax.ffi where the CPU has
// AMX-BF16 (see maxjax/backend/kernels/amx.py) and the backend policy asks for it.
//
// out[m, n] = sum_k x[m, k] * w[n, k], for x float32 [M, K] and w float32 [N, K] (a Linear's
// stored weight). x is split exactly into three bfloat16 parts (hi = bf16(x), mid = bf16(x - hi),
// lo = x - hi - mid: 24 bits in three 8-bit pieces) and w into two (w_hi + w_lo, 16 of its 24
// bits), and the product is
//   x_hi w_hi + x_hi w_lo + x_mid w_hi + x_lo w_hi
// accumulated in float32 by the tiles' TDPBF16PS. Its error relative to |x| |w| is about 2^-16
// (w's lost bits and the dropped terms x_mid w_lo, x_lo w_lo), against float32's 2^-24: JAX's
// lax.Precision.HIGH class ("bfloat16_3x" on TPUs; Henry, Tang and Heinecke, "Leveraging the
// bfloat16 Artificial Intelligence Datatype For Higher-Precision Computations", ARITH 2019). The
// fourth pass makes x's split exact, so the result is a fixed linear map of x's value: a change of
// one ulp in x (a row computed inside a padded batch) moves the result by about that much, where
// the three-pass form (x = hi + bf16(x - hi)) moved it by up to 2^-17 (all-MiniLM-L6-v2's padding
// invariance, 1e-6, failed by one value in 384 with three passes). On a 2-core Sapphire Rapids
// Xeon the passes run at about 1 TFLOP/s per core, against XLA:CPU's float32 GEMM at about 100.
//
// Each call first writes, in scratch buffers kept between calls (Scratch):
//   a: x as bfloat16 [Mp, 3K], row m = the three parts of x[m] (hi, mid, lo: exact), rows M..Mp
//      (Mp: M rounded up to 32) zero;
//   b: w as bfloat16 tiles [N / 16][2K / 2][16][2]: for each block of 16 output columns, the pairs
//      (k, k + 1) of each column side by side (the tiles' VNNI layout), hi(w) for k < K, then
//      lo(w). Not for a weight laid out so once (maxjax_amx_lay_out, when a program's state is
//      prepared, or a stack of them, a layer read in place: maxjax_bf16x3_matmul_laid_out);
// then multiplies them in blocks of 32 rows x 32 columns (four accumulator tiles), a panel of
// columns at a time so that the panel's b stays in the core's L2 across the row blocks. Rows are
// independent: a row's result does not depend on the other rows or on how the work is split.
//
// Needs K and N multiples of 32 (the caller checks). Built with -march=native: the handler exists
// only where the compiler targets AMX-BF16 (maxjax_amx_built() says whether it did).
#include <immintrin.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <cstring>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "parallel.h"
#include "xla/ffi/api/ffi.h"

namespace ffi = xla::ffi;

#if defined(__AMX_TILE__) && defined(__AMX_BF16__) && defined(__AVX512BF16__) && defined(__AVX512BW__)
#define MAXJAX_AMX 1
#endif

extern "C" int maxjax_amx_built() {
#ifdef MAXJAX_AMX
  return 1;
#else
  return 0;
#endif
}

// Asks Linux for the AMX tile state (arch_prctl ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA): once per
// process, before any thread touches a tile. 0 on success, else errno.
extern "C" int maxjax_amx_enable() {
  constexpr int kReqXcompPerm = 0x1023, kXtiledata = 18;
  return syscall(SYS_arch_prctl, kReqXcompPerm, kXtiledata) == 0 ? 0 : errno;
}

#ifdef MAXJAX_AMX
namespace {

using maxjax_kernels::parallel_for;

// x is split in kXParts bfloat16 parts (3: exact), w in 2.
constexpr int kXParts = 3;

struct TileConfig {
  uint8_t palette_id, start_row, reserved[14];
  uint16_t colsb[16];
  uint8_t rows[16];
};

// Tiles 0-3: accumulators (16 rows x 16 float32); 4-5: x (16 rows x 32 bfloat16); 6-7: w (16 pairs
// of rows x 16 columns x 2 bfloat16). All 16 rows of 64 bytes.
inline void configure_tiles() {
  TileConfig c;
  std::memset(&c, 0, sizeof c);
  c.palette_id = 1;
  for (int i = 0; i < 8; ++i) c.rows[i] = 16, c.colsb[i] = 64;
  _tile_loadconfig(&c);
}

// r[i] = row i of a 16 x 16 matrix of 32-bit units -> its transpose, in place.
inline void transpose16(__m512i r[16]) {
  __m512i a[16], b[16];
  for (int i = 0; i < 8; ++i) {
    a[2 * i] = _mm512_unpacklo_epi32(r[2 * i], r[2 * i + 1]);
    a[2 * i + 1] = _mm512_unpackhi_epi32(r[2 * i], r[2 * i + 1]);
  }
  for (int i = 0; i < 4; ++i) {
    b[4 * i] = _mm512_unpacklo_epi64(a[4 * i], a[4 * i + 2]);
    b[4 * i + 1] = _mm512_unpackhi_epi64(a[4 * i], a[4 * i + 2]);
    b[4 * i + 2] = _mm512_unpacklo_epi64(a[4 * i + 1], a[4 * i + 3]);
    b[4 * i + 3] = _mm512_unpackhi_epi64(a[4 * i + 1], a[4 * i + 3]);
  }
  // b[4i + j], 128-bit lane L: rows 4i..4i+3 of column 4L + j
  for (int j = 0; j < 4; ++j) {
    __m512i d0 = _mm512_shuffle_i32x4(b[j], b[4 + j], _MM_SHUFFLE(2, 0, 2, 0));
    __m512i d1 = _mm512_shuffle_i32x4(b[j], b[4 + j], _MM_SHUFFLE(3, 1, 3, 1));
    __m512i e0 = _mm512_shuffle_i32x4(b[8 + j], b[12 + j], _MM_SHUFFLE(2, 0, 2, 0));
    __m512i e1 = _mm512_shuffle_i32x4(b[8 + j], b[12 + j], _MM_SHUFFLE(3, 1, 3, 1));
    r[j] = _mm512_shuffle_i32x4(d0, e0, _MM_SHUFFLE(2, 0, 2, 0));
    r[8 + j] = _mm512_shuffle_i32x4(d0, e0, _MM_SHUFFLE(3, 1, 3, 1));
    r[4 + j] = _mm512_shuffle_i32x4(d1, e1, _MM_SHUFFLE(2, 0, 2, 0));
    r[12 + j] = _mm512_shuffle_i32x4(d1, e1, _MM_SHUFFLE(3, 1, 3, 1));
  }
}

// 32 float32 at p -> their first `parts` bfloat16 parts, in order: part i = bf16 (round to
// nearest even) of what parts 0..i-1 leave (three parts: exact).
inline void split32(const float* p, int parts, __m512i* out) {
  __m512 x0 = _mm512_loadu_ps(p), x1 = _mm512_loadu_ps(p + 16);
  for (int i = 0; i < parts; ++i) {
    const __m512i h = (__m512i)_mm512_cvtne2ps_pbh(x1, x0);  // the lower 16 from x0
    out[i] = h;
    x0 = _mm512_sub_ps(x0, _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm512_castsi512_si256(h)), 16)));
    x1 = _mm512_sub_ps(x1, _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm512_extracti64x4_epi64(h, 1)), 16)));
  }
}

// Rows [r0, r1) of a (r1 <= Mp): x's rows split in three, the padding rows zero.
void split_rows(const float* x, int64_t m, int64_t k, uint16_t* a, int64_t r0, int64_t r1) {
  for (int64_t r = r0; r < r1; ++r) {
    uint16_t* hi = a + r * kXParts * k;
    if (r >= m) {
      std::memset(hi, 0, kXParts * k * sizeof(uint16_t));
      continue;
    }
    for (int64_t c = 0; c < k; c += 32) {
      __m512i parts[kXParts];
      split32(x + r * k + c, kXParts, parts);
      for (int part = 0; part < kXParts; ++part) _mm512_storeu_si512(hi + part * k + c, parts[part]);
    }
  }
}

// Column blocks [b0, b1) of b: w's rows 16 at a time, split and laid out as the tiles read them.
void pack_columns(const float* w, int64_t k, uint16_t* b, int64_t b0, int64_t b1) {
  const int64_t pairs = k;  // per block: k / 2 pairs of hi, then k / 2 of lo
  for (int64_t blk = b0; blk < b1; ++blk) {
    uint32_t* dst = reinterpret_cast<uint32_t*>(b + blk * pairs * 32);
    for (int64_t c = 0; c < k; c += 32) {
      __m512i hi[16], lo[16], parts[2];
      for (int n = 0; n < 16; ++n) split32(w + (blk * 16 + n) * k + c, 2, parts), hi[n] = parts[0], lo[n] = parts[1];
      transpose16(hi);
      transpose16(lo);
      for (int u = 0; u < 16; ++u) {  // unit u: the pair (c + 2u, c + 2u + 1)
        _mm512_storeu_si512(dst + (c / 2 + u) * 16, hi[u]);
        _mm512_storeu_si512(dst + (k / 2 + c / 2 + u) * 16, lo[u]);
      }
    }
  }
}

// Column blocks [b0, b1) of b for a bfloat16 w [n, k]: w's rows 16 at a time, laid out as the tiles
// read them (the pairs (k, k + 1) of each column side by side: the hi half of pack_columns).
void pack_columns_bf16(const uint16_t* w, int64_t k, uint16_t* b, int64_t b0, int64_t b1) {
  for (int64_t blk = b0; blk < b1; ++blk) {
    uint32_t* dst = reinterpret_cast<uint32_t*>(b + blk * (k / 2) * 32);
    for (int64_t c = 0; c < k; c += 32) {
      __m512i r[16];
      for (int j = 0; j < 16; ++j) r[j] = _mm512_loadu_si512(w + (blk * 16 + j) * k + c);
      transpose16(r);
      for (int u = 0; u < 16; ++u) _mm512_storeu_si512(dst + (c / 2 + u) * 16, r[u]);
    }
  }
}

// How a and b are laid out for block32, and which products it forms: a row of a holds `a_row`
// bfloat16 values, a 16-column block of b `b_blk`; `count` 4: x in three parts side by side along
// a row of a (each `x_part` values), w in two along a block of b (`w_part` pairs), the passes
// x_hi w_hi, x_hi w_lo, x_mid w_hi, x_lo w_hi; `count` 1: x and w whole, one pass.
struct Passes {
  int64_t a_row, b_blk;
  int count;
  int64_t x_part, w_part;
};

// float32 x (three parts) times w (two).
inline Passes bf16x3_passes(int64_t k) { return {kXParts * k, k * 32, 4, k, k / 2}; }
// bfloat16 x times bfloat16 w: one pass.
inline Passes bf16_passes(int64_t k) { return {k, (k / 2) * 32, 1, 0, 0}; }

// out rows [m0, m0 + 32) (fewer in the last block: `rows`), columns [n0, n0 + 32), plus the products
// over columns [c0, c0 + len) of x and w (len a multiple of 32); `first`: out starts at zero.
inline void block32(const uint16_t* a, const uint16_t* b, const Passes& ps, float* out, int64_t n, int64_t m0, int64_t n0, int64_t rows,
                    int64_t c0, int64_t len, bool first) {
  alignas(64) float tmp[32 * 32];
  float* o = out + m0 * n + n0;
  const int64_t ldo = rows == 32 ? n * 4 : 128;
  if (rows < 32) {  // the last block goes through tmp: its missing rows are not out's
    std::memset(tmp, 0, sizeof tmp);
    if (!first)
      for (int64_t r = 0; r < rows; ++r) std::memcpy(tmp + r * 32, o + r * n, 32 * sizeof(float));
    o = tmp;
  }
  const int64_t step = ldo / 4;
  if (first && rows == 32) {
    _tile_zero(0);
    _tile_zero(1);
    _tile_zero(2);
    _tile_zero(3);
  } else {
    _tile_loadd(0, o, ldo);
    _tile_loadd(1, o + 16, ldo);
    _tile_loadd(2, o + 16 * step, ldo);
    _tile_loadd(3, o + 16 * step + 16, ldo);
  }
  const int64_t lda = ps.a_row * sizeof(uint16_t);
  const uint16_t* a0 = a + m0 * ps.a_row;
  const uint16_t* a1 = a0 + 16 * ps.a_row;
  const uint16_t* b0 = b + (n0 / 16) * ps.b_blk;
  const uint16_t* b1 = b0 + ps.b_blk;
  auto load_x = [&](int64_t at) {  // x's rows m0.., values at.. of a row of a
    _tile_loadd(4, a0 + at, lda);
    _tile_loadd(5, a1 + at, lda);
  };
  auto load_w = [&](int64_t pair) {  // w's columns n0.., pairs pair.. of their blocks of b
    _tile_loadd(6, b0 + pair * 32, 64);
    _tile_loadd(7, b1 + pair * 32, 64);
  };
  auto products = [] {
    _tile_dpbf16ps(0, 4, 6);
    _tile_dpbf16ps(1, 4, 7);
    _tile_dpbf16ps(2, 5, 6);
    _tile_dpbf16ps(3, 5, 7);
  };
  // The passes run per 32 columns, each reusing the tiles of the pass before that it shares
  // (four passes: 12 tile loads for 16 products, rather than 16).
  for (int64_t c = c0; c < c0 + len; c += 32) {
    load_x(c), load_w(c / 2), products();  // x_hi w_hi (with one pass: x w)
    if (ps.count == 4) {
      load_w(ps.w_part + c / 2), products();                 // x_hi w_lo
      load_x(ps.x_part + c), load_w(c / 2), products();      // x_mid w_hi
      load_x(2 * ps.x_part + c), products();                 // x_lo w_hi
    }
  }
  _tile_stored(0, o, ldo);
  _tile_stored(1, o + 16, ldo);
  _tile_stored(2, o + 16 * step, ldo);
  _tile_stored(3, o + 16 * step + 16, ldo);
  if (rows < 32)
    for (int64_t r = 0; r < rows; ++r) std::memcpy(out + (m0 + r) * n + n0, tmp + r * 32, 32 * sizeof(float));
}

// The products go kKChunk columns of x and w at a time (out accumulates between chunks), and
// within a chunk a panel of at most kPanelColumns output columns at a time, the panel's share of
// b within about kPanelBytes, so that a 32-row block of a and the panel stay in the core's L2
// (2 MiB on Sapphire Rapids) while the row blocks pass. Chosen among 8 settings, interleaved, on
// a 2-core Sapphire Rapids Xeon at all-MiniLM-L6-v2's shapes ([1536, 384] x [1536 or 384, 384],
// [1536, 1536] x [384, 1536]).
constexpr int64_t kKChunk = 1536;
constexpr int64_t kPanelBytes = int64_t(1280) << 10;
constexpr int64_t kPanelColumns = 384;

// Scratch buffers, kept for the next call: a fresh buffer of a few MiB costs more in first-touch
// page faults than the products it serves (XLA:CPU allocates its temporaries per run). Calls that
// run at once (XLA runs independent products together) take different buffers.
class Scratch {
 public:
  explicit Scratch(int64_t values) {
    if (values == 0) return;  // none needed
    std::lock_guard<std::mutex> lock(mutex_);
    size_t best = free_.size();  // the smallest free buffer that is large enough
    for (size_t i = 0; i < free_.size(); ++i)
      if (free_[i].second >= values && (best == free_.size() || free_[i].second < free_[best].second)) best = i;
    if (best < free_.size()) {
      buf_ = std::move(free_[best]);
      free_.erase(free_.begin() + best);
      return;
    }
    buf_ = {Ptr(static_cast<uint16_t*>(::operator new[](values * sizeof(uint16_t), std::align_val_t(64)))), values};
  }
  ~Scratch() {
    if (!buf_.first) return;
    std::lock_guard<std::mutex> lock(mutex_);
    free_.push_back(std::move(buf_));
    if (free_.size() > kKept) {  // more than calls ever run at once: drop the smallest
      size_t small = 0;
      for (size_t i = 1; i < free_.size(); ++i)
        if (free_[i].second < free_[small].second) small = i;
      free_.erase(free_.begin() + small);
    }
  }
  uint16_t* data() const { return buf_.first.get(); }

 private:
  struct Free {
    void operator()(uint16_t* p) const { ::operator delete[](p, std::align_val_t(64)); }
  };
  using Ptr = std::unique_ptr<uint16_t[], Free>;
  std::pair<Ptr, int64_t> buf_;
  static constexpr size_t kKept = 16;
  static inline std::mutex mutex_;
  static inline std::vector<std::pair<Ptr, int64_t>> free_;
};

// out = a @ b for a and b laid out as `ps` says (step 2 of run and run_bf16): per chunk of
// columns of x and w, tasks are (panel, 32-row block) pairs, panel-major, so that consecutive
// tasks reuse a panel of b.
void multiply(ffi::ThreadPool& pool, const uint16_t* a, const uint16_t* b, const Passes& ps, int64_t m, int64_t k, int64_t n, float* o) {
  const int64_t row_blocks = (m + 31) / 32;
  for (int64_t c0 = 0; c0 < k; c0 += kKChunk) {
    const int64_t len = std::min(kKChunk, k - c0);
    const int64_t widest = std::min(kPanelColumns, std::max<int64_t>(32, kPanelBytes / (2 * len * 2) / 32 * 32));
    const int64_t panels = (n + widest - 1) / widest;
    const int64_t panel = (n / 32 + panels - 1) / panels * 32;  // the columns split evenly
    parallel_for(pool, panels * row_blocks, m * n * len * ps.count / 4, [&](int64_t t0, int64_t t1) {
      configure_tiles();
      for (int64_t t = t0; t < t1; ++t) {
        const int64_t p = t / row_blocks, rb = t % row_blocks;
        const int64_t n_end = std::min(n, (p + 1) * panel), rows = std::min<int64_t>(32, m - rb * 32);
        for (int64_t n0 = p * panel; n0 < n_end; n0 += 32) block32(a, b, ps, o, n, rb * 32, n0, rows, c0, len, c0 == 0);
      }
      _tile_release();
    });
  }
}

// out = x @ w.T for x float32 [m, k] and w laid out in b (pack_columns), or, with b null, w
// float32 [n, k] laid out here first.
void run(ffi::ThreadPool& pool, const float* xp, int64_t m, int64_t k, int64_t n, const float* wp, const uint16_t* b, float* o) {
  const int64_t mp = (m + 31) / 32 * 32;
  Scratch a_scratch(mp * kXParts * k), b_scratch(b ? 0 : n * 2 * k);
  uint16_t* a = a_scratch.data();
  uint16_t* b_laid = b_scratch.data();
  // 1. split x (16 rows a task) and lay out w (one 16-column block a task)
  const int64_t row_tasks = mp / 16, col_tasks = b ? 0 : n / 16;
  parallel_for(pool, row_tasks + col_tasks, m * k + (b ? 0 : n * k), [&](int64_t t0, int64_t t1) {
    for (int64_t t = t0; t < t1; ++t) {
      if (t < row_tasks)
        split_rows(xp, m, k, a, t * 16, t * 16 + 16);
      else
        pack_columns(wp, k, b_laid, t - row_tasks, t - row_tasks + 1);
    }
  });
  // 2. the products
  multiply(pool, a, b ? b : b_laid, bf16x3_passes(k), m, k, n, o);
}

// out = x @ w.T for x bfloat16 [m, k] and bfloat16 w laid out in b (pack_columns_bf16): one
// pass; x's rows are read in place, but for a last block of fewer than 32 rows (copied, padded).
void run_bf16(ffi::ThreadPool& pool, const uint16_t* xp, int64_t m, int64_t k, int64_t n, const uint16_t* b, float* o) {
  const int64_t full = m / 32 * 32;
  if (full) multiply(pool, xp, b, bf16_passes(k), full, k, n, o);
  if (full < m) {
    Scratch tail(32 * k);
    std::memset(tail.data(), 0, 32 * k * sizeof(uint16_t));
    std::memcpy(tail.data(), xp + full * k, (m - full) * k * sizeof(uint16_t));
    multiply(pool, tail.data(), b, bf16_passes(k), m - full, k, n, o + full * n);
  }
}

ffi::Error check(int64_t m, int64_t k, int64_t n, int64_t out_values) {
  if (k % 32 || n % 32) return ffi::Error::InvalidArgument("bf16x3 matmul: K and N must be multiples of 32");
  if (out_values != m * n) return ffi::Error::InvalidArgument("bf16x3 matmul: the output's shape");
  return ffi::Error::Success();
}

ffi::Error Bf16x3Matmul(ffi::ThreadPool pool, ffi::Buffer<ffi::F32> x, ffi::Buffer<ffi::F32> w, ffi::ResultBuffer<ffi::F32> out) {
  auto xd = x.dimensions(), wd = w.dimensions();
  if (xd.size() != 2 || wd.size() != 2 || xd[1] != wd[1]) return ffi::Error::InvalidArgument("bf16x3 matmul: x [M, K] and w [N, K] disagree");
  const int64_t m = xd[0], k = xd[1], n = wd[0];
  if (auto e = check(m, k, n, out->element_count()); e.failure()) return e;
  if (m) run(pool, x.typed_data(), m, k, n, w.typed_data(), nullptr, out->typed_data());
  return ffi::Error::Success();
}

// The weight a laid-out operand holds: tiles [N / 16, rows, 32] (rows: K for a float32 weight's two
// parts, K / 2 for a bfloat16 one), or layer `layer` of a stack of them [L, N / 16, rows, 32], read
// in place (a scan step; slicing the stack would copy the layer). Sets n and b (its first tile).
ffi::Error laid_out_weight(ffi::Buffer<ffi::U16>& tiles, ffi::Buffer<ffi::S32>& layer, int64_t rows, const std::string& what, int64_t& n,
                           const uint16_t*& b) {
  auto td = tiles.dimensions();
  const bool stack = td.size() == 4;
  if ((td.size() != 3 && !stack) || layer.element_count() != 1)
    return ffi::Error::InvalidArgument(what + ": tiles [(L,) N / 16, rows, 32] and layer [] expected");
  const int64_t s = stack ? 1 : 0, l = stack ? *layer.typed_data() : 0;
  if (td[s + 1] != rows || td[s + 2] != 32) return ffi::Error::InvalidArgument(what + ": x [M, K] and the tiles disagree");
  if (l < 0 || (stack && l >= td[0])) return ffi::Error::InvalidArgument(what + ": layer index outside the stack");
  n = td[s] * 16;
  b = tiles.typed_data() + l * td[s] * rows * 32;
  return ffi::Error::Success();
}

// float32 x [M, K] times a float32 w laid out (maxjax_amx_lay_out: tiles uint16 [N / 16, K, 32]),
// or a layer of a stack of them (the layer index is ignored for one weight): float32 out [M, N].
ffi::Error Bf16x3MatmulLaidOut(ffi::ThreadPool pool, ffi::Buffer<ffi::F32> x, ffi::Buffer<ffi::U16> tiles, ffi::Buffer<ffi::S32> layer,
                               ffi::ResultBuffer<ffi::F32> out) {
  auto xd = x.dimensions();
  if (xd.size() != 2) return ffi::Error::InvalidArgument("bf16x3 matmul: x must be [M, K]");
  const int64_t m = xd[0], k = xd[1];
  int64_t n;
  const uint16_t* b;
  if (auto e = laid_out_weight(tiles, layer, k, "bf16x3 matmul", n, b); e.failure()) return e;
  if (auto e = check(m, k, n, out->element_count()); e.failure()) return e;
  if (m) run(pool, x.typed_data(), m, k, n, nullptr, b, out->typed_data());
  return ffi::Error::Success();
}

// bfloat16 x [M, K] times a bfloat16 w laid out (maxjax_amx_lay_out_bf16: tiles uint16
// [N / 16, K / 2, 32]), or a layer of a stack of them: one pass, float32 out [M, N].
ffi::Error Bf16MatmulLaidOut(ffi::ThreadPool pool, ffi::Buffer<ffi::BF16> x, ffi::Buffer<ffi::U16> tiles, ffi::Buffer<ffi::S32> layer,
                             ffi::ResultBuffer<ffi::F32> out) {
  auto xd = x.dimensions();
  if (xd.size() != 2) return ffi::Error::InvalidArgument("bf16 matmul: x must be [M, K]");
  const int64_t m = xd[0], k = xd[1];
  int64_t n;
  const uint16_t* b;
  if (auto e = laid_out_weight(tiles, layer, k / 2, "bf16 matmul", n, b); e.failure()) return e;
  if (auto e = check(m, k, n, out->element_count()); e.failure()) return e;
  if (m) run_bf16(pool, x.typed_data(), m, k, n, b, out->typed_data());
  return ffi::Error::Success();
}

}  // namespace

XLA_FFI_DEFINE_HANDLER_SYMBOL(maxjax_bf16_matmul_laid_out, Bf16MatmulLaidOut,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::ThreadPool>()
                                  .Arg<ffi::Buffer<ffi::BF16>>()  // x [M, K]
                                  .Arg<ffi::Buffer<ffi::U16>>()   // tiles [(L,) N / 16, K / 2, 32]
                                  .Arg<ffi::Buffer<ffi::S32>>()   // layer [] (ignored for one weight)
                                  .Ret<ffi::Buffer<ffi::F32>>()   // out [M, N]
);

XLA_FFI_DEFINE_HANDLER_SYMBOL(maxjax_bf16x3_matmul, Bf16x3Matmul,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::ThreadPool>()
                                  .Arg<ffi::Buffer<ffi::F32>>()  // x [M, K]
                                  .Arg<ffi::Buffer<ffi::F32>>()  // w [N, K]
                                  .Ret<ffi::Buffer<ffi::F32>>()  // out [M, N]
);

XLA_FFI_DEFINE_HANDLER_SYMBOL(maxjax_bf16x3_matmul_laid_out, Bf16x3MatmulLaidOut,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::ThreadPool>()
                                  .Arg<ffi::Buffer<ffi::F32>>()  // x [M, K]
                                  .Arg<ffi::Buffer<ffi::U16>>()  // tiles [(L,) N / 16, K, 32]
                                  .Arg<ffi::Buffer<ffi::S32>>()  // layer [] (ignored for one weight)
                                  .Ret<ffi::Buffer<ffi::F32>>()  // out [M, N]
);

// w float32 [n, k] (n and k multiples of 32) -> its tiles, uint16 [n / 16, k, 32] (see
// pack_columns), on the host: once per weight, when a program's state is prepared. 0, or -1 for
// shapes it cannot take.
extern "C" int maxjax_amx_lay_out(const float* w, int64_t n, int64_t k, uint16_t* tiles) {
  if (n % 32 || k % 32) return -1;
  pack_columns(w, k, tiles, 0, n / 16);
  return 0;
}

// w bfloat16 [n, k] (n and k multiples of 32) -> its tiles, uint16 [n / 16, k / 2, 32]
// (pack_columns_bf16): 0, or -1 for shapes it cannot take.
extern "C" int maxjax_amx_lay_out_bf16(const uint16_t* w, int64_t n, int64_t k, uint16_t* tiles) {
  if (n % 32 || k % 32) return -1;
  pack_columns_bf16(w, k, tiles, 0, n / 16);
  return 0;
}
#endif  // MAXJAX_AMX
