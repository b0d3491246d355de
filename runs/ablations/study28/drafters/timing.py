"""Wall-clock timing of the main drafters, interleaved prompt by prompt, after the decodes of `decode.py`.

    python runs/ablations/study28/drafters/timing.py --rounds 3     # -> timing.json

On study 28's 64 test prompts (its seeded sample over the modules), each prompt is decoded by every timed drafter and by
plain greedy decoding one after another, in an order rotated from prompt to prompt, in one process on one thread: a
busy spell of the shared machine then slows every drafter alike, and the speed-up over greedy is read within the run.
`--rounds R` repeats the whole pass R times (the rotation goes on across rounds); each round's rows are kept.
"""
import argparse, json, time

import torch

from decode import HERE, MAX_NEW, WARMUP_TOKENS, decode_one, runs
from domino_research.data import stop_token_ids
from domino_research.decode import greedy_generate
from domino_research.embedded import embedded_dataset_path, load_embedded_target
from domino_research.evaluation import draft_for_target, encode_prompt, read_prompts, sample_prompts

TIMED = ("lookup_project", "lookup_tuned", "draft/domino/seed0", "draft/dflash_shift_d3/seed0", "hybrid/domino/seed0",
         "hybrid/dflash_shift_d3/seed0")
N_PROMPTS, PROMPT_SEED = 64, 0                                # study 28's sample of the test prompts


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rounds", type=int, default=1, help="passes over the prompts (>= 1)")
    rounds = p.parse_args(argv).rounds
    if rounds < 1: p.error(f"--rounds {rounds}: give at least 1")
    torch.set_num_threads(1)
    target, tok = load_embedded_target()
    stops, specs = stop_token_ids(tok, target), runs()
    recs = sample_prompts(read_prompts(embedded_dataset_path("test")), N_PROMPTS, PROMPT_SEED, "auto")
    prompts = [encode_prompt(tok, r["messages"]) for r in recs]
    drafters = {}
    for name in TIMED:
        spec = dict(specs[name])
        folder = spec.pop("draft", None)
        drafters[name] = (spec, draft_for_target(folder, target) if folder is not None else None)

    def decode(name, ids, max_new):
        if name == "greedy":
            t0 = time.perf_counter()
            toks = greedy_generate(target, ids, max_new, stops)
            return toks, dict(seconds=time.perf_counter() - t0)
        return decode_one(target, *drafters[name], ids, stops, max_new)

    order = ("greedy", *TIMED)
    for name in order: decode(name, prompts[0], WARMUP_TOKENS)                   # lazy initialisation, untimed
    rows = []
    for i, (r, ids) in enumerate([(r, ids) for _ in range(rounds) for r, ids in zip(recs, prompts)]):
        row, ref = dict(prompt_id=r["id"], round=i // len(recs)), None
        for name in order[i % len(order):] + order[: i % len(order)]:           # rotated: no drafter always first
            toks, rec = decode(name, ids, MAX_NEW)
            row[name] = {k: rec[k] for k in ("seconds", "verify_steps", "committed", "draft_s", "verify_s") if k in rec}
            row[name]["tokens"] = len(toks)
            if name == "greedy": ref = toks
            else: row[name]["lossless"] = None
            row[name]["_toks"] = toks
        for name in TIMED: row[name]["lossless"] = row[name].pop("_toks") == ref
        row["greedy"].pop("_toks")
        rows.append(row)
        print(i, r["id"], {n: round(row[n]["seconds"], 3) for n in order}, flush=True)
    out = dict(n_prompts=len(recs), rounds=rounds, max_new_tokens=MAX_NEW, prompt_seed=PROMPT_SEED,
               torch_threads=torch.get_num_threads(),
               order="every prompt decoded by each drafter in turn, the order rotated by one per prompt",
               date=time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()), timed=list(order), per_prompt=rows)
    (HERE / "timing.json").write_text(json.dumps(out, separators=(",", ":")) + "\n")


if __name__ == "__main__":
    main()
