"""Study 29's runner (runs/ablations/study29/study.py): piece 1 (`tune`) run end to end on the tiny random setting, and the
checks it makes shown to fail on the faults they exist to catch."""
import dataclasses
import json
import re
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch

from domino_research.ablations import plan_ablation
from domino_research.decode import HYBRID_RULES
from domino_research.evaluation import read_prompts
from domino_research.embedded import resolve_data_path
from domino_research.rates import lr_sweep
from domino_research.study_run import _run_settings, eval_prompt_count
from domino_research.variants import draft_parameters
from _scripts import load_script

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "runs/ablations/study29/study.py"
TABLES = ROOT / "runs/ablations/study29/tables.py"
REGEN = ROOT / "runs/ablations/study29/regen_steps.py"


def _study():
    return load_script(SCRIPT, "study29_study")


def test_edge_rule():
    s = _study()
    tried = {"a": [1e-3, 3e-3, 1e-2], "b": [1e-3, 3e-3, 1e-2], "c": [1e-3, 3e-3, 1e-2], "d": [1e-4, 3e-4, 1e-3]}
    best = {"a": 1e-3, "b": 3e-3, "c": 1e-2, "d": 1e-4}
    # low edge: the next half-decade below; inside: nothing; high edge: the next above; the ladder's end: nothing
    assert s.extensions(best, tried) == [("a", 3e-4), ("c", 3e-2)]
    # a one-rate grid is at both edges at once
    assert s.extensions({"a": 3e-3}, {"a": [3e-3]}) == [("a", 1e-3), ("a", 1e-2)]


def test_finished_edges_extend_only_drafters_whose_rates_are_all_done(tmp_path):
    "A drafter whose grid is complete gets its edge rate in the next round, beside the others' runs; an unfinished one waits."
    s = _study()
    setting = s.Setting(tmp_path, "embedded:validation")
    taus = {"a": {1e-3: 2.3, 3e-3: 2.1, 1e-2: 2.0}, "b": {1e-3: 4.4, 3e-3: 4.5}, "c": {1e-3: 2.5, 3e-3: 2.7, 1e-2: 2.6}}
    for v, t in taus.items():
        for lr, tau in t.items():
            (setting.root / "tune" / "runs" / f"{v}_lr{lr:g}" / "seed0").mkdir(parents=True)
            (setting.root / "tune" / "runs" / f"{v}_lr{lr:g}" / "seed0" / "result.json").write_text(json.dumps({"tau": tau}))
    tried = {v: [1e-3, 3e-3, 1e-2] for v in taus}
    assert s.finished_edges(setting, tried) == [("a", 3e-4)]            # b's 1e-2 is not done: b waits, however it stands
    assert s.finished_edges(setting, {**tried, "a": [3e-4, *tried["a"]]}) == []     # a's 3e-4 not done yet: nothing more


def test_tune_embedded_plans_the_readme_grid():
    "The real piece's table, resolved without training: 3 drafters × 3 rates, each at Domino's parameter count."
    s = _study()
    setting = s.TARGETS["embedded"]()
    assert (setting.validation, setting.steps, setting.keep_steps, setting.jobs) == ("embedded:validation", 2880, (720, 1440), 2)
    assert setting.root == SCRIPT.parent / "embedded"
    # "all": every row of the shipped validation file, counted there (315 today), not a number written in the study
    n_rows = sum(1 for line in Path(resolve_data_path("embedded:validation")).read_text().splitlines() if line.strip())
    assert eval_prompt_count("all", "embedded:validation") == n_rows > 0
    table = lr_sweep([(v, lr) for v in s.TRAINED for lr in s.GRID])
    plan = plan_ablation(list(table), table=table)
    assert sorted(plan) == sorted(f"{v}_lr{lr:g}" for v in s.TRAINED for lr in (1e-3, 3e-3, 1e-2))
    params = {n: draft_parameters(p[3]) for n, p in plan.items()}
    domino = params["domino_lr0.001"]
    for n, c in params.items():
        assert abs(c / domino - 1) < 0.002, (n, c, domino)
    assert plan["eagle3_lr0.01"][3].recipe == "eagle3" and plan["eagle3_lr0.01"][3].learning_rate == 1e-2


