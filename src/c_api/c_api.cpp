// The C API (include/weft/c_api.h) over the runtime and the ops: handles own C++ objects;
// every entry point runs inside guard(), which maps exceptions to status codes and keeps the
// message for weft_last_error(), so no exception ever crosses the C boundary.
#include "weft/c_api.h"

#include <fmt/format.h>

#include <cmath>
#include <cstring>
#include <map>
#include <memory>
#include <new>
#include <set>
#include <string>
#include <tuple>
#include <vector>

#include "weft/core/error.hpp"
#include "weft/ops/collectives.hpp"
#include "weft/ops/embedding_a2a.hpp"
#include "weft/ops/gemm_overlap.hpp"
#include "weft/ops/gemv_ar.hpp"
#include "weft/ops/moe.hpp"
#include "weft/runtime/backend.hpp"
#include "weft/runtime/bootstrap.hpp"
#include "weft/version.hpp"

#ifdef WEFT_HAVE_CUDA
#include <cuda_runtime_api.h>

#include "weft/core/cuda_check.hpp"
#endif

#define WEFT_API extern "C" __attribute__((visibility("default")))

namespace {

using namespace weft;

thread_local std::string g_last_error;

// Runs one entry point: WEFT_OK, or the exception's status with its message kept.
template <class F>
int guard(F&& body) noexcept {
  g_last_error.clear();
  try {
    body();
    return WEFT_OK;
  } catch (const InvalidArgument& e) {
    g_last_error = e.message();
    return WEFT_EINVAL;
  } catch (const TimeoutError& e) {
    g_last_error = e.message();
    return WEFT_ETIMEOUT;
  } catch (const Error& e) {
    g_last_error = e.what();  // with file:line: an internal or system failure
    return WEFT_EFAIL;
  } catch (const std::bad_alloc&) {
    g_last_error = "out of host memory";
    return WEFT_EFAIL;
  } catch (const std::exception& e) {
    g_last_error = e.what();
    return WEFT_EFAIL;
  } catch (...) {
    g_last_error = "unknown exception";
    return WEFT_EFAIL;
  }
}

void require_arg(bool ok, const std::string& msg) {
  if (!ok) throw InvalidArgument(msg);
}

dev::DType to_dtype(int dtype, const char* call) {
  require_arg(dtype == WEFT_F32 || dtype == WEFT_F16 || dtype == WEFT_BF16,
              fmt::format("{}: dtype {} is not one of WEFT_F32 (0), WEFT_F16 (1), WEFT_BF16 (2)", call, dtype));
  return static_cast<dev::DType>(dtype);
}

std::string text_or(const char* s, const char* fallback) { return s && *s ? std::string(s) : std::string(fallback); }

#ifdef WEFT_HAVE_CUDA
bool stream_capturing(const Backend& b, void* stream) {
  if (b.kind() != BackendKind::kNccl) return false;
  cudaStreamCaptureStatus st = cudaStreamCaptureStatusNone;
  WEFT_CUDA_CHECK(cudaStreamIsCapturing(static_cast<cudaStream_t>(stream), &st));
  return st != cudaStreamCaptureStatusNone;
}
#else
bool stream_capturing(const Backend&, void*) { return false; }
#endif

}  // namespace

struct weft_world {
  std::unique_ptr<Backend> backend;
  std::set<uint64_t> blocks;  // weft_alloc's owners not yet freed
  int live_ops = 0;           // weft_coll / weft_gemm / weft_gemv objects not yet destroyed

  bool contains(const void* ptr, uint64_t bytes, uint64_t* offset) const {
    const auto base = reinterpret_cast<uintptr_t>(backend->local_ptr(0));
    const auto p = reinterpret_cast<uintptr_t>(ptr);
    const uint64_t cap = backend->heap().capacity();
    if (!ptr || p < base || p - base >= cap || bytes > cap - (p - base)) return false;
    if (offset) *offset = p - base;
    return true;
  }
};

// Output staging per (collective, count, dtype): decided at the shape's first call, in which
// every rank says whether its output lies outside the heap; when any does, every rank
// allocates the staging (an allocation is collective: one rank cannot make it alone).
struct Staging {
  bool staged = false;
  uint64_t offset = 0;
};

struct weft_coll {
  weft_world* w = nullptr;
  std::unique_ptr<ops::Collectives> ops;
  uint64_t owner = 0;  // the staging's heap owner
  std::map<std::tuple<std::string, uint64_t, int>, Staging> staging;
};

struct weft_gemm {
  weft_world* w = nullptr;
  std::unique_ptr<ops::GemmOverlap> op;
};

struct weft_gemv {
  weft_world* w = nullptr;
  std::unique_ptr<ops::GemvAllReduce> op;
};

struct weft_moe {
  weft_world* w = nullptr;
  std::unique_ptr<ops::MoeDispatchCombine> op;
};

