// The fused GEMV + all-reduce after the GEMV (ops::GemvAllReduce's `fused` method), as
// __host__ __device__ templates: the CUDA kernel (src/kernels/gemv_ar_kernels.cu) and the host
// backend's teams (src/ops/gemv_ar/host_fused.cpp) run the same exchange, sum and epilogue.
//
// Parts: y's n columns are cut into parts of `pw` columns (pw a multiple of 8; the last part
// may be narrower); CTA (team) k of `ctas` owns parts k, k + ctas, k + 2 ctas, ... on every
// rank, so the CTA that pushes a part's lines on one rank is the CTA that reads them on every
// other (same index, same epoch). pw and ctas must be the same on every rank.
//
// One call of CTA k, epoch e = its completed calls + 1 (a uint64 per CTA, never reset):
//  1. for each part: the local GEMV of the part's columns for all m tokens (the caller's code),
//     then push_part: every value rounded to the dtype, 4 per 16-byte LL line (8 data bytes,
//     the epoch e twice: collective_algos.hpp's format) into receive block
//     [parity e & 1][source = this rank] of every rank, this one included;
//  2. finish: for each of its parts' lines, wait for every source's line (deadline
//     c.timeout_ns, the error naming the peer and the op), sum the sources in rank order in
//     fp32 (every rank sums the same rounded values in the same order: bitwise the same y),
//     write y -- or, with the epilogue, residual_out = round(round(sum) + residual), then the
//     norm (below) and y = round(residual_out * inv_rms[t] * gamma);
//  3. the epoch is advanced.
//
// Invariant of the receive lines (why two parities suffice): CTA k of rank r writes call e's
// lines of its parts into rank p's block [e & 1][r] and next writes there in call e + 2. Before
// that, its call e + 1 waited for p's call-(e + 1) lines of the same parts, which p's CTA k
// pushed only after its call e had summed (read) r's call-e lines. A line whose flags are not
// the reader's epoch is stale (e - 2 or older) and is waited on, never read.
//
// The epilogue's norm needs every column of a token, which other CTAs own: each CTA writes its
// per-token sum of squares of residual_out over its parts to sums[q][t][k], arrives at a
// grid-wide barrier (a counter in the heap, +1 per CTA per epilogue call, never reset), waits
// until it reads >= en * ctas, then sums sums[q][t][0 .. ctas) in a fixed order (bitwise the
// same on every rank, unlike fp32 atomics). en, the epilogue call's number, is read from the
// counter itself before the CTA arrives: all CTAs of call en - 1 arrived before this one passed
// that barrier, and none of call en + 1 can arrive before this one does, so the counter lies in
// [(en - 1) ctas, en ctas). The sums are double-buffered by q = en & 1: CTA k writes sums[q]
// again in call en + 2, after barrier en + 1, which every CTA reaches only after it finished
// reading sums[q] in call en. Nothing is zeroed. The barrier needs every CTA resident at once
// (the GPU grid is persistent; host teams are threads).
//
// Norm state layout at a.norm_off (kernels::gemv_norm_bytes(m_max, ctas)): the counter (8
// bytes, 16 reserved), then sums [2][m_max][ctas] floats.
#pragma once
#include <cmath>

#include "weft/device/api.hpp"
#include "weft/device/dtype.hpp"
#include "weft/kernels/collective_algos.hpp"
#include "weft/kernels/gemv_ar_kernels.hpp"