# The tests that read piece 1's tiny run share one worker (xdist_group): spread over two, each built the run (21 s).
TUNED = pytest.mark.xdist_group("study29_tuned")


@pytest.fixture(scope="module")
def tuned(tmp_path_factory):
    "Piece 1 on the tiny setting (one run at a time here: the worker processes are test_ablations' business)."
    s = _study()
    root = tmp_path_factory.mktemp("study29")
    setting = dataclasses.replace(s.tiny(root), jobs=1)
    log = []
    best = s.tune(setting, log=log.append)
    return s, setting, best, log


@TUNED
def test_tune_tiny_runs_every_drafter_on_every_validation_prompt(tuned):
    s, setting, best, log = tuned
    out = setting.root / "tune"
    res = json.loads((out / "results.json").read_text())
    saved = json.loads((out / "best_lr.json").read_text())
    assert saved["best"] == best and set(best) == set(s.TRAINED)
    for v in s.TRAINED:                               # the grid, and whatever the edge rule added, each run done
        assert set(s.GRID) <= set(saved["tried"][v])
        assert {f"{v}_lr{lr:g}" for lr in saved["tried"][v]} <= set(res["variants"])
    ids = sorted(r["id"] for r in read_prompts(setting.validation))
    for name in res["variants"]:
        run = out / "runs" / name / "seed0"
        rec = json.loads((run / "result.json").read_text())
        assert sorted(p["prompt_id"] for p in rec["per_prompt"]) == ids and rec["lossless"] is True
        assert rec["fingerprint"]["evaluation"]["n_eval_prompts"] == "all"
        assert rec["drafter"]["drafter"] == ("eagle3" if name.startswith("eagle3") else "draft")
        for step in setting.keep_steps:               # the checkpoints' drafts piece 5 decodes, and the final one
            assert (run / f"draft_bf16_step{step}" / "model.safetensors").is_file(), (name, step)
        assert (run / "draft_bf16" / "model.safetensors").is_file() and not (run / "checkpoints").exists()
    s.check_decoded_all(out, res, setting.validation)


@TUNED
def test_tune_check_fails_on_other_prompts(tuned):
    "The check `tune` makes after each round fails on a run that decoded a sample, or another prompt file."
    s, setting, _, _ = tuned
    src = setting.root / "tune"
    res = json.loads((src / "results.json").read_text())
    name = next(iter(res["variants"]))
    for fault in ("sample", "other file"):
        bad = setting.root / f"bad_{fault.replace(' ', '_')}"
        shutil.copytree(src, bad, ignore=shutil.ignore_patterns("*.safetensors", "*.png"))
        f = bad / "runs" / name / "seed0" / "result.json"
        rec = json.loads(f.read_text())
        if fault == "sample": rec["per_prompt"] = rec["per_prompt"][:2]
        else: rec["fingerprint"]["evaluation"]["prompts"] = "0" * 64
        f.write_text(json.dumps(rec))
        with pytest.raises(AssertionError, match=name):
            s.check_decoded_all(bad, res, setting.validation)


@TUNED
def test_tune_resumes_and_keeps_identities(tuned):
    "Run again, every run is found done (nothing trains); keeping checkpoints does not change a run's identity."
    s, setting, best, _ = tuned
    log = []
    assert s.tune(setting, log=log.append) == best
    assert not any("trained in" in line for line in log) and any("(skipped)" in line for line in log)
    fp = lambda **kw: _run_settings("domino", 0, setting.configs["embedded_domino"], {}, setting.steps, setting.root,
                                    setting.validation, "all", setting.max_new_tokens, **kw)[3]
    assert fp(keep_steps=setting.keep_steps) == fp()


def test_cli_refuses_out_without_tiny(capsys):
    s = _study()
    with pytest.raises(SystemExit):
        s.main(["tune", "embedded", "--out", "/tmp/x"])
    assert "--out is for --tiny only" in capsys.readouterr().err


def test_only_eagle3_hybrids_name_a_block():
    "The hybrid spec of Domino and DFlash is the one their decodes were fingerprinted with: EAGLE-3's alone gets its block."
    s, lookup = _study(), dict(prompt_lookup_min=1, num_speculative_tokens=15)
    for v in ("domino", "dflash_shift_d3"):
        assert s._hybrid_rule(v, "match>=2", lookup, 16) == {"drafter": "hybrid", "rule": "match>=2", **lookup}
    assert s._hybrid_rule("eagle3", "any", lookup, 16) == {"drafter": "hybrid", "rule": "any", "eagle3_block_size": 16,
                                                            **lookup}