struct weft_moe_layer {
  weft_world* w = nullptr;
  std::unique_ptr<ops::MoeLayer> op;
};

struct weft_embedding_a2a {
  weft_world* w = nullptr;
  std::unique_ptr<ops::EmbeddingA2A> op;
  std::vector<ops::EmbeddingBagInput> in;      // the calls' tables, converted (kept: no allocation per call)
  std::vector<ops::EmbeddingTableGrad> grads;  // backward's sinks, converted
};

namespace {

// The staging of this shape; `need`: this rank's output is outside the heap. The first call of
// a shape is collective (an exchange, maybe an allocation) and refused during capture.
uint64_t staging_for(weft_coll* c, const char* coll, uint64_t count, dev::DType t, uint64_t bytes, bool need,
                     bool always, void* stream) {
  Backend& b = *c->w->backend;
  auto key = std::make_tuple(std::string(coll), count, static_cast<int>(t));
  auto it = c->staging.find(key);
  if (it == c->staging.end()) {
    require_arg(!stream_capturing(b, stream),
                fmt::format("{} of {} {} elements is captured before its first call: make one call of this shape "
                            "outside the capture, or weft_coll_prepare it (it allocates the call's symmetric state)",
                            coll, count, dev::dtype_name(t)));
    // Every rank says what it calls and whether it needs staging: ranks that disagree on the
    // call hear it here (naming both) instead of in a mismatched allocation.
    struct Line {
      char call[120];
      int32_t need;
    } mine{};
    std::snprintf(mine.call, sizeof mine.call, "%s of %llu %s elements", coll, static_cast<unsigned long long>(count),
                  dev::dtype_name(t));
    mine.need = need || always;
    std::vector<Line> all(static_cast<size_t>(b.size()));
    b.bootstrap().allgather(&mine, sizeof mine, all.data());
    bool any = false;
    for (int r = 0; r < b.size(); ++r) {
      const Line& l = all[static_cast<size_t>(r)];
      require_arg(std::strncmp(l.call, mine.call, sizeof mine.call) == 0,
                  fmt::format("collectives: ranks disagree on the call: rank {} has {}, rank {} has {}", b.rank(),
                              mine.call, r, std::string(l.call, strnlen(l.call, sizeof l.call))));
      any = any || l.need;
    }
    Staging s;
    if (any) {
      SymmetricHeap::Scope scope(b.heap(), c->owner);
      s.offset = b.heap().alloc_bytes(bytes, fmt::format("c_api.staging.{}.{}.{}", coll, count, dev::dtype_name(t)));
      s.staged = true;
    }
    it = c->staging.emplace(key, s).first;
  }
  if (need)
    require_arg(it->second.staged,
                fmt::format("{} of {} {} elements: this rank's output is outside the symmetric heap, but at the first "
                            "call of this shape every rank's output was in it, so no staging was allocated: call "
                            "weft_coll_prepare for the shape first (it always allocates the staging), or keep the "
                            "outputs of one shape either symmetric or not",
                            coll, count, dev::dtype_name(t)));
  return it->second.offset;
}

void copy_out(Backend& b, void* dst, uint64_t offset, uint64_t bytes, void* stream) {
  if (bytes == 0) return;
#ifdef WEFT_HAVE_CUDA
  if (b.kind() == BackendKind::kNccl) {
    WEFT_CUDA_CHECK(cudaMemcpyAsync(dst, b.local_ptr(offset), bytes, cudaMemcpyDeviceToDevice,
                                    static_cast<cudaStream_t>(stream)));
    return;
  }
#endif
  (void)stream;
  std::memcpy(dst, b.local_ptr(offset), bytes);
}

weft_coll* check_coll(weft_coll* c) {
  require_arg(c != nullptr && c->ops != nullptr, "collectives: the weft_coll handle is null");
  return c;
}

void check_ptr(const void* p, const char* call, const char* what) {
  require_arg(p != nullptr, fmt::format("{}: {} is a null pointer", call, what));
}

// all_gather / all_to_all: out[world][count], any memory.
void exchange_into_any(weft_coll* c, const char* coll, const void* in, void* out, uint64_t count, int dtype,
                       const char* method, void* stream) {
  check_coll(c);
  const dev::DType t = to_dtype(dtype, coll);
  const ops::Method m = ops::parse_method(text_or(method, "auto"));
  Backend& b = *c->w->backend;
  const bool gather = std::strcmp(coll, "all_gather") == 0;
  if (count == 0) {  // a no-op (the op still agrees on the call where the backend does)
    gather ? c->ops->all_gather(in, 0, 0, t, m, stream) : c->ops->all_to_all(in, 0, 0, t, m, stream);
    return;
  }
  check_ptr(in, coll, "the input");
  check_ptr(out, coll, "the output");
  uint64_t bytes = 0;
  require_arg(!__builtin_mul_overflow(count, static_cast<uint64_t>(b.size()) * dev::dtype_size(t), &bytes),
              fmt::format("{}: {} elements x {} ranks overflows", coll, count, b.size()));
  uint64_t off = 0;
  if (c->w->contains(out, bytes, &off)) {
    gather ? c->ops->all_gather(in, off, count, t, m, stream) : c->ops->all_to_all(in, off, count, t, m, stream);
    return;
  }
  if (m == ops::Method::kBaseline) {  // NCCL (the host reference) writes plain memory
    gather ? c->ops->baseline_all_gather(in, out, count, t, stream)
           : c->ops->baseline_all_to_all(in, out, count, t, stream);
    return;
  }
  const uint64_t st = staging_for(c, coll, count, t, bytes, true, false, stream);
  gather ? c->ops->all_gather(in, st, count, t, m, stream) : c->ops->all_to_all(in, st, count, t, m, stream);
  copy_out(b, out, st, bytes, stream);
}

}  // namespace

