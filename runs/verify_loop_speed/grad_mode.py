"""CPU milliseconds of one verify forward (a 16-token block on a cached prompt, cropped back) and one greedy step of
the embedded target under `torch.no_grad()` and under `torch.inference_mode()`, alternating, in one process:

    OMP_NUM_THREADS=1 PYTHONPATH=$PWD python runs/verify_loop_speed/grad_mode.py
"""
import statistics
import sys
import time
from pathlib import Path

import torch
from transformers import DynamicCache

sys.path.insert(0, str(Path(__file__).parent))
import bench  # noqa: E402  (this folder's loader: the same target and prompts)

from domino_research.decode import kv_heads_shared, crop_cache  # noqa: E402

N, ROUNDS = 200, 4


def main():
    torch.set_num_threads(1)
    target, _, prompts, _ = bench.load(1)
    ids, P = prompts[0], prompts[0].shape[1]
    block = torch.randint(0, target.config.vocab_size, (1, 16), generator=torch.Generator().manual_seed(0))
    cache = DynamicCache(config=target.config)
    with torch.no_grad(): target(input_ids=ids, cache=cache, use_cache=True)

    def verify():
        with kv_heads_shared(torch.device("cpu")): target(input_ids=block, cache=cache, use_cache=True)
        crop_cache(cache, P)

    def greedy_step():
        target(input_ids=block[:, :1], cache=cache, use_cache=True)
        crop_cache(cache, P)

    ms = {}
    for _ in range(ROUNDS):
        for name, f in (("verify", verify), ("greedy step", greedy_step)):
            for mode in (torch.no_grad, torch.inference_mode):
                with mode():
                    f()
                    t0 = time.process_time()
                    for _ in range(N): f()
                ms.setdefault(f"{name}, {mode.__name__}", []).append((time.process_time() - t0) / N * 1e3)
    for k, xs in ms.items(): print(f"{k:28s} " + " ".join(f"{x:.3f}" for x in xs) + f"   median {statistics.median(xs):.3f}")


if __name__ == "__main__":
    main()