def test_cli_jobs_reaches_the_piece(capsys, monkeypatch):
    "--jobs N: the piece runs N at a time (1 leaves a core to a job beside it); fewer than 1 is refused in one line."
    s, seen, threads = _study(), [], torch.get_num_threads()
    monkeypatch.setitem(s.PIECES, "test", lambda setting: seen.append((setting.jobs, torch.get_num_threads())))
    torch.set_num_threads(2)
    try:
        s.main(["test", "embedded"])
        s.main(["test", "embedded", "--jobs", "1"])                  # in this process, on one thread (the workers': each one)
    finally: torch.set_num_threads(threads)
    assert seen == [(2, 2), (1, 1)]
    with pytest.raises(SystemExit):
        s.main(["test", "embedded", "--jobs", "0"])
    assert "--jobs 0: give 1 or more" in capsys.readouterr().err


def test_ctrl_c_is_one_line_that_says_how_to_go_on(tmp_path, monkeypatch):
    s = _study()
    def stopped(_): raise KeyboardInterrupt
    monkeypatch.setitem(s.PIECES, "tune", stopped)
    ended = None                                         # main returning at all is a failure too
    try: s.main(["tune", "embedded", "--tiny", "--out", str(tmp_path)])
    except BaseException as e: ended = e                # the fault, a bare KeyboardInterrupt, is caught here too
    assert isinstance(ended, SystemExit), repr(ended)
    assert re.fullmatch(r"study.py tune: stopped by Ctrl-C; .* run the same command again", str(ended.code)), ended.code
    assert ended.__suppress_context__                    # no KeyboardInterrupt traceback printed above the line


def test_a_target_not_built_is_one_line(capsys):
    "The second target is not shipped (no build passed the loop bar): its pieces say so in one line, with the command."
    s = _study()
    if (s.STUDY.parents[2] / "domino_research" / "assets" / "embedded_docstring").is_dir(): pytest.skip("built here")
    with pytest.raises(SystemExit, match="study.py lookup docstring: embedded_docstring: the build folder .* does not exist"):
        s.main(["lookup", "docstring"])


def test_pieces_refuse_until_the_piece_they_need_is_done(tmp_path):
    s = _study()
    setting = dataclasses.replace(s.tiny(tmp_path), jobs=1)
    for piece, needs in (("settings", "tune"), ("table", "settings"), ("test", "settings"), ("curve", "settings"),
                         ("lookup", "settings")):
        with pytest.raises(SystemExit, match=f"study.py {piece}: .* is missing: run `.*study.py {needs} "):
            s.PIECES[piece](setting)


def _hybrid_eagle3_chains(folder: Path) -> dict:
    "{row: (the chain its drafter spec asked for, the chain the decode's hybrid says it ran)} of EAGLE-3's hybrid rows."
    recs = {f: json.loads(f.read_text()) for f in folder.glob("runs/eagle3+lookup_*/seed*/result.json")}
    return {f.parent.parent.name: (r["drafter"].get("eagle3_block_size"), r["evaluation"]["drafter"]["eagle3_block_size"])
            for f, r in recs.items()}


