"""Every kept draft of study 28 alone and in the hybrid, and prompt lookup (tuned and the project's rule), decoded on all
the test prompts: the per-step records `nbs/41_findings.ipynb` reads.

    python runs/ablations/study28/drafters/decode.py list            # the runs, in order, and which are done
    python runs/ablations/study28/drafters/decode.py run --part 0/2  # the runs of part 0 of 2 (every second run)
    python runs/ablations/study28/drafters/decode.py run --part 1/2  # ... the others (run both at once: two processes)

Each run writes its own `results/<run>.json` when it has decoded every prompt, and a run whose file exists is skipped:
the script is resumable. A process claims a run before decoding it (`results/<run>.claim`, its pid), so two processes,
of any parts, never decode or write the same run; `--part 0/1` run again in a second process shares the rest.
One thread per process, greedy, the embedded target.
"""
import argparse, hashlib, json, os, sys, time
from pathlib import Path

import torch

from domino_research.data import repetition_score, stop_token_ids
from domino_research.decode import (HYBRID_DEFAULT_RULE, LOOKUP_DEFAULTS, PROJECT_LOOKUP, build_drafter,
                                    drafter_generate, greedy_generate, StepTimer, TwoChains)
from domino_research.embedded import embedded_dataset_path, load_embedded_target
from domino_research.evaluation import draft_for_target, encode_prompt, read_prompts

HERE = Path(__file__).parent
OUT = HERE / "results"
STUDY = HERE.parent / "steps2880"
VARIANTS = ("domino", "dflash_shift_d3", "dflash_shift_matched", "dflash_shift_d4", "lambda_steps720")   # trained, kept
SEEDS = (0, 1, 2)
MAX_NEW = 128                                               # study 28's decode settings, on every test prompt
WARMUP_TOKENS = 16                                          # one short untimed decode per run first (lazy initialisation)


def strongest_dflash() -> str:
    "The DFlash variant of highest mean τ in study 28's own table (64 prompts): read before any run here, chooses nothing here."
    res = json.loads((STUDY / "results.json").read_text())["variants"]
    return max((v for v in VARIANTS if v.startswith("dflash")), key=lambda v: res[v]["tau"]["mean"])


def runs() -> dict[str, dict]:
    "{run name: drafter spec (+ 'draft': its kept folder)}, in the order they run: the project-rule hybrids last."
    out = {"greedy": {}, "lookup_tuned": dict(drafter="lookup", **LOOKUP_DEFAULTS),
           "lookup_project": dict(drafter="lookup", **PROJECT_LOOKUP)}
    for v in VARIANTS:
        for s in SEEDS:
            folder = STUDY / "runs" / v / f"seed{s}" / "draft_bf16"
            out[f"draft/{v}/seed{s}"] = dict(drafter="draft", draft=folder)
            out[f"hybrid/{v}/seed{s}"] = dict(drafter="hybrid", rule=HYBRID_DEFAULT_RULE, **LOOKUP_DEFAULTS, draft=folder)
    for v in ("domino", strongest_dflash()):                 # hybrid with the project's lookup rule: if time allows
        for s in SEEDS:
            out[f"hybrid_project/{v}/seed{s}"] = dict(drafter="hybrid", rule=HYBRID_DEFAULT_RULE, **PROJECT_LOOKUP,
                                                      draft=STUDY / "runs" / v / f"seed{s}" / "draft_bf16")
    return out


def result_path(name: str) -> Path: return OUT / (name.replace("/", "__") + ".json")


def claim(name: str) -> bool:
    """Take run `name` for this process: its `.claim` file, made exclusively, holds our pid. A claim whose process is gone
    (killed mid-run) is taken over; one whose process lives is left to it, so processes of any parts never share a run."""
    path = result_path(name).with_suffix(".claim")
    try:
        fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY)
    except FileExistsError:
        try:
            os.kill(int(path.read_text() or 0), 0)
            return False                                    # its process is alive: its run
        except (ProcessLookupError, ValueError):
            path.write_text(str(os.getpid()))               # stale: taken over
            return True
    with os.fdopen(fd, "w") as f: f.write(str(os.getpid()))
    return True


def sha(tokens) -> str: return hashlib.sha1(json.dumps([int(t) for t in tokens]).encode()).hexdigest()[:16]


class Recorder:
    """Wraps a drafter for `drafter_generate`: the wall-clock seconds of each proposal (the draft time of a verify step),
    the gap to the next proposal (the verify, the commit and the loop's bookkeeping), how many tokens each step committed
    (read off the growing sequence the loop hands the drafter), and, for a hybrid, which drafter proposed (a `tree`
    drafter: whether the step was a tree of two chains, `T`, or one chain, `L` or `D`; `proposed` counts both chains)."""
    def __init__(self, drafter):
        self.d, self.block_size, self.layer_ids = drafter, drafter.block_size, drafter.layer_ids
        self.lengths, self.draft_s, self.gap_s, self.chosen, self.n_props, self.t_end = [], [], [], [], [], None

    def __call__(self, ctx, anchor, start, tokens):
        t0 = time.perf_counter()
        if self.t_end is not None: self.gap_s.append(t0 - self.t_end)
        before = dict(getattr(self.d, "chosen", {}))
        props = self.d(ctx, anchor, start, tokens)
        self.t_end = time.perf_counter()
        self.draft_s.append(self.t_end - t0)
        self.lengths.append(len(tokens))
        self.n_props.append(len(props.a) + len(props.b) if isinstance(props, TwoChains) else len(props))
        if before: self.chosen.append(next(k for k in before if self.d.chosen[k] > before[k])[0].upper())
        return props


