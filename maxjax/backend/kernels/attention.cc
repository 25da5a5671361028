// maxjax's CPU kernels: causal grouped-query attention of whole sequences over their own keys and
// values, forward and backward, float32 (part of the kernels' library, see
// maxjax/backend/kernels/__init__.py and attention.py).
//
// XLA:CPU runs this attention (batch 4, 128 positions, 9 query heads over 3 KV heads, head_dim 64:
// SmolLM2's LoRA step) as 36 small batched GEMMs with a softmax and transposes between them, at
// about 60 GFLOP/s, and its backward pass's transposed-operand products outside its matmul
// library. Here one task runs a (batch row, KV head) pair: the keys and values of that head are
// read once into transposed tiles, every query head of the group and every query position uses
// them (four query rows at a time, so each vector loaded serves four), and the softmax never
// leaves the row. Keys after a query's position are skipped (past the end of its last 16-key
// vector) or given probability 0. The AVX2 build is the same code: GCC's vector extensions lower
// a 16-float vector to one AVX-512 register or two AVX2 ones.
//
// Forward (q [B, S, H, D], k and v [B, S, KV, D]; query head h reads KV head h / (H / KV)):
//   s_ij = scale * q_i . k_j (j <= i), lse_i = log sum_j exp(s_ij), o_i = sum_j exp(s_ij - lse_i) v_j.
// Backward, from o, lse and do (Dao et al., 2022, FlashAttention, Algorithm 4 without tiling):
//   p_ij = exp(s_ij - lse_i), d_i = do_i . o_i, ds_ij = p_ij (do_i . v_j - d_i),
//   dq_i = scale sum_j ds_ij k_j, dk_j = scale sum_i ds_ij q_i, dv_j = sum_i p_ij do_i
//   (dk and dv summed over the group's query heads).
#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>
#include <cstdint>
#include <vector>

#include "parallel.h"
#include "xla/ffi/api/ffi.h"

namespace ffi = xla::ffi;
using maxjax_kernels::parallel_for;