@TUNED
def test_later_pieces_on_tiny(tuned):
    "Pieces 2-5 after the tuning, on the tiny setting: each writes what the next reads; a rerun decodes nothing again."
    s, setting, best, _ = tuned
    log = []
    st = s.settings(setting, log=log.append)
    assert set(st["hybrid_rule"]) == set(best) and st["lookup_settings_replayed"] == 432
    assert st["eagle3_block_size"] in (4, 8, 16) and st["trained_rival"] in ("dflash_shift_d3", "eagle3")
    chain = (st["eagle3_block_size"],) * 2             # the hybrid's EAGLE-3 asked for and ran at the chain chosen alone
    assert _hybrid_eagle3_chains(setting.root / "settings") == {f"eagle3+lookup_{r}": chain for r in HYBRID_RULES}
    with pytest.raises(SystemExit, match="run `.*study.py table "):
        s.test(setting)                                   # the table's drafts are not there yet
    s.table(setting, log=log.append)
    t = s.test(setting, log=log.append)
    for v in s.TRAINED:
        for row in (f"{v}_greedy", f"{v}_T1", f"{v}+lookup_greedy", f"{v}+lookup_T1"):
            assert set(t["tau"][row]) == {"0", "1"}, row
    assert set(t["tau"]["lookup_greedy"]) == set(t["tau"]["lookup_T1"]) == {"0"}
    ids = sorted(r["id"] for r in read_prompts(setting.test))
    recs = {f: json.loads(f.read_text()) for f in (setting.root / "test").rglob("result.json")}
    assert len(recs) == 3 * 2 * 3 + 3 + 2                # seed 0 and 1: alone T1, hybrid ×2 (+ alone greedy seed 0); lookup
    assert set(_hybrid_eagle3_chains(setting.root / "test").values()) == {chain}
    for f, rec in recs.items():                          # every test prompt, sampled where the row says so
        assert sorted(p["prompt_id"] for p in rec["per_prompt"]) == ids, f
        assert rec["evaluation"]["temperature"] == (1.0 if "_T1" in str(f) else 0.0), f
    c = s.curve(setting, log=log.append)
    assert set(c) == {"domino", st["trained_rival"]} and all(set(d) == {"1", "2", "4"} for d in c.values())
    again = []
    s.test(setting, log=again.append)
    assert not any("decoded in" in line and "skipped" not in line for line in again), again
    # piece 6b: lookup alone at the chosen setting, on another target's folder: the same τ as test's lookup rows
    other = dataclasses.replace(setting, root=setting.root / "other", grid_from=setting.root)
    other.root.mkdir()
    lk = s.lookup(other, log=log.append)
    assert lk["setting"] == st["lookup"] and lk["setting_from"] == setting.root.name
    assert lk["tau"] == {"lookup_greedy": t["tau"]["lookup_greedy"]["0"], "lookup_T1": t["tau"]["lookup_T1"]["0"]}
    assert json.loads((other.root / "lookup.json").read_text()) == lk


@TUNED
def test_table_only_runs_the_seeds_asked_for(tuned):
    "`table --only`: a part of piece 3 (the rest is neither trained nor decoded); a seed the table does not have is refused."
    s, setting, _, _ = tuned
    s.settings(setting, log=lambda _: None)                # done by the test above: skipped
    log = []
    out = s.table(dataclasses.replace(setting, only={"domino": (1,)}), log=log.append)
    assert list(out) == ["domino"] and list(out["domino"]["meta"]["seeds"]) == [1]
    assert log and all("domino" in line for line in log if line.startswith("[")), log
    with pytest.raises(SystemExit, match=r"--only domino seed 2: not in the table"):
        s.table(dataclasses.replace(setting, only={"domino": (2,)}))
    assert s._only("eagle3=1,2") == ("eagle3", (1, 2))
    with pytest.raises(SystemExit, match=r"--only domino seed 0: not in the table"):
        s.table(dataclasses.replace(setting, only={"domino": (0,)}))     # seed 0 is the tuning's run
    for bad in ("eagle3", "eagle3=", "eagle3=-1", "lookup=1", "eagle3=a"):
        with pytest.raises(Exception, match="write DRAFTER=SEEDS"):
            s._only(bad)