def decode_one(target, spec, draft, ids, stops, max_new):
    "(tokens, per-prompt record) of one prompt under drafter `spec` (a fresh drafter: its caches start empty)."
    timer = StepTimer()
    rec = Recorder(build_drafter(spec, target, draft=draft, timer=timer))
    t0 = time.perf_counter()
    toks, st = drafter_generate(target, rec, ids, max_new, stops, timer=timer)
    t1 = time.perf_counter()
    if rec.t_end is not None: rec.gap_s.append(t1 - rec.t_end)          # the last step's verify
    ends = rec.lengths[1:] + [ids.shape[1] + len(toks)]
    kept = [b - a for a, b in zip(rec.lengths, ends)]                     # tokens committed per verify step
    assert len(kept) == st["verify_steps"] and sum(kept) == st["committed"], (kept, st)
    row = dict(new_tokens=len(toks), tokens_sha=sha(toks), verify_steps=st["verify_steps"], committed=st["committed"],
               kept=kept, proposed=rec.n_props, seconds=round(t1 - t0, 4),
               prefill_s=round(st["seconds"].get("prefill", 0.0), 5),
               draft_s=round(sum(rec.draft_s), 5), verify_s=round(sum(rec.gap_s), 5),
               timer_s={k: round(v, 5) for k, v in st["seconds"].items()})
    if rec.chosen: row["chosen"] = "".join(rec.chosen)
    if "chain_won" in st: row["chain_won"] = st["chain_won"]          # tree steps whose kept chain was lookup's (a) or the draft's
    return toks, row


def test_prompts(tok):
    "Every prompt of the embedded test split, in file order (study 28 decoded a 64-prompt sample of these)."
    recs = read_prompts(embedded_dataset_path("test"))
    return recs, [encode_prompt(tok, r["messages"]) for r in recs]


def run_one(name, spec, target, tok, recs, prompts):
    stops, spec = stop_token_ids(tok, target), dict(spec)
    folder = spec.pop("draft", None)
    draft = draft_for_target(folder, target) if folder is not None else None
    greedy = json.loads(result_path("greedy").read_text()) if result_path("greedy").is_file() else None
    rows, t0 = [], time.perf_counter()
    if name == "greedy":
        greedy_generate(target, prompts[0], WARMUP_TOKENS, stops)
        for r, ids in zip(recs, prompts):
            s0 = time.perf_counter()
            toks = greedy_generate(target, ids, MAX_NEW, stops)
            rows.append(dict(prompt_id=r["id"], prompt_tokens=ids.shape[1], new_tokens=len(toks), tokens=toks,
                             tokens_sha=sha(toks), seconds=round(time.perf_counter() - s0, 4),
                             repetition=repetition_score(ids[0].tolist(), toks)))
    else:
        decode_one(target, spec, draft, prompts[0], stops, WARMUP_TOKENS)
        for i, (r, ids) in enumerate(zip(recs, prompts)):
            toks, row = decode_one(target, spec, draft, ids, stops, MAX_NEW)
            if greedy is not None: row["lossless"] = row["tokens_sha"] == greedy["per_prompt"][i]["tokens_sha"]
            rows.append(dict(prompt_id=r["id"], prompt_tokens=ids.shape[1], **row))
    steps, committed = sum(r.get("verify_steps", 0) for r in rows), sum(r.get("committed", 0) for r in rows)
    res = dict(run=name, drafter={k: str(v) if isinstance(v, Path) else v for k, v in spec.items()},
               draft=str(folder.relative_to(HERE.parents[3])) if folder is not None else None,
               n_prompts=len(rows), max_new_tokens=MAX_NEW, split="test", torch_threads=torch.get_num_threads(),
               tau=committed / steps if steps else None, seconds=round(time.perf_counter() - t0, 1),
               lossless=all(r.get("lossless", False) for r in rows) if greedy is not None and name != "greedy" else None,
               date=time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()), per_prompt=rows)
    tmp = result_path(name).with_suffix(".tmp")
    tmp.write_text(json.dumps(res, separators=(",", ":")) + "\n")
    os.replace(tmp, result_path(name))                      # whole or absent: a killed run leaves no half file
    print(f"{name}: tau {res['tau']}, lossless {res['lossless']}, {res['seconds']} s", flush=True)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("piece", choices=("list", "run"))
    p.add_argument("--part", default="0/1", help="k/n: the runs whose index is k modulo n")
    a = p.parse_args(argv)
    all_runs = runs()
    if a.piece == "list":
        for i, n in enumerate(all_runs): print(i, n, "done" if result_path(n).is_file() else "-")
        return
    try: k, n = (int(x) for x in a.part.split("/"))
    except ValueError: sys.exit(f"decode.py: --part {a.part!r} must be k/n with 0 <= k < n, e.g. 0/2")
    if not 0 <= k < n: sys.exit(f"decode.py: --part {a.part!r} must be k/n with 0 <= k < n, e.g. 0/2")
    torch.set_num_threads(1)
    OUT.mkdir(exist_ok=True)
    target, tok = load_embedded_target()
    recs, prompts = test_prompts(tok)
    for i, (name, spec) in enumerate(all_runs.items()):
        if i % n != k or result_path(name).is_file() or not claim(name): continue
        run_one(name, spec, target, tok, recs, prompts)
        result_path(name).with_suffix(".claim").unlink()


if __name__ == "__main__":
    main()
