// The C API (include/weft/c_api.h) on the host backend: forked ranks build their world through
// weft_world_create with the test's own allgather (files in the launcher's shared directory);
// every collective exact on integer data into heap and plain outputs, all_to_all_v, the heap,
// a GEMM op, the GEMV + AllReduce op and the embedding-bag lookups + all-to-all exact (forward and every kind
// of backward), and the status codes and messages of bad input and timeouts.
#include "weft/c_api.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include "rank_harness.hpp"
#include "weft/core/error.hpp"
#include "weft/device/dtype.hpp"

using namespace weft;
using namespace weft::testing;

namespace {

// The caller's exchange: files <dir>/capi.<round>.<rank>, written then renamed.
struct FileExchange {
  std::string dir;
  int rank = 0, size = 1;
  uint64_t round = 0;
  int timeout_ms = 5000;
  int refuse_round = -1;  // a round that reports a timeout naming rank size - 1
};

int file_allgather(void* user, const void* in, size_t bytes, void* out, int* timed_out, int* missing_rank, char* err,
                   size_t errlen) {
  auto* x = static_cast<FileExchange*>(user);
  const uint64_t round = x->round++;
  if (static_cast<int>(round) == x->refuse_round) {
    *timed_out = 1;
    *missing_rank = x->size - 1;
    std::snprintf(err, errlen, "the store did not hear from rank %d", x->size - 1);
    return 1;
  }
  auto path = [&](int r) { return fmt::format("{}/capi.{}.{}", x->dir, round, r); };
  {
    std::ofstream f(path(x->rank) + ".tmp", std::ios::binary);
    f.write(static_cast<const char*>(in), static_cast<std::streamsize>(bytes));
  }
  if (std::rename((path(x->rank) + ".tmp").c_str(), path(x->rank).c_str()) != 0) {
    std::snprintf(err, errlen, "rename failed");
    return 1;
  }
  const auto start = std::chrono::steady_clock::now();
  for (int r = 0; r < x->size; ++r) {
    while (::access(path(r).c_str(), F_OK) != 0) {
      if (std::chrono::steady_clock::now() - start > std::chrono::milliseconds(x->timeout_ms)) {
        *timed_out = 1;
        *missing_rank = r;
        std::snprintf(err, errlen, "round %llu: rank %d did not arrive", static_cast<unsigned long long>(round), r);
        return 1;
      }
      std::this_thread::sleep_for(std::chrono::microseconds(200));
    }
    std::ifstream f(path(r), std::ios::binary);
    f.read(static_cast<char*>(out) + bytes * r, static_cast<std::streamsize>(bytes));
    if (static_cast<size_t>(f.gcount()) != bytes) {
      std::snprintf(err, errlen, "rank %d sent %lld bytes, expected %zu", r, static_cast<long long>(f.gcount()),
                    bytes);
      return 1;
    }
  }
  return 0;
}

void ok(int status, const char* what) {
  WEFT_CHECK(status == WEFT_OK, fmt::format("{}: status {}: {}", what, status, weft_last_error()));
}

// Expects `status` with a message containing every piece.
void expect_err(int status, int want, std::initializer_list<std::string> pieces, const char* what) {
  WEFT_CHECK(status == want, fmt::format("{}: status {}, want {} ({})", what, status, want, weft_last_error()));
  const std::string msg = weft_last_error();
  for (const auto& p : pieces)
    WEFT_CHECK(msg.find(p) != std::string::npos, fmt::format("{}: message '{}' lacks '{}'", what, msg, p));
}

weft_world* make_world(FileExchange& x, int64_t timeout_ms = 5000) {
  x.dir = std::getenv("WEFT_BOOTSTRAP_DIR") ? std::getenv("WEFT_BOOTSTRAP_DIR") : "/tmp";
  x.rank = world_rank();
  x.size = std::stoi(std::getenv("WEFT_WORLD_SIZE"));
  x.timeout_ms = static_cast<int>(timeout_ms);
  weft_world_options o{};
  o.rank = x.rank;
  o.size = x.size;
  o.local_rank = x.rank;
  o.device = -1;
  o.backend = "host";
  o.allgather = &file_allgather;
  o.user = &x;
  o.heap_mib = 8;
  o.timeout_ms = timeout_ms;
  weft_world* w = nullptr;
  ok(weft_world_create(&o, &w), "weft_world_create");
  return w;
}

float val(int rank, uint64_t i) { return static_cast<float>(static_cast<int>((rank * 7 + i * 3) % 16) - 4); }

// A buffer of n floats: in the heap (symmetric) or plain memory.
struct Buf {
  weft_world* w;
  bool sym;
  std::vector<std::vector<float>> plain;
  std::vector<uint64_t> handles;
  float* operator()(size_t n) {
    if (!sym) {
      plain.emplace_back(std::max<size_t>(n, 1), -99.f);
      return plain.back().data();
    }
    uint64_t h = 0, off = 0;
    void* p = nullptr;
    ok(weft_alloc(w, 4 * std::max<size_t>(n, 1), &h, &off, &p), "weft_alloc");
    handles.push_back(h);
    return static_cast<float*>(p);
  }
};

void collectives_exact(bool symmetric, const char* method) {
  FileExchange x;
  weft_world* w = make_world(x);
  const int me = x.rank, world = x.size;
  weft_coll* c = nullptr;
  ok(weft_coll_create(w, &c), "weft_coll_create");
  Buf buf{w, symmetric, {}, {}};
  for (uint64_t n : {1ull, 13ull, 1000ull}) {
    float* in = buf(n * world);
    for (uint64_t i = 0; i < n * world; ++i) in[i] = val(me, i);
    float* out = buf(n);
    const bool base = method && std::strcmp(method, "baseline") == 0;
    ok(weft_all_reduce(c, in, out, n, WEFT_F32, base ? "baseline" : method ? "one-shot" : nullptr, nullptr),
       "all_reduce");
    for (uint64_t i = 0; i < n; ++i) {
      float want = 0;
      for (int r = 0; r < world; ++r) want += val(r, i);
      WEFT_CHECK(out[i] == want, fmt::format("all_reduce[{}] = {}, want {}", i, out[i], want));
    }
    float* g = buf(n * world);
    ok(weft_all_gather(c, in, g, n, WEFT_F32, method, nullptr), "all_gather");
    for (int r = 0; r < world; ++r)
      for (uint64_t i = 0; i < n; ++i)
        WEFT_CHECK(g[r * n + i] == val(r, i), fmt::format("all_gather[{}][{}] = {}", r, i, g[r * n + i]));
    float* rs = buf(n);
    ok(weft_reduce_scatter(c, in, rs, n, WEFT_F32, method, nullptr), "reduce_scatter");
    for (uint64_t i = 0; i < n; ++i) {
      float want = 0;
      for (int r = 0; r < world; ++r) want += val(r, me * n + i);
      WEFT_CHECK(rs[i] == want, fmt::format("reduce_scatter[{}] = {}, want {}", i, rs[i], want));
    }
    float* a2a = buf(n * world);
    ok(weft_all_to_all(c, in, a2a, n, WEFT_F32, method, nullptr), "all_to_all");
    for (int s = 0; s < world; ++s)
      for (uint64_t i = 0; i < n; ++i)
        WEFT_CHECK(a2a[s * n + i] == val(s, me * n + i), fmt::format("all_to_all[{}][{}] = {}", s, i, a2a[s * n + i]));
  }
  // all_to_all_v: rank s sends s + p + 1 elements to rank p.
  const uint64_t cap = static_cast<uint64_t>(world * world + world);
  std::vector<uint64_t> send(world), recv(world, 0);
  uint64_t total = 0;
  for (int p = 0; p < world; ++p) total += send[p] = static_cast<uint64_t>(me + p + 1);
  float* in = buf(cap);
  for (uint64_t i = 0; i < total; ++i) in[i] = static_cast<float>(100 * me + i);
  float* out = buf(cap);
  const bool base = method && std::strcmp(method, "baseline") == 0;
  ok(weft_all_to_all_v(c, in, send.data(), out, cap, recv.data(), WEFT_F32, base ? "baseline" : method ? "direct" : nullptr,
                       nullptr),
     "all_to_all_v");
  uint64_t at = 0;
  for (int s = 0; s < world; ++s) {
    WEFT_CHECK(recv[s] == static_cast<uint64_t>(s + me + 1), fmt::format("recv_counts[{}] = {}", s, recv[s]));
    uint64_t from = 0;
    for (int p = 0; p < me; ++p) from += static_cast<uint64_t>(s + p + 1);
    for (uint64_t i = 0; i < recv[s]; ++i, ++at)
      WEFT_CHECK(out[at] == static_cast<float>(100 * s + from + i), fmt::format("all_to_all_v[{}] = {}", at, out[at]));
  }
  ok(weft_coll_destroy(c), "weft_coll_destroy");
  for (uint64_t h : buf.handles) ok(weft_free(w, h), "weft_free");
  uint64_t capacity = 0, used = 1;
  ok(weft_heap_info(w, &capacity, &used), "weft_heap_info");
  WEFT_CHECK(capacity == 8ull << 20 && used == 0, fmt::format("heap {} of {} in use after every free", used, capacity));
  ok(weft_world_destroy(w), "weft_world_destroy");
}

// weft_gemv_*: one object serves every M up to m_max, every method exact on integer data; the
// epilogue (residual_out exact, the normalised output within bf16 rounding of an fp32
// reference); bad input refused with the message.
void gemv_exact() {
  FileExchange x;
  weft_world* w = make_world(x);
  const int me = x.rank, world = x.size;
  const int64_t N = 24, K = 16 * world, KL = K / world, MMAX = 9;
  auto X = [](int64_t i, int64_t k) { return static_cast<float>((i + 2 * k) % 5 - 2); };
  auto W = [](int64_t n, int64_t k) { return static_cast<float>((3 * n + k) % 3 - 1); };
  auto R = [](int64_t i, int64_t n) { return static_cast<float>((i * 5 + n) % 7 - 3); };
  auto G = [](int64_t n) { return 0.5f + static_cast<float>(n % 4) * 0.25f; };
  std::vector<dev::bf16_t> xs(MMAX * KL), ws(N * KL), y(MMAX * N), res(MMAX * N), gamma(N), ro(MMAX * N);
  for (int64_t i = 0; i < MMAX; ++i)
    for (int64_t j = 0; j < KL; ++j) xs[i * KL + j] = dev::from_float<dev::bf16_t>(X(i, me * KL + j));
  for (int64_t n = 0; n < N; ++n)
    for (int64_t j = 0; j < KL; ++j) ws[n * KL + j] = dev::from_float<dev::bf16_t>(W(n, me * KL + j));
  for (int64_t i = 0; i < MMAX; ++i)
    for (int64_t n = 0; n < N; ++n) res[i * N + n] = dev::from_float<dev::bf16_t>(R(i, n));
  for (int64_t n = 0; n < N; ++n) gamma[n] = dev::from_float<dev::bf16_t>(G(n));
  auto want_y = [&](int64_t i, int64_t n) {
    float s = 0;
    for (int64_t k = 0; k < K; ++k) s += X(i, k) * W(n, k);
    return s;
  };
  for (int epilogue : {0, 1}) {
    weft_gemv_config cfg{};
    cfg.n = N;
    cfg.k = K;
    cfg.m_max = MMAX;
    cfg.dtype = WEFT_BF16;
    cfg.epilogue = epilogue;
    weft_gemv* g = nullptr;
    ok(weft_gemv_create(w, &cfg, &g), "weft_gemv_create");
    for (int64_t m : {int64_t{1}, int64_t{4}, MMAX})
      for (const char* method : {"baseline", "decomposed", "fused", "auto"}) {
        std::fill(y.begin(), y.end(), dev::from_float<dev::bf16_t>(-99.f));
        ok(weft_gemv_run(g, xs.data(), ws.data(), y.data(), m, method, epilogue ? res.data() : nullptr,
                         epilogue ? gamma.data() : nullptr, epilogue ? ro.data() : nullptr, nullptr),
           "weft_gemv_run");
        for (int64_t i = 0; i < m; ++i) {
          double ss = 0;
          for (int64_t n = 0; n < N; ++n) {
            const float r = want_y(i, n) + (epilogue ? R(i, n) : 0.f);
            ss += static_cast<double>(r) * r;
            if (epilogue) {
              const float got = dev::to_float(ro[i * N + n]);
              WEFT_CHECK(got == r, fmt::format("M {} {}: residual_out[{}][{}] = {}, want {}", m, method, i, n, got, r));
            }
          }
          const float inv = 1.f / std::sqrt(static_cast<float>(ss / N) + 1e-6f);
          for (int64_t n = 0; n < N; ++n) {
            const float got = dev::to_float(y[i * N + n]);
            if (!epilogue) {
              WEFT_CHECK(got == want_y(i, n),
                         fmt::format("M {} {}: y[{}][{}] = {}, want {}", m, method, i, n, got, want_y(i, n)));
            } else {
              const float want = (want_y(i, n) + R(i, n)) * inv * G(n);
              WEFT_CHECK(std::abs(got - want) <= 1e-2f * std::max(1.f, std::abs(want)),
                         fmt::format("M {} {}: out[{}][{}] = {}, want {}", m, method, i, n, got, want));
            }
          }
        }
        // Rows past M are not written.
        if (m < MMAX)
          WEFT_CHECK(dev::to_float(y[m * N]) == -99.f, fmt::format("M {} {}: row {} written", m, method, m));
      }
    const char* am = nullptr;
    ok(weft_gemv_auto_method(g, 1, &am), "weft_gemv_auto_method");
    WEFT_CHECK(am && std::strlen(am) > 0, "auto_method names a method");
    ok(weft_gemv_auto_method(g, 0, &am), "weft_gemv_auto_method(0)");
    expect_err(weft_gemv_auto_method(g, MMAX + 1, &am), WEFT_EINVAL, {"outside"}, "auto_method M > m_max");
    expect_err(weft_gemv_run(g, xs.data(), nullptr, y.data(), 1, nullptr, nullptr, nullptr, nullptr, nullptr),
               WEFT_EINVAL, {"w", "null"}, "null w");
    expect_err(weft_gemv_run(g, xs.data(), ws.data(), y.data(), 1, "quick", nullptr, nullptr, nullptr, nullptr),
               WEFT_EINVAL, {"quick"}, "bad method");
    // M above m_max: every rank refuses it the same way (no exchange happens).
    expect_err(weft_gemv_run(g, xs.data(), ws.data(), y.data(), MMAX + 1, nullptr, epilogue ? res.data() : nullptr,
                             epilogue ? gamma.data() : nullptr, epilogue ? ro.data() : nullptr, nullptr),
               WEFT_EINVAL, {std::to_string(MMAX + 1)}, "M > m_max");
    ok(weft_gemv_destroy(g), "weft_gemv_destroy");
  }
  weft_gemv_config bad{};
  bad.n = N;
  bad.k = K + 1;
  bad.dtype = WEFT_BF16;
  weft_gemv* g = nullptr;
  expect_err(weft_gemv_create(w, &bad, &g), WEFT_EINVAL, {std::to_string(K + 1)}, "K not divisible");
  bad.k = K;
  bad.dtype = WEFT_F32;
  expect_err(weft_gemv_create(w, &bad, &g), WEFT_EINVAL, {}, "f32");
  bad.dtype = WEFT_BF16;
  bad.m_max = 129;
  expect_err(weft_gemv_create(w, &bad, &g), WEFT_EINVAL, {"129"}, "m_max 129");
  expect_err(weft_gemv_create(w, nullptr, &g), WEFT_EINVAL, {"null"}, "null config");
  ok(weft_world_destroy(w), "destroy");
}

// The embedding tests' ranks, tables and bags: rank r holds (2r + 1) % 3 tables (worlds 2 and 3
// have a rank with none) of different dims, small integer weights; bag b of global table g holds
// (g + b) % 3 indices (0: empty), index(g, b, i) each; this rank's tables' offsets, indices and
// per-sample weights (halves and ones) for the global batch.
struct EmbeddingCase {
  using Index = int64_t (*)(int64_t, int64_t, int64_t);
  static int64_t rows(int64_t g) { return 5 + 2 * g; }
  static int64_t dim(int64_t g) { return 8 * (1 + g % 3); }
  static float W(int64_t g, int64_t row, int64_t j) { return static_cast<float>((g * 7 + row * 3 + j) % 5 - 2); }
  static int64_t bag_size(int64_t g, int64_t bag) { return (g + bag) % 3; }  // 0 (empty), 1 or 2: means exact
  static float psw(int64_t bag, int64_t i) { return (bag + i) % 2 ? 0.5f : 1.f; }
  Index index;
  int64_t B = 3, bags = 0, n_global = 0, first = 0, total = 0, local = 0, n_mine = 0;
  std::vector<int> owner;                         // global table -> rank
  std::vector<int64_t> my_rows, my_dims, cols;  // cols: each global table's first column in out
  std::vector<std::vector<int64_t>> offsets, indices;
  std::vector<std::vector<float>> psws;
  EmbeddingCase(int me, int world, Index idx) : index(idx), bags(world * 3) {
    for (int r = 0; r < world; ++r)
      for (int t = 0; t < (2 * r + 1) % 3; ++t) owner.push_back(r);
    n_global = static_cast<int64_t>(owner.size());
    for (int64_t g = 0; g < n_global; ++g) {
      if (owner[g] < me) ++first;
      cols.push_back(total);
      total += dim(g);
      if (owner[g] != me) continue;
      my_rows.push_back(rows(g));
      my_dims.push_back(dim(g));
      local += dim(g);
    }
    n_mine = static_cast<int64_t>(my_rows.size());
    offsets.resize(n_mine);
    indices.resize(n_mine);
    psws.resize(n_mine);
    for (int64_t t = 0; t < n_mine; ++t) {
      const int64_t g = first + t;
      offsets[t].push_back(0);
      for (int64_t bag = 0; bag < bags; ++bag) {
        for (int64_t i = 0; i < bag_size(g, bag); ++i) {
          indices[t].push_back(index(g, bag, i));
          psws[t].push_back(psw(bag, i));
        }
        offsets[t].push_back(static_cast<int64_t>(indices[t].size()));
      }
    }
  }
};

// weft_embedding_a2a_*: rank r holds (2r + 1) % 3 tables (worlds 2 and 3 have a rank with none)
// of different dims; out on rank r is its samples' pooled rows of every table in global order,
// exact on integer tables (sum and mean, per-sample weights of halves, f32 and bf16, empty bags)
// by every method; the layout query; bad input refused with the message, on every rank.
void embedding_exact() {
  FileExchange x;
  weft_world* w = make_world(x);
  EmbeddingCase c(x.rank, x.size, [](int64_t g, int64_t bag, int64_t i) {
    return (g + bag * 5 + i * 3) % EmbeddingCase::rows(g);
  });
  const int64_t B = c.B, n_global = c.n_global, first = c.first, total = c.total, local = c.local, n_mine = c.n_mine;
  const std::vector<int64_t>&my_rows = c.my_rows, &my_dims = c.my_dims, &cols = c.cols;
  std::vector<std::vector<int64_t>>&offsets = c.offsets, &indices = c.indices;
  const std::vector<std::vector<float>>& psws = c.psws;
  auto dim = EmbeddingCase::dim;
  auto W = EmbeddingCase::W;
  auto bag_size = EmbeddingCase::bag_size;
  auto psw = EmbeddingCase::psw;
  auto index = c.index;
  const int me = x.rank;
  std::vector<std::vector<float>> wf(n_mine);
  std::vector<std::vector<dev::bf16_t>> wb(n_mine);
  for (int64_t t = 0; t < n_mine; ++t) {
    const int64_t g = first + t;
    for (int64_t row = 0; row < EmbeddingCase::rows(g); ++row)
      for (int64_t j = 0; j < dim(g); ++j) {
        wf[t].push_back(W(g, row, j));
        wb[t].push_back(dev::from_float<dev::bf16_t>(W(g, row, j)));
      }
  }
  const std::array<const char*, 5> kMethods = {"auto", "baseline", "decomposed", "fused", nullptr};
  size_t checks = 0;
  for (int wt : {WEFT_F32, WEFT_BF16})
    for (int ot : {WEFT_F32, WEFT_BF16})
      for (const char* pooling : {"sum", static_cast<const char*>(nullptr), "mean"})
        for (int weighted : {0, 1}) {
          weft_embedding_a2a_config cfg{};
          cfg.n_tables = n_mine;
          cfg.rows = my_rows.data();
          cfg.dims = my_dims.data();
          cfg.batch = B;
          cfg.weight_dtype = wt;
          cfg.out_dtype = ot;
          cfg.pooling = pooling;
          cfg.check_indices = 1;
          weft_embedding_a2a* e = nullptr;
          ok(weft_embedding_a2a_create(w, &cfg, &e), "weft_embedding_a2a_create");
          int64_t got_total = -1, n_dims = -1, got_first = -1, got_local = -1;
          const int64_t* dims = nullptr;
          ok(weft_embedding_a2a_layout(e, &got_total, &dims, &n_dims, &got_first, &got_local), "layout");
          WEFT_CHECK(got_total == total && n_dims == n_global && got_first == first && got_local == local,
                     fmt::format("layout: total {} ({}), {} dims ({}), first {} ({}), local {} ({})", got_total, total,
                                 n_dims, n_global, got_first, first, got_local, local));
          for (int64_t g = 0; g < n_global; ++g)
            WEFT_CHECK(dims[g] == dim(g), fmt::format("dims[{}] = {}, want {}", g, dims[g], dim(g)));
          std::vector<weft_embedding_bag> in;
          for (int64_t t = 0; t < n_mine; ++t)
            in.push_back({wt == WEFT_F32 ? static_cast<const void*>(wf[t].data()) : wb[t].data(), offsets[t].data(),
                          indices[t].empty() ? nullptr : indices[t].data(), weighted ? psws[t].data() : nullptr,
                          static_cast<int64_t>(indices[t].size())});
          std::vector<float> out_f(static_cast<size_t>(B * total), -99.f);
          std::vector<dev::bf16_t> out_b(static_cast<size_t>(B * total), dev::from_float<dev::bf16_t>(-99.f));
          void* out = ot == WEFT_F32 ? static_cast<void*>(out_f.data()) : out_b.data();
          const char* method = kMethods[checks++ % kMethods.size()];
          ok(weft_embedding_a2a_forward(e, in.empty() ? nullptr : in.data(), out, method, nullptr), "forward");
          for (int64_t b = 0; b < B; ++b)
            for (int64_t g = 0; g < n_global; ++g) {
              const int64_t bag = me * B + b, n = bag_size(g, bag);
              for (int64_t j = 0; j < dim(g); ++j) {
                float want = 0;
                for (int64_t i = 0; i < n; ++i) want += (weighted ? psw(bag, i) : 1.f) * W(g, index(g, bag, i), j);
                if (pooling && std::strcmp(pooling, "mean") == 0 && n > 0) want /= static_cast<float>(n);
                const size_t at = static_cast<size_t>(b * total + cols[g] + j);
                const float got = ot == WEFT_F32 ? out_f[at] : dev::to_float(out_b[at]);
                WEFT_CHECK(got == want,
                           fmt::format("weights {} out {} {}{} {}: sample {} table {} column {}: {}, want {}", wt, ot,
                                       pooling ? pooling : "(null)", weighted ? " weighted" : "",
                                       method ? method : "(null)", b, g, j, got, want));
              }
            }
          ok(weft_embedding_a2a_destroy(e), "weft_embedding_a2a_destroy");
        }
  // Bad input, refused on every rank with the message.
  weft_embedding_a2a_config cfg{};
  cfg.n_tables = n_mine;
  cfg.rows = my_rows.data();
  cfg.dims = my_dims.data();
  cfg.batch = B;
  cfg.weight_dtype = WEFT_F32;
  cfg.out_dtype = WEFT_F32;
  weft_embedding_a2a* e = nullptr;
  cfg.pooling = "max";
  expect_err(weft_embedding_a2a_create(w, &cfg, &e), WEFT_EINVAL, {"unknown pooling 'max'", "sum or mean"},
             "bad pooling");
  cfg.pooling = nullptr;
  cfg.out_dtype = 7;
  expect_err(weft_embedding_a2a_create(w, &cfg, &e), WEFT_EINVAL, {"dtype 7"}, "dtype 7");
  cfg.out_dtype = WEFT_F32;
  expect_err(weft_embedding_a2a_create(w, nullptr, &e), WEFT_EINVAL, {"null"}, "null config");
  ok(weft_embedding_a2a_create(w, &cfg, &e), "weft_embedding_a2a_create");
  std::vector<weft_embedding_bag> in;
  for (int64_t t = 0; t < n_mine; ++t)
    in.push_back({wf[t].data(), offsets[t].data(), indices[t].data(), nullptr, -1});  // -1: num_indices not given
  std::vector<float> out(static_cast<size_t>(B * total));
  const weft_embedding_bag* tables = in.empty() ? nullptr : in.data();
  expect_err(weft_embedding_a2a_forward(e, tables, out.data(), "quick", nullptr), WEFT_EINVAL, {"quick"}, "bad method");
  expect_err(weft_embedding_a2a_forward(e, tables, nullptr, nullptr, nullptr), WEFT_EINVAL, {"out", "null"},
             "null out");
  // An index outside its table on rank 0 (global table 0) alone: rank 0 names the table and the
  // position, the others hear that a rank's call is bad.
  if (me == 0) indices[0][1] = 99;
  expect_err(weft_embedding_a2a_forward(e, tables, out.data(), nullptr, nullptr), WEFT_EINVAL,
             {me == 0 ? "table 0 (global 0): indices[1] = 99 is outside 0 ... 4" : "disagree"}, "index out of range");
  if (me == 0) indices[0][1] = 0;
  ok(weft_embedding_a2a_forward(e, tables, out.data(), nullptr, nullptr), "forward after the refusals");
  expect_err(weft_embedding_a2a_layout(nullptr, nullptr, nullptr, nullptr, nullptr, nullptr), WEFT_EINVAL, {"null"},
             "null handle");
  expect_err(weft_world_destroy(w), WEFT_EINVAL, {"destroy them first"}, "world before its op");
  ok(weft_embedding_a2a_destroy(e), "weft_embedding_a2a_destroy");
  ok(weft_world_destroy(w), "destroy");
}

// weft_embedding_a2a_backward: embedding_exact's ranks, tables and bags; grad_out on rank q is
// small integers; every kind (NULL: dense) against the definition computed here in the same order:
// dense, sparse and sgd exact (f32 and bf16 weights and grad_out, sum and mean, per-sample
// weights), adagrad within a few ulps (the same IEEE operations, but a compiler may contract a
// multiply-add); num_indices passed through (a wrong one on rank 0 named there, -1: not given);
// an unknown kind and a null Adagrad state refused.
void embedding_backward_exact() {
  FileExchange x;
  weft_world* w = make_world(x);
  EmbeddingCase c(x.rank, x.size, [](int64_t g, int64_t bag, int64_t i) {
    return (g * 2 + bag + i * 3) % EmbeddingCase::rows(g);  // rows repeat across bags
  });
  const int64_t B = c.B, bags = c.bags, first = c.first, total = c.total, n_mine = c.n_mine;
  const std::vector<int64_t>&my_rows = c.my_rows, &my_dims = c.my_dims, &cols = c.cols;
  std::vector<std::vector<int64_t>>&offsets = c.offsets, &indices = c.indices;
  const std::vector<std::vector<float>>& psws = c.psws;
  auto rows = EmbeddingCase::rows;
  auto dim = EmbeddingCase::dim;
  auto W = EmbeddingCase::W;
  auto bag_size = EmbeddingCase::bag_size;
  auto psw = EmbeddingCase::psw;
  auto index = c.index;
  const int me = x.rank;
  auto GO = [](int64_t q, int64_t b, int64_t c) { return static_cast<float>((q * 5 + b * 3 + c) % 7 - 3); };
  auto S0 = [](int64_t row, int64_t j) { return 0.25f * static_cast<float>((row + j) % 3); };  // Adagrad's state
  // Row r's gradient of this rank's table t, by the definition: the bags in order, each one's
  // indices in order, in fp32 from 0.
  auto grad = [&](int64_t t, int64_t r, bool mean, bool weighted) {
    const int64_t g = first + t;
    std::vector<float> acc(static_cast<size_t>(dim(g)), 0.f);
    for (int64_t bag = 0; bag < bags; ++bag) {
      const int64_t n = bag_size(g, bag);
      for (int64_t i = 0; i < n; ++i) {
        if (index(g, bag, i) != r) continue;
        const float s = mean ? 1.f / static_cast<float>(n) : 1.f;
        const float f = (weighted ? psw(bag, i) : 1.f) * s;
        for (int64_t j = 0; j < dim(g); ++j) acc[j] = acc[j] + f * GO(bag / B, bag % B, cols[g] + j);
      }
    }
    return acc;
  };
  auto indexed = [&](int64_t t) {  // the distinct rows this rank's table t's bags index, ascending
    std::vector<int64_t> r = indices[t];
    std::sort(r.begin(), r.end());
    r.erase(std::unique(r.begin(), r.end()), r.end());
    return r;
  };
  const std::array<const char*, 5> kMethods = {"auto", "baseline", "decomposed", "fused", nullptr};
  const float lr = 0.5f, eps = 1e-10f;
  size_t calls = 0;
  for (int wt : {WEFT_F32, WEFT_BF16})
    for (int ot : {WEFT_F32, WEFT_BF16})
      for (const char* pooling : {"sum", "mean"}) {
        const bool mean = std::strcmp(pooling, "mean") == 0;
        weft_embedding_a2a_config cfg{};
        cfg.n_tables = n_mine;
        cfg.rows = my_rows.data();
        cfg.dims = my_dims.data();
        cfg.batch = B;
        cfg.weight_dtype = wt;
        cfg.out_dtype = ot;
        cfg.pooling = pooling;
        cfg.check_indices = 1;
        weft_embedding_a2a* e = nullptr;
        ok(weft_embedding_a2a_create(w, &cfg, &e), "weft_embedding_a2a_create");
        std::vector<float> go_f(static_cast<size_t>(B * total));
        for (int64_t b = 0; b < B; ++b)
          for (int64_t c = 0; c < total; ++c) go_f[static_cast<size_t>(b * total + c)] = GO(me, b, c);
        std::vector<dev::bf16_t> go_b;
        for (float v : go_f) go_b.push_back(dev::from_float<dev::bf16_t>(v));
        const void* grad_out = ot == WEFT_F32 ? static_cast<const void*>(go_f.data()) : go_b.data();
        for (int weighted : {0, 1})
          for (const char* kind : {static_cast<const char*>(nullptr), "dense", "sparse", "sgd", "adagrad"}) {
            const std::string k = kind ? kind : "dense";
            const std::string what = fmt::format("weights {} out {} {}{} {}", wt, ot, pooling,
                                                 weighted ? " weighted" : "", kind ? kind : "(null)");
            // The sinks, poisoned: backward sets what it owns.
            std::vector<std::vector<float>> dense(n_mine), values(n_mine), wf(n_mine), state(n_mine);
            std::vector<std::vector<dev::bf16_t>> wb(n_mine);
            std::vector<std::vector<int64_t>> sp_rows(n_mine);
            std::vector<int64_t> count(static_cast<size_t>(n_mine), -1);
            std::vector<weft_embedding_bag> in;
            std::vector<weft_embedding_grad> sinks;
            for (int64_t t = 0; t < n_mine; ++t) {
              const int64_t g = first + t, elems = rows(g) * dim(g), nnz = static_cast<int64_t>(indices[t].size());
              dense[t].assign(static_cast<size_t>(elems), -7.f);
              sp_rows[t].assign(static_cast<size_t>(std::max<int64_t>(nnz, 1)), -7);
              values[t].assign(static_cast<size_t>(std::max<int64_t>(nnz, 1) * dim(g)), -7.f);
              for (int64_t row = 0; row < rows(g); ++row)
                for (int64_t j = 0; j < dim(g); ++j) {
                  wf[t].push_back(W(g, row, j));
                  wb[t].push_back(dev::from_float<dev::bf16_t>(W(g, row, j)));
                  state[t].push_back(S0(row, j));
                }
              void* weight = wt == WEFT_F32 ? static_cast<void*>(wf[t].data()) : wb[t].data();
              // num_indices: given on even calls, not given (-1) on odd ones.
              in.push_back({weight, offsets[t].data(), indices[t].empty() ? nullptr : indices[t].data(),
                            weighted ? psws[t].data() : nullptr, calls % 2 ? -1 : nnz});
              sinks.push_back(
                  {dense[t].data(), sp_rows[t].data(), values[t].data(), &count[t], weight, state[t].data()});
            }
            const char* method = kMethods[calls++ % kMethods.size()];
            ok(weft_embedding_a2a_backward(e, in.empty() ? nullptr : in.data(), grad_out,
                                           sinks.empty() ? nullptr : sinks.data(), kind, lr, eps, method, nullptr),
               what.c_str());
            for (int64_t t = 0; t < n_mine; ++t) {
              const int64_t g = first + t, D = dim(g);
              const std::vector<int64_t> hit = indexed(t);
              if (k == "sparse")
                WEFT_CHECK(count[t] == static_cast<int64_t>(hit.size()),
                           fmt::format("{}: table {}: count {}, want {}", what, g, count[t], hit.size()));
              for (int64_t row = 0, n = 0; row < rows(g); ++row) {
                const bool is_hit = std::binary_search(hit.begin(), hit.end(), row);
                const std::vector<float> want_g =
                    is_hit ? grad(t, row, mean, weighted) : std::vector<float>(static_cast<size_t>(D), 0.f);
                if (k == "sparse" && is_hit) {
                  WEFT_CHECK(sp_rows[t][n] == row,
                             fmt::format("{}: table {}: rows[{}] = {}, want {}", what, g, n, sp_rows[t][n], row));
                  for (int64_t j = 0; j < D; ++j)
                    WEFT_CHECK(values[t][n * D + j] == want_g[j],
                               fmt::format("{}: table {} row {} column {}: {}, want {}", what, g, row, j,
                                           values[t][n * D + j], want_g[j]));
                }
                n += is_hit;
                for (int64_t j = 0; j < D; ++j) {
                  const size_t at = static_cast<size_t>(row * D + j);
                  const float w0 = W(g, row, j), s0 = S0(row, j), gj = want_g[j];
                  const float got = wt == WEFT_F32 ? wf[t][at] : dev::to_float(wb[t][at]);
                  const float got_state = state[t][at];
                  float want = w0, want_state = s0;
                  if (is_hit && k == "sgd") want = w0 - lr * gj;
                  if (is_hit && k == "adagrad") {
                    want_state = s0 + gj * gj;
                    want = w0 + -lr * (gj / (std::sqrt(want_state) + eps));
                  }
                  if (wt == WEFT_BF16) want = dev::to_float(dev::from_float<dev::bf16_t>(want));
                  // adagrad: a few ulps of the weight's dtype (one rounding may differ after a contraction).
                  const float tol = k == "adagrad" ? std::abs(want) * (wt == WEFT_F32 ? 1e-6f : 1e-2f) : 0.f;
                  WEFT_CHECK(std::abs(got - want) <= tol && got_state == want_state,  // the state's sums: exact
                             fmt::format("{}: table {} row {} column {}: weight {} (want {}), state {} (want {})", what,
                                         g, row, j, got, want, got_state, want_state));
                  if (k == "dense")
                    WEFT_CHECK(dense[t][at] == gj, fmt::format("{}: table {} row {} column {}: {}, want {}", what, g,
                                                               row, j, dense[t][at], gj));
                }
              }
            }
          }
        ok(weft_embedding_a2a_destroy(e), "weft_embedding_a2a_destroy");
      }
  // Bad input, refused with the message.
  weft_embedding_a2a_config cfg{};
  cfg.n_tables = n_mine;
  cfg.rows = my_rows.data();
  cfg.dims = my_dims.data();
  cfg.batch = B;
  cfg.weight_dtype = WEFT_F32;
  cfg.out_dtype = WEFT_F32;
  weft_embedding_a2a* e = nullptr;
  ok(weft_embedding_a2a_create(w, &cfg, &e), "weft_embedding_a2a_create");
  std::vector<std::vector<float>> wf(n_mine), dense(n_mine);
  std::vector<weft_embedding_bag> in;
  std::vector<weft_embedding_grad> sinks;
  for (int64_t t = 0; t < n_mine; ++t) {
    const int64_t g = first + t;
    wf[t].assign(static_cast<size_t>(rows(g) * dim(g)), 1.f);
    dense[t].assign(wf[t].size(), 0.f);
    in.push_back(
        {wf[t].data(), offsets[t].data(), indices[t].data(), nullptr, static_cast<int64_t>(indices[t].size())});
    sinks.push_back({dense[t].data(), nullptr, nullptr, nullptr, wf[t].data(), nullptr});
  }
  std::vector<float> go(static_cast<size_t>(B * total), 1.f);
  const weft_embedding_bag* tables = in.empty() ? nullptr : in.data();
  const weft_embedding_grad* grads = sinks.empty() ? nullptr : sinks.data();
  expect_err(weft_embedding_a2a_backward(e, tables, go.data(), grads, "momentum", lr, eps, nullptr, nullptr),
             WEFT_EINVAL, {"momentum"}, "bad kind");
  expect_err(weft_embedding_a2a_backward(nullptr, tables, go.data(), grads, nullptr, lr, eps, nullptr, nullptr),
             WEFT_EINVAL, {"null"}, "null handle");
  // Adagrad without its state: refused on every rank, every message naming rank 0's table (rank
  // 0 holds one; with more ranks the agreement's message carries rank 0's verdict).
  expect_err(weft_embedding_a2a_backward(e, tables, go.data(), grads, "adagrad", lr, eps, nullptr, nullptr),
             WEFT_EINVAL, {"table 0 (global 0): the Adagrad state: null pointer"}, "adagrad without state");
  // A num_indices that disagrees with the offsets on rank 0 alone: passed through, refused everywhere.
  int64_t nnz0 = 0;  // rank 0's table's (global 0's) indices
  for (int64_t bag = 0; bag < bags; ++bag) nnz0 += bag_size(0, bag);
  if (me == 0) in[0].num_indices += 1;
  expect_err(weft_embedding_a2a_backward(e, tables, go.data(), grads, nullptr, lr, eps, nullptr, nullptr), WEFT_EINVAL,
             {fmt::format("table 0 (global 0): num_indices = {} but the offsets end at {}", nnz0 + 1, nnz0)},
             "num_indices");
  if (me == 0) in[0].num_indices -= 1;
  ok(weft_embedding_a2a_backward(e, tables, go.data(), grads, "dense", lr, eps, "baseline", nullptr),
     "backward after the refusals");
  ok(weft_embedding_a2a_destroy(e), "weft_embedding_a2a_destroy");
  ok(weft_world_destroy(w), "destroy");
}

}  // namespace