namespace weft::gemv {

using kernels::GemvArgs;

// Lines each thread polls per batch in finish (all issued before any is waited on).
inline constexpr int kLineUnroll = 4;
// The norm's per-CTA sums each thread loads per batch (in flight together), and at most this
// many threads per token (each round of the tree over them is a group-wide sync).
inline constexpr int kNormUnroll = 32;
inline constexpr int kNormGroup = 64;

WEFT_HD int parts_of(int n, int pw) { return (n + pw - 1) / pw; }
// Parts CTA k owns: k, k + ctas, ...
WEFT_HD int parts_of_cta(int n, int pw, int ctas, int k) {
  const int np = parts_of(n, pw);
  return np > k ? (np - k + ctas - 1) / ctas : 0;
}
WEFT_HD int max_parts_per_cta(int n, int pw, int ctas) { return parts_of_cta(n, pw, ctas, 0); }

// Floats of the per-CTA scratch finish() needs (shared memory on the GPU): each line's sum of
// squares [parts per CTA * m_max * pw / 4], per-part sums of squares [m_max][parts per CTA],
// group sums [max(threads, m_max)], inv_rms [m_max].
WEFT_HD int scratch_floats(int m_max, int parts_per_cta, int pw, int threads) {
  return parts_per_cta * m_max * (pw / 4) + m_max * parts_per_cta + (threads > m_max ? threads : m_max) + m_max;
}

// Heap offset of the line holding columns j .. j+3 of token t from `src`, parity par.
WEFT_HD uint64_t line_off(const GemvArgs& a, int world, uint64_t par, int src, int t, int j) {
  const uint64_t per_src = static_cast<uint64_t>(a.m_max) * static_cast<uint64_t>(a.n) / 4;
  return a.lines_off +
         16ull * ((par * static_cast<uint64_t>(world) + static_cast<uint64_t>(src)) * per_src +
                  static_cast<uint64_t>(t) * static_cast<uint64_t>(a.n / 4) + static_cast<uint64_t>(j / 4));
}
// LL128 (a.ll128): heap offset of line `line` of part `part` (width pw) from `src`.
WEFT_HD uint64_t ll128_line_off(const GemvArgs& a, int world, uint64_t par, int src, int pw, int part, uint64_t line) {
  const uint64_t lpp = kernels::gemv_ll128_lines_per_part(a.m_max, pw);
  const uint64_t parts = static_cast<uint64_t>(parts_of(a.n, pw));
  return a.lines_off + 128ull * (((par * static_cast<uint64_t>(world) + static_cast<uint64_t>(src)) * parts +
                                  static_cast<uint64_t>(part)) *
                                     lpp +
                                 line);
}
WEFT_HD uint64_t norm_sums_off(const GemvArgs& a, uint64_t par, int t, int k) {
  return a.norm_off + 16 +
         4ull * ((par * static_cast<uint64_t>(a.m_max) + static_cast<uint64_t>(t)) * static_cast<uint64_t>(a.ctas) +
                 static_cast<uint64_t>(k));
}

WEFT_HD uint64_t epoch_begin(const dev::DeviceCtx& c, const GemvArgs& a, int k) {
  return *c.local<uint64_t>(a.epoch_off + 8ull * static_cast<uint64_t>(k)) + 1;
}
#if defined(__CUDACC__)
#pragma nv_exec_check_disable
#endif
template <class Coop>
WEFT_HD void epoch_end(Coop g, const dev::DeviceCtx& c, const GemvArgs& a, int k, uint64_t e) {
  g.sync();  // every thread has read the epoch before the leader advances it
  if (g.rank() == 0) *c.local<uint64_t>(a.epoch_off + 8ull * static_cast<uint64_t>(k)) = e;
}

// Packs 4 values rounded to T into a line's 8 data bytes (element q at bits 16 q).
template <class T>
WEFT_HD uint64_t pack4(const float* v) {
  T r[4];
  for (int q = 0; q < 4; ++q) r[q] = dev::from_float<T>(v[q]);
  uint64_t d;
  __builtin_memcpy(&d, r, 8);
  return d;
}
template <class T>
WEFT_HD void unpack4(uint64_t d, float* v) {
  T r[4];
  __builtin_memcpy(r, &d, 8);
  for (int q = 0; q < 4; ++q) v[q] = dev::to_float(r[q]);
}

// Pushes this rank's partial of columns [j0, j1) (multiples of 4) of its part j0 / pw for tokens
// 0 .. m-1 into block [e & 1][rank] of every rank, this one first. value(t, j, v) gives the
// fp32 partial of columns j .. j+3 of token t in v[0..3]. LL lines, or with a.ll128 LL128
// lines of the part's words (those past j1 zero): on the GPU 8 lanes of a warp own a line (the
// group's size a multiple of 32, every lane calling), on the host a worker owns whole lines.
#if defined(__CUDACC__)
#pragma nv_exec_check_disable
#endif
template <class T, class Coop, class Value>
WEFT_HD void push_part(Coop g, const dev::DeviceCtx& c, const GemvArgs& a, uint64_t e, int pw, int j0, int j1,
                       const Value& value) {
  const uint64_t par = e & 1;
  if (a.ll128) {
    const int lpp = pw / 4, words = a.m * lpp, lines = (words + 14) / 15, part = j0 / pw;
    auto word = [&](int w) -> uint64_t {
      const int t = w / lpp, j = j0 + 4 * (w % lpp);
      if (w >= words || j >= j1) return 0;
      float v[4];
      value(t, j, v);
      return pack4<T>(v);
    };
#if defined(__CUDA_ARCH__)
    // Warp w owns lines 4w + lane / 8, stepping by 4 x warps; lane t = lane % 8 holds words
    // 15 L + 2t and 15 L + 2t + 1 (lane 7: word 15 L + 14 and the flag).
    const int lane = g.rank() & 31, t = lane & 7, warp = g.rank() >> 5, warps = g.size() >> 5;
    for (int l0 = 4 * warp; l0 < lines; l0 += 4 * warps) {
      const int line = l0 + (lane >> 3);
      if (line >= lines) continue;
      const int w0 = 15 * line + 2 * t;
      const uint64_t v0 = word(w0), v1 = t < 7 ? word(w0 + 1) : e;
      const uint64_t off = ll128_line_off(a, c.world, par, c.rank, pw, part, static_cast<uint64_t>(line));
      for (int dd = 0; dd < c.world; ++dd)
        coll::ll128_store(c.ptr<uint64_t>((c.rank + dd) % c.world, off) + 2 * t, v0, v1);
    }
#else
    for (int line = g.rank(); line < lines; line += g.size()) {
      const uint64_t off = ll128_line_off(a, c.world, par, c.rank, pw, part, static_cast<uint64_t>(line));
      for (int dd = 0; dd < c.world; ++dd) {
        uint64_t* dst = c.ptr<uint64_t>((c.rank + dd) % c.world, off);
        for (int q = 0; q < 15; ++q) __atomic_store_n(dst + q, word(15 * line + q), __ATOMIC_RELAXED);
        __atomic_store_n(dst + 15, e, __ATOMIC_RELEASE);
      }
    }
#endif
    return;
  }
  const int lpt = (j1 - j0) / 4;  // lines per token
  const int items = a.m * lpt;
  const uint32_t flag = static_cast<uint32_t>(e);
  for (int i = g.rank(); i < items; i += g.size()) {
    const int t = i / lpt, j = j0 + 4 * (i % lpt);
    float v[4];
    value(t, j, v);
    const uint64_t d = pack4<T>(v);
    const uint64_t off = line_off(a, c.world, par, c.rank, t, j);
    for (int dd = 0; dd < c.world; ++dd) coll::ll_store(c.ptr<uint64_t>((c.rank + dd) % c.world, off), d, flag);
  }
}

// Item i of CTA k's lines: its part's columns j .. j+3 of token t (false past the end).
WEFT_HD bool item_at(const GemvArgs& a, int pw, int k, int items, int i, int& t, int& j) {
  if (i >= items) return false;
  const int lpp = pw / 4, per_part = a.m * lpp;
  const int part = k + (i / per_part) * a.ctas;
  t = (i % per_part) / lpp;
  j = part * pw + 4 * (i % lpp);
  return j < a.n;
}

// Step 2 (after every part of CTA k was pushed): waits for, sums and writes CTA k's lines, then
// the epilogue when a.residual is set. `scratch`: scratch_floats(m_max, parts, pw, g.size()) floats
// shared by the group.
#if defined(__CUDACC__)
#pragma nv_exec_check_disable
#endif
template <class T, bool kPrint = true, class Coop>
WEFT_HD void finish(Coop g, const dev::DeviceCtx& c, const GemvArgs& a, int k, int pw, uint64_t e, float* scratch) {
  constexpr int U = kLineUnroll;
  const uint64_t par = e & 1;
  const uint32_t flag = static_cast<uint32_t>(e);
  const int P = parts_of_cta(a.n, pw, a.ctas, k);
  const int items = P * a.m * (pw / 4);
  const int me = g.rank(), step = g.size();
  const bool epi = a.residual != nullptr;
  T* y = static_cast<T*>(a.y);
  float* line_sq = scratch;  // [items]: each line's sum of squares of residual_out (epilogue)
  // Item i's sum over the sources (acc, fp32): y, or residual_out and its sum of squares.
  auto emit = [&](int i, const float* acc) {
    int t, j;
    if (!item_at(a, pw, k, items, i, t, j)) {
      if (epi && i < items) line_sq[i] = 0.f;  // a line past n (the last part's)
      return;
    }
    const uint64_t at = static_cast<uint64_t>(t) * static_cast<uint64_t>(a.n) + static_cast<uint64_t>(j);
    if (!epi) {
      *reinterpret_cast<uint64_t*>(y + at) = pack4<T>(acc);
      return;
    }
    float s[4], r[4];
    unpack4<T>(pack4<T>(acc), s);  // y rounded to the dtype, as the unfused sequence has it
    unpack4<T>(*reinterpret_cast<const uint64_t*>(static_cast<const T*>(a.residual) + at), r);
    for (int q = 0; q < 4; ++q) s[q] += r[q];
    const uint64_t ro = pack4<T>(s);
    *reinterpret_cast<uint64_t*>(static_cast<T*>(a.residual_out) + at) = ro;
    unpack4<T>(ro, s);  // the rounded values, as the norm reads them
    line_sq[i] = s[0] * s[0] + s[1] * s[1] + s[2] * s[2] + s[3] * s[3];
  };
  if (a.ll128) {
    // The CTA's parts' LL128 lines of this call's m tokens (item i = part index * per_part + word).
    const int lpp = pw / 4, per_part = a.m * lpp, lines = (per_part + 14) / 15, all = P * lines;
#if defined(__CUDA_ARCH__)
    const int lane = me & 31, t8 = lane & 7, warp = me >> 5, warps = step >> 5;
    for (int l0 = 4 * warp; l0 < all; l0 += 4 * warps) {  // uniform per warp: the votes see every lane
      const int gl = l0 + (lane >> 3), pi = gl / lines, line = gl % lines;
      const bool act = gl < all;
      const int w0 = 15 * line + 2 * t8;
      float acc0[4] = {0.f, 0.f, 0.f, 0.f}, acc1[4] = {0.f, 0.f, 0.f, 0.f};
      for (int p = 0; p < c.world; ++p) {  // rank order: every rank gets bitwise the same sums
        const uint64_t off =
            act ? ll128_line_off(a, c.world, par, p, pw, k + pi * a.ctas, static_cast<uint64_t>(line)) : 0;
        const uint64_t* src = c.local<const uint64_t>(off) + 2 * t8;
        uint64_t v0 = 0, v1 = 0, t_start = 0;
        for (uint32_t spins = 0;;) {
          if (act) coll::ll128_load(src, v0, v1);
          const bool here = !act || t8 != 7 || v1 == e;
          if (__all_sync(0xffffffffu, __shfl_sync(0xffffffffu, here, lane | 7))) break;
          if (spins == 0) t_start = dev::now_ns();
          dev::spin_pause(++spins);
          if ((spins & 63u) == 0u && t8 == 7 && !here && dev::now_ns() - t_start > c.timeout_ns)
            dev::fail_wait<kPrint>(c, dev::WaitKind::kSignal, p, off + 120, e, v1, dev::now_ns() - t_start, a.op_tag);
        }
        if (t8 == 7) v1 = 0;
        float f[4];
        unpack4<T>(v0, f);
        for (int q = 0; q < 4; ++q) acc0[q] += f[q];
        unpack4<T>(v1, f);
        for (int q = 0; q < 4; ++q) acc1[q] += f[q];
      }
      if (act && w0 < per_part) emit(pi * per_part + w0, acc0);
      if (act && t8 < 7 && w0 + 1 < per_part) emit(pi * per_part + w0 + 1, acc1);
    }
#else
    for (int gl = me; gl < all; gl += step) {
      const int pi = gl / lines, line = gl % lines;
      float acc[15][4] = {};
      for (int p = 0; p < c.world; ++p) {
        const uint64_t off = ll128_line_off(a, c.world, par, p, pw, k + pi * a.ctas, static_cast<uint64_t>(line));
        const uint64_t* src = c.local<const uint64_t>(off);
        const uint64_t t_start = dev::now_ns();
        for (uint32_t spins = 0; __atomic_load_n(src + 15, __ATOMIC_ACQUIRE) != e;) {
          dev::spin_pause(++spins);
          const uint64_t waited = dev::now_ns() - t_start;
          if ((spins & 63u) == 0u && waited > c.timeout_ns)
            dev::fail_wait<kPrint>(c, dev::WaitKind::kSignal, p, off + 120, e,
                                   __atomic_load_n(src + 15, __ATOMIC_RELAXED), waited, a.op_tag);
        }
        for (int q = 0; q < 15; ++q) {
          float f[4];
          unpack4<T>(__atomic_load_n(src + q, __ATOMIC_RELAXED), f);
          for (int qq = 0; qq < 4; ++qq) acc[q][qq] += f[qq];
        }
      }
      for (int q = 0; q < 15 && 15 * line + q < per_part; ++q) emit(pi * per_part + 15 * line + q, acc[q]);
    }
#endif
  } else {
    for (int i0 = me; i0 < items; i0 += U * step) {
      int t[U], j[U];
      bool live[U];
      float acc[U][4];
      for (int u = 0; u < U; ++u) {
        live[u] = item_at(a, pw, k, items, i0 + u * step, t[u], j[u]);
        for (int q = 0; q < 4; ++q) acc[u][q] = 0.f;
      }
      for (int p = 0; p < c.world; ++p) {  // rank order: every rank gets bitwise the same sums
        uint64_t v[U];
        bool ok[U];
        for (int u = 0; u < U; ++u)
          ok[u] =
              !live[u] || coll::ll_try(c.local<const uint64_t>(line_off(a, c.world, par, p, t[u], j[u])), flag, v[u]);
        for (int u = 0; u < U; ++u)
          if (!ok[u]) {
            const uint64_t off = line_off(a, c.world, par, p, t[u], j[u]);
            v[u] = coll::ll_wait<kPrint>(c, c.local<const uint64_t>(off), flag, p, off, a.op_tag);
          }
        for (int u = 0; u < U; ++u) {
          if (!live[u]) continue;
          float f[4];
          unpack4<T>(v[u], f);
          for (int q = 0; q < 4; ++q) acc[u][q] += f[q];
        }
      }
      for (int u = 0; u < U; ++u)
        if (i0 + u * step < items) emit(i0 + u * step, acc[u]);
    }
  }
  if (!epi) return;

  // ---- epilogue: per-token sums of squares, grid barrier, normalisation ----
  const int lpp = pw / 4, per_part = a.m * lpp;
  float* part_sq = scratch + P * a.m_max * lpp;                   // [m][P]
  float* group_sq = part_sq + a.m_max * P;                        // [m * G]
  float* inv_rms = group_sq + (step > a.m_max ? step : a.m_max);  // [m]
  const T* ro = static_cast<const T*>(a.residual_out);
  g.sync();                                   // this CTA's line sums are written
  for (int i = me; i < a.m * P; i += step) {  // a part's lines in order
    const int t = i / P, pi = i % P;
    const float* ls = line_sq + pi * per_part + t * lpp;
    float s = 0.f;
    for (int l = 0; l < lpp; ++l) s += ls[l];
    part_sq[i] = s;
  }
  uint64_t* counter = c.local<uint64_t>(a.norm_off);
  const uint64_t ctas = static_cast<uint64_t>(a.ctas);
  const uint64_t en = dev::load_acquire(counter) / ctas + 1;  // see the header comment
  const uint64_t q = en & 1;
  g.sync();
  for (int t = me; t < a.m; t += step) {
    float s = 0.f;
    for (int pi = 0; pi < P; ++pi) s += part_sq[t * P + pi];
    *c.local<float>(norm_sums_off(a, q, t, k)) = s;
  }
  g.sync();
  if (me == 0) {
    dev::add_release_gpu(counter, 1);  // cumulative: the group's sums (ordered by the sync) come first
    dev::wait_ge<kPrint>(c, a.norm_off, en * ctas, -1, dev::WaitKind::kBarrier, a.op_tag);
  }
  g.sync();
  // Token t's total over the CTAs: G threads (the largest power of two <= kNormGroup with m G
  // <= the group's size) each sum the CTAs G apart, then a pairwise tree over the G group sums;
  // the order depends only on (ctas, m, group size): the same on every rank.
  int G = 1;
  while (2 * G * a.m <= step && 2 * G <= kNormGroup) G *= 2;
  for (int i = me; i < a.m * G; i += step) {
    const int t = i / G, gi = i % G;
    float s = 0.f;
    // Batches of kNormUnroll loads in flight together; past the last CTA a batch adds exact
    // zeros (the sums are >= 0: s + 0 == s), so the order is that of a plain loop over kk.
    for (int kk = gi; kk < a.ctas; kk += kNormUnroll * G) {
      float v[kNormUnroll];
      for (int u = 0; u < kNormUnroll; ++u)
        v[u] = kk + u * G < a.ctas ? *c.local<const float>(norm_sums_off(a, q, t, kk + u * G)) : 0.f;
      for (int u = 0; u < kNormUnroll; ++u) s += v[u];
    }
    group_sq[i] = s;
  }
  g.sync();
  for (int half = G / 2; half >= 1; half /= 2) {
    for (int i = me; i < a.m * half; i += step) {
      const int t = i / half, gi = i % half;
      group_sq[t * G + gi] += group_sq[t * G + gi + half];
    }
    g.sync();
  }
  for (int t = me; t < a.m; t += step) {
    // 1 / sqrt (IEEE in CUDA without fast math, as on the host): GPU and host agree bitwise.
    inv_rms[t] = 1.0f / sqrtf(group_sq[t * G] / static_cast<float>(a.n) + a.eps);
  }
  g.sync();
  const T* gamma = static_cast<const T*>(a.gamma);
  for (int i = me; i < items; i += step) {
    int t, j;
    if (!item_at(a, pw, k, items, i, t, j)) continue;
    const uint64_t at = static_cast<uint64_t>(t) * static_cast<uint64_t>(a.n) + static_cast<uint64_t>(j);
    float r[4], gm[4];
    unpack4<T>(*reinterpret_cast<const uint64_t*>(ro + at), r);
    unpack4<T>(*reinterpret_cast<const uint64_t*>(gamma + j), gm);
    for (int qq = 0; qq < 4; ++qq) r[qq] = r[qq] * inv_rms[t] * gm[qq];
    *reinterpret_cast<uint64_t*>(y + at) = pack4<T>(r);
  }
}

}  // namespace weft::gemv