@TUNED
def test_test_only_decodes_those_drafts_rows_which_the_whole_piece_then_skips(tuned, tmp_path):
    """`test --only`: a part of piece 4 sized to a session: the rows of the drafts asked for (seed 0 is the tuning's) and no
    others, no test.json; the whole piece then decodes only the rest, and a draft the study does not keep is refused."""
    s, setting, _, _ = tuned
    for piece in (s.settings, s.table): piece(setting, log=lambda _: None)       # done by the tests above: skipped
    part = dataclasses.replace(setting, root=tmp_path / "part")
    shutil.copytree(setting.root, part.root, ignore=shutil.ignore_patterns("test", "test.json", ".data_cache"))
    out = s.test(dataclasses.replace(part, only={"eagle3": (0,), "domino": (1,)}), log=lambda _: None)
    assert sorted(out) == sorted(["eagle3_greedy seed 0", "eagle3_T1 seed 0", "eagle3+lookup_greedy seed 0",
                                  "eagle3+lookup_T1 seed 0", "domino_T1 seed 1", "domino+lookup_greedy seed 1",
                                  "domino+lookup_T1 seed 1"])
    written = sorted(f"{f.parent.parent.name} {f.parent.name}" for f in (part.root / "test").rglob("result.json"))
    assert written == sorted(k.replace(" seed ", " seed") for k in out) and not (part.root / "test.json").exists()
    log = []
    whole = s.test(part, log=log.append)
    skipped = sorted(line.split("]")[0][1:] for line in log if "(skipped)" in line)
    assert skipped == sorted(out)                                         # what the part decoded is not decoded again
    assert whole["tau"] == s.test(setting, log=lambda _: None)["tau"]     # as the whole piece at once (done above)
    with pytest.raises(SystemExit, match=r"study.py test: --only domino seed 2: not a draft the study keeps"):
        s.test(dataclasses.replace(part, only={"domino": (2,)}))


def test_final_rates_are_those_the_edge_rule_leaves_alone(tmp_path):
    "A drafter's rate is final once every first rate is done and its best is inside them; an unfinished run counts as not done."
    s = _study()
    setting = s.Setting(tmp_path, "x")
    def done(v, lr, tau):
        run = tmp_path / "tune" / "runs" / f"{v}_lr{lr:g}" / "seed0"
        run.mkdir(parents=True)
        if tau is not None: (run / "result.json").write_text(json.dumps({"tau": tau}))
    for lr, tau in zip(s.GRID, (2.0, 3.0, 3.0)): done("domino", lr, tau)          # inside (a tie: the lower rate, as `tune`)
    for lr, tau in zip(s.GRID, (4.4, 4.5, 4.6)): done("eagle3", lr, tau)          # at the upper edge
    for lr, tau in zip((3e-4, *s.GRID), (1.8, 2.3, 2.1, None)): done("dflash_shift_d3", lr, tau)   # 1e-2 still running
    assert s.final_rates(setting) == {"domino": 3e-3}
    done("eagle3", 3e-2, 4.55)
    assert s.final_rates(setting) == {"domino": 3e-3, "eagle3": 1e-2}


@TUNED
def test_table_only_before_piece_2_runs_what_the_piece_will_skip(tuned, tmp_path):
    """`table --only` before settings.json: Domino's seeds at its final rate, the very run the table makes after piece 2
    (same fingerprint, same τ); EAGLE-3 waits for its chain length."""
    s, setting, best, _ = tuned
    s.settings(setting, log=lambda _: None)
    s.table(dataclasses.replace(setting, only={"domino": (1,)}), log=lambda _: None)   # the run after piece 2 (skipped if done)
    early = dataclasses.replace(setting, root=tmp_path / "early")
    shutil.copytree(setting.root / "tune", early.root / "tune", ignore=shutil.ignore_patterns("*.safetensors", "*.png"))
    assert "domino" in s.final_rates(early)                 # the tiny ladder ends at the grid: every rate is final
    s.table(dataclasses.replace(early, only={"domino": (1,)}), log=lambda _: None)
    rec = lambda root: json.loads((root / f"steps{setting.steps}/domino/runs/domino/seed1/result.json").read_text())
    assert rec(early.root)["fingerprint"] == rec(setting.root)["fingerprint"]
    assert rec(early.root)["tau"] == rec(setting.root)["tau"]
    with pytest.raises(SystemExit, match=r"--only eagle3 before piece 2 .*chain length"):
        s.table(dataclasses.replace(early, only={"eagle3": (1,)}))


