// The collectives op: argument checks, the method choice (`auto` from model.cpp) and dispatch
// to the method objects (baseline.cpp, algorithms.cpp).
#include "weft/ops/collectives.hpp"

#include <fmt/format.h>

#include "collectives_impl.hpp"
#include "weft/core/error.hpp"

namespace weft::ops {

struct Collectives::Impl {
  explicit Impl(Backend& b) : share(b, "collectives"), op(b, "collectives"), baseline(op), algos(op) {
    op.set_share(&share);
  }

  detail::HeapShare share;  // first: destroyed last, after the method objects
  detail::OpBase op;
  detail::BaselineCollective baseline;
  detail::AlgoCollective algos;

  // Every call: recorded for the failure report (Backend::record_call: a few stores), then,
  // where the backend agrees on every call (host), the ranks agree on the collective, count,
  // type and method (an allgather of a line through shared memory), so a mismatch is reported
  // as one, naming both, on every rank -- not a wrong result on one and a timeout on another.
  // On GPUs the first call of each shape is agreed (AlgoCollective::args; a per-call exchange
  // would cost a host round trip and break CUDA-graph capture); a later call that differs
  // makes the waits time out, and the failure report names both calls from the records.
  void agree_call(const char* coll, uint64_t count, dev::DType t, Method m) const {
    op.backend().record_call(coll, to_string(m), count, static_cast<int32_t>(t), false);
    if (!op.backend().agrees_every_call() || op.world() < 2) return;
    op.agree("the call", fmt::format("{} of {} {} elements, method {}", coll, count, dev::dtype_name(t), to_string(m)));
  }
  void check_pointer(const void* p, dev::DType t, const char* what) const {
    op.check_ptr(p, dev::dtype_size(t), what,
                 fmt::format("its element size ({} bytes for {})", dev::dtype_size(t), dev::dtype_name(t)));
  }
  void check_symmetric_out(uint64_t out_off, uint64_t elems, dev::DType t, const char* what) const {
    WEFT_REQUIRE(out_off % dev::dtype_size(t) == 0,
                 fmt::format("{} output offset is not aligned to its element size", what));
    WEFT_REQUIRE(out_off + elems * dev::dtype_size(t) <= op.backend().heap().used(),
                 fmt::format("{} output is not a symmetric allocation (or too small for {} elements)", what, elems));
  }
  // `m` must be one of `allowed` (auto already resolved).
  static void check_method(Method m, std::initializer_list<Method> allowed, const char* call) {
    for (Method a : allowed)
      if (m == a) return;
    throw_invalid(__FILE__, __LINE__, fmt::format("{} has no method '{}'", call, to_string(m)));
  }
  void run_algo(coll::Algo algo, uint64_t count, dev::DType t, void* stream, const void* in, void* out,
                uint64_t out_off) {
    coll::Args a = algos.args(algo, count, t, stream);
    a.in = in;
    a.out = out;
    a.out_off = out_off;
    algos.run(a, t, stream);
  }
};

namespace {
coll::Algo all_reduce_algo(Method m) {
  Collectives::Impl::check_method(
      m, {Method::kOneShot, Method::kTwoShot, Method::kLowLatency, Method::kLowLatency128}, "all_reduce");
  return m == Method::kOneShot         ? coll::Algo::kAllReduceOneShot
         : m == Method::kTwoShot       ? coll::Algo::kAllReduceTwoShot
         : m == Method::kLowLatency128 ? coll::Algo::kAllReduceLL128
                                       : coll::Algo::kAllReduceLL;
}
}  // namespace

Collectives::Collectives(Backend& b) : impl_(std::make_unique<Impl>(b)) {}
Collectives::~Collectives() = default;

Method Collectives::auto_all_reduce(uint64_t bytes) const { return detail::auto_all_reduce(bytes, impl_->op.world()); }

Method Collectives::auto_exchange(uint64_t bytes_to_peers) const { return detail::auto_exchange(bytes_to_peers); }

void Collectives::baseline_all_gather(const void* in, void* out, uint64_t count, dev::DType t, void* stream) {
  impl_->op.guarded([&] {
    impl_->agree_call("all_gather", count, t, Method::kBaseline);
    if (count == 0) return;
    impl_->check_pointer(in, t, "all_gather input");
    impl_->check_pointer(out, t, "all_gather output");
    impl_->baseline.run(coll::Algo::kAllGather, in, out, count, t, stream);
  });
}

void Collectives::baseline_all_to_all(const void* in, void* out, uint64_t count, dev::DType t, void* stream) {
  impl_->op.guarded([&] {
    impl_->agree_call("all_to_all", count, t, Method::kBaseline);
    if (count == 0) return;
    impl_->check_pointer(in, t, "all_to_all input");
    impl_->check_pointer(out, t, "all_to_all output");
    impl_->baseline.run(coll::Algo::kAllToAll, in, out, count, t, stream);
  });
}

void Collectives::all_to_all_v(const void* in, const uint64_t* send_counts, uint64_t out_off, uint64_t out_capacity,
                               uint64_t* recv_counts, dev::DType t, Method m, void* stream) {
  impl_->op.guarded([&] {
    Impl& I = *impl_;
    WEFT_REQUIRE(send_counts && recv_counts, "all_to_all_v: send_counts and recv_counts must not be null");
    I.agree_call("all_to_all_v (output capacity)", out_capacity, t, m);
    I.check_symmetric_out(out_off, out_capacity, t, "all_to_all_v");
    if (m == Method::kBaseline)
      return I.baseline.all_to_all_v(in, send_counts, out_off, out_capacity, recv_counts, t, stream);
    Impl::check_method(m, {Method::kAuto, Method::kDirect}, "all_to_all_v");
    coll::Args a = I.algos.args(coll::Algo::kAllToAllV, out_capacity, t, stream);
    a.in = in;
    a.out_off = out_off;
    a.send_counts = send_counts;
    a.recv_counts = recv_counts;
    a.out_capacity = out_capacity;
    I.algos.run(a, t, stream);
  });
}

void Collectives::all_reduce(const void* in, void* out, uint64_t count, dev::DType t, Method m, void* stream) {
  impl_->op.guarded([&] {
    Impl& I = *impl_;
    I.agree_call("all_reduce", count, t, m);
    if (count == 0) return;
    I.check_pointer(in, t, "all_reduce input");
    I.check_pointer(out, t, "all_reduce output");
    if (m == Method::kAuto) m = auto_all_reduce(count * dev::dtype_size(t));
    if (m == Method::kBaseline) return I.baseline.run(coll::Algo::kAllReduceOneShot, in, out, count, t, stream);
    I.run_algo(all_reduce_algo(m), count, t, stream, in, out, 0);
  });
}

void Collectives::prepare_all_reduce(uint64_t count, dev::DType t, Method m) {
  if (count == 0) return;
  Impl& I = *impl_;
  if (m == Method::kAuto) m = auto_all_reduce(count * dev::dtype_size(t));
  if (m == Method::kBaseline) return;
  I.algos.args(all_reduce_algo(m), count, t, nullptr);
}

namespace {
// all-gather, reduce-scatter, all-to-all: the algorithm `m` runs (auto resolved as the calls do).
coll::Algo exchange_algo(const Collectives& c, Method m, uint64_t count, dev::DType t, int world, const char* call,
                         coll::Algo direct, coll::Algo ll) {
  if (m == Method::kAuto) m = c.auto_exchange(count * dev::dtype_size(t) * static_cast<uint64_t>(world - 1));
  Collectives::Impl::check_method(m, {Method::kDirect, Method::kLowLatency}, call);
  return m == Method::kDirect ? direct : ll;
}
}  // namespace

void Collectives::prepare_all_gather(uint64_t count, dev::DType t, Method m) {
  if (count == 0 || m == Method::kBaseline) return;
  impl_->algos.args(exchange_algo(*this, m, count, t, impl_->op.world(), "all_gather", coll::Algo::kAllGather,
                                  coll::Algo::kAllGatherLL),
                    count, t, nullptr);
}

void Collectives::prepare_reduce_scatter(uint64_t count, dev::DType t, Method m) {
  if (count == 0 || m == Method::kBaseline) return;
  impl_->algos.args(exchange_algo(*this, m, count, t, impl_->op.world(), "reduce_scatter",
                                  coll::Algo::kReduceScatter, coll::Algo::kReduceScatterLL),
                    count, t, nullptr);
}

void Collectives::prepare_all_to_all(uint64_t count, dev::DType t, Method m) {
  if (count == 0 || m == Method::kBaseline) return;
  impl_->algos.args(exchange_algo(*this, m, count, t, impl_->op.world(), "all_to_all", coll::Algo::kAllToAll,
                                  coll::Algo::kAllToAllLL),
                    count, t, nullptr);
}

void Collectives::prepare_all_to_all_v(uint64_t out_capacity, dev::DType t, Method m) {
  if (m == Method::kBaseline) return;
  Impl::check_method(m, {Method::kAuto, Method::kDirect}, "all_to_all_v");
  impl_->algos.args(coll::Algo::kAllToAllV, out_capacity, t, nullptr);
}

void Collectives::all_gather(const void* in, uint64_t out_off, uint64_t count, dev::DType t, Method m, void* stream) {
  impl_->op.guarded([&] {
    Impl& I = *impl_;
    I.agree_call("all_gather", count, t, m);
    if (count == 0) return;
    I.check_pointer(in, t, "all_gather input");
    I.check_symmetric_out(out_off, count * I.op.world(), t, "all_gather");
    if (m == Method::kBaseline)
      return I.baseline.run(coll::Algo::kAllGather, in, I.op.backend().local_ptr(out_off), count, t, stream);
    if (m == Method::kAuto) m = auto_exchange(count * dev::dtype_size(t) * static_cast<uint64_t>(I.op.world() - 1));
    Impl::check_method(m, {Method::kDirect, Method::kLowLatency}, "all_gather");
    I.run_algo(m == Method::kDirect ? coll::Algo::kAllGather : coll::Algo::kAllGatherLL, count, t, stream, in, nullptr,
               out_off);
  });
}

void Collectives::reduce_scatter(const void* in, void* out, uint64_t count, dev::DType t, Method m, void* stream) {
  impl_->op.guarded([&] {
    Impl& I = *impl_;
    I.agree_call("reduce_scatter", count, t, m);
    if (count == 0) return;
    I.check_pointer(in, t, "reduce_scatter input");
    I.check_pointer(out, t, "reduce_scatter output");
    if (m == Method::kBaseline) return I.baseline.run(coll::Algo::kReduceScatter, in, out, count, t, stream);
    if (m == Method::kAuto) m = auto_exchange(count * dev::dtype_size(t) * static_cast<uint64_t>(I.op.world() - 1));
    Impl::check_method(m, {Method::kDirect, Method::kLowLatency}, "reduce_scatter");
    I.run_algo(m == Method::kDirect ? coll::Algo::kReduceScatter : coll::Algo::kReduceScatterLL, count, t, stream, in,
               out, 0);
  });
}

void Collectives::all_to_all(const void* in, uint64_t out_off, uint64_t count, dev::DType t, Method m, void* stream) {
  impl_->op.guarded([&] {
    Impl& I = *impl_;
    I.agree_call("all_to_all", count, t, m);
    if (count == 0) return;
    I.check_pointer(in, t, "all_to_all input");
    I.check_symmetric_out(out_off, count * I.op.world(), t, "all_to_all");
    if (m == Method::kBaseline) return I.baseline.all_to_all_symmetric(in, out_off, count, t, stream);
    if (m == Method::kAuto) m = auto_exchange(count * dev::dtype_size(t) * static_cast<uint64_t>(I.op.world() - 1));
    Impl::check_method(m, {Method::kDirect, Method::kLowLatency}, "all_to_all");
    I.run_algo(m == Method::kDirect ? coll::Algo::kAllToAll : coll::Algo::kAllToAllLL, count, t, stream, in, nullptr,
               out_off);
  });
}

}  // namespace weft::ops
