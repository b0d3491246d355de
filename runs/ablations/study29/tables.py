"""Study 29's tables, computed from the files its pieces wrote (notebook 41 shows them and asserts every figure it quotes).

    python runs/ablations/study29/tables.py                          # the shipped target's pieces (embedded/)
    python runs/ablations/study29/tables.py --root DIR --tiny        # a dry run (study.py PIECE embedded --tiny --out DIR)

It prints the tuning (decoded validation τ by learning rate), every row of piece 4 with its interval, the rows on each
split of the prompts, and each drafter's projected speed-up at Qwen3-8B's shapes (latency/latency.json).

τ of a row (a drafter, alone or in the hybrid, greedy or sampled) is the mean over its seeds of each seed's pooled τ
(Σ committed / Σ verify steps over the prompts), with a 95 % bootstrap interval over prompts. A ratio of two rows pairs
seed with seed on the seeds both have (lookup, which has no seed, pairs with every seed) and quotes the wider of the
paired bootstrap over prompts and seeds and a t interval over the per-seed ratios (notebook 41, study 28's rule).
"""
import argparse, importlib.util, json
from pathlib import Path

import numpy as np

from domino_research.decode import _RULES_READING_THE_DRAFT
from domino_research.evaluation import read_prompts, sample_prompts
from domino_research.stats import quoted_tau_ratio, seed_mean_tau

STUDY = Path(__file__).resolve().parent
TAGS = ("greedy", "T1")                                  # the decodes of piece 4: greedy and sampled at T = 1
LATENCY = {"domino": "domino", "dflash_shift_d3": "dflash", "eagle3": "eagle3", "lookup": "lookup"}   # latency.json's names


PIECE_WRITES = {"settings.json": "settings", "test.json": "test", "best_lr.json": "tune", "curve.json": "curve"}


def _read(path: Path) -> dict:
    path = Path(path)
    if not path.exists():                 # a piece not run yet (or a wrong --root): say which, not a traceback
        piece = PIECE_WRITES.get(path.name)
        raise FileNotFoundError(f"{path}: not there" + (f": piece `{piece}` writes it (`python runs/ablations/study29/"
                                                        f"study.py {piece} <target>`), or --root names another folder"
                                                        if piece else ""))
    return json.loads(path.read_text())


def test_records(root: Path) -> dict:
    """{row: {seed: record}} of piece 4 (`test`) with the table's own greedy decodes of seeds >= 1 (piece 3), as
    `study.test` assembled them: rows '<v>_<tag>', '<v>+lookup_<tag>' and 'lookup_<tag>'."""
    root, st = Path(root), _read(Path(root) / "settings.json")
    summary = _read(root / "test.json")["tau"]            # written last, when every row of piece 4 is there
    rows = {}
    for f in sorted((root / "test" / "runs").glob("*/seed*/result.json")):
        rows.setdefault(f.parent.parent.name, {})[int(f.parent.name[4:])] = _read(f)
    for v in st["rates"]:
        for f in sorted(root.glob(f"steps*/{v}/runs/{v}/seed*/result.json")):       # steps2880 (a dry run: steps4)
            rows.setdefault(f"{v}_greedy", {})[int(f.parent.name[4:])] = _read(f)
    for tag in TAGS:
        rows[f"lookup_{tag}"] = {0: _read(root / "test" / f"lookup_{tag}" / "runs" / "lookup" / "seed0" / "result.json")}
    for row, seeds in rows.items():                      # what test.json lists is what these files hold, row for row
        assert {str(k): r["tau"] for k, r in seeds.items()} == summary[row], f"{row}: files and test.json disagree"
    assert set(rows) == set(summary), f"rows {set(summary) ^ set(rows)}: in one of test.json and the run folders only"
    return rows


