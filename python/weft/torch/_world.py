"""weft worlds built from torch.distributed process groups.

A world's ranks and bootstrap come from the group: its rank and size, and an allgather over
torch.distributed's own store (the one torchrun's rendezvous made), under a prefix unique to the
group and to the world's generation. No launcher, no shared directory, no second rendezvous.
"""

from __future__ import annotations

import datetime
import os
import threading

import torch
import torch.distributed as dist

import weft

__all__ = ["TorchWorld", "init", "world", "shutdown"]

_DEFAULT_TIMEOUT_MS = 30000

# group name -> TorchWorld, and how many worlds each group has had in this process (every rank
# of a group makes the same sequence of init()/shutdown() calls, so generations agree).
_worlds: dict[str, "TorchWorld"] = {}
_generations: dict[str, int] = {}
_lock = threading.Lock()


def _timeout_ms(timeout_ms: int) -> int:
    if timeout_ms and timeout_ms > 0:
        return int(timeout_ms)
    env = os.environ.get("WEFT_TIMEOUT_MS", "")
    try:
        value = int(env) if env else 0
    except ValueError:
        value = 0  # weft itself rejects the malformed value with a message naming it
    return value if value > 0 else _DEFAULT_TIMEOUT_MS


class StoreAllgather:
    """The bootstrap weft calls: every rank's bytes through the group's store.

    Round r: set `<prefix>/<r>/<rank>`, wait for every rank's key, read them. A rank that has
    finished round r knows every rank has entered round r, so has finished reading round r-1:
    it then deletes its own round r-1 key (where the store can delete), so the store holds at
    most two rounds per world.
    """

    def __init__(self, store, prefix: str, rank: int, size: int, timeout_ms: int):
        self.store = dist.PrefixStore(prefix, store)
        self.prefix = prefix
        self.rank = rank
        self.size = size
        self.timeout = datetime.timedelta(milliseconds=timeout_ms)
        self.timeout_ms = timeout_ms
        self.round = 0
        self._can_delete = True

    def __call__(self, data: bytes) -> list[bytes]:
        r = self.round
        self.round += 1
        keys = [f"{r}/{p}" for p in range(self.size)]
        self.store.set(keys[self.rank], bytes(data))
        try:
            self.store.wait(keys, self.timeout)
        except Exception as e:  # the store's timeout (RuntimeError / DistStoreError)
            missing = self._missing(keys)
            who = f"rank {missing}" if missing is not None else "a rank"
            err = TimeoutError(
                f"weft bootstrap over the torch.distributed store: {who} of {self.size} did not "
                f"arrive within {self.timeout_ms} ms (round {r}, prefix '{self.prefix}'): {e}")
            err.missing_rank = -1 if missing is None else missing
            raise err from e
        out = [self.store.get(k) for k in keys]
        if r > 0 and self._can_delete:
            try:
                self.store.delete_key(f"{r - 1}/{self.rank}")
            except Exception:  # stores without deletion (some FileStore versions)
                self._can_delete = False
        return out

    def _missing(self, keys):
        for p, k in enumerate(keys):
            try:
                if not self.store.check([k]):
                    return p
            except Exception:
                return None
        return None

    def cleanup(self):
        """Deletes this rank's last key (after the world is destroyed: no round follows)."""
        if self.round > 0 and self._can_delete:
            try:
                self.store.delete_key(f"{self.round - 1}/{self.rank}")
            except Exception:
                pass


def _group_name(group) -> str:
    if group is None:
        group = dist.group.WORLD
    return group.group_name


def _choose_backend(group, backend):
    if backend is not None:
        if backend not in ("host", "nccl"):
            raise weft.InvalidArgument(f"weft.torch.init: backend must be 'host' or 'nccl', not {backend!r}")
        return backend
    env = os.environ.get("WEFT_BACKEND", "")
    if env in ("host", "nccl"):
        return env
    name = str(dist.get_backend(group)).lower()
    if "nccl" in name and torch.cuda.is_available():
        return "nccl"
    return "host"