// ---- library ------------------------------------------------------------------------------
WEFT_API const char* weft_last_error(void) { return g_last_error.c_str(); }
WEFT_API int weft_api_version(void) { return WEFT_C_API_VERSION; }
WEFT_API const char* weft_version(void) { return weft::kVersion; }
WEFT_API int weft_has_cuda(void) {
#ifdef WEFT_HAVE_CUDA
  return 1;
#else
  return 0;
#endif
}

// ---- world --------------------------------------------------------------------------------
WEFT_API int weft_world_create(const weft_world_options* opt, weft_world** out) {
  return guard([&] {
    require_arg(opt != nullptr && out != nullptr, "weft_world_create: opt and out must not be null");
    *out = nullptr;
    require_arg(opt->size >= 1 && opt->rank >= 0 && opt->rank < opt->size,
                fmt::format("weft_world_create: rank {} of a world of {}: need 0 <= rank < size", opt->rank,
                            opt->size));
    const int local_size = opt->local_size == 0 ? opt->size : opt->local_size;
    require_arg(local_size >= 1 && local_size <= opt->size && opt->local_rank >= 0 && opt->local_rank < local_size,
                fmt::format("weft_world_create: local rank {} of {} on a node (world of {}): need 0 <= local_rank < "
                            "local_size <= size",
                            opt->local_rank, local_size, opt->size));
    require_arg(opt->heap_mib >= 0 && opt->timeout_ms >= 0,
                fmt::format("weft_world_create: heap_mib {} and timeout_ms {} must not be negative", opt->heap_mib,
                            opt->timeout_ms));
    require_arg(opt->allgather != nullptr || opt->size == 1,
                fmt::format("weft_world_create: a world of {} ranks needs the caller's allgather (NULL: only a world "
                            "of one)",
                            opt->size));
    World w;
    w.rank = opt->rank;
    w.size = opt->size;
    w.local_rank = opt->local_rank;
    w.local_size = local_size;
    w.node = opt->rank / local_size;
    w.source = "caller";

    // The tunables come from the environment; the options replace theirs.
    EnvMap env = current_env();
    const std::string backend = text_or(opt->backend, "");
    if (!backend.empty()) env["WEFT_BACKEND"] = backend;
    // A host world never touches CUDA (count_gpus initialises it).
    const bool host = env_get(env, "WEFT_BACKEND").value_or("") == "host";
    const BackendKind kind = resolve_backend(env, host ? 0 : count_gpus());
    if (opt->heap_mib > 0)
      env[kind == BackendKind::kHost ? tunables::kHostHeapMiB.env : tunables::kGpuHeapMiB.env] =
          std::to_string(opt->heap_mib);
    if (opt->timeout_ms > 0) env[tunables::kTimeoutMs.env] = std::to_string(opt->timeout_ms);
    validate_tunables(env);

    int device = -1;
#ifdef WEFT_HAVE_CUDA
    if (kind == BackendKind::kNccl) {
      device = opt->device;
      if (device < 0) WEFT_CUDA_CHECK(cudaGetDevice(&device));
    }
#endif
    std::unique_ptr<Bootstrap> bs = opt->allgather
                                        ? std::unique_ptr<Bootstrap>(std::make_unique<CallbackBootstrap>(
                                              w, reinterpret_cast<AllgatherCallback>(opt->allgather), opt->user))
                                        : make_bootstrap(w, env);
    auto world = std::make_unique<weft_world>();
    world->backend = make_backend(w, env, std::move(bs), kind, device);
    *out = world.release();
  });
}

WEFT_API int weft_world_destroy(weft_world* w) {
  return guard([&] {
    if (!w) return;
    require_arg(w->live_ops == 0, fmt::format("weft_world_destroy: {} op object(s) of this world are still alive: "
                                              "destroy them first",
                                              w->live_ops));
    delete w;
  });
}