class Tables:
    "Per-prompt counts of every row of piece 4 on the same prompts, in the prompts' file order."
    def __init__(self, root: Path, strata: dict, prompts):
        self.root, self.rows = Path(root), test_records(root)
        first = next(iter(self.rows["lookup_greedy"].values()))
        self.ids = [p["prompt_id"] for p in first["per_prompt"]]
        for row, seeds in self.rows.items():
            for k, r in seeds.items():
                assert [p["prompt_id"] for p in r["per_prompt"]] == self.ids, f"{row} seed {k}: other prompts or order"
        # the decodes' order is the prompt sample's (seeded, round-robin over modules); ids repeat, so match by row index
        ps = first["evaluation"]["prompt_sample"]
        order = [r["index"] for r in sample_prompts(read_prompts(prompts), len(self.ids), ps["seed"], ps["stratify_by"])]
        by_index = {p["index"]: p for p in strata["prompts"]}
        assert [by_index[i]["id"] for i in order] == self.ids, f"{prompts}: other prompts than the decodes', or in another order"
        self.index, self.stratum = order, np.array([by_index[i]["stratum"] for i in order])
        self.loops = self._looping()

    def _looping(self) -> np.ndarray:
        "Whether the target's greedy answer to each prompt loops: the same in every greedy record (they are lossless)."
        greedy = [r for row, seeds in self.rows.items() if row.endswith("_greedy") for r in seeds.values()]
        loops = {tuple(p["loops"] for p in r["per_prompt"]) for r in greedy}
        assert len(loops) == 1 and all(r["lossless"] for r in greedy), "the greedy decodes disagree on the target's answers"
        return np.array(loops.pop())

    def counts(self, row: str, seeds=None, sel=slice(None)) -> tuple[np.ndarray, np.ndarray]:
        "Committed tokens and verify steps, [prompts, seeds], of a row on the prompts `sel` (seeds: all it has, or these)."
        runs = self.rows[row]
        ks = sorted(runs) if seeds is None else seeds
        return tuple(np.array([[p[key] for p in runs[k]["per_prompt"]] for k in ks], dtype=float).T[sel]
                     for key in ("committed_spec", "verify_steps_spec"))

    def tau(self, row: str, sel=slice(None), n_boot: int = 10_000) -> dict:
        "τ (the mean over seeds of each seed's pooled τ) with a 95 % percentile bootstrap over prompts, and the seeds' τ."
        if not np.ones(len(self.ids), bool)[sel].any(): raise ValueError(f"{row}: no prompt in this selection")
        return seed_mean_tau(*self.counts(row, sel=sel), n_boot=n_boot)

    def ratio(self, a: str, b: str, sel=slice(None), n_boot: int = 10_000) -> dict:
        "τ_a / τ_b on the prompts `sel`, seed paired with seed on the seeds both rows have (lookup: with every seed)."
        sa, sb = sorted(self.rows[a]), sorted(self.rows[b])
        shared = sa if len(sb) == 1 and b.startswith("lookup") else sb if len(sa) == 1 and a.startswith("lookup") \
            else [k for k in sa if k in sb]
        pick = lambda row, s: [k if k in self.rows[row] else 0 for k in shared] if row.startswith("lookup") else shared
        return dict(quoted_tau_ratio(*self.counts(a, pick(a, sa), sel), *self.counts(b, pick(b, sb), sel), n_boot=n_boot),
                    seeds=shared)

    def splits(self) -> dict:
        "{name: boolean mask over the prompts}: all, each prompt-only stratum, the looping and the non-looping answers."
        return {"all": np.ones(len(self.ids), bool), **{f"stratum{t}": self.stratum == t for t in range(3)},
                "looping": self.loops, "non-looping": ~self.loops}

    def draft_share(self, row: str, seed=None) -> float:
        "The share of a hybrid row's verify steps (a seed's, or every seed's) whose proposals came from its trained draft."
        chosen = []
        for k in (sorted(self.rows[row]) if seed is None else [seed]):
            if "chosen_spec" not in self.rows[row][k]["per_prompt"][0]:
                raise ValueError(f"{row} seed {k}: its record does not count the steps each part proposed for (decoded "
                                 f"before `chosen_spec` existed): move its folder aside and decode it again "
                                 f"(`study.py test <target> --only {row.split('+')[0]}={k}`)")
            chosen += [p["chosen_spec"] for p in self.rows[row][k]["per_prompt"]]
        return sum(c["draft"] for c in chosen) / sum(c["draft"] + c["lookup"] for c in chosen)

    def per_tau(self, row: str, latency: dict, settings: dict, seed=None) -> float:
        """Plain decoding's time per token over one verify step's (draft + verify) at Qwen3-8B's shapes, `latency()`'s
        projection: speed-up = τ · per_tau. A hybrid searches with lookup at every step, runs its draft where it sends the
        draft's proposals (at every step if its rule reads the draft), and verifies the width of what it sent. Each trained
        drafter is timed at its method's Qwen3-8B recipe (`dflash_shift_d3`: DFlash's)."""
        v = row.rpartition("_")[0]
        base = v.split("+")[0]
        d = latency[LATENCY[base]]
        if base == "eagle3":        # the chain its decodes ran (the one chosen on validation, alone and in the hybrid)
            width, chosen = self.eagle3_width(row, settings), settings["eagle3_block_size"]
            if width != chosen:
                raise ValueError(f"{row}: decoded EAGLE-3 at block {width}, not the block {chosen} settings.json chose: "
                                 f"move its folders aside and decode it again (`study.py test <target> --only eagle3=K`)")
            if d["block_size"] != width:
                raise ValueError(f"{row}: verifies blocks of {width}, but latency.json timed EAGLE-3 at {d['block_size']}: "
                                 f"time that width (latency/latency.py --eagle3_block_size {width}) before projecting it")
        if v == base: return d["per_tau"]
        look, share = latency["lookup"], self.draft_share(row, seed)
        runs = 1.0 if settings["hybrid_rule"][base] in _RULES_READING_THE_DRAFT else share
        step = look["t_draft"] + runs * d["t_draft"] + share * d["t_verify"] + (1 - share) * look["t_verify"]
        return look["t_plain"] / step

    def speedup(self, row: str, latency: dict, settings: dict) -> float:
        "Projected speed-up over plain decoding: the mean over seeds of each seed's τ × per_tau (its own draft share)."
        return float(np.mean([r["tau"] * self.per_tau(row, latency, settings, k) for k, r in sorted(self.rows[row].items())]))

    def eagle3_width(self, row: str, settings: dict) -> int:
        """The verify width of an EAGLE-3 row (its chain + 1), as its decodes' drafter spec set it: `block_size` alone,
        `eagle3_block_size` in the hybrid; the draft config's block where the spec left it out (notebook 30)."""
        key = "eagle3_block_size" if "+" in row else "block_size"
        widths = {r["drafter"].get(key) or self.draft_block("eagle3", settings) for r in self.rows[row].values()}
        if len(widths) != 1:
            raise ValueError(f"{row}: its seeds ran EAGLE-3 at different blocks {sorted(widths)}: decode the seeds whose "
                             f"block is not settings.json's eagle3_block_size again")
        return widths.pop()

    def draft_block(self, v: str, settings: dict) -> int:
        "The block a trained drafter's draft was built with (its kept draft's config.json; the same for every seed)."
        run = self.root / "tune" / "runs" / f"{v}_lr{settings['rates'][v]:g}" / "seed0"
        return _read(run / "draft" / "config.json")["block_size"]


