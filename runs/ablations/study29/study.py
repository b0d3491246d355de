"""The commands of study 29, run from any folder: every path is this file's folder's (README.md beside this file is the
plan: what each piece is for, what it costs, what it writes).

    python runs/ablations/study29/study.py tune embedded          # piece 1: the learning-rate grid at the full budget,
                                                                  # seed 0, decoded on every validation prompt (resumable)
    python runs/ablations/study29/study.py settings embedded      # piece 2: lookup's setting (replayed), the hybrid's rule
                                                                  # per drafter, EAGLE-3's chain length; the rivals
    python runs/ablations/study29/study.py table embedded         # piece 3: seeds 1-4 of Domino and the trained rival,
                                                                  # 1-2 of the third drafter (each decoded greedily, test)
    ... table embedded --only eagle3=1,2 domino=2                 # a part of piece 3 that fits a session
    python runs/ablations/study29/study.py test embedded          # piece 4: every kept draft alone and in the hybrid,
                                                                  # greedy and T = 1, and lookup: all test prompts
    ... test embedded --only eagle3=0 domino=1,2                  # a part of piece 4: these drafts' rows (no test.json)
    python runs/ablations/study29/study.py curve embedded         # piece 5: seed 0 at 720 and 1440 steps, validation
    python runs/ablations/study29/study.py lookup docstring       # piece 6b: lookup alone on the second target's test
                                                                  # prompts, at the first target's setting
    python runs/ablations/study29/study.py tune docstring         # pieces 7-11: the same on the second target
    ... PIECE TARGET --tiny                                       # any piece on a tiny random setting (a dry run)

Every piece skips the runs it finds done with the same settings (an interrupted run continues from its last
checkpoint) and refuses in one line when the piece it needs is not done.
"""
import argparse, dataclasses, importlib.util, json, math, tempfile, time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

import torch

from domino_research.ablations import decode_rows, run_ablation
from domino_research.data import stop_token_ids
from domino_research.config import ConfigError
from domino_research.decode import HYBRID_RULES, greedy_generate
from domino_research.evaluation import encode_prompt, read_prompts
from domino_research.rates import best_learning_rates, lr_sweep, with_learning_rate
from domino_research.study_run import TargetCache, source_digest
from domino_research.embedded import embedded_mask_token_id, resolve_data_path, resolve_target_path, shipped_build
from domino_research.variants import VARIANTS, Variant, tiny_setting

STUDY = Path(__file__).resolve().parent     # not the current folder: a piece run elsewhere would start anew there
COMMAND = f"python {STUDY / 'study.py'}"
TRAINED = ("domino", "dflash_shift_d3", "eagle3")       # the trained drafters, each at Domino's parameter count
GRID = (1e-3, 3e-3, 1e-2)                               # the learning rates every trained drafter is tried at
EAGLE3_BLOCKS = (4, 16)                 # EAGLE-3's verify blocks tried beside its draft's own (8: chains of 3, 7, 15)
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
    test: str = "embedded:test"                         # the prompts the study's τ is reported on: every one of them
    grid_from: Optional[Path] = None                    # a target whose tuning narrows this one's (None: the full grid)
    table_seeds: dict = field(default_factory=lambda: {"headline": (1, 2, 3, 4), "third": (1, 2)})
    temperature: float = 1.0                            # the sampled decodes of `test`
    only: Optional[dict] = None                         # `table`, `test`: {drafter: seeds} to run now (None: all)


def _docstring() -> Setting:
    """The second target (README, pieces 7-11): its build's target and data; its mask token read from its tokenizer.
    Tuned: Domino and the trained rival only, at two rates around the first target's choice; no third drafter."""
    name = "embedded_docstring"
    shipped_build(name)                                 # a missing build: one line saying how to build it
    return Setting(STUDY / "docstring", f"{name}:validation", test=f"{name}:test", table_seeds={"headline": (1, 2, 3, 4)},
                   grid_from=STUDY / "embedded",
                   base_overrides={"target": name, "train_data": f"{name}:train", "eval_data": f"{name}:validation",
                                   "mask_token_id": embedded_mask_token_id(shipped_build(name))})


