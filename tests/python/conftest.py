"""Rank pools for the PyTorch tests: N processes (torch.multiprocessing spawn) joined by
torch.distributed (gloo, a FileStore per pool) with weft's world over the default group, on the
host backend. A pool starts once per size and runs many tests (starting a rank imports torch,
seconds on a loaded CI machine). Torch is imported lazily: tests that do not use the pools run
without it.
"""

import os
import queue
import tempfile
import traceback

import pytest

# Every rank's environment: the host backend, a small heap, a deadline short enough that a
# test that desynchronises the ranks fails in seconds rather than hanging.
RANK_ENV = {"WEFT_BACKEND": "host", "WEFT_HOST_HEAP_MIB": "32", "WEFT_TIMEOUT_MS": "15000",
            "OMP_NUM_THREADS": "1"}


def _rank_main(rank, size, init_file, env, inq, outq, init_weft, dist_backend="gloo"):
    os.environ.update(env)
    try:
        import torch
        import torch.distributed as dist

        torch.set_num_threads(1)
        if dist_backend == "nccl":
            torch.cuda.set_device(rank)
        dist.init_process_group(dist_backend, init_method=f"file://{init_file}", rank=rank, world_size=size)
        if init_weft:
            import weft.torch

            weft.torch.init()
        outq.put((rank, "ready", None))
    except BaseException as e:  # noqa: BLE001 (reported to the parent)
        outq.put((rank, "err", f"{type(e).__name__}: {e}\n{traceback.format_exc()}"))
        return
    while True:
        item = inq.get()
        if item is None:
            break
        fn, args = item
        try:
            outq.put((rank, "ok", fn(*args)))
        except BaseException as e:  # noqa: BLE001
            outq.put((rank, "err", f"{type(e).__name__}: {e}\n{traceback.format_exc()}"))
    try:
        import weft.torch

        weft.torch.shutdown()
        dist.destroy_process_group()
    except BaseException:  # noqa: BLE001
        pass


class RankPool:
    """`size` ranks that run module-level functions: run(fn, *args) -> [result of rank 0, ...]."""

    def __init__(self, size, env=None, init_weft=True, start_timeout=180, dist_backend="gloo"):
        import torch.multiprocessing as mp

        self.size = size
        ctx = mp.get_context("spawn")
        self._dir = tempfile.TemporaryDirectory(prefix="weft-torch-test-")
        init_file = os.path.join(self._dir.name, "store")
        full_env = dict(RANK_ENV)
        full_env.update(env or {})
        self._inqs = [ctx.Queue() for _ in range(size)]
        self._outq = ctx.Queue()
        self._procs = [ctx.Process(target=_rank_main, args=(r, size, init_file, full_env, self._inqs[r], self._outq,
                                                             init_weft, dist_backend), daemon=True)
                       for r in range(size)]
        for p in self._procs:
            p.start()
        self.broken = None
        self._collect("start-up", start_timeout)

    def _collect(self, what, timeout):
        results, errors = [None] * self.size, {}
        got = 0
        while got < self.size:
            try:
                rank, status, value = self._outq.get(timeout=timeout)
            except queue.Empty:
                missing = [r for r in range(self.size) if results[r] is None and r not in errors]
                self.close(kill=True)
                self.broken = f"{what}: ranks {missing} did not answer within {timeout} s"
                raise AssertionError(self.broken) from None
            got += 1
            if status == "err":
                errors[rank] = value
            else:
                results[rank] = value
        if errors:
            raise AssertionError(f"{what} failed on rank(s) {sorted(errors)}:\n" +
                                 "\n".join(f"--- rank {r} ---\n{errors[r]}" for r in sorted(errors)))
        return results

    def run(self, fn, *args, timeout=120):
        if self.broken:
            pytest.skip(f"the {self.size}-rank pool broke earlier: {self.broken}")
        for q in self._inqs:
            q.put((fn, args))
        return self._collect(f"{fn.__name__} on {self.size} ranks", timeout)

    def run_answering(self, answering, fn, *args, timeout=120):
        """As run, for a function after which only the ranks in `answering` answer (the others
        exit: the pool is spent afterwards). Returns {rank: result}."""
        for q in self._inqs:
            q.put((fn, args))
        out, errors = {}, {}
        while len(out) + len(errors) < len(answering):
            try:
                rank, status, value = self._outq.get(timeout=timeout)
            except queue.Empty:
                raise AssertionError(f"{fn.__name__}: ranks {sorted(set(answering) - set(out) - set(errors))} "
                                     f"did not answer within {timeout} s") from None
            (errors if status == "err" else out)[rank] = value
        self.broken = "spent by run_answering"
        if errors:
            raise AssertionError("\n".join(f"--- rank {r} ---\n{errors[r]}" for r in sorted(errors)))
        return out

    def close(self, kill=False):
        if not kill:
            for q in self._inqs:
                q.put(None)
            for p in self._procs:
                p.join(timeout=20)
        for p in self._procs:
            if p.is_alive():
                p.kill()
                p.join(timeout=5)
        self._dir.cleanup()


class Pools:
    def __init__(self):
        self._pools = {}

    def get(self, size, gpu=False):
        """`size` CPU ranks (gloo, the host backend), or with gpu=True one rank per GPU (NCCL,
        weft's nccl backend)."""
        pool = self._pools.get((size, gpu))
        if pool is None:
            if gpu:
                pool = RankPool(size, env={"WEFT_BACKEND": "nccl", "WEFT_GPU_HEAP_MIB": "1024",
                                           "WEFT_TIMEOUT_MS": "30000"}, dist_backend="nccl", start_timeout=300)
            else:
                pool = RankPool(size)
            self._pools[(size, gpu)] = pool
        return pool

    def close(self):
        for pool in self._pools.values():
            if not pool.broken:
                pool.close()


@pytest.fixture(scope="session")
def pools():
    pytest.importorskip("torch")
    p = Pools()
    yield p
    p.close()