namespace {

// 16 floats: one AVX-512 register, two AVX2 ones (GCC's vector extension lowers to either).
typedef float vf __attribute__((vector_size(64)));
typedef int32_t vi __attribute__((vector_size(64)));
constexpr int64_t kLanes = 16;

inline vf load(const float* p) {
  vf v;
  std::memcpy(&v, p, sizeof v);
  return v;
}
inline void store(float* p, vf v) { std::memcpy(p, &v, sizeof v); }
inline vf splat(float a) { return vf{} + a; }
inline float hsum(vf v) {
  float s = 0.0f;
  for (int l = 0; l < kLanes; ++l) s += v[l];
  return s;
}

// exp(x) of 16 arguments: Cephes' expf (range reduction by ln 2, degree-6 polynomial; about 1
// ulp); arguments below -87 give about exp(-87) instead of 0, above 88 exp(88) (lanes past a
// query's last key, overwritten with 0, can hold anything: the clamp keeps the integer
// conversion and shift below defined).
inline vf vexp(vf x) {
  x = x < -87.0f ? splat(-87.0f) : x;
  x = x > 88.0f ? splat(88.0f) : x;
  const vf y = x * 1.44269504088896341f;
  const vi k = __builtin_convertvector(y + (y < 0.0f ? splat(-0.5f) : splat(0.5f)), vi);  // round to nearest
  const vf kf = __builtin_convertvector(k, vf);
  const vf r = x - kf * 0.693359375f + kf * 2.12194440e-4f;
  vf p = splat(1.9875691500e-4f);
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  p = p * r * r + r + 1.0f;
  const vi bits = (k + 127) << 23;
  vf two_k;
  std::memcpy(&two_k, &bits, sizeof two_k);
  return p * two_k;
}

struct Dims {
  int64_t b, s, h, kv, d;
  int64_t sp;  // s rounded up to whole vectors: the stride of transposed tiles
};

ffi::Error check(const char* what, const ffi::Buffer<ffi::F32>& q, const ffi::Buffer<ffi::F32>& k,
                 const ffi::Buffer<ffi::F32>& v, Dims& dims) {
  const auto qd = q.dimensions(), kd = k.dimensions(), vd = v.dimensions();
  if (qd.size() != 4 || kd.size() != 4 || vd.size() != 4)
    return ffi::Error::InvalidArgument(std::string(what) + ": q, k and v must be [batch, seq, heads, head_dim]");
  dims = {qd[0], qd[1], qd[2], kd[2], qd[3], (qd[1] + kLanes - 1) / kLanes * kLanes};
  for (int i : {0, 1, 3})
    if (kd[i] != qd[i] || vd[i] != qd[i]) return ffi::Error::InvalidArgument(std::string(what) + ": q, k and v disagree in shape");
  if (vd[2] != dims.kv || dims.kv == 0 || dims.h % dims.kv)
    return ffi::Error::InvalidArgument(std::string(what) + ": query heads must be a multiple of KV heads");
  if (dims.d % kLanes || dims.d > 256) return ffi::Error::InvalidArgument(std::string(what) + ": head_dim must be 16, 32, ..., 256");
  return ffi::Error::Success();
}

// The [d, sp] transpose of KV head `head` of x [b, s, kv, d] in batch row `row` (zero past s).
void transposed(const float* x, const Dims& n, int64_t row, int64_t head, float* out) {
  std::fill(out, out + n.d * n.sp, 0.0f);
  for (int64_t j = 0; j < n.s; ++j) {
    const float* xj = x + ((row * n.s + j) * n.kv + head) * n.d;
    for (int64_t c = 0; c < n.d; ++c) out[c * n.sp + j] = xj[c];
  }
}

// Query rows run kRows at a time, so that each key (or value) vector loaded serves all of them.
constexpr int kRows = 4;

// s_r[j] = scale * a_r . x_j for r < kRows and j < count (rounded up to whole vectors), from
// xt [d, sp].
inline void scores(const float* const* a, const float* xt, const Dims& n, int64_t count, float scale, float* const* s) {
  const int64_t blocks = (count + kLanes - 1) / kLanes;
  for (int64_t jb = 0; jb < blocks; ++jb) {
    vf acc[kRows] = {};
    const float* col = xt + jb * kLanes;
    for (int64_t c = 0; c < n.d; ++c) {
      const vf x = load(col + c * n.sp);
      for (int r = 0; r < kRows; ++r) acc[r] += a[r][c] * x;
    }
    for (int r = 0; r < kRows; ++r) store(s[r] + jb * kLanes, acc[r] * scale);
  }
}

// p[j] = exp(p[j] - sub) for j <= i, 0 for i < j < sp.
inline void probabilities(float* p, int64_t i, float sub, int64_t sp) {
  const int64_t blocks = i / kLanes + 1;
  for (int64_t jb = 0; jb < blocks; ++jb) {
    vf e = vexp(load(p + jb * kLanes) - sub);
    if (jb == blocks - 1)
      for (int64_t l = i % kLanes + 1; l < kLanes; ++l) e[l] = 0.0f;
    store(p + jb * kLanes, e);
  }
  std::fill(p + blocks * kLanes, p + sp, 0.0f);
}

// The rows i0 .. i0 + kRows - 1 of a block, clamped to the last (a short last block repeats its
// last row; its results are written once).
inline int64_t row_of(int64_t i0, int r, int64_t s) { return std::min(i0 + r, s - 1); }

ffi::Error Forward(ffi::ThreadPool pool, ffi::Buffer<ffi::F32> q, ffi::Buffer<ffi::F32> k, ffi::Buffer<ffi::F32> v,
                   float scale, ffi::ResultBuffer<ffi::F32> o, ffi::ResultBuffer<ffi::F32> lse) {
  Dims n;
  if (auto e = check("causal attention", q, k, v, n); e.failure()) return e;
  const int64_t g = n.h / n.kv, vd = n.d / kLanes;
  const float *qp = q.typed_data(), *kp = k.typed_data(), *vp = v.typed_data();
  float *op = o->typed_data(), *lp = lse->typed_data();
  parallel_for(pool, n.b * n.kv, n.b * n.h * n.s * n.s * n.d, [&](int64_t t0, int64_t t1) {
    std::vector<float> kt(n.d * n.sp), sm(kRows * n.sp);
    vf acc[kRows][16];
    for (int64_t t = t0; t < t1; ++t) {
      const int64_t row = t / n.kv, head = t % n.kv;
      transposed(kp, n, row, head, kt.data());
      for (int64_t qh = head * g; qh < (head + 1) * g; ++qh)
        for (int64_t i0 = 0; i0 < n.s; i0 += kRows) {
          const float* qi[kRows];
          float* si[kRows];
          float total[kRows], m[kRows];
          for (int r = 0; r < kRows; ++r) {
            qi[r] = qp + ((row * n.s + row_of(i0, r, n.s)) * n.h + qh) * n.d;
            si[r] = sm.data() + r * n.sp;
          }
          const int64_t last = row_of(i0, kRows - 1, n.s);
          scores(qi, kt.data(), n, last + 1, scale, si);
          for (int r = 0; r < kRows; ++r) {
            const int64_t i = row_of(i0, r, n.s);
            m[r] = si[r][0];
            for (int64_t j = 1; j <= i; ++j) m[r] = std::max(m[r], si[r][j]);
            probabilities(si[r], i, m[r], n.sp);
            vf sum{};
            for (int64_t jb = 0; jb <= i / kLanes; ++jb) sum += load(si[r] + jb * kLanes);
            total[r] = hsum(sum);
            for (int64_t c = 0; c < vd; ++c) acc[r][c] = vf{};
          }
          for (int64_t j = 0; j <= last; ++j) {
            const float* vj = vp + ((row * n.s + j) * n.kv + head) * n.d;
            for (int64_t c = 0; c < vd; ++c) {
              const vf x = load(vj + c * kLanes);
              for (int r = 0; r < kRows; ++r) acc[r][c] += si[r][j] * x;
            }
          }
          for (int r = 0; r < kRows && i0 + r < n.s; ++r) {
            const int64_t i = i0 + r;
            float* oi = op + ((row * n.s + i) * n.h + qh) * n.d;
            for (int64_t c = 0; c < vd; ++c) store(oi + c * kLanes, acc[r][c] / total[r]);
            lp[(row * n.h + qh) * n.s + i] = m[r] + std::log(total[r]);
          }
        }
    }
  });
  return ffi::Error::Success();
}

ffi::Error Backward(ffi::ThreadPool pool, ffi::Buffer<ffi::F32> q, ffi::Buffer<ffi::F32> k, ffi::Buffer<ffi::F32> v,
                    ffi::Buffer<ffi::F32> o, ffi::Buffer<ffi::F32> lse, ffi::Buffer<ffi::F32> dout, float scale,
                    ffi::ResultBuffer<ffi::F32> dq, ffi::ResultBuffer<ffi::F32> dk, ffi::ResultBuffer<ffi::F32> dv) {
  Dims n;
  if (auto e = check("causal attention backward", q, k, v, n); e.failure()) return e;
  const int64_t g = n.h / n.kv, vd = n.d / kLanes;
  const float *qp = q.typed_data(), *kp = k.typed_data(), *vp = v.typed_data(), *opp = o.typed_data();
  const float *lp = lse.typed_data(), *dop = dout.typed_data();
  float *dqp = dq->typed_data(), *dkp = dk->typed_data(), *dvp = dv->typed_data();
  parallel_for(pool, n.b * n.kv, 2 * n.b * n.h * n.s * n.s * n.d, [&](int64_t t0, int64_t t1) {
    // per query head: its probabilities P and score cotangents dS [s, sp] (rows i, keys j <= i, 0 past i)
    std::vector<float> kt(n.d * n.sp), vt(n.d * n.sp), pm(n.s * n.sp), dsm(n.s * n.sp), dks(n.s * n.d), dvs(n.s * n.d);
    vf acc[kRows][16];
    for (int64_t t = t0; t < t1; ++t) {
      const int64_t row = t / n.kv, head = t % n.kv;
      transposed(kp, n, row, head, kt.data());
      transposed(vp, n, row, head, vt.data());
      std::fill(dks.begin(), dks.end(), 0.0f);  // dk, dv of this KV head [s, d], summed over the group
      std::fill(dvs.begin(), dvs.end(), 0.0f);
      for (int64_t qh = head * g; qh < (head + 1) * g; ++qh) {
        for (int64_t i0 = 0; i0 < n.s; i0 += kRows) {  // P and dS, kRows rows at a time; dq_i = sum_j ds_ij k_j
          const float *qi[kRows], *doi[kRows];
          float *pi[kRows], *dsi[kRows];
          const int64_t last = row_of(i0, kRows - 1, n.s);
          for (int r = 0; r < kRows; ++r) {
            const int64_t at = ((row * n.s + row_of(i0, r, n.s)) * n.h + qh) * n.d;
            qi[r] = qp + at;
            doi[r] = dop + at;
            pi[r] = pm.data() + row_of(i0, r, n.s) * n.sp;
            dsi[r] = dsm.data() + row_of(i0, r, n.s) * n.sp;
          }
          scores(qi, kt.data(), n, last + 1, scale, pi);
          scores(doi, vt.data(), n, last + 1, 1.0f, dsi);  // do_i . v_j
          for (int r = 0; r < kRows; ++r) {
            for (int64_t c = 0; c < vd; ++c) acc[r][c] = vf{};
            if (i0 + r >= n.s) continue;  // a short last block's repeated row: its P and dS rows are done
            const int64_t i = i0 + r;
            probabilities(pi[r], i, lp[(row * n.h + qh) * n.s + i], n.sp);
            vf dot{};
            for (int64_t c = 0; c < vd; ++c) dot += load(doi[r] + c * kLanes) * load(opp + (doi[r] - dop) + c * kLanes);
            const float di = hsum(dot);
            for (int64_t jb = 0; jb < n.sp / kLanes; ++jb) {
              float* d = dsi[r] + jb * kLanes;
              store(d, load(pi[r] + jb * kLanes) * (load(d) - di) * scale);
            }
          }
          for (int64_t j = 0; j <= last; ++j) {
            const float* kj = kp + ((row * n.s + j) * n.kv + head) * n.d;
            for (int64_t c = 0; c < vd; ++c) {
              const vf x = load(kj + c * kLanes);
              for (int r = 0; r < kRows; ++r) acc[r][c] += dsi[r][j] * x;
            }
          }
          for (int r = 0; r < kRows && i0 + r < n.s; ++r)
            for (int64_t c = 0; c < vd; ++c) store(dqp + (qi[r] - qp) + c * kLanes, acc[r][c]);
        }
        for (int64_t j0 = 0; j0 < n.s; j0 += 2) {  // dk_j = sum_i ds_ij q_i, dv_j = sum_i p_ij do_i (i >= j), two keys at a time
          const int64_t j1 = std::min(j0 + 1, n.s - 1);
          for (int64_t c = 0; c < vd; ++c) acc[0][c] = acc[1][c] = acc[2][c] = acc[3][c] = vf{};
          for (int64_t i = j0; i < n.s; ++i) {
            const int64_t at = ((row * n.s + i) * n.h + qh) * n.d;
            const float* ds_i = dsm.data() + i * n.sp;
            const float* p_i = pm.data() + i * n.sp;
            const float a0 = ds_i[j0], b0 = p_i[j0], a1 = ds_i[j1], b1 = p_i[j1];
            for (int64_t c = 0; c < vd; ++c) {
              const vf x = load(qp + at + c * kLanes), y = load(dop + at + c * kLanes);
              acc[0][c] += a0 * x;
              acc[1][c] += b0 * y;
              acc[2][c] += a1 * x;
              acc[3][c] += b1 * y;
            }
          }
          for (int64_t jj = j0; jj <= j1 && jj < j0 + 2; ++jj) {
            const int r = int(jj - j0) * 2;
            float *dkj = dks.data() + jj * n.d, *dvj = dvs.data() + jj * n.d;
            for (int64_t c = 0; c < vd; ++c) {
              store(dkj + c * kLanes, load(dkj + c * kLanes) + acc[r][c]);
              store(dvj + c * kLanes, load(dvj + c * kLanes) + acc[r + 1][c]);
            }
          }
        }
      }
      for (int64_t j = 0; j < n.s; ++j) {
        const int64_t at = ((row * n.s + j) * n.kv + head) * n.d;
        std::memcpy(dkp + at, dks.data() + j * n.d, n.d * sizeof(float));
        std::memcpy(dvp + at, dvs.data() + j * n.d, n.d * sizeof(float));
      }
    }
  });
  return ffi::Error::Success();
}

}  // namespace