class CApiCollectives : public ::testing::TestWithParam<std::tuple<int, bool, const char*>> {};

TEST_P(CApiCollectives, ExactIntoHeapAndPlainOutputs) {
  const auto [world, symmetric, method] = GetParam();
  expect_all_ok(run_host_ranks(world, [symmetric, method] { collectives_exact(symmetric, method); }));
}

INSTANTIATE_TEST_SUITE_P(Worlds, CApiCollectives,
                         ::testing::Combine(::testing::Values(1, 2, 3), ::testing::Bool(),
                                            ::testing::Values(nullptr, "baseline", "direct")));

TEST(CApi, HeapAllocFreeContains) {
  expect_all_ok(run_host_ranks(2, [] {
    FileExchange x;
    weft_world* w = make_world(x);
    int rank = -1, size = -1, kind = -1;
    ok(weft_world_info(w, &rank, &size, &kind), "weft_world_info");
    WEFT_CHECK(rank == x.rank && size == 2 && kind == WEFT_BACKEND_HOST, "weft_world_info");
    uint64_t h1 = 0, off1 = 0, h2 = 0, off2 = 0, off = 0;
    void *p1 = nullptr, *p2 = nullptr;
    ok(weft_alloc(w, 100, &h1, &off1, &p1), "alloc 1");
    ok(weft_alloc(w, 4096, &h2, &off2, &p2), "alloc 2");
    WEFT_CHECK(h1 != h2 && off2 > off1, "two blocks, two handles");
    for (int i = 0; i < 4096; ++i) WEFT_CHECK(static_cast<char*>(p2)[i] == 0, "alloc is zeroed");
    WEFT_CHECK(weft_heap_contains(w, p2, 4096, &off) == 1 && off == off2, "heap_contains p2");
    WEFT_CHECK(weft_heap_contains(w, static_cast<char*>(p1) + 10, 10, &off) == 1 && off == off1 + 10, "inside");
    WEFT_CHECK(weft_heap_contains(w, p1, 9ull << 20, &off) == 0, "past the heap's end");
    int local = 0;
    WEFT_CHECK(weft_heap_contains(w, &local, 4, &off) == 0, "a stack address");
    ok(weft_free(w, h1), "free 1");
    expect_err(weft_free(w, h1), WEFT_EINVAL, {"not a live block"}, "double free");
    uint64_t h3 = 0;
    expect_err(weft_alloc(w, 16ull << 20, &h3, nullptr, nullptr), WEFT_EINVAL, {"c_api.alloc"}, "too large");
    ok(weft_free(w, h2), "free 2");
    ok(weft_world_barrier(w), "barrier");
    ok(weft_world_synchronize(w), "synchronize");
    ok(weft_world_destroy(w), "destroy");
  }));
}

