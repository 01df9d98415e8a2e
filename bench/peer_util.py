"""Helpers the PyTorch peers in bench/ share (each script imports this from its own folder)."""
import datetime
import json
import os
import statistics

import torch
import torch.distributed as dist


def median_us(run, reps, calls):
    """Median us per call on this rank: `reps` timings of run() (`calls` calls each) between two
    CUDA events, the ranks lined up by a barrier before each."""
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    times = []
    for _ in range(reps):
        dist.barrier()
        torch.cuda.synchronize()
        start.record()
        run()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) * 1e3 / calls)
    return statistics.median(times)


def slowest(us):
    """The largest `us` over the ranks (every rank calls it)."""
    t = torch.tensor([us], dtype=torch.float64, device="cuda")
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return float(t.item())


def write_result(path, default_stem, record):
    """Writes `record` with its "date" as JSON to `path`, or to <default_stem>-<UTC stamp>.json;
    prints and returns the path."""
    stamp = datetime.datetime.now(datetime.timezone.utc)
    path = path or f"{default_stem}-{stamp.strftime('%Y%m%d-%H%M%S')}.json"
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    with open(path, "w") as f:
        json.dump({**record, "date": stamp.strftime("%Y-%m-%dT%H:%M:%SZ")}, f, indent=2)
    print("wrote", path)
    return path
