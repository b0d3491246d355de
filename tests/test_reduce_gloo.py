"MetricSums across 2 gloo ranks (one with no batch at all) == the 1-process result over the same data, with no hang."
import json, os, socket, time
from datetime import timedelta

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from domino_research.reduce import MetricSums

NAMES = ["loss", "final_loss", "accuracy", "accept_len"]
TIMEOUT_S = 120


def _batches(n=7, seed=0):
    "Per-batch (num, den) pairs; values are multiples of 1/1024 so every sum is exact in float64 and fp32."
    g = torch.Generator().manual_seed(seed)
    q = lambda *s: (torch.rand(*s, generator=g) * 1024 * 8).round() / 1024
    out = []
    for _ in range(n):
        w, ls, lf = q(()), q(()), q(())
        out.append({"loss": (ls * w, w), "final_loss": (lf * w, w),
                    "accuracy": (torch.randint(0, 50, (), generator=g), torch.tensor(50)),
                    "accept_len": (torch.randint(0, 40, (), generator=g), torch.tensor(8))})
    return out


def _accumulate(batches):
    es = MetricSums(NAMES)
    for b in batches:
        for name, (num, den) in b.items(): es.add(name, num, den)
    return es


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _worker(rank, world, port, out_dir, split, use_accelerate):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE=str(world),
                      LOCAL_RANK=str(rank), LOCAL_WORLD_SIZE=str(world))
    torch.set_num_threads(1)
    batches = _batches()
    if split == "rank1_empty": mine = batches if rank == 0 else []      # rank 1 sees no batch at all
    else: mine = batches[rank::world]                                   # "interleaved": a sharded loader
    accelerator = None
    if use_accelerate:
        from accelerate import Accelerator
        accelerator = Accelerator(cpu=True)
        assert accelerator.num_processes == world, accelerator.num_processes
    else:
        dist.init_process_group("gloo", rank=rank, world_size=world, timeout=timedelta(seconds=60))
    es = _accumulate(mine).all_reduce(accelerator)
    with open(os.path.join(out_dir, f"rank{rank}.json"), "w") as f:
        json.dump({"result": es.result(), "totals": es.totals(), "n_batches": len(mine)}, f)
    dist.barrier()
    dist.destroy_process_group()


def _spawn(tmp_path, split, use_accelerate=False, world=2):
    ctx = mp.spawn(_worker, args=(world, _free_port(), str(tmp_path), split, use_accelerate), nprocs=world, join=False)
    deadline = time.monotonic() + TIMEOUT_S
    while not ctx.join(timeout=1):
        if time.monotonic() > deadline:
            for p in ctx.processes:
                if p.is_alive(): p.kill()
            pytest.fail(f"MetricSums all_reduce with split={split} did not finish within {TIMEOUT_S} s (hang?)")
    return [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(world)]


@pytest.mark.parametrize("split,use_accelerate", [("rank1_empty", False), ("interleaved", False), ("rank1_empty", True)])
def test_two_ranks_equal_one_process(tmp_path, split, use_accelerate):
    single = _accumulate(_batches())
    single.all_reduce()                     # no process group here: a no-op
    ranks = _spawn(tmp_path, split, use_accelerate)
    if split == "rank1_empty": assert [r["n_batches"] for r in ranks] == [7, 0]
    for r in ranks:
        assert r["result"] == single.result()                       # exactly, not approximately
        assert {k: tuple(v) for k, v in r["totals"].items()} == single.totals()
    assert single.result()["accuracy"] > 0