def test_settings_table_bolds_what_piece_2_chose():
    "The decode-time choices' table: one bold entry per choice, the one settings.json kept, whatever order they were tried in."
    T = load_script(TABLES, "study29_tables")
    st = {"lookup": dict(prompt_lookup_min=1, prompt_lookup_max=8, num_speculative_tokens=15, occurrence="latest",
                         self_extend=True), "lookup_tau": 2.5, "lookup_settings_replayed": 432,
          "hybrid_rule": {"domino": "match>=2", "eagle3": "agree"},
          "hybrid_tau": {"domino+lookup_any": 4.0, "domino+lookup_match>=2": 4.5, "eagle3+lookup_any": 5.0,
                         "eagle3+lookup_agree": 5.5},
          "eagle3_block_size": 16, "eagle3_tau_by_block_size": {"8": 4.5, "4": 3.0, "16": 5.6},
          "tau_alone": {"domino": 2.7, "eagle3": 5.6}, "trained_rival": "eagle3", "headline_rival": "eagle3"}
    md = T.settings_table(st)
    assert re.findall(r"\*\*(.+?)\*\*", md) == ["match>=2 4.500", "agree 5.500", "16 5.600", "`eagle3` 5.600"]
    assert "| 4 3.000, 8 4.500, **16 5.600** | 16 |" in md                 # blocks in order of width, not as stored
    assert "n 1–8, latest occurrence, 15 proposals, self-extension" in md


def test_tables_cli_names_the_piece_a_missing_file_comes_from(tmp_path, capsys):
    "tables.py on a folder a piece has not filled yet: one line naming the file and the piece that writes it, exit 2."
    T = load_script(TABLES, "study29_tables")
    (tmp_path / "settings.json").write_text("{}")
    for root, missing in ((tmp_path / "none", "settings.json"), (tmp_path, "test.json")):
        with pytest.raises(SystemExit) as e:
            T.main(["--root", str(root)])
        err = capsys.readouterr().err
        assert e.value.code == 2 and err.count("\n") == 1 and "Traceback" not in err, err
        assert f"{root / missing}: not there: piece `{T.PIECE_WRITES[missing]}` writes it" in err


def test_reduced_vocab_scales_only_the_chains_passes_through_the_head():
    "The 32k-vocabulary estimate: chain × head time × (1 − vocab / 151,936) comes off the draft step; nothing else moves."
    T = load_script(TABLES, "study29_tables")
    raw = {"projection": {"eagle3": dict(t_draft=3.0, t_verify=4.0, t_plain=2.0)}, "draft": {"eagle3": {"block_size": 16}},
           "lines": {"1": {"intercept": 0.1}}}
    est = T.reduced_vocab(raw, 32_000)
    assert est["t_draft"] == pytest.approx(3.0 - 15 * 0.1 * (1 - 32_000 / 151_936))
    assert est["per_tau"] == pytest.approx(2.0 / (est["t_draft"] + 4.0))
    assert T.reduced_vocab(raw, 151_936) == {"t_draft": 3.0, "per_tau": 2.0 / 7.0}      # the target's own head: as timed


def test_run_hours_sum_each_pieces_runs_once(tmp_path):
    "run_hours: a piece's hours are its own runs' train and decode seconds; a decode of a draft trained elsewhere adds none."
    T = load_script(TABLES, "study29_tables")
    runs = {"tune/runs/a_lr0.01/seed0": (7200, 360), "tune/runs/b_lr0.01/seed0": (3600, 0),
            "test/runs/a_greedy/seed1": (0, 1800), "test/lookup_T1/runs/lookup/seed0": (0, 900)}
    for run, (train, decode) in runs.items():
        (tmp_path / run).mkdir(parents=True)
        (tmp_path / run / "result.json").write_text(json.dumps(dict(train_seconds=train, eval_seconds=decode)))
    (tmp_path / "test" / "runs" / "a_T1" / "seed1").mkdir(parents=True)          # a run not finished: no result.json
    assert T.run_hours(tmp_path) == {"test": dict(runs=2, train=0.0, decode=0.75), "tune": dict(runs=2, train=3.0, decode=0.1)}


