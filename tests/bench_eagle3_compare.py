"""τ, per-slot acceptance and draft time per verify step of an EAGLE-3 and a Domino draft trained on the embedded target,
on the same 50 test prompts (seed 0, stratified, as evaluate_draft samples them), greedy, <= 128 new tokens, lossless
checked against plain greedy decoding. Not a test (pytest does not collect it); the #40 comparison at the demo's budget
(runs/eagle3_demo_budget/README.md has the commands):

    python -m domino_research.train --config embedded_eagle3 --draft_intermediate_size 1665 --run_name eagle3 --output_dir RUNS
    python -m domino_research.train --config embedded_domino --n_eval_prompts 0 --run_name domino --output_dir RUNS
    python tests/bench_eagle3_compare.py RUNS [--step N] [--out results.json]

`--step N` decodes both runs' `checkpoints/step-N` drafts instead of their final `draft/` (a comparison at an equal number
of optimiser steps while a run is unfinished). MLP width 1665 gives the EAGLE-3 draft the Domino demo draft's 770,944
parameters."""
import argparse, json, time
from pathlib import Path

import torch
from domino_research.data import stop_token_ids
from domino_research.decode import StepTimer, eagle3_generate, greedy_generate, speculative_generate
from domino_research.eagle3 import Eagle3DraftModel
from domino_research.embedded import resolve_target_path
from domino_research.evaluation import _default_prompts, _load_target, encode_prompt, read_prompts, sample_prompts
from domino_research.export import load_draft

ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
ap.add_argument("runs", type=Path, help="the folder holding the runs eagle3/ and domino/")
ap.add_argument("--step", type=int, default=None, help="decode checkpoints/step-N of both runs (default: the final draft/)")
ap.add_argument("--out", type=Path, default=None, help="also write the figures to this JSON file")
args = ap.parse_args()
torch.set_num_threads(1)
folder = lambda run: args.runs / run / (f"checkpoints/step-{args.step}/draft" if args.step else "draft")
target, tok = _load_target(resolve_target_path("embedded"))
sample = sample_prompts(read_prompts(_default_prompts()), 50, 0, "auto")
enc, stops = [encode_prompt(tok, r["messages"], False) for r in sample], stop_token_ids(tok, target)
drafts = {"eagle3": Eagle3DraftModel.from_pretrained(folder("eagle3")).eval(), "domino": load_draft(folder("domino")).eval()}
gens = {"eagle3": lambda ids, timer: eagle3_generate(target, drafts["eagle3"], ids, 128, stops, timer=timer),
        "domino": lambda ids, timer: speculative_generate(target, drafts["domino"], ids, 128, stops, timer=timer)}
t0 = time.time()
plain = [greedy_generate(target, ids, 128, stops) for ids in enc]        # the reference each drafter must reproduce
out = {"prompts": len(enc), "max_new_tokens": 128, "step": args.step or "final",
       "drafts": {k: str(folder(k)) for k in drafts}}
for name, gen in gens.items():
    committed = steps = 0
    draft_s, lossless, accepted_at = 0.0, True, None
    for ids, ref in zip(enc, plain):
        timer = StepTimer()
        toks, st = gen(ids, timer)
        lossless &= toks == ref
        committed, steps = committed + st["committed"], steps + st["verify_steps"]
        draft_s += sum(v for k, v in timer.seconds.items() if k in ("draft", "rollout"))
        accepted_at = st["accepted_at"] if accepted_at is None else [a + b for a, b in zip(accepted_at, st["accepted_at"])]
    out[name] = dict(params=sum(p.numel() for p in drafts[name].parameters()),
                     block_size=drafts[name].config.block_size if name == "eagle3" else drafts[name].dflash.block_size,
                     tau=committed / steps, verify_steps=steps, draft_ms_per_step=1000 * draft_s / steps,
                     lossless=bool(lossless), accept_rate_at=[round(a / steps, 3) for a in accepted_at])
    print(name, json.dumps(out[name]), flush=True)
out["wall_s"] = round(time.time() - t0, 1)
if args.out: args.out.write_text(json.dumps(out, indent=2) + "\n")
