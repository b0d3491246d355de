"""Prompt lookup's settings and the hybrid's rule, chosen on the validation prompts (never the test prompts).

    python runs/lookup_sweep/sweep.py greedy     # plain greedy answers of the validation prompts  -> greedy.json
    python runs/lookup_sweep/sweep.py lookup     # every lookup setting, τ replayed on those answers -> results.json
    python runs/lookup_sweep/sweep.py decode     # real decodes: lookup (both rules), Domino and the hybrid (see decode_all)
    python runs/lookup_sweep/sweep.py decode --every_rule   # and every rule with every kept draft (a check of the choice)
    python runs/lookup_sweep/sweep.py choose     # the chosen defaults                              -> results.json

Every piece is resumable (results.json is rewritten after each decode) and runs on one thread, one process.
"""
import argparse, itertools, json, sys, time
from pathlib import Path

import numpy as np
import torch

from domino_research.data import stop_token_ids
from domino_research.decode import (HYBRID_RULES, PROJECT_LOOKUP, greedy_generate, hybrid_generate, lookup_propose,
                                    ngram_generate, speculative_generate)
from domino_research.embedded import embedded_dataset_path, load_embedded_target
from domino_research.evaluation import encode_prompt, read_prompts, sample_prompts
from domino_research.export import find_draft_dir, load_draft

HERE = Path(__file__).parent
STUDY = HERE.parent / "ablations" / "study28" / "steps2880" / "runs"
N_PROMPTS, MAX_NEW, PROMPT_SEED, SEEDS = 64, 128, 0, (0, 1, 2)        # study 28's decode settings, its kept draft seeds
RULE_SEED = 0                                                         # the draft seed every hybrid rule runs with
GRID = dict(prompt_lookup_min=(1, 2, 3), prompt_lookup_max=(1, 2, 3, 4, 6, 8, 12, 16, 24, 32),
            num_speculative_tokens=(3, 7, 11, 15), occurrence=("earliest", "latest"), self_extend=(False, True))
MAX_K = 15      # proposals per step at most: the verify width of the drafts (block 16), so τ compares like with like


def validation_prompts(tok):
    "Study 28's sample (64 prompts, seed 0, round-robin over modules), drawn from the validation split."
    recs = sample_prompts(read_prompts(embedded_dataset_path("validation")), N_PROMPTS, PROMPT_SEED, "auto")
    return [encode_prompt(tok, r["messages"]) for r in recs]


class PrefixMatches:
    """Suffix-match lengths of every prefix the replays meet, computed once: for the sequence `seq` and each end position
    j < len(seq) - 1, `m[j]` = how many tokens ending at j equal the tokens ending at the last one (at most `MAX_N`)."""
    MAX_N = max(GRID["prompt_lookup_max"])

    def __init__(self): self.cache = {}

    def __call__(self, key, seq: np.ndarray) -> np.ndarray:
        if key not in self.cache:
            L, m = len(seq), np.zeros(max(len(seq) - 1, 0), dtype=np.int64)
            alive = np.ones_like(m, dtype=bool)
            for t in range(min(self.MAX_N, L - 1)):           # the t-th token back from each end, against the suffix's
                j = np.arange(t, L - 1)
                alive[t:] &= seq[j - t] == seq[L - 1 - t]
                alive[:t] = False
                m += alive
            self.cache[key] = m
        return self.cache[key]


def fast_propose(m, seq, prompt_lookup_min, prompt_lookup_max, num_speculative_tokens, occurrence, self_extend):
    "`lookup_propose` from the prefix's match lengths `m` (same result: checked on a sample in `sweep_lookup`)."
    n = min(int(m.max(initial=0)), prompt_lookup_max)
    if n < prompt_lookup_min: return [], 0
    hits = np.flatnonzero(m >= n)
    follow = int(hits[0] if occurrence == "earliest" else hits[-1]) + 1
    if not self_extend: return seq[follow: follow + num_speculative_tokens].tolist(), n
    return seq[follow + np.arange(num_speculative_tokens) % (len(seq) - follow)].tolist(), n