class TorchWorld:
    """weft's world for one torch.distributed group, with the ops' cached state.

    Attributes: group (the ProcessGroup), group_name, rank and size (in the group), backend
    ("host"/"nccl"), device (torch.device tensors must be on), world (the weft.World).
    """

    def __init__(self, group, backend=None, heap_mib=0, timeout_ms=0):
        if not dist.is_available() or not dist.is_initialized():
            raise RuntimeError("weft.torch.init: torch.distributed is not initialised "
                               "(call torch.distributed.init_process_group first, e.g. under torchrun)")
        pg = group if group is not None else dist.group.WORLD
        if pg is None or pg == dist.GroupMember.NON_GROUP_MEMBER:
            raise weft.InvalidArgument("weft.torch.init: this rank is not a member of the group")
        self.group = group
        self.group_name = _group_name(group)
        self.rank = dist.get_rank(group)
        self.size = dist.get_world_size(group)
        if self.rank < 0:
            raise weft.InvalidArgument("weft.torch.init: this rank is not a member of the group")
        self.backend = _choose_backend(group, backend)
        self.timeout_ms = _timeout_ms(timeout_ms)
        if self.backend == "nccl":
            if not torch.cuda.is_available():
                raise weft.InvalidArgument("weft.torch.init: backend 'nccl' needs CUDA, which torch cannot see")
            dev = torch.cuda.current_device()
            self.device = torch.device("cuda", dev)
        else:
            dev = -1
            self.device = torch.device("cpu")
        gen = _generations.get(self.group_name, 0)
        _generations[self.group_name] = gen + 1
        store = dist.distributed_c10d._get_default_store()
        self._allgather = StoreAllgather(store, f"weft/{self.group_name}/{gen}", self.rank, self.size,
                                         self.timeout_ms)
        self.world = weft.World(self.rank, self.size, device=dev, backend=self.backend,
                                allgather=self._allgather, heap_mib=heap_mib, timeout_ms=timeout_ms)
        self.closed = False
        self._coll = None
        self._coll_prepared: set = set()
        self._gemms: dict = {}

    # ---- cached op state --------------------------------------------------------------
    def collectives(self):
        if self._coll is None:
            self._coll = weft.Collectives(self.world)
        return self._coll

    def gemm(self, key, create):
        g = self._gemms.get(key)
        if g is None:
            g = create()
            self._gemms[key] = g
        return g

    def release_ops(self):
        """Destroys the ops' cached state (workspaces on the symmetric heap), e.g. between the
        shapes of a benchmark. Every rank calls it at the same point (blocks are freed in the
        same order everywhere); later calls create state again, eagerly."""
        objs = list(self._gemms.values()) + ([self._coll] if self._coll is not None else [])
        self._gemms.clear()
        self._coll = None
        self._coll_prepared.clear()
        for obj in objs:
            obj.close()

    # ---- memory -------------------------------------------------------------------------
    def heap_info(self):
        """(capacity, used) of this rank's symmetric heap, bytes."""
        return self.world.heap_info()

    def synchronize(self):
        self.world.synchronize()

    def barrier(self):
        self.world.barrier()

    def close(self):
        """Destroys the ops' state and the world (local). Symmetric tensors of this world must
        be gone first: their memory is unmapped with the heap. The world is forgotten even when
        weft reports an error while destroying it (that error is raised after)."""
        if self.closed:
            return
        self.closed = True
        first = None
        objs = list(self._gemms.values()) + ([self._coll] if self._coll is not None else [])
        self._gemms.clear()
        self._coll = None
        for obj in objs + [self.world]:
            try:
                obj.close()
            except Exception as e:  # noqa: BLE001 -- keep destroying the rest
                first = first or e
        self._allgather.cleanup()
        with _lock:
            if _worlds.get(self.group_name) is self:
                del _worlds[self.group_name]
        if first is not None:
            raise first

    def __repr__(self):
        return (f"weft.torch.TorchWorld(group={self.group_name!r}, rank={self.rank}, size={self.size}, "
                f"backend={self.backend!r}{', closed' if self.closed else ''})")


def init(group=None, *, backend=None, heap_mib=0, timeout_ms=0) -> TorchWorld:
    """Builds weft's world over a torch.distributed group (collective over the group).

    group: a ProcessGroup (None: the default group). backend: "host" or "nccl" (None:
    WEFT_BACKEND, else "nccl" for a group with NCCL where CUDA is available, "host" for
    gloo/CPU). heap_mib: the symmetric heap per rank (0: WEFT_GPU_HEAP_MIB /
    WEFT_HOST_HEAP_MIB). timeout_ms: every wait's deadline (0: WEFT_TIMEOUT_MS).
    Calling it again for a group with a live world returns that world.
    """
    name = _group_name(group)
    with _lock:
        w = _worlds.get(name)
    if w is not None and not w.closed:
        return w
    w = TorchWorld(group, backend=backend, heap_mib=heap_mib, timeout_ms=timeout_ms)
    with _lock:
        _worlds[name] = w
    return w


def _default_name():
    if dist.is_available() and dist.is_initialized():
        return dist.group.WORLD.group_name
    return None


def lookup(group_name: str) -> TorchWorld:
    """The world for a group name ("" : the default group's world, or the only world)."""
    with _lock:
        if group_name:
            w = _worlds.get(group_name)
            if w is None:
                raise RuntimeError(f"weft: no world for process group '{group_name}': "
                                   f"call weft.torch.init(group) first")
            return w
        dflt = _default_name()
        if dflt is not None and dflt in _worlds:
            return _worlds[dflt]
        if len(_worlds) == 1:
            return next(iter(_worlds.values()))
        if not _worlds:
            raise RuntimeError("weft: no world: call weft.torch.init() first")
        raise RuntimeError("weft: several worlds and none for the default group: pass group=")


def world(group=None) -> TorchWorld:
    """The world init() built for `group` (None: the default group's, or the only one)."""
    if group is None or isinstance(group, str):
        return lookup(group or "")
    return lookup(_group_name(group))


def group_name(group) -> str:
    """The string the ops take for a group (None: "", the default)."""
    if group is None or isinstance(group, str):
        return group or ""
    return _group_name(group)


def shutdown(group=None):
    """Closes the world of `group` (None: every world)."""
    if group is None:
        with _lock:
            ws = list(_worlds.values())
        for w in ws:
            w.close()
        return
    world(group).close()