def latency(path: Path = STUDY / "latency" / "latency.json") -> dict:
    "latency.json's projection of each drafter (t_draft, t_verify, t_plain, per_tau), with the verify width it timed."
    lat = _read(path)
    return {d: {**p, "block_size": lat["draft"][d]["block_size"]} for d, p in lat["projection"].items()}


def reduced_vocab(raw: dict, vocab: int, drafter: str = "eagle3") -> dict:
    """An estimate, not a timing: `drafter`'s step at Qwen3-8B's shapes with a draft head over `vocab` ids instead of the
    target's vocabulary (SpecForge's EAGLE-3 for Qwen3 drafts from 32,000). `raw` is latency.json as written. Each of
    its chain's passes through the head costs the width-1 line's intercept (embedding, final norm and LM head: the head
    is nearly all of it), scaled by vocab / the target's vocabulary; the rest of the step as timed. τ is left as it is."""
    p, full = raw["projection"][drafter], _read(STUDY.parents[2] / "domino_research/assets/qwen3_8b/config.json")["vocab_size"]
    chain = raw["draft"][drafter]["block_size"] - 1
    t_draft = p["t_draft"] - chain * raw["lines"]["1"]["intercept"] * (1 - vocab / full)
    return dict(t_draft=t_draft, per_tau=p["t_plain"] / (t_draft + p["t_verify"]))


