#include <fmt/format.h>
#include <nccl.h>
#include <nccl_device.h>

#include <vector>

#include "weft/core/cuda_check.hpp"
#include "weft/core/error.hpp"
#include "weft/kernels/runtime_kernels.hpp"
#include "weft/runtime/nccl_backend.hpp"

namespace weft {
namespace {

class NcclBackend final : public Backend {
 public:
  NcclBackend(const World& w, const EnvMap& env, std::unique_ptr<Bootstrap> bs, int device)
      : Backend(BackendKind::kNccl, w, std::move(bs)) {
    ctx_.timeout_ns = static_cast<uint64_t>(tunable_value(tunables::kTimeoutMs, env)) * 1000000ull;
    const int gpus = count_gpus();
    if (device < 0) {
      check_local_ranks_fit(w, gpus);
      device_ = w.local_rank;
    } else {  // the caller's choice (the C API: a framework that already picked its device)
      WEFT_REQUIRE(device < gpus, fmt::format("rank {}: CUDA device {} asked for, but {} GPU(s) are visible", w.rank,
                                              device, gpus));
      device_ = device;
    }
    WEFT_CUDA_CHECK(cudaSetDevice(device_));
    cudaDeviceProp prop{};
    WEFT_CUDA_CHECK(cudaGetDeviceProperties(&prop, device_));
    name_ = prop.name;

    ncclUniqueId id{};
    if (w.rank == 0) WEFT_NCCL_CHECK(ncclGetUniqueId(&id));
    bootstrap_->broadcast(&id, sizeof id, 0);
    WEFT_NCCL_CHECK(ncclCommInitRank(&comm_, w.size, id, w.rank));

    // Load/store reach to every rank is what the device API assumes.
    ncclTeam_t lsa = ncclTeamLsa(comm_);
    WEFT_REQUIRE(lsa.nRanks == w.size,
                 fmt::format("the NCCL window is not symmetric over all ranks: rank {} reaches {} of {} ranks by "
                             "load/store (NVLink); weft's nccl backend needs peer access between every pair of GPUs "
                             "(GPUs without peer access, or several nodes: use WEFT_BACKEND=host for tests)",
                             w.rank, lsa.nRanks, w.size));

    const int64_t mib = tunable_value(tunables::kGpuHeapMiB, env);
    WEFT_REQUIRE(mib >= 1, fmt::format("{}={} must be at least 1", tunables::kGpuHeapMiB.env, mib));
    heap_bytes_ = static_cast<size_t>(mib) << 20;
    WEFT_NCCL_CHECK(ncclMemAlloc(&buf_, heap_bytes_));
    // The symmetric window and the device communicator are what weft's kernels address peers
    // through; NCCL refuses them where it has no symmetric-memory support (e.g. a machine
    // without CUDA VMM peer mappings): say so, and what to use instead, not only NCCL's words.
    auto symmetric = [&](ncclResult_t r, const char* what) {
      if (r == ncclSuccess) return;
      throw_error(__FILE__, __LINE__,
                  fmt::format("rank {}: NCCL could not {} ({}: {}); weft's nccl backend needs NCCL's "
                              "symmetric memory (NCCL >= 2.28 with CUDA VMM and peer access between the "
                              "GPUs); without it, WEFT_BACKEND=host runs the ops on the host for tests",
                              w.rank, what, ncclGetErrorString(r), ncclGetLastError(nullptr)));
    };
    symmetric(ncclCommWindowRegister(comm_, buf_, heap_bytes_, &win_, NCCL_WIN_COLL_SYMMETRIC),
              "register weft's heap as a symmetric window");
    ncclDevCommRequirements reqs{};
    reqs.lsaBarrierCount = 1;
    symmetric(ncclDevCommCreate(comm_, &reqs, &devcomm_), "create its device communicator");
    have_devcomm_ = true;

    WEFT_CUDA_CHECK(cudaHostAlloc(&slot_host_, sizeof(dev::ErrorSlot), cudaHostAllocMapped));
    *slot_host_ = dev::ErrorSlot{};
    WEFT_CUDA_CHECK(cudaHostGetDevicePointer(reinterpret_cast<void**>(&slot_dev_), slot_host_, 0));
    ctx_.error = slot_dev_;
    host_slot_ = slot_host_;

    char** bases_dev = nullptr;
    WEFT_CUDA_CHECK(cudaMalloc(&bases_dev, sizeof(char*) * w.size));
    WEFT_CUDA_CHECK(kernels::lsa_bases(win_, w.size, bases_dev, nullptr));
    std::vector<char*> bases(w.size);
    WEFT_CUDA_CHECK(cudaMemcpy(bases.data(), bases_dev, sizeof(char*) * w.size, cudaMemcpyDeviceToHost));
    WEFT_CUDA_CHECK(cudaFree(bases_dev));
    for (int p = 0; p < w.size; ++p) ctx_.peer_base[p] = bases[p];
    // peer_base[rank] is the window's own mapping of buf_ (another virtual address for the
    // same memory): kernels use the window's addresses, host copies use buf_. The symmetry
    // check below proves that the two agree.

    check_symmetry();
    init_heap(heap_bytes_);
  }