@TUNED
def test_tables_read_piece_4_back_and_refuse_what_disagrees(tuned):
    """tables.py on the tiny pieces: each row's seeds' τ are the ones its decodes wrote, a ratio pairs the seeds both rows
    have, the splits cover every prompt; records test.json does not list alike, or decoded in another order, are refused."""
    s, setting, _, _ = tuned
    for piece in (s.settings, s.table, s.test): piece(setting, log=lambda _: None)   # done by the test above: skipped
    T, root = load_script(TABLES, "study29_tables"), setting.root
    prompts = root / "setting" / "val.jsonl"
    strata = T.tiny_strata(prompts, root / "setting" / "target")
    t = T.Tables(root, strata, prompts)
    summary = json.loads((root / "test.json").read_text())["tau"]
    assert set(t.rows) == set(summary)
    for row, seeds in summary.items():
        x = t.tau(row, n_boot=50)
        assert x["seeds"] == pytest.approx([seeds[k] for k in sorted(seeds, key=int)], abs=1e-12), row
        assert x["n"] == len(t.ids) == len(read_prompts(prompts)) and x["lo"] <= x["tau"] <= x["hi"], row
    r = t.ratio("domino_greedy", "lookup_greedy", n_boot=50)    # lookup (one run) is paired with each of Domino's seeds
    assert r["seeds"] == [0, 1]
    assert r["per_seed"] == pytest.approx([summary["domino_greedy"][k] / summary["lookup_greedy"]["0"] for k in "01"])
    sp = t.splits()
    assert sum(int(sp[f"stratum{k}"].sum()) for k in range(3)) == int(sp["all"].sum()) == len(t.ids)
    assert (sp["looping"] ^ sp["non-looping"]).all()
    for fault, match in (("tau", "files and test.json disagree"), ("order", "other prompts or order")):
        bad = root.parent / f"{root.name}_bad_{fault}"
        shutil.copytree(root, bad, ignore=shutil.ignore_patterns("*.safetensors", "*.png", ".data_cache"))
        f = next((bad / "test" / "runs").glob("domino_T1/seed0/result.json"))
        rec = json.loads(f.read_text())
        if fault == "tau": rec["tau"] += 0.01
        else: rec["per_prompt"] = rec["per_prompt"][::-1]
        f.write_text(json.dumps(rec))
        with pytest.raises(AssertionError, match=match):
            T.Tables(bad, strata, prompts)


@TUNED
def test_tables_project_a_hybrid_from_the_steps_its_draft_proposed_for(tuned):
    """The hybrid's projected step: lookup's search every step, the draft's step and verify width where the draft proposed
    (every step if the rule reads the draft), lookup's width elsewhere; EAGLE-3 at the chain its decodes ran (the chosen
    one, alone and in the hybrid); a record without the step counts, or a width latency.json did not time, is refused in
    one line."""
    s, setting, _, _ = tuned
    for piece in (s.settings, s.table, s.test): piece(setting, log=lambda _: None)   # done by the tests above: skipped
    T, root = load_script(TABLES, "study29_tables"), setting.root
    prompts = root / "setting" / "val.jsonl"
    t = T.Tables(root, T.tiny_strata(prompts, root / "setting" / "target"), prompts)
    st = json.loads((root / "settings.json").read_text())
    timing = lambda draft, verify, bs: dict(t_draft=draft, t_verify=verify, t_plain=2.0, per_tau=2.0 / (draft + verify),
                                            block_size=bs)
    e3 = st["eagle3_block_size"]                          # every verify time differs: a width taken from the wrong side fails
    assert t.eagle3_width("eagle3_greedy", st) == t.eagle3_width("eagle3+lookup_greedy", st) == e3
    lat = dict(domino=timing(1.0, 5.0, 16), lookup=timing(0.1, 4.0, 16), eagle3=timing(1.5, 3.0, e3))
    prompts_of = lambda row: [p for r in t.rows[row].values() for p in r["per_prompt"]]
    row = "domino+lookup_greedy"
    steps = [(p["chosen_spec"]["draft"], p["verify_steps_spec"]) for p in prompts_of(row)]
    assert all(d <= v for d, v in steps) and sum(d for d, _ in steps) / sum(v for _, v in steps) == t.draft_share(row)
    st["hybrid_rule"] |= {"domino": "match>=2", "eagle3": "match>=2"}
    for rule, share, want in (("match>=2", 1, 2 / (0.1 + 1 + 5)), ("match>=2", 0, 2 / (0.1 + 4)),
                              ("agree", 0, 2 / (0.1 + 1 + 4)), ("match>=2", 0.5, 2 / (0.1 + 0.5 + 2.5 + 2))):
        st["hybrid_rule"]["domino"] = rule                 # `agree` reads the draft: it runs at every step
        for p in prompts_of(row):
            p["chosen_spec"] = {"draft": share * p["verify_steps_spec"], "lookup": (1 - share) * p["verify_steps_spec"]}
        assert t.per_tau(row, lat, st) == pytest.approx(want), (rule, share)
    for p in prompts_of("eagle3+lookup_greedy"): p["chosen_spec"] = {"draft": p["verify_steps_spec"], "lookup": 0}
    assert t.per_tau("eagle3+lookup_greedy", lat, st) == pytest.approx(2 / (0.1 + 1.5 + 3))
    seeds = sorted(t.rows["domino_greedy"].items())
    assert t.speedup("domino_greedy", lat, st) == pytest.approx(np.mean([r["tau"] for _, r in seeds]) * 2 / 6)
    lat["eagle3"]["block_size"] = e3 + 1
    for row in ("eagle3_greedy", "eagle3+lookup_T1"):
        timed_other = rf"{re.escape(row)}: verifies blocks of {e3}, but latency.json timed EAGLE-3 at {e3 + 1}: .* {e3}\)"
        with pytest.raises(ValueError, match=timed_other):
            t.per_tau(row, lat, st)
    lat["eagle3"]["block_size"] = e3
    for r in t.rows["eagle3+lookup_greedy"].values(): r["drafter"]["eagle3_block_size"] = e3 + 1   # another block ran:
    with pytest.raises(ValueError, match=rf"decoded EAGLE-3 at block {e3 + 1}, not the block {e3} .* --only eagle3=K"):
        t.per_tau("eagle3+lookup_greedy", lat, st)                    # decoding it again is the fix, not another timing
    for r in t.rows["eagle3+lookup_greedy"].values(): del r["drafter"]["eagle3_block_size"]   # decoded before the setting:
    assert t.eagle3_width("eagle3+lookup_greedy", st) == t.draft_block("eagle3", st)         # its draft's own block
    md = T.projection_table(t, lat, st, ["domino", "domino+lookup", "lookup"])   # the notebook's table: the same figures
    for v in ("domino", "domino+lookup", "lookup"):
        cell = lambda row: f"{t.per_tau(row, lat, st):.3f} | {t.speedup(row, lat, st):.2f}×"
        assert f"| `{v}` | {cell(v + '_greedy')} | {cell(v + '_T1')} |" in md.splitlines(), v
    row = "domino+lookup_greedy"
    del prompts_of(row)[0]["chosen_spec"]
    with pytest.raises(ValueError, match=r"domino\+lookup_greedy seed 0: .* --only domino=0"):
        t.draft_share(row)