WEFT_API int weft_world_info(const weft_world* w, int* rank, int* size, int* backend_kind) {
  return guard([&] {
    require_arg(w != nullptr, "weft_world_info: the world is null");
    if (rank) *rank = w->backend->rank();
    if (size) *size = w->backend->size();
    if (backend_kind) *backend_kind = w->backend->kind() == BackendKind::kHost ? WEFT_BACKEND_HOST : WEFT_BACKEND_NCCL;
  });
}

WEFT_API int weft_world_synchronize(weft_world* w) {
  return guard([&] {
    require_arg(w != nullptr, "weft_world_synchronize: the world is null");
    w->backend->synchronize();
  });
}

WEFT_API int weft_world_barrier(weft_world* w) {
  return guard([&] {
    require_arg(w != nullptr, "weft_world_barrier: the world is null");
    w->backend->barrier();
  });
}

// ---- symmetric memory ---------------------------------------------------------------------
WEFT_API int weft_alloc(weft_world* w, uint64_t bytes, uint64_t* handle, uint64_t* offset, void** ptr) {
  return guard([&] {
    require_arg(w != nullptr && handle != nullptr, "weft_alloc: the world and handle must not be null");
    SymmetricHeap& h = w->backend->heap();
    const uint64_t owner = h.new_owner();
    uint64_t off = 0;
    {
      SymmetricHeap::Scope scope(h, owner);
      off = h.alloc_bytes(bytes, "c_api.alloc");  // collective, zeroed
    }
    w->blocks.insert(owner);
    *handle = owner;
    if (offset) *offset = off;
    if (ptr) *ptr = w->backend->local_ptr(off);
  });
}

WEFT_API int weft_free(weft_world* w, uint64_t handle) {
  return guard([&] {
    require_arg(w != nullptr, "weft_free: the world is null");
    require_arg(w->blocks.count(handle) == 1,
                fmt::format("weft_free: handle {} is not a live block of this world (freed twice?)", handle));
    // The block's last use may still be running on this rank's streams.
    w->backend->synchronize();
    w->backend->heap().release(handle);
    w->blocks.erase(handle);
  });
}

WEFT_API int weft_heap_info(const weft_world* w, uint64_t* capacity, uint64_t* used) {
  return guard([&] {
    require_arg(w != nullptr, "weft_heap_info: the world is null");
    if (capacity) *capacity = w->backend->heap().capacity();
    if (used) *used = w->backend->heap().in_use();
  });
}

WEFT_API int weft_heap_contains(const weft_world* w, const void* ptr, uint64_t bytes, uint64_t* offset) {
  if (!w) return 0;
  return w->contains(ptr, bytes, offset) ? 1 : 0;
}

// ---- collectives --------------------------------------------------------------------------
WEFT_API int weft_coll_create(weft_world* w, weft_coll** out) {
  return guard([&] {
    require_arg(w != nullptr && out != nullptr, "weft_coll_create: the world and out must not be null");
    auto c = std::make_unique<weft_coll>();
    c->w = w;
    c->owner = w->backend->heap().new_owner();
    c->ops = std::make_unique<ops::Collectives>(*w->backend);
    *out = c.release();
    ++w->live_ops;
  });
}

WEFT_API int weft_coll_destroy(weft_coll* c) {
  return guard([&] {
    if (!c) return;
    std::unique_ptr<weft_coll> own(c);
    --c->w->live_ops;
    c->ops.reset();  // synchronises, releases its own state
    if (!c->staging.empty()) {
      c->w->backend->synchronize();  // the last copy out of the staging
      c->w->backend->heap().release(c->owner);
    }
  });
}

WEFT_API int weft_all_reduce(weft_coll* c, const void* in, void* out, uint64_t count, int dtype, const char* method,
                             void* stream) {
  return guard([&] {
    check_coll(c);
    const dev::DType t = to_dtype(dtype, "all_reduce");
    const ops::Method m = ops::parse_method(text_or(method, "auto"));
    c->ops->all_reduce(in, out, count, t, m, stream);
  });
}

WEFT_API int weft_all_gather(weft_coll* c, const void* in, void* out, uint64_t count, int dtype, const char* method,
                             void* stream) {
  return guard([&] { exchange_into_any(c, "all_gather", in, out, count, dtype, method, stream); });
}

WEFT_API int weft_reduce_scatter(weft_coll* c, const void* in, void* out, uint64_t count, int dtype,
                                 const char* method, void* stream) {
  return guard([&] {
    check_coll(c);
    const dev::DType t = to_dtype(dtype, "reduce_scatter");
    const ops::Method m = ops::parse_method(text_or(method, "auto"));
    c->ops->reduce_scatter(in, out, count, t, m, stream);
  });
}

WEFT_API int weft_all_to_all(weft_coll* c, const void* in, void* out, uint64_t count, int dtype, const char* method,
                             void* stream) {
  return guard([&] { exchange_into_any(c, "all_to_all", in, out, count, dtype, method, stream); });
}