  ~NcclBackend() override {
    // After a failed wait the context is gone: abort instead of collective teardown.
    if (failed_) {
      if (comm_) ncclCommAbort(comm_);
      return;
    }
    if (have_devcomm_) ncclDevCommDestroy(comm_, &devcomm_);
    if (win_) ncclCommWindowDeregister(comm_, win_);
    if (buf_) ncclMemFree(buf_);
    if (comm_) ncclCommDestroy(comm_);
    if (slot_host_) cudaFreeHost(slot_host_);
  }

  std::string device_name() const override { return name_; }
  void* local_ptr(uint64_t offset) const override { return static_cast<char*>(buf_) + offset; }
  void* nccl_comm() const override { return comm_; }

  void zero(uint64_t offset, size_t bytes) override {
    WEFT_CUDA_CHECK(cudaMemset(static_cast<char*>(buf_) + offset, 0, bytes));
    synchronize();
  }

  void copy_to_host(void* dst, uint64_t offset, size_t bytes) override {
    synchronize();
    WEFT_CUDA_CHECK(cudaMemcpy(dst, static_cast<char*>(buf_) + offset, bytes, cudaMemcpyDeviceToHost));
  }
  void copy_from_host(uint64_t offset, const void* src, size_t bytes) override {
    synchronize();
    WEFT_CUDA_CHECK(cudaMemcpy(static_cast<char*>(buf_) + offset, src, bytes, cudaMemcpyHostToDevice));
    // From pageable memory cudaMemcpy may return before the data has landed; kernels on
    // non-blocking streams would not wait for it.
    synchronize();
  }

  void synchronize() override {
    cudaError_t e = cudaDeviceSynchronize();
    if (e == cudaSuccess) return;
    failed_ = true;
    if (slot_host_->claimed) {
      // A wait passed its deadline: the failure report turns this rank's view (its peer, maybe
      // waiting itself) into the rank that actually failed, or the calls that differ.
      try {
        raise_timeout(*slot_host_, ctx_.timeout_ns);  // InvalidArgument for a refused all_to_all_v
      } catch (const TimeoutError& t) {
        raise_failure(t);
      }
    }
    throw_error(__FILE__, __LINE__, fmt::format("rank {}: device failure: {}", rank(), cudaGetErrorString(e)));
  }

 private:
  // Writes through every peer pointer and reads back what the peers wrote here: proves the
  // window is symmetric and mapped before anything relies on it.
  void check_symmetry() {
    const size_t bytes = 8ull * size();
    WEFT_CUDA_CHECK(cudaMemset(buf_, 0, bytes));
    WEFT_CUDA_CHECK(cudaDeviceSynchronize());
    bootstrap_->barrier();
    WEFT_CUDA_CHECK(kernels::symmetry_write(ctx_, nullptr));
    WEFT_CUDA_CHECK(cudaDeviceSynchronize());
    bootstrap_->barrier();
    std::vector<uint64_t> got(size());
    WEFT_CUDA_CHECK(cudaMemcpy(got.data(), buf_, bytes, cudaMemcpyDeviceToHost));
    for (int r = 0; r < size(); ++r) {
      const uint64_t want = (static_cast<uint64_t>(r + 1) << 32) | static_cast<uint64_t>(rank());
      WEFT_CHECK(got[r] == want, fmt::format("symmetric window check failed on rank {}: slot {} holds {:#x}, expected "
                                             "{:#x} (rank {}'s writes through its peer pointer did not land here)",
                                             rank(), r, got[r], want, r));
    }
    bootstrap_->barrier();  // nobody zeroes the slots (heap allocation) before all have read
  }

  int device_ = 0;
  std::string name_;
  ncclComm_t comm_ = nullptr;
  void* buf_ = nullptr;
  size_t heap_bytes_ = 0;
  ncclWindow_t win_ = nullptr;
  ncclDevComm devcomm_{};
  bool have_devcomm_ = false;
  dev::ErrorSlot* slot_host_ = nullptr;
  dev::ErrorSlot* slot_dev_ = nullptr;
  bool failed_ = false;
};

}  // namespace

std::unique_ptr<Backend> make_nccl_backend(const World& w, const EnvMap& env, std::unique_ptr<Bootstrap> bs,
                                           int device) {
  return std::make_unique<NcclBackend>(w, env, std::move(bs), device);
}

}  // namespace weft
