"""The commands of study 28, run from any folder: every path is this file's folder's (README.md beside this file says
what each piece is for).

    python runs/ablations/study28/study.py sweep            # 720-step LR sweep, seed 0 (resumable)
    python runs/ablations/study28/study.py rates            # best_lr.json from the sweep (validation split)
    python runs/ablations/study28/study.py table 0,1,2      # the 2880-step table at those rates (resumable)
    python runs/ablations/study28/study.py latency          # then every kept draft timed alone, and the table rewritten
"""
import argparse, json
from pathlib import Path

import torch

from domino_research.ablations import run_ablation, time_kept_drafts
from domino_research.rates import best_learning_rates, learning_rates_from, lr_sweep, with_learning_rates

STUDY = Path(__file__).resolve().parent     # not the current folder: `rates` elsewhere would start the sweep anew there
COMMAND = f"python {STUDY / 'study.py'}"
GRID = (3e-4, 1e-3, 3e-3)
# a best rate at the edge of the grid is extended by the next rate out, until the best is inside: dflash_shift_d4 was
# best at 3e-3 (so it ran at 1e-2), domino at 3e-3 and then at 1e-2 (so it ran at 1e-2 and 3e-2)
SWEPT = {"dflash_shift_matched": GRID, "dflash_shift_d3": GRID, "dflash_shift_d4": GRID + (1e-2,),
         "domino": GRID + (1e-2, 3e-2)}
CARRIED = {"lambda_steps720": "domino"}                # not swept: the rate of the variant it differs from least
# the first study's `dflash_shift` and `domino_small_head` are left out: at three seeds each they would have added a third
# session of machine time to a study whose question is the matched controls and the copy baseline
TABLE = ["ngram", "domino", "dflash_shift_d3", "dflash_shift_matched", "dflash_shift_d4", "lambda_steps720"]
DECODE = dict(n_eval_prompts=64, max_new_tokens=128)


def sweep() -> dict:
    t = lr_sweep([(v, lr) for v, rates in SWEPT.items() for lr in rates])
    return run_ablation(list(t), 720, [0], STUDY / "sweep720", table=t, jobs=2, keep_drafts=False, **DECODE)


def rates() -> dict:
    best = best_learning_rates(sweep())                      # every sweep run is done: this only re-reads them
    best |= {v: best[src] for v, src in CARRIED.items()}
    (STUDY / "best_lr.json").write_text(json.dumps(best, indent=2) + "\n")
    return best


def seed_list(text: str) -> list[int]:
    "`0,1,2` → [0, 1, 2]; anything else is refused in one line."
    try: seeds = [int(s) for s in text.split(",")]
    except ValueError: seeds = []
    if not seeds or any(s < 0 for s in seeds):
        raise SystemExit(f"study.py table: seeds must be integers >= 0 separated by commas, like 0,1,2 (got {text!r})")
    return seeds


def table(seeds: str, variants: str = ",".join(TABLE)) -> dict:
    rates = learning_rates_from(str(STUDY / "best_lr.json"))
    return run_ablation(variants.split(","), 2880, seed_list(seeds), STUDY / "steps2880",
                        table=with_learning_rates(rates), jobs=2, **DECODE)


def latency() -> dict:
    "Every kept draft of the complete table timed alone, then the table rewritten with those timings: nothing is trained."
    runs = STUDY / "steps2880" / "runs"
    missing = [f"{v} seed {s}" for v in TABLE for s in (0, 1, 2) if not (runs / v / f"seed{s}" / "result.json").is_file()]
    if missing:
        raise SystemExit(f"study.py latency: the table in {STUDY / 'steps2880'} is not complete ({', '.join(missing)}): "
                         f"run `{COMMAND} table 0,1,2` first")
    torch.set_num_threads(1)                                 # one thread, as each table run had; run it on an idle machine
    timed = time_kept_drafts(STUDY / "steps2880")
    table("0,1,2")
    return timed


if __name__ == "__main__":
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("piece", choices=["sweep", "rates", "table", "latency"])
    p.add_argument("seeds", nargs="?", default="0", help="table: comma-separated seeds")
    p.add_argument("--variants", default=",".join(TABLE), help="table: comma-separated variants")
    a = p.parse_args()
    if a.piece == "table": seed_list(a.seeds)                # before anything loads
    if a.piece == "sweep": sweep()
    elif a.piece == "rates": print(rates())
    elif a.piece == "table": table(a.seeds, a.variants)
    else: latency()