def projection_table(t: "Tables", latency: dict, settings: dict, rows: list) -> str:
    "Markdown: each drafter of `rows` ('domino', 'domino+lookup', ...) projected at Qwen3-8B's shapes, greedy and T = 1."
    cell = lambda row: f"{t.per_tau(row, latency, settings):.3f} | {t.speedup(row, latency, settings):.2f}×"
    return "\n".join(["| drafter | per_tau, greedy | speed-up, greedy | per_tau, T = 1 | speed-up, T = 1 |", "|---" * 5 + "|",
                      *(f"| `{v}` | {cell(f'{v}_greedy')} | {cell(f'{v}_T1')} |" for v in rows)])


def tuning_table(root: Path) -> str:
    "Markdown: decoded validation τ of each trained drafter at each learning rate it was tried at; bold, the one kept."
    tune = _read(Path(root) / "tune" / "best_lr.json")
    rates = sorted({lr for rs in tune["tried"].values() for lr in rs})
    cell = lambda v, lr: "–" if lr not in tune["tried"][v] else (
        "**{:.3f}**" if lr == tune["best"][v] else "{:.3f}").format(tune["tau"][f"{v}_lr{lr:g}"])
    return "\n".join(["| drafter | " + " | ".join(f"{lr:g}" for lr in rates) + " |", "|---" * (len(rates) + 1) + "|",
                      *(f"| `{v}` | " + " | ".join(cell(v, lr) for lr in rates) + " |" for v in tune["tried"])])


def settings_table(st: dict) -> str:
    """Markdown: piece 2's decode-time choices (settings.json), each with the decoded validation τ of what it was chosen
    from; bold, the one kept. The rivals are the trained drafters' and lookup's τ alone."""
    bold = lambda name, tau, kept: f"**{name} {tau:.3f}**" if kept else f"{name} {tau:.3f}"
    lk = st["lookup"]
    rows = [("lookup (prompt lookup)", f"{st['lookup_settings_replayed']} settings replayed, best {st['lookup_tau']:.3f}",
             f"n {lk['prompt_lookup_min']}–{lk['prompt_lookup_max']}, {lk['occurrence']} occurrence, "
             f"{lk['num_speculative_tokens']} proposals" + (", self-extension" if lk["self_extend"] else ""))]
    for v, rule in st["hybrid_rule"].items():
        tried = {k.rpartition("_")[2]: tau for k, tau in st["hybrid_tau"].items() if k.startswith(f"{v}+lookup_")}
        rows.append((f"`{v}` + lookup: the rule", ", ".join(bold(r, tau, r == rule) for r, tau in tried.items()), rule))
    if st.get("eagle3_block_size"):
        blocks = sorted(st["eagle3_tau_by_block_size"].items(), key=lambda kv: int(kv[0]))
        rows.append(("`eagle3`: the block (chain + 1)", ", ".join(
            bold(b, tau, int(b) == st["eagle3_block_size"]) for b, tau in blocks), str(st["eagle3_block_size"])))
    alone = st["tau_alone"] | {"lookup": st["lookup_tau"]}
    rows.append(("the rivals: τ alone", ", ".join(bold(f"`{v}`", tau, v == st["trained_rival"]) for v, tau in alone.items()),
                 f"trained: `{st['trained_rival']}`, headline: `{st['headline_rival']}`"))
    return "\n".join(["| setting | tried (decoded validation τ) | chosen |", "|---|---|---|",
                      *(f"| {a} | {b} | {c} |" for a, b, c in rows)])