def replay_tau(prompts, answers, settings, matches: PrefixMatches) -> dict:
    """τ of prompt lookup at T = 0 without the target: decoding is lossless, so the target's token after any prefix of a
    greedy answer is the answer's next token, and the loop's steps can be replayed exactly on the answers."""
    steps = committed = 0
    for p, (ids, ref) in enumerate(zip(prompts, answers)):
        full, P, i = np.asarray(ids[0].tolist() + ref), ids.shape[1], 1   # ref[0] comes from the prefill: not counted
        while i < len(ref):
            seq = full[:P + i]
            props, _ = fast_propose(matches((p, i), seq), seq, **settings)
            rest = ref[i:]                                   # the target's tokens from the anchor's next slot on
            n = next((j for j, (d, t) in enumerate(zip(props, rest)) if d != t), min(len(props), len(rest)))
            kept = min(n + 1, len(rest))                     # the answer's end (stop token or budget) cuts the step
            steps, committed, i = steps + 1, committed + kept, i + kept
    return dict(tau=committed / steps, verify_steps=steps, committed=committed)


def load(path: Path, default):
    return json.loads(path.read_text()) if path.is_file() else default


def save(path: Path, obj): path.write_text(json.dumps(obj, indent=1) + "\n")


def greedy(target, tok, prompts):
    stops, answers, t0 = stop_token_ids(tok, target), [], time.perf_counter()
    for ids in prompts: answers.append(greedy_generate(target, ids, MAX_NEW, stops))
    save(HERE / "greedy.json", dict(prompts=[p[0].tolist() for p in prompts], answers=answers,
                                    seconds=time.perf_counter() - t0))


def sweep_lookup(prompts, answers, results):
    rows, matches, rng = [], PrefixMatches(), np.random.default_rng(0)
    for values in itertools.product(*GRID.values()):
        s = dict(zip(GRID, values))
        if s["prompt_lookup_min"] > s["prompt_lookup_max"] or s["num_speculative_tokens"] > MAX_K: continue
        rows.append(dict(settings=s, **replay_tau(prompts, answers, s, matches)))
    for _ in range(2000):                                    # the fast path proposes what lookup_propose does
        (p, i), setting = list(matches.cache)[rng.integers(len(matches.cache))], rows[rng.integers(len(rows))]["settings"]
        seq = np.asarray(prompts[p][0].tolist() + answers[p])[:prompts[p].shape[1] + i]
        assert fast_propose(matches.cache[(p, i)], seq, **setting) == lookup_propose(seq.tolist(), **setting), (p, i, setting)
    results["lookup_sweep"] = dict(grid=GRID, max_k=MAX_K, n_settings=len(rows), rows=rows)


def best_lookup(results) -> dict:
    "The setting of highest replayed τ; ties go to the first in grid order (the smaller n and k)."
    return max(results["lookup_sweep"]["rows"], key=lambda r: r["tau"])["settings"]


def decode_all(target, tok, prompts, answers, results, every_rule: bool = False):
    """Real decodes, each checked token for token against the greedy answers: lookup (the project's rule, the chosen
    setting), Domino and the hybrid under every rule with the seed-0 draft, then Domino and the hybrid under the rule
    chosen on seed 0 with the seed-1 and seed-2 drafts (every rule on every seed did not fit the time)."""
    stops, tuned, drafts = stop_token_ids(tok, target), best_lookup(results), {}
    results.setdefault("decodes", {})
    def draft(seed):
        if seed not in drafts:
            d = load_draft(find_draft_dir(STUDY / "domino" / f"seed{seed}"), target_config=target.config)
            drafts[seed] = d.to(dtype=next(target.parameters()).dtype).eval()
        return drafts[seed]
    def domino(seed): return lambda ids: speculative_generate(target, draft(seed), ids, MAX_NEW, stops)
    def hybrid(seed, rule): return lambda ids: hybrid_generate(target, draft(seed), ids, MAX_NEW, stops, rule=rule, lookup=tuned)
    jobs = {"lookup_project": lambda ids: ngram_generate(target, ids, MAX_NEW, stops, **PROJECT_LOOKUP),
            "lookup_tuned": lambda ids: ngram_generate(target, ids, MAX_NEW, stops, **tuned),
            f"domino/seed{RULE_SEED}": domino(RULE_SEED)}
    jobs |= {f"hybrid_{rule}/seed{RULE_SEED}": hybrid(RULE_SEED, rule) for rule in HYBRID_RULES}
    run_jobs(jobs, prompts, answers, results)
    rule = best_rule(results)
    later = [s for s in SEEDS if s != RULE_SEED]
    run_jobs({f"domino/seed{s}": domino(s) for s in later} | {f"hybrid_{rule}/seed{s}": hybrid(s, rule) for s in later},
             prompts, answers, results)
    if every_rule:                                           # the other rules on the other seeds: a check of the choice
        run_jobs({f"hybrid_{r}/seed{s}": hybrid(s, r) for s in later for r in HYBRID_RULES}, prompts, answers, results)


