"""The commands of study 29, run from any folder: every path is this file's folder's (README.md beside this file is the
plan: what each piece is for, what it costs, what it writes).

    python runs/ablations/study29/study.py tune embedded          # piece 1: the learning-rate grid at the full budget,
                                                                  # seed 0, decoded on every validation prompt (resumable)
    python runs/ablations/study29/study.py tune embedded --tiny   # the same piece on a tiny random setting, in a minute

Every piece skips the runs it finds done with the same settings; an interrupted run continues from its last checkpoint.
"""
import argparse, json, math, tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

from domino_research.ablations import run_ablation
from domino_research.evaluation import read_prompts
from domino_research.rates import best_learning_rates, lr_sweep
from domino_research.study_run import source_digest
from domino_research.embedded import resolve_data_path
from domino_research.variants import tiny_setting

STUDY = Path(__file__).resolve().parent     # not the current folder: a piece run elsewhere would start anew there
COMMAND = f"python {STUDY / 'study.py'}"
TRAINED = ("domino", "dflash_shift_d3", "eagle3")       # the trained drafters, each at Domino's parameter count
GRID = (1e-3, 3e-3, 1e-2)                               # the learning rates every trained drafter is tried at
LADDER = (1e-4, 3e-4, 1e-3, 3e-3, 1e-2, 3e-2, 1e-1)     # half-decades: a best rate at the grid's edge adds the next out
STEPS = 2880                                            # the full budget (study 28's)
KEEP_STEPS = (720, 1440)                                # checkpoints whose drafts piece 5 (`curve`) decodes
MAX_NEW_TOKENS = 128


@dataclass
class Setting:
    "Where a piece writes and what it trains on: a target of the study, or the tiny random setting of a dry run."
    root: Path                                          # <root>/tune, ...
    validation: str                                     # the prompts tuning decodes: every one of them
    steps: int = STEPS
    keep_steps: tuple = KEEP_STEPS
    max_new_tokens: int = MAX_NEW_TOKENS
    jobs: int = 2                                       # two runs at a time, one thread each (as study 28)
    configs: Optional[dict] = None                      # recipe name -> YAML (the tiny setting's); None: the shipped recipes
    base_overrides: dict = field(default_factory=dict)  # keys every run gets (another target's: target, data)
    ladder: tuple = LADDER                              # the rates the edge rule may add


TARGETS = {"embedded": lambda: Setting(STUDY / "embedded", "embedded:validation")}


def tiny(root) -> Setting:
    """The same pieces on `tiny_setting` under `root`: 4 steps, checkpoints kept at 1 and 2, 16 new tokens, 4 prompts; one
    rate below the grid on the ladder, so the edge rule runs at most one round more."""
    t = tiny_setting(Path(root) / "setting")
    return Setting(Path(root), t["prompts"], steps=4, keep_steps=(1, 2), max_new_tokens=16, configs=t["configs"],
                   ladder=(3e-4, *GRID))


def extensions(best: dict, tried: dict, ladder: tuple = LADDER) -> list[tuple[str, float]]:
    """(variant, rate) to run next: a variant whose best rate is the lowest (highest) it was tried at adds the next
    half-decade below (above), until its best is inside; at the ladder's end nothing is added (the best stays at its edge)."""
    out = []
    for v, lr in best.items():
        i, rates = min(range(len(ladder)), key=lambda k: abs(math.log(ladder[k] / lr))), sorted(tried[v])
        if math.isclose(lr, rates[0]) and i > 0: out.append((v, ladder[i - 1]))
        if math.isclose(lr, rates[-1]) and i < len(ladder) - 1: out.append((v, ladder[i + 1]))
    return out


def check_decoded_all(out_dir: Path, res: dict, prompts: str) -> None:
    """Every run of `res` (run_ablation's result for `out_dir`) decoded every prompt of `prompts`, those very prompts (by
    what the file holds, and by id): raises AssertionError naming the run that did not."""
    ids, digest = sorted(r["id"] for r in read_prompts(resolve_data_path(prompts))), source_digest(prompts)
    for name in res["variants"]:
        for seed in res["meta"]["seeds"]:
            rec = json.loads((Path(out_dir) / "runs" / name / f"seed{seed}" / "result.json").read_text())
            got = sorted(p["prompt_id"] for p in rec["per_prompt"])
            assert rec["fingerprint"]["evaluation"]["prompts"] == digest, f"{name} seed {seed}: decoded other prompts"
            assert got == ids, f"{name} seed {seed}: decoded {len(got)} prompts, not the {len(ids)} of {prompts}"


def tune(s: Setting, log=print) -> dict:
    """Piece 1: every trained drafter at each rate of the grid, seed 0, the full budget, decoded greedily on every
    validation prompt; then the edge rule, until every best rate is inside its tried rates. Writes <root>/tune/ and
    <root>/tune/best_lr.json ({variant: rate}, chosen by decoded τ); returns that mapping."""
    tried = {v: list(GRID) for v in TRAINED}
    while True:
        table = lr_sweep([(v, lr) for v in TRAINED for lr in sorted(tried[v])])
        res = run_ablation(list(table), s.steps, [0], s.root / "tune", table=table, prompts=s.validation,
                           n_eval_prompts="all", max_new_tokens=s.max_new_tokens, jobs=s.jobs, keep_steps=s.keep_steps,
                           configs=s.configs, base_overrides=s.base_overrides or None, log=log)
        check_decoded_all(s.root / "tune", res, s.validation)
        best = best_learning_rates(res, metric="tau")
        more = extensions(best, tried, s.ladder)
        if not more: break
        for v, lr in more:
            log(f"tune: {v} was best at the edge ({best[v]:g}): adding {lr:g}")
            tried[v].append(lr)
    taus = {n: d["tau"]["mean"] for n, d in res["variants"].items()}
    out = {"metric": "decoded τ, every validation prompt, greedy, seed 0", "steps": s.steps, "best": best,
           "tau": taus, "tried": {v: sorted(r) for v, r in tried.items()}}
    (s.root / "tune" / "best_lr.json").write_text(json.dumps(out, indent=2) + "\n")
    log(f"tune: best rates {best}")
    return best


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("piece", choices=["tune"])
    p.add_argument("target", choices=list(TARGETS))
    p.add_argument("--tiny", action="store_true", help="a dry run on the tiny random setting (nothing of the study's)")
    p.add_argument("--out", type=Path, help="--tiny: where it writes (default: a new temporary folder)")
    a = p.parse_args(argv)
    if a.out and not a.tiny: p.error("--out is for --tiny only: the study's pieces write beside this file")
    if a.tiny:
        root = a.out or Path(tempfile.mkdtemp(prefix="study29_tiny_"))
        print(f"dry run on the tiny setting in {root}")
        s = tiny(root)
    else: s = TARGETS[a.target]()
    return tune(s)


if __name__ == "__main__":
    main()
