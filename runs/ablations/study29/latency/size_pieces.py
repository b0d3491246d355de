"""The pieces of latency.py's real run timed one by one, to size it (README.md: "Run time of the real run").

    nice -n 10 python runs/ablations/study29/latency/size_pieces.py      # about 3 minutes, 6 GB of RAM
"""
import resource
import time

import torch

import latency as L


def timed(what: str, fn):
    t0 = time.perf_counter()
    out = fn()
    print(f"{what}: {time.perf_counter() - t0:.1f} s", flush=True)
    return out


def main(reps: int = 2):
    torch.set_num_threads(1)
    target = timed("build 2-layer target", lambda: L.random_target(2, False, torch.bfloat16))
    cache = timed("prefill 512 at 2 layers", lambda: L.context_cache(target, 512))
    for b in (1, 8, 16):
        print(f"verify b={b}: {L.verify_seconds(target, cache, b, reps) * 1e3:.0f} ms/step", flush=True)
    full = L.target_config(36, False)
    for name in ("dflash", "domino", "eagle3"):
        draft = timed(f"build {name} draft", lambda: L.recipe_draft(name, full, False, torch.bfloat16))
        timer = L.StepTimer()
        d = L.build_drafter(dict(drafter="eagle3" if name == "eagle3" else "draft"), L.DraftTarget(full, target),
                            draft=draft, timer=timer)
        s = timed(f"{name} cache fill + {reps + 1} steps", lambda: L.draft_seconds(d, 4096, 512, 4, reps, timer=timer))
        sections = {k: round(v / (reps + 1), 3) for k, v in timer.seconds.items()}
        print(f"{name} draft step {s * 1e3:.0f} ms, mean seconds by section {sections}", flush=True)
        del d, draft
    print(f"max RSS {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1e6:.1f} GB")


if __name__ == "__main__":
    main()