def run_hours(root: Path) -> dict:
    """{piece: {"runs", "train", "decode"}}: how many runs each piece's folder holds and the hours they spent training and
    decoding, summed from their result.json (`train_seconds`, `eval_seconds`: wall clock of the process, each on its
    own core). A run counts once, where it ran: a trained draft another piece decodes again counts in that piece at 0 h
    of training. Not in it: the strata, the latency timings and the second target's builds, which write no result.json."""
    hours = {}
    for f in sorted(Path(root).glob("*/**/result.json")):
        r, h = _read(f), hours.setdefault(f.relative_to(root).parts[0], dict(runs=0, train=0.0, decode=0.0))
        h["runs"] += 1
        h["train"] += r["train_seconds"] / 3600
        h["decode"] += r["eval_seconds"] / 3600
    return hours


def tiny_strata(prompts_file: Path, tokenizer_dir: Path) -> dict:
    "A dry run's strata, scored by strata.py (its prompts are not the study's: their cut points mean nothing)."
    from domino_research.target import load_tokenizer
    spec = importlib.util.spec_from_file_location("study29_strata", STUDY / "strata.py")
    strata = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(strata)
    cuts, prompts = strata.prompt_strata(read_prompts(prompts_file), load_tokenizer(tokenizer_dir))
    return {"cuts": cuts, "prompts": prompts}


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--root", type=Path, default=STUDY / "embedded")
    p.add_argument("--strata", type=Path, default=STUDY / "strata_embedded.json")
    p.add_argument("--tiny", action="store_true", help="--root is a dry run: its strata are computed from its prompts")
    a = p.parse_args(argv)
    try: _print_tables(a)
    except FileNotFoundError as e: p.exit(2, f"tables.py: {e}\n")


def _print_tables(a: argparse.Namespace):
    if a.tiny:
        prompts = a.root / "setting" / "val.jsonl"
        strata = tiny_strata(prompts, a.root / "setting" / "target")
    else: strata, prompts = _read(a.strata), STUDY.parents[2] / _read(a.strata)["source"]
    t, st = Tables(a.root, strata, prompts), _read(a.root / "settings.json")
    print(tuning_table(a.root), settings_table(st), sep="\n\n", end="\n\n")
    splits = {name: sel for name, sel in t.splits().items() if sel.any()}      # a dry run's few prompts leave some empty
    print("| row | seeds | " + " | ".join(f"{n} ({int(sel.sum())})" for n, sel in splits.items()) + " |")
    print("|---" * (len(splits) + 2) + "|")
    for row in sorted(t.rows, key=lambda r: -t.tau(r, n_boot=200)["tau"]):
        x = {n: t.tau(row, sel, n_boot=1000) for n, sel in splits.items()}
        print(f"| `{row}` | {len(t.rows[row])} | " + " | ".join(
            "{tau:.2f} [{lo:.2f}, {hi:.2f}]".format(**x[n]) for n in splits) + " |")
    if a.tiny: return                                    # its drafts are not Qwen3-8B's shapes: nothing to project
    lat = latency()
    print("\nprojected at Qwen3-8B's shapes (the mean over seeds of τ × per_tau; all prompts; a hybrid's per_tau at its "
          "own share of steps sent to the draft):")
    print(projection_table(t, lat, st, sorted({r.rpartition("_")[0] for r in t.rows})))
    print("share of a hybrid's steps sent to its draft: " + ", ".join(
        f"{row} {t.draft_share(row):.0%}" for row in sorted(t.rows) if "+lookup" in row))
    e3 = reduced_vocab(_read(STUDY / "latency" / "latency.json"), 32_000)
    print(f"EAGLE-3 with a 32,000-id draft head (an estimate): t_draft {e3['t_draft']:.2f} s, per_tau {e3['per_tau']:.3f}")
    hours = run_hours(a.root)
    print("\nrun hours (train + decode, one core each): " + ", ".join(
        f"{p} {h['train'] + h['decode']:.1f} h ({h['runs']} runs)" for p, h in hours.items()) +
        f"; in all {sum(h['train'] + h['decode'] for h in hours.values()):.1f} h")


if __name__ == "__main__":
    main()