TARGETS = {"embedded": lambda: Setting(STUDY / "embedded", "embedded:validation"), "docstring": _docstring}


def tiny(root) -> Setting:
    """The same pieces on `tiny_setting` under `root`: 4 steps, checkpoints kept at 1 and 2, 16 new tokens, 4 prompts; one
    rate below the grid on the ladder, so the edge rule runs at most one round more."""
    t = tiny_setting(Path(root) / "setting")
    return Setting(Path(root), t["prompts"], steps=4, keep_steps=(1, 2), max_new_tokens=16, configs=t["configs"],
                   ladder=(3e-4, *GRID), test=t["prompts"], table_seeds={"headline": (1,), "third": (1,)})


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


def refuse(piece: str, needs: Path, command: str):
    "Stop in one line: this piece needs a piece that is not done."
    raise SystemExit(f"study.py {piece}: {needs} is missing: run `{COMMAND} {command}` first (and until it completes)")


def read(path: Path, piece: str, command: str) -> dict:
    if not path.is_file(): refuse(piece, path, command)
    return json.loads(path.read_text())


def first_rates(s: Setting) -> dict:
    """{drafter: the rates tried first}: the grid for every trained drafter; on a target tuned after another
    (`grid_from`), Domino and that target's trained rival only, each at its chosen rate there and the neighbour half a
    decade towards its second best there (README, piece 7)."""
    if s.grid_from is None: return {v: list(GRID) for v in TRAINED}
    first = read(s.grid_from / "tune" / "best_lr.json", "tune", f"tune {s.grid_from.name}")
    rival = read(s.grid_from / "settings.json", "tune", f"settings {s.grid_from.name}")["trained_rival"]
    out = {}
    for v in ("domino", rival):
        taus = {lr: first["tau"][f"{v}_lr{lr:g}"] for lr in first["tried"][v]}
        best, second = sorted(taus, key=lambda lr: -taus[lr])[:2]
        i = LADDER.index(min(LADDER, key=lambda r: abs(math.log(r / best))))
        out[v] = sorted([best, LADDER[i + 1] if second > best else LADDER[i - 1]])
    return out


def finished_edges(s: Setting, tried: dict) -> list[tuple[str, float]]:
    """The edge rule's next rates for the drafters whose every tried rate has already been trained and decoded (by
    their `result.json`); `tune` adds them to its next round instead of waiting for the other drafters' runs."""
    done = {v: {lr: _tune_run(s, v, lr) / "result.json" for lr in rates} for v, rates in tried.items()}
    done = {v: {lr: json.loads(f.read_text())["tau"] for lr, f in fs.items()} for v, fs in done.items()
            if all(f.is_file() for f in fs.values())}
    return extensions({v: max(sorted(t), key=t.get) for v, t in done.items()}, {v: tried[v] for v in done}, s.ladder)


def final_rates(s: Setting) -> dict:
    """{drafter: rate} of the drafters whose tuning is already final, from the runs `tune` has finished: every rate it
    tries first is done, and the best of the done rates lies inside them (the edge rule would add nothing)."""
    out = {}
    for v, first in first_rates(s).items():
        done = {float(f.parent.parent.name.rpartition("_lr")[2]): json.loads(f.read_text())["tau"]
                for f in (s.root / "tune" / "runs").glob(f"{v}_lr*/seed0/result.json")}
        best = max(sorted(done), key=done.get, default=None)    # a tie goes to the lowest rate, as in `tune`'s choice
        if set(first) <= set(done) and not extensions({v: best}, {v: list(done)}, s.ladder): out[v] = best
    return out


def tune(s: Setting, log=print) -> dict:
    """Piece 1: every trained drafter at each rate of the grid, seed 0, the full budget, decoded greedily on every
    validation prompt; then the edge rule, until every best rate is inside its tried rates. Writes <root>/tune/ and
    <root>/tune/best_lr.json ({variant: rate}, chosen by decoded τ); returns that mapping."""
    tried = first_rates(s)
    while True:
        for v, lr in finished_edges(s, tried):           # beside the round's other runs, so that no core idles
            log(f"tune: {v}'s rates are all done and its best is at the edge: adding {lr:g}")
            tried[v].append(lr)
        table = lr_sweep([(v, lr) for v in tried for lr in sorted(tried[v])])
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

