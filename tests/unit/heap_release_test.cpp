// Issue 28 item 8: destroying an op returns its symmetric-heap space, so create/destroy loops
// do not exhaust the heap; the free list is first-fit, coalesced, and the same on every rank.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "gemm_overlap_check.hpp"
#include "rank_harness.hpp"
#include "weft/core/error.hpp"
#include "weft/ops/collectives.hpp"
#include "weft/ops/gemm_overlap.hpp"
#include "weft/runtime/heap.hpp"

using namespace weft;
using namespace weft::testing;

// Blocks of a released owner are taken again first-fit, neighbours coalesce, a free block at
// the top lowers it, and ranks that release differently are refused at their next allocation.
TEST(HeapRelease, FreeListIsFirstFitAndCoalesces) {
  expect_all_ok(run_host_ranks(2, [] {
    auto b = make_backend();
    SymmetricHeap& h = b->heap();
    const size_t base = h.used(), live = h.in_use();
    const uint64_t one = h.new_owner(), two = h.new_owner();
    uint64_t a = 0, c = 0, d = 0;
    {
      SymmetricHeap::Scope s(h, one);
      a = h.alloc_bytes(1000, "t.a");
    }
    {
      SymmetricHeap::Scope s(h, two);
      c = h.alloc_bytes(4096, "t.c");
    }
    {
      SymmetricHeap::Scope s(h, one);
      d = h.alloc_bytes(512, "t.d");
    }
    WEFT_CHECK(a < c && c < d, "allocations not in order");
    h.release(one);  // a and d go back; d was at the top
    WEFT_CHECK(h.used() == c + 4096, fmt::format("the top is {}, not the end of c {}", h.used(), c + 4096));
    const uint64_t three = h.new_owner();
    {
      SymmetricHeap::Scope s(h, three);
      WEFT_CHECK(h.alloc_bytes(900, "t.e") == a, "a's block is not taken first");
    }
    h.release(two);
    h.release(three);  // everything back: coalesced down to where it began
    WEFT_CHECK(h.used() == base && h.in_use() == live,
               fmt::format("heap at {} ({} in use), began at {} ({})", h.used(), h.in_use(), base, live));
    // A release that differs across ranks: the block is allocated on every rank, owned by
    // `four` on rank 0 only, so only rank 0 frees it; the next allocation is refused on every
    // rank, naming both offsets.
    const uint64_t four = h.new_owner();
    {
      SymmetricHeap::Scope s(h, b->rank() == 0 ? four : 0);
      h.alloc_bytes(256, "t.f");
    }
    h.release(four);
    std::string msg;
    try {
      h.alloc_bytes(128, "t.g");
    } catch (const InvalidArgument& e) {
      msg = e.what();
    }
    WEFT_CHECK(msg.find("disagrees across ranks") != std::string::npos,
               "an allocation after releases that differ across ranks was not refused: " + msg);
  }));
}

// Create, run and destroy ops many times on a heap that holds a few of them: the heap's top
// and live bytes come back to where they were after every op's destruction.
TEST(HeapRelease, DestroyedOpsReturnTheirSpace) {
  expect_all_ok(run_host_ranks(2, [] {
    auto b = make_backend();
    SymmetricHeap& h = b->heap();
    const size_t base = h.used(), live = h.in_use();
    const int rank = b->rank(), world = b->size();
    for (int i = 0; i < 40; ++i) {
      {
        ops::GemmOverlapConfig cfg = overlap_config({ops::GemmOp::kGemmAr, 64, 8 * world, 24});
        cfg.m_buckets = {7};
        ops::GemmOverlap op(*b, cfg);
        std::vector<uint16_t> a(static_cast<size_t>(op.a_rows() * op.a_cols())),
            w(static_cast<size_t>(op.b_rows() * op.b_cols())), c(static_cast<size_t>(op.c_rows() * op.c_cols()));
        for (ops::GemmMethod m : {ops::GemmMethod::kBaseline, ops::GemmMethod::kDecomposed, ops::GemmMethod::kFused}) {
          fill_overlap_inputs(op, rank, i + 1, /*sparse=*/false, a.data(), w.data());
          op.run(a.data(), w.data(), c.data(), {.method = m});
          check_overlap_output(op, c.data(), rank, world, i + 1, false, fmt::format("iteration {}", i));
        }
      }
      {
        ops::Collectives coll(*b);
        std::vector<uint16_t> x(4096, 0x3F80), y(4096);
        for (ops::Method m : {ops::Method::kOneShot, ops::Method::kTwoShot, ops::Method::kLowLatency})
          coll.all_reduce(x.data(), y.data(), x.size(), dev::DType::kBF16, m);
      }
      WEFT_CHECK(h.used() == base && h.in_use() == live,
                 fmt::format("after op {}: heap top {} ({} in use), began at {} ({})", i, h.used(), h.in_use(), base,
                             live));
    }
  }));
}