WEFT_API int weft_all_to_all_v(weft_coll* c, const void* in, const uint64_t* send_counts, void* out,
                               uint64_t out_capacity, uint64_t* recv_counts, int dtype, const char* method,
                               void* stream) {
  return guard([&] {
    check_coll(c);
    const dev::DType t = to_dtype(dtype, "all_to_all_v");
    const ops::Method m = ops::parse_method(text_or(method, "auto"));
    check_ptr(send_counts, "all_to_all_v", "send_counts");
    check_ptr(recv_counts, "all_to_all_v", "recv_counts");
    check_ptr(out, "all_to_all_v", "the output");
    Backend& b = *c->w->backend;
    uint64_t bytes = 0;
    require_arg(!__builtin_mul_overflow(out_capacity, dev::dtype_size(t), &bytes),
                fmt::format("all_to_all_v: an output of {} elements overflows", out_capacity));
    uint64_t off = 0;
    if (c->w->contains(out, bytes, &off)) {
      c->ops->all_to_all_v(in, send_counts, off, out_capacity, recv_counts, t, m, stream);
      return;
    }
    const uint64_t st = staging_for(c, "all_to_all_v", out_capacity, t, bytes, true, false, stream);
    c->ops->all_to_all_v(in, send_counts, st, out_capacity, recv_counts, t, m, stream);
    copy_out(b, out, st, bytes, stream);  // the whole capacity: the counts are on the device
  });
}

WEFT_API int weft_coll_prepare(weft_coll* c, const char* collective, uint64_t count, int dtype, const char* method) {
  return guard([&] {
    check_coll(c);
    require_arg(collective != nullptr, "weft_coll_prepare: the collective's name is null");
    const std::string coll = collective;
    const dev::DType t = to_dtype(dtype, "weft_coll_prepare");
    const ops::Method m = ops::parse_method(text_or(method, "auto"));
    const uint64_t world = static_cast<uint64_t>(c->w->backend->size());
    if (coll == "all_reduce") return c->ops->prepare_all_reduce(count, t, m);
    if (coll == "reduce_scatter") return c->ops->prepare_reduce_scatter(count, t, m);
    const bool a2av = coll == "all_to_all_v";
    require_arg(coll == "all_gather" || coll == "all_to_all" || a2av,
                fmt::format("weft_coll_prepare: unknown collective '{}': expected all_reduce, all_gather, "
                            "reduce_scatter, all_to_all or all_to_all_v",
                            coll));
    if (coll == "all_gather") c->ops->prepare_all_gather(count, t, m);
    if (coll == "all_to_all") c->ops->prepare_all_to_all(count, t, m);
    if (a2av) c->ops->prepare_all_to_all_v(count, t, m);
    // The output staging (unless the baseline, which writes plain memory; all_to_all_v's
    // baseline writes the heap too).
    if (count == 0 || (m == ops::Method::kBaseline && !a2av)) return;
    uint64_t bytes = 0;
    require_arg(!__builtin_mul_overflow(count, (a2av ? 1 : world) * dev::dtype_size(t), &bytes),
                fmt::format("weft_coll_prepare: {} of {} elements overflows", coll, count));
    staging_for(c, coll.c_str(), count, t, bytes, false, true, nullptr);
  });
}

// ---- GEMM + communication -----------------------------------------------------------------
WEFT_API int weft_gemm_create(weft_world* w, const weft_gemm_config* cfg, weft_gemm** out) {
  return guard([&] {
    require_arg(w != nullptr && cfg != nullptr && out != nullptr,
                "weft_gemm_create: the world, config and out must not be null");
    require_arg(cfg->op != nullptr, "weft_gemm_create: config.op is null (ag_gemm, gemm_rs or gemm_ar)");
    ops::GemmOverlapConfig oc;
    oc.op = ops::parse_gemm_op(cfg->op);
    oc.m = cfg->m;
    oc.n = cfg->n;
    oc.k = cfg->k;
    oc.dtype = to_dtype(cfg->dtype, "weft_gemm_create");
    oc.b_layout = ops::parse_b_layout(text_or(cfg->b_layout, "nk"));
    oc.chunks = cfg->chunks;
    require_arg(cfg->n_m_buckets >= 0 && (cfg->n_m_buckets == 0 || cfg->m_buckets != nullptr),
                fmt::format("weft_gemm_create: {} m_buckets at {}", cfg->n_m_buckets,
                            static_cast<const void*>(cfg->m_buckets)));
    oc.m_buckets.assign(cfg->m_buckets, cfg->m_buckets + cfg->n_m_buckets);
    auto g = std::make_unique<weft_gemm>();
    g->w = w;
    g->op = std::make_unique<ops::GemmOverlap>(*w->backend, oc);
    *out = g.release();
    ++w->live_ops;
  });
}

