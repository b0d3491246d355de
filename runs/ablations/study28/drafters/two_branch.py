"""The two-branch (tree) verify of notebook 30 against the per-step hybrid, on study 28's kept Domino drafts.

    python runs/ablations/study28/drafters/two_branch.py                          # 64 prompts x 3 seeds -> two_branch.json
    python runs/ablations/study28/drafters/two_branch.py --prompts all --seeds 0 --drafters tree   # -> two_branch_all.json

Each prompt is decoded by the hybrid (`decode.py`'s `hybrid/domino/seed<s>`: rule `HYBRID_DEFAULT_RULE`, lookup
`LOOKUP_DEFAULTS`) and by the `tree` drafter (the same lookup and draft: lookup's chain and the draft's in one target
forward wherever lookup proposes), one after the other in one process on one thread, the order swapped from prompt to
prompt, so a busy spell of the shared machine slows both alike. Every decode is checked against the target's own
greedy tokens (`results/greedy.json`, `decode.py`'s reference run), and the hybrid's steps against its committed run
(`results/hybrid__domino__seed<s>.json`). `decode.py`'s `decode_one` records each decode (steps, tokens per step,
proposals per step: both chains for a tree step, the timer's seconds); each prompt's row adds the tree's
`chain_won`. Greedy, 128 new tokens at most, the embedded target, study 28's 64 test prompts (its seeded sample) or all
303. `--drafters tree` decodes the tree alone (the hybrid's τ is then its committed run's, which the hybrid decodes
here repeat step for step).
"""
import argparse, json, time

import torch

from decode import HERE, MAX_NEW, WARMUP_TOKENS, decode_one, result_path, runs, test_prompts
from timing import N_PROMPTS, PROMPT_SEED
from domino_research.data import stop_token_ids
from domino_research.decode import LOOKUP_DEFAULTS
from domino_research.embedded import load_embedded_target
from domino_research.evaluation import draft_for_target, sample_prompts

OUT = {"study": HERE / "two_branch.json", "all": HERE / "two_branch_all.json"}


def specs(seed: int) -> dict:
    "{'hybrid': decode.py's hybrid run of the seed's Domino draft, 'tree': the tree drafter with its lookup} (+ 'draft')."
    hybrid = dict(runs()[f"hybrid/domino/seed{seed}"])
    return {"hybrid": hybrid, "tree": dict(drafter="tree", **LOOKUP_DEFAULTS, draft=hybrid["draft"])}


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--prompts", choices=("study", "all"), default="study", help="study 28's 64 test prompts, or all 303")
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2], help="the Domino drafts' seeds")
    p.add_argument("--drafters", choices=("hybrid", "tree"), nargs="+", default=["hybrid", "tree"], help="which to decode")
    a = p.parse_args(argv)
    torch.set_num_threads(1)
    target, tok = load_embedded_target()
    stops = stop_token_ids(tok, target)
    recs, prompts = test_prompts(tok)                                       # all 303, in file order
    at = list(range(len(recs)))                                             # (two prompt ids occur twice: rows by place)
    if a.prompts == "study":
        sample = [{k: v for k, v in r.items() if k not in ("group", "stratify_by")}     # (keys the sample adds)
                  for r in sample_prompts(recs, N_PROMPTS, PROMPT_SEED, "auto")]
        at = [i for i in at if recs[i] in sample]
        assert len(at) == N_PROMPTS, len(at)
    greedy = json.loads(result_path("greedy").read_text())["per_prompt"]    # the same 303 prompts, in the same order
    assert [g["prompt_id"] for g in greedy] == [r["id"] for r in recs]
    out = dict(prompts=a.prompts, n_prompts=len(at), prompt_seed=PROMPT_SEED, seeds=a.seeds, max_new_tokens=MAX_NEW,
               torch_threads=torch.get_num_threads(), order="each prompt by both drafters in turn, the order swapped per prompt" if len(a.drafters) == 2 else f"{a.drafters[0]} alone",
               lookup=LOOKUP_DEFAULTS, runs={})
    for seed in a.seeds:
        spec = specs(seed)
        draft = draft_for_target(spec["hybrid"]["draft"], target)
        drafters = {k: {n: v for n, v in s.items() if n != "draft"} for k, s in spec.items() if k in a.drafters}
        committed = json.loads(result_path(f"hybrid/domino/seed{seed}").read_text())["per_prompt"]   # the 303, in order
        for name in drafters: decode_one(target, drafters[name], draft, prompts[0], stops, WARMUP_TOKENS)   # lazy init
        rows, t0 = [], time.perf_counter()
        for k, i in enumerate(at):
            row = dict(prompt_id=recs[i]["id"], place=i)
            for name in (list(drafters) if k % 2 == 0 else list(drafters)[::-1]):
                toks, row[name] = decode_one(target, drafters[name], draft, prompts[i], stops, MAX_NEW)
                assert toks == greedy[i]["tokens"], f"seed {seed} prompt {i}: {name} is not the target's greedy answer"
            if "hybrid" in row: assert row["hybrid"]["kept"] == committed[i]["kept"], f"seed {seed} prompt {i}: hybrid's steps"
            rows.append(row)
            print(seed, k, row["prompt_id"], {n: (row[n]["verify_steps"], row[n]["seconds"]) for n in drafters}, flush=True)
        tau = {n: sum(x[n]["committed"] for x in rows) / sum(x[n]["verify_steps"] for x in rows) for n in drafters}
        out["runs"][f"seed{seed}"] = dict(drafters=drafters, draft=str(spec["hybrid"]["draft"].relative_to(HERE.parents[3])),
                                          tau=tau, seconds=round(time.perf_counter() - t0, 1), per_prompt=rows)
        print(f"seed {seed}: tau {tau}", flush=True)
    out["date"] = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime())
    OUT[a.prompts].write_text(json.dumps(out, separators=(",", ":")) + "\n")


if __name__ == "__main__":
    main()