@TUNED
def test_regen_steps_writes_the_kept_drafts_only_from_the_same_losses(tuned, tmp_path):
    """regen_steps.py trains a finished run again and writes its kept step drafts byte for byte; with one setting changed
    (the learning rate) it refuses and writes nothing; and it never overwrites a kept draft."""
    s, setting, best, _ = tuned
    R = load_script(REGEN, "study29_regen")
    src = setting.root / "tune" / "runs" / f"domino_lr{best['domino']:g}" / "seed0"
    runs = {k: tmp_path / k / "runs" / "domino" / "seed0" for k in ("same", "other_lr")}
    for run in runs.values():
        shutil.copytree(src, run, ignore=shutil.ignore_patterns("checkpoints"))
    kept = lambda run: [run / f"draft_bf16_step{k}" / "model.safetensors" for k in setting.keep_steps]
    original = [f.read_bytes() for f in kept(src)]
    for run in runs.values():
        for f in kept(run): f.unlink()
    cfg = runs["other_lr"] / "config.yaml"
    cfg.write_text(re.sub(r"(?m)^learning_rate: .*$", "learning_rate: 0.5", cfg.read_text()))
    steps = ["--steps", *map(str, setting.keep_steps)]
    with pytest.raises(SystemExit, match="the loss differs .*nothing written"):
        R.main([str(runs["other_lr"]), *steps, "--scratch", str(tmp_path / "scratch_other")])
    assert not any(f.exists() for f in kept(runs["other_lr"]))
    R.main([str(runs["same"]), *steps, "--scratch", str(tmp_path / "scratch_same")])
    assert [f.read_bytes() for f in kept(runs["same"])] == original
    with pytest.raises(SystemExit, match="exist already"):
        R.main([str(runs["same"]), *steps, "--scratch", str(tmp_path / "scratch_again")])