TEST(CApi, GemmOpsExact) {
  expect_all_ok(run_host_ranks(2, [] {
    FileExchange x;
    weft_world* w = make_world(x);
    const int me = x.rank, world = x.size;
    for (const char* opname : {"ag_gemm", "gemm_rs", "gemm_ar"}) {
      const int64_t M = 8, N = 16, K = 32;
      weft_gemm_config cfg{};
      cfg.op = opname;
      cfg.m = M;
      cfg.n = N;
      cfg.k = K;
      cfg.dtype = WEFT_BF16;
      const int64_t buckets[] = {4};
      cfg.m_buckets = buckets;
      cfg.n_m_buckets = 1;
      weft_gemm* g = nullptr;
      ok(weft_gemm_create(w, &cfg, &g), "weft_gemm_create");
      int64_t ar, ac, br, bc, cr, cc;
      ok(weft_gemm_shapes(g, 0, &ar, &ac, &br, &bc, &cr, &cc), "shapes");
      const bool ag = std::strcmp(opname, "ag_gemm") == 0;
      // A: the global A[M][K] (ag_gemm: rows sharded; else K sharded); B = W[N][K_local].
      auto A = [&](int64_t i, int64_t k) { return static_cast<float>((i + 2 * k) % 5 - 2); };
      auto W = [&](int64_t n, int64_t k) { return static_cast<float>((n + k) % 3 - 1); };
      auto a_of = [&](int r, int64_t i, int64_t j) { return ag ? A(r * ar + i, j) : A(i, r * ac + j); };
      auto b_of = [&](int r, int64_t n, int64_t j) { return ag ? W(n, j) : W(n, r * bc + j); };
      std::vector<dev::bf16_t> a(ar * ac), b(br * bc), c(cr * cc);
      for (int64_t i = 0; i < ar; ++i)
        for (int64_t j = 0; j < ac; ++j) a[i * ac + j] = dev::from_float<dev::bf16_t>(a_of(me, i, j));
      for (int64_t n = 0; n < br; ++n)
        for (int64_t j = 0; j < bc; ++j) b[n * bc + j] = dev::from_float<dev::bf16_t>(b_of(me, n, j));
      for (const char* method : {"baseline", "decomposed", "auto"}) {
        ok(weft_gemm_run(g, a.data(), b.data(), c.data(), 0, method, nullptr), "weft_gemm_run");
        const int64_t row0 = std::strcmp(opname, "gemm_rs") == 0 ? me * cr : 0;
        for (int64_t i = 0; i < cr; ++i)
          for (int64_t n = 0; n < N; ++n) {
            float want = 0;
            for (int64_t k = 0; k < K; ++k) want += A(row0 + i, k) * W(n, k);
            const float got = dev::to_float(c[i * cc + n]);
            WEFT_CHECK(got == want, fmt::format("{} {}: C[{}][{}] = {}, want {}", opname, method, i, n, got, want));
          }
      }
      const char* am = nullptr;
      ok(weft_gemm_auto_method(g, 4, &am), "auto_method");
      WEFT_CHECK(am && std::strlen(am) > 0, "auto_method names a method");
      expect_err(weft_gemm_run(g, a.data(), nullptr, c.data(), 0, nullptr, nullptr), WEFT_EINVAL, {"B", "null"},
                 "null B");
      expect_err(weft_gemm_run(g, a.data(), b.data(), c.data(), 0, "quick", nullptr), WEFT_EINVAL,
                 {"unknown method 'quick'"}, "bad method");
      ok(weft_gemm_destroy(g), "weft_gemm_destroy");
    }
    (void)world;
    ok(weft_world_destroy(w), "destroy");
  }));
}