WEFT_API int weft_gemm_destroy(weft_gemm* g) {
  return guard([&] {
    if (!g) return;
    std::unique_ptr<weft_gemm> own(g);
    --g->w->live_ops;
  });
}

WEFT_API int weft_gemm_run_gathered(weft_gemm* g, const void* a, const void* b, void* c, int64_t m,
                                    const char* method, void* stream, void* gathered_a) {
  return guard([&] {
    require_arg(g != nullptr, "weft_gemm_run: the weft_gemm handle is null");
    const char* op = ops::to_string(g->op->config().op);
    check_ptr(a, op, "A");
    check_ptr(b, op, "B");
    check_ptr(c, op, "C");
    ops::GemmRunOptions o;
    o.method = ops::parse_gemm_method(text_or(method, "auto"));
    o.m = m;
    o.stream = stream;
    o.gathered_a = gathered_a;
    g->op->run(a, b, c, o);
  });
}

WEFT_API int weft_gemm_run(weft_gemm* g, const void* a, const void* b, void* c, int64_t m, const char* method,
                           void* stream) {
  return weft_gemm_run_gathered(g, a, b, c, m, method, stream, nullptr);
}

WEFT_API int weft_gemm_shapes(const weft_gemm* g, int64_t m, int64_t* a_rows, int64_t* a_cols, int64_t* b_rows,
                              int64_t* b_cols, int64_t* c_rows, int64_t* c_cols) {
  return guard([&] {
    require_arg(g != nullptr, "weft_gemm_shapes: the weft_gemm handle is null");
    const ops::GemmOverlap& op = *g->op;
    require_arg(m >= 0 && m <= op.config().m,
                fmt::format("weft_gemm_shapes: M = {} outside [0, {}] (0: the configured M)", m, op.config().m));
    if (a_rows) *a_rows = op.a_rows(m);
    if (a_cols) *a_cols = op.a_cols();
    if (b_rows) *b_rows = op.b_rows();
    if (b_cols) *b_cols = op.b_cols();
    if (c_rows) *c_rows = op.c_rows(m);
    if (c_cols) *c_cols = op.c_cols();
  });
}

WEFT_API int weft_gemm_auto_method(const weft_gemm* g, int64_t m, const char** method) {
  return guard([&] {
    require_arg(g != nullptr && method != nullptr, "weft_gemm_auto_method: the handle and method must not be null");
    *method = ops::to_string(m == 0 ? g->op->auto_choice().method : g->op->auto_choice(m).method);
  });
}

// ---- GEMV + AllReduce -------------------------------------------------------------------------
WEFT_API int weft_gemv_create(weft_world* w, const weft_gemv_config* cfg, weft_gemv** out) {
  return guard([&] {
    require_arg(w != nullptr && cfg != nullptr && out != nullptr,
                "weft_gemv_create: the world, config and out must not be null");
    ops::GemvArConfig oc;
    oc.n = cfg->n;
    oc.k = cfg->k;
    oc.m_max = cfg->m_max == 0 ? ops::kGemvMaxM : cfg->m_max;
    oc.dtype = to_dtype(cfg->dtype, "weft_gemv_create");
    oc.epilogue = cfg->epilogue != 0;
    if (cfg->eps != 0) oc.eps = cfg->eps;
    require_arg(std::isfinite(oc.eps) && oc.eps > 0,
                fmt::format("weft_gemv_create: eps {} must be a positive number", oc.eps));
    auto g = std::make_unique<weft_gemv>();
    g->w = w;
    g->op = std::make_unique<ops::GemvAllReduce>(*w->backend, oc);
    *out = g.release();
    ++w->live_ops;
  });
}

WEFT_API int weft_gemv_destroy(weft_gemv* g) {
  return guard([&] {
    if (!g) return;
    std::unique_ptr<weft_gemv> own(g);
    --g->w->live_ops;
  });
}

WEFT_API int weft_gemv_run(weft_gemv* g, const void* x, const void* w, void* y, int64_t m, const char* method,
                           const void* residual, const void* gamma, void* residual_out, void* stream) {
  return guard([&] {
    require_arg(g != nullptr, "weft_gemv_run: the weft_gemv handle is null");
    check_ptr(x, "gemv_ar", "x");
    check_ptr(w, "gemv_ar", "w");
    check_ptr(y, "gemv_ar", "y");
    ops::GemvRunOptions o;
    o.method = ops::parse_gemv_method(text_or(method, "auto"));
    o.m = m;
    o.residual = residual;
    o.gamma = gamma;
    o.residual_out = residual_out;
    o.stream = stream;
    g->op->run(x, w, y, o);
  });
}

WEFT_API int weft_gemv_auto_method(const weft_gemv* g, int64_t m, const char** method) {
  return guard([&] {
    require_arg(g != nullptr && method != nullptr, "weft_gemv_auto_method: the handle and method must not be null");
    const int64_t m_max = g->op->config().m_max;
    require_arg(m >= 0 && m <= m_max,
                fmt::format("weft_gemv_auto_method: M = {} outside [0, {}] (0: m_max)", m, m_max));
    *method = ops::to_string(g->op->auto_choice(m == 0 ? m_max : m).method);
  });
}

