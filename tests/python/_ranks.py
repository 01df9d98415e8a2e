"""Test helpers: ranks as processes, and an allgather over files in a shared directory."""

import multiprocessing as mp
import os
import time
import traceback


class PeerMissing(TimeoutError):
    def __init__(self, msg, missing_rank):
        super().__init__(msg)
        self.missing_rank = missing_rank


class FileAllgather:
    """allgather(data) -> list[bytes] through files <dir>/<tag>.<round>.<rank> (write, then rename)."""

    def __init__(self, directory, rank, size, tag="ag", timeout_s=10.0):
        self.dir, self.rank, self.size, self.tag, self.timeout_s = directory, rank, size, tag, timeout_s
        self.round = 0

    def _path(self, rnd, r):
        return os.path.join(self.dir, f"{self.tag}.{rnd}.{r}")

    def __call__(self, data):
        rnd = self.round
        self.round += 1
        tmp = self._path(rnd, self.rank) + ".tmp"
        with open(tmp, "wb") as f:
            f.write(data)
        os.rename(tmp, self._path(rnd, self.rank))
        out = [None] * self.size
        start = time.monotonic()
        sleep = 1e-4
        while True:
            for r in range(self.size):
                if out[r] is None and os.path.exists(self._path(rnd, r)):
                    with open(self._path(rnd, r), "rb") as f:
                        out[r] = f.read()
            missing = [r for r in range(self.size) if out[r] is None]
            if not missing:
                return out
            if time.monotonic() - start > self.timeout_s:
                raise PeerMissing(f"round {rnd}: rank {missing[0]} did not arrive", missing[0])
            time.sleep(sleep)
            sleep = min(sleep * 2, 0.005)


def _entry(fn, rank, size, directory, args, q):
    try:
        res = fn(rank, size, directory, *args)
        q.put((rank, "ok", res))
    except BaseException as e:  # noqa: BLE001
        q.put((rank, "error", f"{type(e).__name__}: {e}\n{traceback.format_exc()}"))


def run_ranks(fn, size, directory, *args, timeout_s=120, expect_dead=()):
    """Runs fn(rank, size, directory, *args) in `size` forked processes; returns {rank: result}.
    Raises AssertionError with every failing rank's error. Ranks in expect_dead may exit without
    reporting."""
    os.environ.setdefault("WEFT_BACKEND", "host")
    os.environ.setdefault("WEFT_HOST_HEAP_MIB", "8")
    ctx = mp.get_context("fork")
    q = ctx.Queue()
    procs = [ctx.Process(target=_entry, args=(fn, r, size, directory, args, q)) for r in range(size)]
    for p in procs:
        p.start()
    results, errors = {}, {}
    want = size - len(expect_dead)
    deadline = time.monotonic() + timeout_s
    while len(results) + len(errors) < want and time.monotonic() < deadline:
        try:
            rank, status, val = q.get(timeout=0.5)
        except Exception:  # noqa: BLE001 -- queue.Empty
            continue
        (results if status == "ok" else errors)[rank] = val
    for p in procs:
        p.join(timeout=max(0.1, deadline - time.monotonic()))
        if p.is_alive():
            p.kill()
            p.join()
    if errors:
        raise AssertionError("\n".join(f"rank {r}: {e}" for r, e in sorted(errors.items())))
    missing = [r for r in range(size) if r not in results and r not in expect_dead]
    if missing:
        raise AssertionError(f"ranks {missing} did not finish within {timeout_s} s")
    return results