TEST(CApi, GemvOpExact) {
  for (int world : {1, 2, 3}) expect_all_ok(run_host_ranks(world, [] { gemv_exact(); }));
}

TEST(CApi, EmbeddingA2AExact) {
  for (int world : {1, 2, 3}) expect_all_ok(run_host_ranks(world, [] { embedding_exact(); }));
}

TEST(CApi, EmbeddingA2ABackwardExact) {
  for (int world : {1, 2, 3}) expect_all_ok(run_host_ranks(world, [] { embedding_backward_exact(); }));
}

// A configuration every rank gets wrong alike is refused on every rank, naming the value.
TEST(CApi, EmbeddingA2AConfigurationFaultsAreRefused) {
  for (int world : {1, 2})
    expect_all_ok(run_host_ranks(world, [] {
      FileExchange x;
      weft_world* w = make_world(x);
      const int64_t rows[] = {5}, dims[] = {8}, dims12[] = {12};
      weft_embedding_a2a_config cfg{};
      cfg.n_tables = 1;
      cfg.rows = rows;
      cfg.dims = dims;
      cfg.batch = 2;
      cfg.weight_dtype = WEFT_F32;
      cfg.out_dtype = WEFT_F16;
      weft_embedding_a2a* e = nullptr;
      expect_err(weft_embedding_a2a_create(w, &cfg, &e), WEFT_EINVAL, {"output must be f32 or bf16, got f16"},
                 "f16 out");
      cfg.out_dtype = WEFT_F32;
      cfg.batch = -1;
      expect_err(weft_embedding_a2a_create(w, &cfg, &e), WEFT_EINVAL, {"batch must be >= 0, got -1"}, "batch -1");
      cfg.batch = 2;
      cfg.dims = dims12;
      expect_err(weft_embedding_a2a_create(w, &cfg, &e), WEFT_EINVAL, {"dim must be a multiple of 8", "got 12"},
                 "dim 12");
      cfg.dims = dims;
      cfg.n_tables = 2;
      cfg.rows = nullptr;
      expect_err(weft_embedding_a2a_create(w, &cfg, &e), WEFT_EINVAL, {"2 tables with rows at"}, "rows null");
      WEFT_CHECK(e == nullptr, "no op after a refusal");
      ok(weft_world_destroy(w), "destroy");
    }));
}