def _lookup_sweep():
    "runs/lookup_sweep/sweep.py, the replay of lookup's settings on a target's greedy answers (reused, not copied)."
    spec = importlib.util.spec_from_file_location("lookup_sweep", STUDY.parents[1] / "lookup_sweep" / "sweep.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _tuned(s: Setting, piece: str) -> dict:
    "best_lr.json of `tune`, or a one-line refusal."
    return read(s.root / "tune" / "best_lr.json", piece, f"tune {_name(s)}")


def _name(s: Setting) -> str: return s.root.name


def _tune_run(s: Setting, v: str, lr: float) -> Path: return s.root / "tune" / "runs" / f"{v}_lr{lr:g}" / "seed0"


def _drafter(v: str, settings: Optional[dict] = None) -> dict:
    "The drafter spec a trained drafter decodes alone with: EAGLE-3 at its chosen chain length (settings.json)."
    if v != "eagle3" or settings is None: return dict(VARIANTS[v].drafter)
    return {"drafter": "eagle3", "block_size": settings["eagle3_block_size"]}


def _hybrid(v: str, settings: dict) -> dict:
    "The drafter spec a trained drafter decodes with in the hybrid: its rule, lookup's setting, EAGLE-3 at its chosen chain."
    return _hybrid_rule(v, settings["hybrid_rule"][v], settings["lookup"], settings.get("eagle3_block_size"))


def _hybrid_rule(v: str, rule: str, lookup: dict, eagle3_block_size: Optional[int]) -> dict:
    "The hybrid of drafter `v` with `rule` and lookup's setting; EAGLE-3's part at the chain it decodes alone."
    chain = {"eagle3_block_size": eagle3_block_size} if v == "eagle3" else {}
    return {"drafter": "hybrid", "rule": rule, **chain, **lookup}


def _greedy_answers(s: Setting, out: Path, log) -> tuple[list, list]:
    "The target's greedy answers to every validation prompt (in file order), computed once into <out>/greedy.json."
    model, tok = TargetCache()(resolve_target_path(s.base_overrides.get("target") or _target_name(s)))
    prompts = [encode_prompt(tok, r["messages"]) for r in read_prompts(resolve_data_path(s.validation))]
    f = out / "greedy.json"
    if f.is_file() and json.loads(f.read_text())["prompts"] == [p[0].tolist() for p in prompts]:
        return prompts, json.loads(f.read_text())["answers"]
    stops, t0 = stop_token_ids(tok, model), time.perf_counter()
    answers = [greedy_generate(model, ids, s.max_new_tokens, stops) for ids in prompts]
    out.mkdir(parents=True, exist_ok=True)
    f.write_text(json.dumps({"prompts": [p[0].tolist() for p in prompts], "answers": answers,
                             "seconds": time.perf_counter() - t0}) + "\n")
    log(f"settings: greedy answers to {len(prompts)} validation prompts in {time.perf_counter() - t0:.0f}s")
    return prompts, answers


def _target_name(s: Setting) -> str:
    "The target of the tiny setting's configs (the study's targets are given by name in base_overrides or the recipe)."
    if s.configs is None: return "embedded"
    import yaml
    return yaml.safe_load(Path(s.configs["embedded_domino"]).read_text())["target"]


def settings(s: Setting, log=print) -> dict:
    """Piece 2: on every validation prompt, greedy: lookup's setting (its grid replayed on the target's greedy answers),
    EAGLE-3's verify block (`EAGLE3_BLOCKS` beside its draft's own, the tuning's), the hybrid's rule for each trained drafter
    at its chosen rate (every rule decoded over its seed-0 draft; EAGLE-3's at its chosen chain, so after it); then the
    rivals. Writes <root>/settings.json."""
    best, out = _tuned(s, "settings")["best"], s.root / "settings"
    prompts, answers = _greedy_answers(s, out, log)
    sweep = _lookup_sweep()
    replay = {}
    sweep.sweep_lookup(prompts, answers, replay)
    lookup = sweep.best_lookup(replay)
    lookup_tau = max(r["tau"] for r in replay["lookup_sweep"]["rows"])
    common = dict(out_dir=out, prompts=s.validation, n_eval_prompts="all", max_new_tokens=s.max_new_tokens)

    def row(name: str, v: str, drafter: dict) -> dict:
        return dict(name=name, seed=0, source=_tune_run(s, v, best[v]), drafter=drafter, **common)

    def hybrids(vs, eagle3_block: Optional[int]) -> dict:
        return {(f"{v}+lookup_{r}", v): row(f"{v}+lookup_{r}", v, _hybrid_rule(v, r, lookup, eagle3_block)) for v in vs
                for r in HYBRID_RULES}
    rows = hybrids([v for v in best if v != "eagle3"], None)
    if "eagle3" in best:                       # the tuning decoded its draft's own block; the others tried beside it
        own = json.loads((_tune_run(s, "eagle3", best["eagle3"]) / "draft" / "config.json").read_text())["block_size"]
        tried = [bs for bs in EAGLE3_BLOCKS if bs != own]
        rows |= {(f"eagle3_bs{bs}", "eagle3"): row(f"eagle3_bs{bs}", "eagle3", {"drafter": "eagle3", "block_size": bs})
                 for bs in tried}
    recs = decode_rows(rows, jobs=s.jobs, log=log)
    tau = {v: json.loads((_tune_run(s, v, best[v]) / "result.json").read_text())["tau"] for v in best}
    chain = {own: tau["eagle3"]} | {bs: recs[f"eagle3_bs{bs}", "eagle3"]["tau"] for bs in tried} if "eagle3" in best else {}
    eagle3_bs = max(chain, key=chain.get, default=None)       # a tie keeps the draft's own block (the first key)
    if eagle3_bs is not None:                  # EAGLE-3 alone and in the hybrid at the block chosen alone
        tau["eagle3"] = chain[eagle3_bs]
        recs |= decode_rows(hybrids(["eagle3"], eagle3_bs), jobs=s.jobs, log=log)
    rule = {v: max(HYBRID_RULES, key=lambda r: recs[f"{v}+lookup_{r}", v]["tau"]) for v in best}
    rivals = [v for v in best if v != "domino"]
    trained_rival = max(rivals, key=lambda v: tau[v])
    res = {"rates": best, "lookup": lookup, "lookup_tau": lookup_tau,
           "lookup_settings_replayed": len(replay["lookup_sweep"]["rows"]),
           "hybrid_rule": rule, "hybrid_tau": {f"{v}+lookup_{r}": recs[f"{v}+lookup_{r}", v]["tau"] for v in best
                                                for r in HYBRID_RULES},
           "eagle3_block_size": eagle3_bs, "eagle3_tau_by_block_size": chain, "tau_alone": tau,
           "trained_rival": trained_rival, "headline_rival": trained_rival if tau[trained_rival] >= lookup_tau else "lookup",
           "rule": "validation τ alone (all validation prompts, greedy, seed 0); the test prompts choose nothing"}
    (s.root / "settings.json").write_text(json.dumps(res, indent=2) + "\n")
    log(f"settings: trained rival {res['trained_rival']}, headline rival {res['headline_rival']}")
    return res


def _table_variants(s: Setting, st: dict) -> dict:
    "{variant: (Variant at its chosen rate and drafter, seeds)} of the table: Domino and the trained rival, the third."
    rival, third = st["trained_rival"], [v for v in st["rates"] if v not in ("domino", st["trained_rival"])]
    seeds = {"domino": s.table_seeds["headline"], rival: s.table_seeds["headline"]}
    if "third" in s.table_seeds: seeds |= {v: s.table_seeds["third"] for v in third}
    return {v: (dataclasses.replace(with_learning_rate(VARIANTS[v], st["rates"][v]), drafter=_drafter(v, st)), seeds[v])
            for v in seeds}


def _early_variants(s: Setting) -> dict:
    """`_table_variants` of the drafters of `--only` before piece 2: each at its final rate (`final_rates`), with the
    seeds it has in the table whichever drafter piece 2 makes the rival; EAGLE-3 waits (piece 2 sets its chain length)."""
    rates, heads, third = final_rates(s), s.table_seeds["headline"], s.table_seeds.get("third", ())
    for v in s.only:
        if v == "eagle3" or v not in rates:
            why = "its chain length is chosen there" if v == "eagle3" else "its rate is not final yet"
            raise SystemExit(f"study.py table: --only {v} before piece 2 (settings.json): {why}; run `{COMMAND} "
                             f"settings {_name(s)}` first (after `tune` completes)")
    seeds = lambda v: heads if v == "domino" else tuple(k for k in heads if k in third)
    return {v: (dataclasses.replace(with_learning_rate(VARIANTS[v], rates[v]), drafter=_drafter(v)), seeds(v)) for v in s.only}


def table(s: Setting, log=print) -> dict:
    """Piece 3: the other seeds of each trained drafter at its chosen rate (5 in all for Domino and the trained rival,
    3 for the third), each decoded alone, greedily, on every test prompt: <root>/steps<steps>/. With `only` and no
    settings.json yet, the seeds of drafters whose rate is already final (the same runs, which the piece then skips)."""
    f = s.root / "settings.json"
    early = s.only is not None and not f.is_file()
    runs, out = (_early_variants(s) if early else _table_variants(s, read(f, "table", f"settings {_name(s)}"))), {}
    if s.only is not None:                               # a part of the table, sized to a session (--only)
        extra = [f"{v} seed {k}" for v, ks in s.only.items() for k in ks if v not in runs or k not in runs[v][1]]
        if extra: raise SystemExit(f"study.py table: --only {', '.join(extra)}: not in the table "
                                   f"({ {v: list(ks) for v, (_, ks) in runs.items()} }; seed 0 is the tuning's run)")
        runs = {v: (variant, [k for k in seeds if k in s.only[v]]) for v, (variant, seeds) in runs.items() if v in s.only}
    for v, (variant, seeds) in runs.items():
        out[v] = run_ablation([v], s.steps, list(seeds), s.root / f"steps{s.steps}" / v, table={v: variant},
                              prompts=s.test, n_eval_prompts="all", max_new_tokens=s.max_new_tokens, jobs=s.jobs,
                              configs=s.configs, base_overrides=s.base_overrides or None, log=log)
    return out


def _kept_runs(s: Setting, st: dict, piece: str) -> dict:
    """{(variant, seed): run folder with a kept draft}: seed 0 is the tuning's run at the chosen rate, the rest the
    table's; with `only`, those drafts alone (a draft the study does not keep is refused)."""
    runs = {}
    for v, (_, seeds) in _table_variants(s, st).items():
        runs[v, 0] = _tune_run(s, v, st["rates"][v])
        runs |= {(v, k): s.root / f"steps{s.steps}" / v / "runs" / v / f"seed{k}" for k in seeds}
    if s.only is not None:
        extra = [f"{v} seed {k}" for v, ks in s.only.items() for k in ks if (v, k) not in runs]
        if extra: raise SystemExit(f"study.py {piece}: --only {', '.join(extra)}: not a draft the study keeps "
                                   f"({', '.join(f'{v} seed {k}' for v, k in runs)})")
        runs = {(v, k): d for (v, k), d in runs.items() if k in s.only.get(v, ())}
    missing = [(v, k) for (v, k), d in runs.items() if not (d / "result.json").is_file()]
    if any(k == 0 for _, k in missing): refuse(piece, s.root / "tune", f"tune {_name(s)}")
    if missing:
        ask = f" --only {' '.join(f'{v}={k}' for v, k in missing)}" if s.only is not None else ""
        refuse(piece, s.root / f"steps{s.steps}" / f"({', '.join(f'{v} seed {k}' for v, k in missing)})",
               f"table {_name(s)}{ask}")
    return runs


def test(s: Setting, log=print) -> dict:
    """Piece 4: every kept draft alone and in the hybrid, greedy and sampled at T = `temperature`, and lookup at its
    setting, greedy and sampled, on every test prompt. Writes <root>/test/ and <root>/test.json (τ per row and seed).
    With `only`: those drafts' rows alone, written to <root>/test/ (which the whole piece then skips), no test.json."""
    st = read(s.root / "settings.json", "test", f"settings {_name(s)}")
    runs, out = _kept_runs(s, st, "test"), s.root / "test"
    common = dict(out_dir=out, prompts=s.test, n_eval_prompts="all", max_new_tokens=s.max_new_tokens)
    rows = {}
    for (v, k), src in runs.items():
        for t in (0.0, s.temperature):
            tag = "greedy" if t == 0 else f"T{t:g}"
            if not (t == 0 and k > 0):                   # the table's own decode is the alone greedy row of seeds >= 1
                rows[f"{v}_{tag}", k] = dict(name=f"{v}_{tag}", seed=k, source=src, drafter=_drafter(v, st), temperature=t,
                                             **common)
            rows[f"{v}+lookup_{tag}", k] = dict(name=f"{v}+lookup_{tag}", seed=k, source=src, drafter=_hybrid(v, st),
                                                temperature=t, **common)
    recs = decode_rows(rows, jobs=s.jobs, log=log)
    if s.only is not None:
        log(f"test: {len(recs)} rows of {sorted(runs)} done; `{COMMAND} test {_name(s)}` adds the rest and test.json")
        return {f"{name} seed {k}": r["tau"] for (name, k), r in recs.items()}
    for (v, k), src in runs.items():
        if k > 0: recs[f"{v}_greedy", k] = json.loads((src / "result.json").read_text())
    recs |= _lookup_rows(s, st["lookup"], out, log)
    table_ = {}
    for (name, k), r in recs.items(): table_.setdefault(name, {})[str(k)] = r["tau"]
    summary = {"prompts": s.test, "temperature": s.temperature, "tau": table_,
               "mean_tau": {n: sum(d.values()) / len(d) for n, d in table_.items()}}
    (s.root / "test.json").write_text(json.dumps(summary, indent=2) + "\n")
    return summary


def _lookup_rows(s: Setting, setting: dict, out: Path, log=print) -> dict:
    "{(lookup_TAG, 0): result} of prompt lookup at `setting`, greedy and at T = `temperature`, on every test prompt."
    lookup = {"lookup": Variant("embedded_domino", {}, "prompt lookup at the setting chosen on validation",
                                drafter={"drafter": "lookup", **setting})}
    recs = {}
    for t in (0.0, s.temperature):
        tag = "greedy" if t == 0 else f"T{t:g}"
        run_ablation(["lookup"], s.steps, [0], out / f"lookup_{tag}", table=lookup, prompts=s.test, n_eval_prompts="all",
                     max_new_tokens=s.max_new_tokens, configs=s.configs, base_overrides=s.base_overrides or None,
                     temperature=t, log=log)
        recs[f"lookup_{tag}", 0] = json.loads((out / f"lookup_{tag}" / "runs" / "lookup" / "seed0" / "result.json").read_text())
    return recs


def lookup(s: Setting, log=print) -> dict:
    """Piece 6b, for a target no drafter is trained on yet (the second): prompt lookup alone, at the setting chosen on the
    first target's validation prompts (`grid_from`; its own, without one), greedy and at T = `temperature`, on every test
    prompt. Writes <root>/lookup/ and <root>/lookup.json (τ of each, and the setting)."""
    first = s.grid_from or s.root
    st = read(first / "settings.json", "lookup", f"settings {first.name if s.grid_from else _name(s)}")
    recs = _lookup_rows(s, st["lookup"], s.root / "lookup", log)
    summary = {"prompts": s.test, "temperature": s.temperature, "setting": st["lookup"], "setting_from": first.name,
               "tau": {name: r["tau"] for (name, _), r in recs.items()}}
    (s.root / "lookup.json").write_text(json.dumps(summary, indent=2) + "\n")
    return summary


def curve(s: Setting, log=print) -> dict:
    """Piece 5: does the ranking still move: seed 0 of Domino and the trained rival at the kept checkpoints (720 and 1440
    steps of the tuning's runs) decoded on every validation prompt, greedy, beside the full budget's τ of the tuning."""
    st = read(s.root / "settings.json", "curve", f"settings {_name(s)}")
    common = dict(out_dir=s.root / "curve", prompts=s.validation, n_eval_prompts="all", max_new_tokens=s.max_new_tokens)
    heads = ("domino", st["trained_rival"])
    rows = {(v, step): dict(name=f"{v}_step{step}", seed=0, source=_tune_run(s, v, st["rates"][v]), step=step,
                            drafter=_drafter(v, st), **common) for v in heads for step in s.keep_steps}
    recs = decode_rows(rows, jobs=s.jobs, log=log)
    res = {v: {str(step): recs[v, step]["tau"] for step in s.keep_steps} for v in heads}
    for v in heads: res[v][str(s.steps)] = st["tau_alone"][v]
    (s.root / "curve.json").write_text(json.dumps({"prompts": s.validation, "tau": res}, indent=2) + "\n")
    return res


def _only(arg: str) -> tuple[str, tuple[int, ...]]:
    "--only's DRAFTER=SEEDS (seeds 0,1,...) as (drafter, seeds); a malformed one is argparse's one-line error."
    v, _, seeds = arg.partition("=")
    try: ks = tuple(int(k) for k in seeds.split(","))
    except ValueError: ks = ()
    if v not in TRAINED or not ks or min(ks) < 0:
        raise argparse.ArgumentTypeError(f"{arg!r}: write DRAFTER=SEEDS, a drafter of {TRAINED} and seeds >= 0 (e.g. eagle3=1,2)")
    return v, ks


PIECES = {"tune": tune, "settings": settings, "table": table, "test": test, "curve": curve, "lookup": lookup}


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("piece", choices=list(PIECES))
    p.add_argument("target", choices=list(TARGETS))
    p.add_argument("--tiny", action="store_true", help="a dry run on the tiny random setting (nothing of the study's)")
    p.add_argument("--out", type=Path, help="--tiny: where it writes (default: a new temporary folder)")
    p.add_argument("--only", nargs="+", metavar="DRAFTER=SEEDS", type=_only,
                   help="table, test: only these seeds' runs now, to fit a session (e.g. eagle3=1,2 domino=2; seed 0, the "
                        "tuning's, is a draft of test's); the rest on a later call")
    p.add_argument("--jobs", type=int, help="runs at a time, one thread each (default: the setting's, 2 = both cores); "
                                            "1 runs in this process on one thread, leaving a core to a job beside it")
    a = p.parse_args(argv)
    if a.jobs is not None and a.jobs < 1: p.error(f"--jobs {a.jobs}: give 1 or more runs at a time")
    if a.out and not a.tiny: p.error("--out is for --tiny only: the study's pieces write beside this file")
    if a.only and a.piece not in ("table", "test"): p.error("--only is for the table and test pieces only")
    if a.tiny:
        root = a.out or Path(tempfile.mkdtemp(prefix="study29_tiny_"))
        print(f"dry run on the tiny setting in {root}")
        s = tiny(root)
    else:
        try: s = TARGETS[a.target]()
        except ConfigError as e: raise SystemExit(f"study.py {a.piece} {a.target}: {e}") from None   # a build not there
    if a.jobs: s = dataclasses.replace(s, jobs=a.jobs)
    if s.jobs == 1: torch.set_num_threads(1)   # the run in this process takes one thread, as each worker of two does
    if a.only:
        only = {}
        for v, ks in a.only: only[v] = tuple(sorted({*only.get(v, ()), *ks}))
        s = dataclasses.replace(s, only=only)
    try: return PIECES[a.piece](s)
    except KeyboardInterrupt:                   # the runs' own lines say where each stopped; no traceback on top of them
        raise SystemExit(f"study.py {a.piece}: stopped by Ctrl-C; finished runs are kept and a run in flight resumes from "
                         f"its last checkpoint: run the same command again") from None


if __name__ == "__main__":
    main()