XLA_FFI_DEFINE_HANDLER_SYMBOL(maxjax_causal_attention, Forward,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::ThreadPool>()
                                  .Arg<ffi::Buffer<ffi::F32>>()  // q [b, s, h, d]
                                  .Arg<ffi::Buffer<ffi::F32>>()  // k [b, s, kv, d]
                                  .Arg<ffi::Buffer<ffi::F32>>()  // v [b, s, kv, d]
                                  .Attr<float>("scale")
                                  .Ret<ffi::Buffer<ffi::F32>>()  // o [b, s, h, d]
                                  .Ret<ffi::Buffer<ffi::F32>>()  // lse [b, h, s]
);

XLA_FFI_DEFINE_HANDLER_SYMBOL(maxjax_causal_attention_backward, Backward,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::ThreadPool>()
                                  .Arg<ffi::Buffer<ffi::F32>>()  // q [b, s, h, d]
                                  .Arg<ffi::Buffer<ffi::F32>>()  // k [b, s, kv, d]
                                  .Arg<ffi::Buffer<ffi::F32>>()  // v [b, s, kv, d]
                                  .Arg<ffi::Buffer<ffi::F32>>()  // o [b, s, h, d]
                                  .Arg<ffi::Buffer<ffi::F32>>()  // lse [b, h, s]
                                  .Arg<ffi::Buffer<ffi::F32>>()  // do [b, s, h, d]
                                  .Attr<float>("scale")
                                  .Ret<ffi::Buffer<ffi::F32>>()  // dq [b, s, h, d]
                                  .Ret<ffi::Buffer<ffi::F32>>()  // dk [b, s, kv, d]
                                  .Ret<ffi::Buffer<ffi::F32>>()  // dv [b, s, kv, d]
);