TEST(CApi, BadInputIsRefusedWithTheMessage) {
  expect_all_ok(run_host_ranks(2, [] {
    FileExchange x;
    weft_world* w = make_world(x);
    weft_coll* c = nullptr;
    ok(weft_coll_create(w, &c), "weft_coll_create");
    std::vector<float> buf(64, 1.f);
    expect_err(weft_all_reduce(c, nullptr, buf.data(), 8, WEFT_F32, nullptr, nullptr), WEFT_EINVAL, {"null pointer"},
               "null input");
    expect_err(weft_all_gather(c, buf.data(), nullptr, 8, WEFT_F32, nullptr, nullptr), WEFT_EINVAL,
               {"output", "null"}, "null output");
    expect_err(weft_all_reduce(c, buf.data(), buf.data(), 8, 3, nullptr, nullptr), WEFT_EINVAL, {"dtype 3"},
               "bad dtype");
    expect_err(weft_all_reduce(c, buf.data(), buf.data(), 8, WEFT_F32, "fastest", nullptr), WEFT_EINVAL,
               {"unknown method 'fastest'"}, "bad method");
    expect_err(weft_coll_prepare(c, "broadcast", 8, WEFT_F32, nullptr), WEFT_EINVAL, {"unknown collective"},
               "bad collective");
    expect_err(weft_all_reduce(nullptr, buf.data(), buf.data(), 8, WEFT_F32, nullptr, nullptr), WEFT_EINVAL,
               {"null"}, "null handle");
    ok(weft_all_reduce(c, nullptr, nullptr, 0, WEFT_F32, nullptr, nullptr), "count 0 is a no-op");
    // The ranks disagree on the count: refused on every rank, naming both.
    const uint64_t n = x.rank == 0 ? 8 : 9;
    expect_err(weft_all_reduce(c, buf.data(), buf.data(), n, WEFT_F32, nullptr, nullptr), WEFT_EINVAL,
               {"disagree", "8", "9"}, "count mismatch");
    expect_err(weft_all_gather(c, buf.data(), buf.data() + 8, n, WEFT_F32, nullptr, nullptr), WEFT_EINVAL,
               {"disagree", "8", "9"}, "all_gather count mismatch");
    expect_err(weft_world_destroy(w), WEFT_EINVAL, {"destroy them first"}, "world before its ops");
    ok(weft_coll_destroy(c), "weft_coll_destroy");
    ok(weft_world_destroy(w), "destroy");
    // Options.
    weft_world_options o{};
    o.rank = 2;
    o.size = 2;
    weft_world* bad = nullptr;
    expect_err(weft_world_create(&o, &bad), WEFT_EINVAL, {"rank 2 of a world of 2"}, "rank out of range");
    o.rank = 0;
    expect_err(weft_world_create(&o, &bad), WEFT_EINVAL, {"allgather"}, "no allgather for 2 ranks");
    expect_err(weft_world_create(nullptr, &bad), WEFT_EINVAL, {"null"}, "null options");
  }));
}

