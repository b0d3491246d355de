"""The ablation notebook end to end under papermill: a tiny table (DFlash + Domino, two seeds, two steps) on the random
target, checked for its files, the results.json schema, the table, the plots and the deleted weights (each run keeps
only its bf16 draft)."""
import json, math, os, subprocess, sys

import pytest
import yaml

from conftest import REPO, run_notebook, write_config

ENV = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}
PNG = b"\x89PNG\r\n\x1a\n"
SPREAD = {"mean", "std", "min", "max", "n"}


def tiny_configs(tiny, tmp_path) -> dict:
    "The two recipe configs of the tiny setting (DFlash has no head keys)."
    base = {k: v for k, v in tiny["base"].items() if k not in ("output_dir", "recipe")}
    dflash = {k: v for k, v in base.items() if k not in ("emb_dim", "gru_hidden_dim")}
    return {"embedded_dflash": write_config(tmp_path / "dflash.yaml", {"recipe": "dflash", **dflash}),
            "embedded_domino": write_config(tmp_path / "domino.yaml", {"recipe": "domino", **base})}


def test_papermill_ablations_notebook(tiny, tmp_path):
    out = tmp_path / "abl"
    cmd = [sys.executable, "-m", "papermill", str(REPO / "nbs" / "ablations.ipynb"), str(tmp_path / "ablations.ipynb"),
           "--cwd", str(REPO / "nbs"), "-p", "out_dir", str(out), "-p", "steps", "2", "-y", "seeds: [0, 1]",
           "-p", "variants", "dflash,domino", "-p", "n_eval_prompts", "2", "-p", "max_new_tokens", "8",
           "-p", "prompts", str(tiny["root"] / "val.jsonl"), "-p", "configs", yaml.safe_dump(tiny_configs(tiny, tmp_path))]
    p = subprocess.run(cmd, env=ENV, capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stderr[-4000:]

    assert {"results.json", "results.md", "tau.png", "training_curves.png", "per_slot_acceptance.png", "runs"} <= \
        {q.name for q in out.iterdir()}
    for png in ("tau.png", "training_curves.png", "per_slot_acceptance.png"):
        assert (out / png).read_bytes()[:8] == PNG and (out / png).stat().st_size > 5_000, png

    res = json.loads((out / "results.json").read_text())           # strict JSON: no NaN
    assert res["meta"]["steps"] == 2 and res["meta"]["seeds"] == [0, 1] and res["meta"]["variants"] == ["dflash", "domino"]
    assert list(res["variants"]) == ["dflash", "domino"]
    for name, d in res["variants"].items():
        for k in ("tau", "tau_base", "accuracy", "accept_len"):
            assert set(d[k]) == SPREAD and d[k]["n"] == 2, (name, k)
        t = d["tau"]
        assert 1 <= t["min"] <= t["mean"] <= t["max"] <= d["block_size"] == 4
        seeds = [d["per_seed"][s]["tau"] for s in ("0", "1")]
        assert math.isclose(t["mean"], sum(seeds) / 2) and math.isclose(t["std"], abs(seeds[0] - seeds[1]) / math.sqrt(2))
        assert len(d["per_slot_acceptance"]) == 3 and d["lossless"] is True
        assert all(d["per_seed"][s]["steps"] == 2 for s in ("0", "1"))
    assert res["variants"]["dflash"]["recipe"] == "dflash" and res["variants"]["domino"]["recipe"] == "domino"
    c = next(c for c in res["comparisons"] if (c["num"], c["den"]) == ("domino", "dflash"))
    seed_tau = lambda n, s: res["variants"][n]["per_seed"][s]["tau"]
    for s in ("0", "1"):                                            # per seed, the pooled ratio is the ratio of the τs
        assert math.isclose(c["per_seed"][s], seed_tau("domino", s) / seed_tau("dflash", s), rel_tol=1e-12)

    md = (out / "results.md").read_text()
    rows = [l for l in md.splitlines() if l.startswith("| `")]
    assert [l.split("|")[1].strip() for l in rows] == [
        "`dflash`",
        "`domino`",
        "`domino` / `dflash`",
        "`domino` with / without head",
    ]
    assert all(len(l.split("|")) == 14 for l in rows[:2])           # the variant table: 12 columns, latency's two last
    for name, d in res["variants"].items():                         # the latency column: measured, positive
        assert d["draft_ms"]["n"] == 2 and d["draft_ms"]["min"] > 0 and d["tau_per_draft_ms"]["min"] > 0, name
    assert f"| `domino` / `dflash` | the Domino recipe over the DFlash recipe | {c['all']['ratio']:.3f} [" in md
    (cmp,) = res["comparisons"]                                     # with an interval over the 2 prompts and both seeds
    assert (cmp["num"], cmp["den"], cmp["seeds"], cmp["n_prompts"], cmp["n_seeds"]) == ("domino", "dflash", ["0", "1"], 2, 2)
    assert cmp["all"]["lo"] <= cmp["all"]["ratio"] <= cmp["all"]["hi"] and set(cmp["per_seed"]) == {"0", "1"}
    assert res["variants"]["domino"]["head_gain"]["all"]["n"] == 2 and res["variants"]["dflash"]["head_gain"] is None

    for n in ("dflash", "domino"):
        for s in (0, 1):
            run = out / "runs" / n / f"seed{s}"
            assert {"result.json", "metrics.jsonl", "config.yaml", "trained.json"} <= {q.name for q in run.iterdir()}
    assert not list(out.rglob("checkpoints"))                       # weights deleted, but each run's kept bf16 draft
    assert sorted(q.relative_to(out).as_posix() for q in out.rglob("*.safetensors")) == \
        [f"runs/{n}/seed{s}/draft_bf16/model.safetensors" for n in ("dflash", "domino") for s in (0, 1)]


def test_bad_variant_fails_before_training(tiny, tmp_path):
    "In this process (conftest.run_notebook; the other two tests launch papermill): refused before anything is trained."
    out = tmp_path / "abl"
    ran, error = run_notebook("ablations.ipynb", out_dir=str(out), variants="dflash,domin",
                              configs=yaml.safe_dump(tiny_configs(tiny, tmp_path)))
    assert error is not None and "unknown ['domin']" in str(error) and "choose from" in str(error), error
    assert not (out / "runs").exists()


def test_papermill_budget_curve(tiny, tmp_path):
    out = tmp_path / "curve"
    cmd = [sys.executable, "-m", "papermill", str(REPO / "nbs" / "ablations.ipynb"), str(tmp_path / "c.ipynb"),
           "--cwd", str(REPO / "nbs"), "-p", "out_dir", str(out), "-y", "budgets: [2, 1]", "-p", "variants", "dflash,domino",
           "-p", "n_eval_prompts", "2", "-p", "max_new_tokens", "8", "-p", "prompts", str(tiny["root"] / "val.jsonl"),
           "-p", "configs", yaml.safe_dump(tiny_configs(tiny, tmp_path))]
    p = subprocess.run(cmd, env=ENV, capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stderr[-4000:]
    assert {"budget.json", "budget.md", "budget.png", "steps1", "steps2"} <= {q.name for q in out.iterdir()}
    curve = json.loads((out / "budget.json").read_text())
    assert curve["budgets"] == [1, 2] and set(curve["tau"]) == {"dflash", "domino"}
    for b in (1, 2):
        res = json.loads((out / f"steps{b}" / "results.json").read_text())
        assert all(d["per_seed"]["0"]["steps"] == b for d in res["variants"].values())


def test_learning_rate_sweep_then_the_chosen_rates(tiny, tmp_path):
    "An LR sweep through the driver, its best rate per variant written to a file, and a table trained at that rate."
    from domino_research.rates import best_learning_rates
    configs = yaml.safe_dump(tiny_configs(tiny, tmp_path))
    kw = dict(variants="domino", steps=1, n_eval_prompts=2, max_new_tokens=8, prompts=str(tiny["root"] / "val.jsonl"),
              configs=configs)
    ran, error = run_notebook("ablations.ipynb", out_dir=str(tmp_path / "sweep"), sweep_learning_rates="[1e-3, 2e-3]", **kw)
    assert error is None, error
    sweep = json.loads((tmp_path / "sweep" / "results.json").read_text())
    assert list(sweep["variants"]) == ["domino_lr0.001", "domino_lr0.002"]
    for name, lr in (("domino_lr0.001", 1e-3), ("domino_lr0.002", 2e-3)):
        run = tmp_path / "sweep" / "runs" / name / "seed0"
        assert yaml.safe_load((run / "config.yaml").read_text())["learning_rate"] == lr, name
    best = best_learning_rates(sweep)
    (tmp_path / "best_lr.json").write_text(json.dumps(best))
    ran, error = run_notebook("ablations.ipynb", out_dir=str(tmp_path / "tuned"), learning_rates=str(tmp_path / "best_lr.json"),
                              **kw)
    assert error is None, error
    run = tmp_path / "tuned" / "runs" / "domino" / "seed0"                    # the variant's own name, at the chosen rate
    assert yaml.safe_load((run / "config.yaml").read_text())["learning_rate"] == best["domino"]


def test_learning_rate_mistakes_fail_before_training(tiny, tmp_path):
    out, configs = tmp_path / "abl", yaml.safe_dump(tiny_configs(tiny, tmp_path))
    for params, needle in (
        (dict(learning_rates="{dmino: 1e-3}"), "unknown variants ['dmino']"),
        (dict(learning_rates="{domino: 1e-3}", sweep_learning_rates="[1e-3]"), "not both"),
        (dict(sweep_learning_rates="[fast]"), "sweep_learning_rates: dflash: the learning rate must be a number > 0"),
        (dict(learning_rates=str(tmp_path / "best.json")), "best.json does not exist"),
    ):
        ran, error = run_notebook("ablations.ipynb", out_dir=str(out), variants="dflash,domino", configs=configs, **params)
        assert error is not None and needle in str(error), (params, error)
    assert not (out / "runs").exists()


def test_lookup_only_table_runs_to_its_end(tiny, tmp_path):
    "`-p variants \"[ngram]\"` trains nothing, so no training curves are drawn: the display cell asked for them (a traceback)."
    out = tmp_path / "abl"
    ran, error = run_notebook("ablations.ipynb", out_dir=str(out), variants="[ngram]", n_eval_prompts=2, max_new_tokens=8,
                              prompts=str(tiny["root"] / "val.jsonl"), configs=yaml.safe_dump(tiny_configs(tiny, tmp_path)))
    assert error is None, error
    assert (out / "tau.png").is_file() and not (out / "training_curves.png").exists()


def test_seeds_or_budgets_that_are_not_integers_are_one_line(tiny, tmp_path):
    "`-p seeds \"a,b\"` ended in int('a')'s traceback; now the parameter is named, before anything is trained."
    from domino_research.config import ConfigError
    out = tmp_path / "abl"
    for key, value in (("seeds", "a,b"), ("seeds", "-1"), ("budgets", "10,x"), ("budgets", "[0]")):
        ran, error = run_notebook("ablations.ipynb", out_dir=str(out), configs=yaml.safe_dump(tiny_configs(tiny, tmp_path)),
                                  **{key: value})
        assert isinstance(error, ConfigError) and f"parameter '{key}' must list integers >= " in str(error), (key, error)
    assert not out.exists()
    ran, error = run_notebook("ablations.ipynb", out_dir=str(out), seeds="0,1", steps=1, variants="[ngram]",
                              n_eval_prompts=1, max_new_tokens=4, prompts=str(tiny["root"] / "val.jsonl"),
                              configs=yaml.safe_dump(tiny_configs(tiny, tmp_path)))
    assert error is None and json.loads((out / "results.json").read_text())["meta"]["seeds"] == [0, 1], error


@pytest.mark.parametrize("to", ["group", "parent"])
def test_ctrl_c_stops_a_worker_pool_at_once(tiny, tmp_path, to):
    """Ctrl-C in `run_ablation(..., jobs=2)` with 4 runs queued: the two runs in flight stop, no queued run starts (its log
    would appear), and the call returns within seconds. Before, the pool started the next queued run and waited for it.
    `group`: a terminal's Ctrl-C, which reaches the workers too; `parent`: SIGINT to the parent alone (`kill -INT`, a
    supervisor), where the workers are ended by the parent: it had lost their handles to `pool.shutdown` and waited
    for the runs in flight to finish (as it would after a run's failure)."""
    import signal, time
    out = tmp_path / "abl"
    script = (f"from domino_research.ablations import run_ablation\n"
              f"run_ablation(['dflash', 'domino'], steps=1_000_000, seeds=[0, 1], out_dir={str(out)!r}, n_eval_prompts=1, "
              f"max_new_tokens=4, prompts={str(tiny['root'] / 'val.jsonl')!r}, configs={tiny_configs(tiny, tmp_path)!r}, "
              f"jobs=2, log=lambda m: print(m, flush=True))\n")
    p = subprocess.Popen([sys.executable, "-c", script], env=ENV, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                         text=True, start_new_session=True)             # its own process group: Ctrl-C reaches the workers too
    logs = lambda: sorted(q.relative_to(out).as_posix() for q in out.glob("runs/*/seed*.log"))
    try:
        deadline = time.time() + 240
        while time.time() < deadline and p.poll() is None and not (len(logs()) == 2 and all(
                (out / q).stat().st_size > 0 for q in logs()) and list(out.glob("runs/*/seed*/metrics.jsonl"))):
            time.sleep(0.5)
        assert p.poll() is None and len(logs()) == 2, (logs(), p.poll())  # two runs training, two queued
        time.sleep(2)
        t0 = time.time()
        (os.killpg if to == "group" else os.kill)(p.pid, signal.SIGINT)  # group: what the terminal does on Ctrl-C
        _, err = p.communicate(timeout=90)
        took = time.time() - t0
    finally:
        if p.poll() is None: os.killpg(p.pid, signal.SIGKILL)
    assert p.returncode != 0 and "KeyboardInterrupt" in err or "interrupted" in err.lower(), err[-3000:]
    assert len(logs()) == 2, f"a queued run started after Ctrl-C: {logs()}"
    assert took < 30, f"returned {took:.0f} s after Ctrl-C"


STUDY28 = REPO / "runs" / "ablations" / "study28"


def _run_study(study, *args, cwd, timeout=240) -> subprocess.CompletedProcess:
    """`python <study>/study.py args...` started in `cwd`, run in this process as Python runs a script (runpy: `__file__`
    is the copy's, `__name__` is "__main__"; a SystemExit's message goes to stderr, exit 1): a new Python adds ~6 s of
    imports. Stopped (and failed) past `timeout` seconds: it would have started work anew."""
    import contextlib, io, runpy, signal
    def too_long(*_): raise AssertionError(f"study.py {' '.join(args)} from {cwd} ran past {timeout} s: it started work anew")
    out, err, code, argv = io.StringIO(), io.StringIO(), 0, sys.argv
    alarm = signal.signal(signal.SIGALRM, too_long)
    signal.setitimer(signal.ITIMER_REAL, timeout)
    try:
        sys.argv = [str(study / "study.py"), *args]
        with contextlib.chdir(cwd), contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            try: runpy.run_path(str(study / "study.py"), run_name="__main__")
            except SystemExit as e:
                if isinstance(e.code, str): print(e.code, file=sys.stderr)
                code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, alarm)
        sys.argv = argv
    return subprocess.CompletedProcess(sys.argv, code, out.getvalue(), err.getvalue())


def test_study_py_resolves_its_folders_from_its_own_location(tmp_path):
    """Study 28's commands from another folder: `rates` re-reads the finished sweep (it started the 15-run sweep there),
    `latency` names the one run missing and the command that adds it (it called the complete table incomplete), and
    `table x` is one line. A copy of the study (no weights, no plots) stands in for it."""
    import shutil
    study, elsewhere = tmp_path / "study28", tmp_path / "elsewhere"
    shutil.copytree(STUDY28, study, ignore=shutil.ignore_patterns("*.safetensors", "*.png"))
    elsewhere.mkdir()
    r = _run_study(study, "rates", cwd=elsewhere)
    assert r.returncode == 0, r.stderr[-3000:]
    assert yaml.safe_load(r.stdout.strip().splitlines()[-1]) == json.loads((STUDY28 / "best_lr.json").read_text())
    (study / "steps2880" / "runs" / "domino" / "seed1" / "result.json").unlink()
    r = _run_study(study, "latency", cwd=elsewhere)
    assert r.returncode != 0 and "is not complete (domino seed 1): run `python " in r.stderr, r.stderr[-3000:]
    assert f"{study / 'study.py'} table 0,1,2` first" in r.stderr, r.stderr[-3000:]
    r = _run_study(study, "table", "x", cwd=elsewhere)
    assert r.returncode != 0 and "Traceback" not in r.stderr and "seeds must be integers >= 0" in r.stderr, r.stderr[-3000:]
    assert not list(elsewhere.iterdir())                            # nothing was written where it was started


def test_stored_study_runs_keep_their_identity():
    """Today's code computes, for the settings of every kept study-28 run, the fingerprint that run stored: a config key
    added since (a new default that changes nothing for these runs) must not make 18 hours of finished runs look stale."""
    from domino_research.study_run import _fingerprint
    from domino_research.train_config import load_train_config
    stored_runs = sorted((REPO / "runs/ablations/study28").glob("*/runs/*/seed*/trained.json"))
    assert len(stored_runs) >= 30, stored_runs
    for trained in stored_runs:
        stored = json.loads(trained.read_text())["fingerprint"]["config"]
        cfg = load_train_config(None, **{k: v for k, v in stored.items() if k != "decode_eval_prompts"})
        today = _fingerprint(cfg, {"prompts": "embedded:test"})["config"]
        differ = {k: (today.get(k), stored.get(k)) for k in {*today, *stored} if today.get(k) != stored.get(k)}
        assert not differ, (trained, differ)


def test_stored_study_lookup_runs_are_finished():
    """Study 28's `ngram` runs (recorded before the drafter registry, and before lookup had an occurrence rule and
    self-extension) are found finished by the task `run_ablation` builds today: the variant pins the project's rule, which
    is what those runs decoded with. A variant that left the new settings to the `lookup` drafter's swept defaults would
    re-decode all three (its drafter differs), and so would a variant that did not name them at all."""
    from domino_research.ablations import plan_ablation
    from domino_research.study_run import finished_record
    from domino_research.variants import VARIANTS
    from domino_research.decode import LOOKUP_DEFAULTS
    out, (config, overrides, changes, _) = STUDY28 / "steps2880", plan_ablation(["ngram"], None, None, None, VARIANTS)["ngram"]
    def task(seed, drafter):
        return dict(name="ngram", seed=seed, config=config, overrides=overrides, changes=changes, steps=2880, out_dir=out,
                    prompts="embedded:test", n_eval_prompts=64, max_new_tokens=128, drafter=drafter)
    for seed in (0, 1, 2):
        rec = finished_record(**task(seed, VARIANTS["ngram"].drafter))
        assert rec is not None and rec["drafter"] == VARIANTS["ngram"].drafter, seed
        assert rec["drafter"]["occurrence"] == "earliest" and rec["drafter"]["self_extend"] is False
        for wrong in ({"drafter": "lookup", **LOOKUP_DEFAULTS},
                      {"drafter": "lookup", "prompt_lookup_min": 1, "prompt_lookup_max": 3, "num_speculative_tokens": 15}):
            assert finished_record(**task(seed, wrong)) is None, (seed, wrong)