def run_jobs(jobs, prompts, answers, results):
    runs = results["decodes"]
    for name, run in jobs.items():
        if name in runs: continue
        steps = committed = 0
        chosen, lossless, t0 = dict(lookup=0, draft=0), True, time.perf_counter()
        for ids, ref in zip(prompts, answers):
            toks, st = run(ids)
            lossless &= toks == ref
            steps, committed = steps + st["verify_steps"], committed + st["committed"]
            for k, v in st.get("chosen", {}).items(): chosen[k] += v
        runs[name] = dict(tau=committed / steps, verify_steps=steps, committed=committed, lossless=lossless,
                          seconds=round(time.perf_counter() - t0, 1), **({"chosen": chosen} if "hybrid" in name else {}))
        if name.startswith("lookup_"):
            runs[name]["settings"] = PROJECT_LOOKUP if name == "lookup_project" else best_lookup(results)
        print(name, runs[name], flush=True)
        save(HERE / "results.json", results)


def best_rule(results) -> str:
    "The hybrid rule of highest τ with the seed-`RULE_SEED` draft."
    runs = results["decodes"]
    return max(HYBRID_RULES, key=lambda r: runs[f"hybrid_{r}/seed{RULE_SEED}"]["tau"])


def choose(results):
    runs, mean, rule = results["decodes"], lambda xs: sum(xs) / len(xs), best_rule(results)
    results["chosen"] = dict(
        lookup=best_lookup(results), hybrid_rule=rule, rule_seed=RULE_SEED,
        hybrid_tau_by_rule={r: runs[f"hybrid_{r}/seed{RULE_SEED}"]["tau"] for r in HYBRID_RULES},
        tau_by_seed={name: [runs[f"{name}/seed{s}"]["tau"] for s in SEEDS] for name in ("domino", f"hybrid_{rule}")},
        lookup_tau=dict(project=runs["lookup_project"]["tau"], tuned=runs["lookup_tuned"]["tau"]))
    results["chosen"]["mean_tau"] = {k: mean(v) for k, v in results["chosen"]["tau_by_seed"].items()}
    if all(f"hybrid_{r}/seed{s}" in runs for r in HYBRID_RULES for s in SEEDS):      # after `decode --every_rule`
        results["chosen"]["mean_tau_by_rule"] = {r: mean([runs[f"hybrid_{r}/seed{s}"]["tau"] for s in SEEDS])
                                                 for r in HYBRID_RULES}


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("piece", choices=("greedy", "lookup", "decode", "choose"))
    p.add_argument("--every_rule", action="store_true", help="decode: also every rule with the seed-1 and seed-2 drafts")
    a = p.parse_args(argv)
    torch.set_num_threads(1)
    results = load(HERE / "results.json", dict(split="validation", n_prompts=N_PROMPTS, max_new_tokens=MAX_NEW,
                                               prompt_seed=PROMPT_SEED, draft_seeds=list(SEEDS)))
    if a.piece == "choose":
        choose(results)
        return save(HERE / "results.json", results)
    target, tok = load_embedded_target()
    prompts = validation_prompts(tok)
    if a.piece == "greedy": return greedy(target, tok, prompts)
    g = load(HERE / "greedy.json", None)
    if g is None or g["prompts"] != [p[0].tolist() for p in prompts]:
        sys.exit("sweep.py: run `python runs/lookup_sweep/sweep.py greedy` first (greedy.json is missing or stale)")
    if a.piece == "lookup": sweep_lookup(prompts, g["answers"], results)
    else: return decode_all(target, tok, prompts, g["answers"], results, a.every_rule)
    save(HERE / "results.json", results)


if __name__ == "__main__":
    main()