TEST(CApi, CallbackTimeoutNamesTheRank) {
  expect_all_ok(run_host_ranks(2, [] {
    FileExchange x;
    x.refuse_round = 0;  // the first exchange (the handshake) reports rank 1 missing
    x.dir = std::getenv("WEFT_BOOTSTRAP_DIR");
    x.rank = world_rank();
    x.size = 2;
    weft_world_options o{};
    o.rank = x.rank;
    o.size = 2;
    o.backend = "host";
    o.allgather = &file_allgather;
    o.user = &x;
    weft_world* w = nullptr;
    expect_err(weft_world_create(&o, &w), WEFT_ETIMEOUT, {"rank 1", "the store did not hear from rank 1"},
               "callback timeout");
    WEFT_CHECK(w == nullptr, "no world after a failure");
  }));
}

TEST(CApi, SingleRankWithoutAllgather) {
  weft_world_options o{};
  o.rank = 0;
  o.size = 1;
  o.backend = "host";
  o.heap_mib = 2;
  weft_world* w = nullptr;
  ASSERT_EQ(weft_world_create(&o, &w), WEFT_OK) << weft_last_error();
  EXPECT_STREQ(weft_last_error(), "");
  weft_coll* c = nullptr;
  ASSERT_EQ(weft_coll_create(w, &c), WEFT_OK) << weft_last_error();
  std::vector<float> in{1, 2, 3}, out(3);
  ASSERT_EQ(weft_all_gather(c, in.data(), out.data(), 3, WEFT_F32, nullptr, nullptr), WEFT_OK) << weft_last_error();
  EXPECT_EQ(out, in);
  EXPECT_EQ(weft_coll_prepare(c, "all_to_all", 3, WEFT_F32, "direct"), WEFT_OK) << weft_last_error();
  EXPECT_EQ(weft_coll_destroy(c), WEFT_OK);
  EXPECT_EQ(weft_world_destroy(w), WEFT_OK);
  EXPECT_EQ(weft_api_version(), WEFT_C_API_VERSION);
  EXPECT_GT(std::strlen(weft_version()), 0u);
}

TEST(CApi, ADeadRankIsATimeoutNamingIt) {
  auto res = run_host_ranks(2, [] {
    FileExchange x;
    weft_world* w = make_world(x, 1500);
    weft_coll* c = nullptr;
    ok(weft_coll_create(w, &c), "weft_coll_create");
    std::vector<float> buf(256, 1.f);
    ok(weft_all_reduce(c, buf.data(), buf.data(), 256, WEFT_F32, "one-shot", nullptr), "first call");
    if (x.rank == 1) _exit(0);
    expect_err(weft_all_reduce(c, buf.data(), buf.data(), 256, WEFT_F32, "one-shot", nullptr), WEFT_ETIMEOUT,
               {"rank 1"}, "peer gone");
  });
  EXPECT_EQ(res[0].exit_code, 0) << res[0].message;
}