// ---- MoE token exchange -------------------------------------------------------------------------
namespace {
ops::MoeConfig moe_config(const weft_moe_config& c, const char* fn) {
  ops::MoeConfig oc;
  oc.hidden = c.hidden;
  oc.experts = c.experts;
  oc.top_k = c.top_k;
  oc.max_tokens = c.max_tokens;
  oc.recv_capacity = c.recv_capacity;
  oc.dtype = to_dtype(c.dtype, fn);
  oc.check_ids = c.check_ids != 0;
  return oc;
}
}  // namespace

WEFT_API int weft_moe_create(weft_world* w, const weft_moe_config* cfg, weft_moe** out) {
  return guard([&] {
    require_arg(w != nullptr && cfg != nullptr && out != nullptr,
                "weft_moe_create: the world, config and out must not be null");
    auto m = std::make_unique<weft_moe>();
    m->w = w;
    m->op = std::make_unique<ops::MoeDispatchCombine>(*w->backend, moe_config(*cfg, "weft_moe_create"));
    *out = m.release();
    ++w->live_ops;
  });
}

WEFT_API int weft_moe_destroy(weft_moe* m) {
  return guard([&] {
    if (!m) return;
    std::unique_ptr<weft_moe> own(m);
    --m->w->live_ops;
  });
}

WEFT_API int weft_moe_dispatch(weft_moe* m, const void* x, const int32_t* ids, int64_t tokens, const char* method,
                               void* stream) {
  return guard([&] {
    require_arg(m != nullptr, "weft_moe_dispatch: the weft_moe handle is null");
    m->op->dispatch(x, ids, {.method = ops::parse_moe_method(text_or(method, "auto")), .tokens = tokens, .stream = stream});
  });
}

WEFT_API int weft_moe_combine(weft_moe* m, const void* expert_out, const float* weights, void* y, int64_t tokens,
                              const char* method, void* stream) {
  return guard([&] {
    require_arg(m != nullptr, "weft_moe_combine: the weft_moe handle is null");
    m->op->combine(expert_out, weights, y,
                   {.method = ops::parse_moe_method(text_or(method, "auto")), .tokens = tokens, .stream = stream});
  });
}

WEFT_API int weft_moe_buffers(const weft_moe* m, const void** recv, const int64_t** recv_counts,
                              int64_t* recv_capacity, int64_t* local_experts) {
  return guard([&] {
    require_arg(m != nullptr, "weft_moe_buffers: the weft_moe handle is null");
    if (recv) *recv = m->op->recv();
    if (recv_counts) *recv_counts = m->op->recv_counts();
    if (recv_capacity) *recv_capacity = m->op->recv_capacity();
    if (local_experts) *local_experts = m->op->local_experts();
  });
}

// ---- MoE layer ----------------------------------------------------------------------------------
WEFT_API int weft_moe_layer_create(weft_world* w, const weft_moe_config* cfg, int64_t ffn, weft_moe_layer** out) {
  return guard([&] {
    require_arg(w != nullptr && cfg != nullptr && out != nullptr,
                "weft_moe_layer_create: the world, config and out must not be null");
    ops::MoeLayerConfig lc;
    lc.moe = moe_config(*cfg, "weft_moe_layer_create");
    lc.ffn = ffn;
    auto m = std::make_unique<weft_moe_layer>();
    m->w = w;
    m->op = std::make_unique<ops::MoeLayer>(*w->backend, lc);
    *out = m.release();
    ++w->live_ops;
  });
}

WEFT_API int weft_moe_layer_destroy(weft_moe_layer* m) {
  return guard([&] {
    if (!m) return;
    std::unique_ptr<weft_moe_layer> own(m);
    --m->w->live_ops;
  });
}

WEFT_API int weft_moe_layer_forward(weft_moe_layer* m, const void* x, const int32_t* ids, const float* weights,
                                    const void* w_up, const void* w_down, void* y, int64_t tokens,
                                    const char* method, void* stream) {
  return guard([&] {
    require_arg(m != nullptr, "weft_moe_layer_forward: the weft_moe_layer handle is null");
    const ops::MoeLayerMethod how = ops::parse_moe_layer_method(text_or(method, "auto"));
    m->op->forward(x, ids, weights, w_up, w_down, y, {.method = how, .tokens = tokens, .stream = stream});
  });
}

// ---- Embedding-bag lookups + all-to-all -------------------------------------------------------
namespace {
ops::EmbeddingPooling parse_pooling(const std::string& s) {
  if (s == "sum") return ops::EmbeddingPooling::kSum;
  require_arg(s == "mean", fmt::format("embedding_a2a: unknown pooling '{}': expected sum or mean", s));
  return ops::EmbeddingPooling::kMean;
}

// The C tables into e->in: null tables stay null, reaching the op, which refuses them on every
// rank (a refusal here alone would leave the other ranks waiting).
const ops::EmbeddingBagInput* convert_tables(weft_embedding_a2a& e, const weft_embedding_bag* tables) {
  if (!tables) return nullptr;
  for (size_t t = 0; t < e.in.size(); ++t) {
    const weft_embedding_bag& b = tables[t];
    e.in[t] = {b.weight, b.offsets, b.indices, b.per_sample_weights, b.num_indices};
  }
  return e.in.data();
}
}  // namespace

WEFT_API int weft_embedding_a2a_create(weft_world* w, const weft_embedding_a2a_config* cfg, weft_embedding_a2a** out) {
  return guard([&] {
    require_arg(w != nullptr && cfg != nullptr && out != nullptr,
                "weft_embedding_a2a_create: the world, config and out must not be null");
    require_arg(cfg->n_tables >= 0 && (cfg->n_tables == 0 || (cfg->rows != nullptr && cfg->dims != nullptr)),
                fmt::format("weft_embedding_a2a_create: {} tables with rows at {} and dims at {}", cfg->n_tables,
                            static_cast<const void*>(cfg->rows), static_cast<const void*>(cfg->dims)));
    ops::EmbeddingA2AConfig oc;
    for (int64_t t = 0; t < cfg->n_tables; ++t) oc.tables.push_back({cfg->rows[t], cfg->dims[t]});
    oc.batch = cfg->batch;
    oc.weight_dtype = to_dtype(cfg->weight_dtype, "weft_embedding_a2a_create (weight_dtype)");
    oc.out_dtype = to_dtype(cfg->out_dtype, "weft_embedding_a2a_create (out_dtype)");
    oc.pooling = parse_pooling(text_or(cfg->pooling, "sum"));
    oc.check_indices = cfg->check_indices != 0;
    auto e = std::make_unique<weft_embedding_a2a>();
    e->w = w;
    e->op = std::make_unique<ops::EmbeddingA2A>(*w->backend, oc);
    e->in.resize(static_cast<size_t>(cfg->n_tables));
    e->grads.resize(static_cast<size_t>(cfg->n_tables));
    *out = e.release();
    ++w->live_ops;
  });
}

WEFT_API int weft_embedding_a2a_destroy(weft_embedding_a2a* e) {
  return guard([&] {
    if (!e) return;
    std::unique_ptr<weft_embedding_a2a> own(e);
    --e->w->live_ops;
  });
}

WEFT_API int weft_embedding_a2a_forward(weft_embedding_a2a* e, const weft_embedding_bag* tables, void* out,
                                        const char* method, void* stream) {
  return guard([&] {
    require_arg(e != nullptr, "weft_embedding_a2a_forward: the weft_embedding_a2a handle is null");
    const ops::EmbeddingA2AMethod how = ops::parse_embedding_a2a_method(text_or(method, "auto"));
    e->op->forward(convert_tables(*e, tables), out, {.method = how, .stream = stream});
  });
}

WEFT_API int weft_embedding_a2a_backward(weft_embedding_a2a* e, const weft_embedding_bag* tables, const void* grad_out,
                                         const weft_embedding_grad* grads, const char* kind, float lr, float eps,
                                         const char* method, void* stream) {
  return guard([&] {
    require_arg(e != nullptr, "weft_embedding_a2a_backward: the weft_embedding_a2a handle is null");
    ops::EmbeddingBackwardOptions o;
    o.method = ops::parse_embedding_a2a_method(text_or(method, "auto"));
    o.stream = stream;
    o.kind = ops::parse_embedding_grad_kind(text_or(kind, "dense"));
    o.lr = lr;
    o.eps = eps;
    // Null grads reach the op, as null tables do.
    for (size_t t = 0; grads && t < e->grads.size(); ++t)
      e->grads[t] = {grads[t].dense, grads[t].rows, grads[t].values, grads[t].count, grads[t].weight, grads[t].state};
    e->op->backward(convert_tables(*e, tables), grad_out, grads ? e->grads.data() : nullptr, o);
  });
}

WEFT_API int weft_embedding_a2a_layout(const weft_embedding_a2a* e, int64_t* total_dim, const int64_t** dims,
                                       int64_t* n_dims, int64_t* first_table, int64_t* local_dim) {
  return guard([&] {
    require_arg(e != nullptr, "weft_embedding_a2a_layout: the weft_embedding_a2a handle is null");
    const ops::EmbeddingA2A& op = *e->op;
    if (total_dim) *total_dim = op.total_dim();
    if (dims) *dims = op.dims().data();
    if (n_dims) *n_dims = static_cast<int64_t>(op.dims().size());
    if (first_table) *first_table = op.first_table();
    if (local_dim) *local_dim = op.local_dim();
  });
}
