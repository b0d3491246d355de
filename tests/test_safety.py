"""Nothing lost, nothing hijacked: run names, overwrite, locks, resume and damaged files, each through the training CLI
as a user would meet it. Every test states the data that must survive and checks it byte for byte."""
import hashlib, json, os, re, subprocess, sys, time
from pathlib import Path

import pytest

from conftest import run_notebook, write_config
from _preloaded import launch_train
from test_train import ENV, train_here, _weights, _wait_for


def snapshot(root) -> dict:
    "Every file under `root` with its sha256: what must survive."
    root = Path(root)
    return {str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(root.rglob("*"))
            if p.is_file() and p.suffix != ".lock"}                   # a lock file records its latest holder


def one_line_error(p, *needles):
    assert p.returncode == 2, (p.returncode, p.stdout[-2000:], p.stderr[-3000:])
    assert "Traceback" not in p.stderr, p.stderr[-3000:]
    # `error: ...` from the run; argparse's usage errors carry the program's name first (`python -m ...: error: ...`)
    err = [l for l in p.stderr.splitlines() if l.startswith("error: ") or ": error: " in l]
    assert len(err) == 1, p.stderr[-3000:]
    for n in needles: assert n in err[0], err[0]
    return err[0]


@pytest.fixture(scope="module")
def trained_once(tiny, tmp_path_factory):
    "One finished 2-step run `old` per module and worker (twenty tests use one)."
    root = tmp_path_factory.mktemp("trained")
    cfg = write_config(root / "c.yaml", {**tiny["base"], "output_dir": str(root / "runs"), "max_steps": 2,
                                         "save_every_steps": 1})
    p = train_here(cfg, "--run_name", "old")
    assert p.returncode == 0, p.stderr[-3000:]
    return root


@pytest.fixture
def trained(tiny, tmp_path, trained_once):
    """A finished 2-step run `old` with checkpoints, next to a sibling run and an unrelated file in output_dir: a copy of
    the module's run, its config.yaml pointing here (the checkpoints keep theirs: output_dir is a resumable key)."""
    import shutil
    runs = tmp_path / "runs"
    shutil.copytree(trained_once / "runs", runs, symlinks=True)
    saved = runs / "old" / "config.yaml"
    saved.write_text(saved.read_text().replace(str(trained_once / "runs"), str(runs)))
    cfg = write_config(tmp_path / "c.yaml", {**tiny["base"], "output_dir": str(runs), "max_steps": 2, "save_every_steps": 1})
    (runs / "sibling").mkdir()
    (runs / "sibling" / "results.json").write_text('{"tau": 2.2}\n')
    (tmp_path / "keep.txt").write_text("a user's file next to output_dir\n")
    return {"cfg": cfg, "runs": runs, "before": snapshot(tmp_path)}


# ------------------------------------------------------------------ 1. run names that point elsewhere
@pytest.mark.parametrize("name", ["..", ".", "", "/abs/dir", "a/../..", ".hidden"])
def test_run_name_outside_output_dir_refused(trained, tmp_path, name):
    name = str(tmp_path / "victim") if name == "/abs/dir" else name
    if name.startswith("/"):
        Path(name).mkdir()
        (Path(name) / "data.bin").write_text("x")
    before = snapshot(tmp_path)
    p = train_here(trained["cfg"], "--run_name", name, "--overwrite", "true")
    one_line_error(p, "run_name", "one plain folder name")
    assert snapshot(tmp_path) == before


def test_papermill_empty_run_name_deletes_nothing(tiny, trained, tmp_path):
    """`-p run_name ''` used to delete the whole output_dir: now it is a fresh, dated run next to the others. In this
    process (conftest.run_notebook: papermill's own typing of the `-p` values); test_train.py's test_papermill_train_notebook
    launches papermill itself."""
    ran, error = run_notebook("train.ipynb", config=trained["cfg"], output_dir=str(trained["runs"]), run_name="",
                              max_steps="1", seq_length="96", extra="{num_anchors: 4}")
    assert error is None, (ran, error)
    after = snapshot(tmp_path)
    assert {k: v for k, v in after.items() if k in trained["before"]} == trained["before"]   # nothing changed or lost
    assert any(d.name.startswith("train_nb-") for d in trained["runs"].iterdir())


def test_papermill_defaults_do_not_overwrite(tiny, trained, tmp_path):
    "In this process, as the test above: the notebook's defaults stop at an existing run, which is left as it was."
    ran, error = run_notebook("train.ipynb", config=trained["cfg"], output_dir=str(trained["runs"]), run_name="old")
    assert error is not None and "already exists" in str(error), (ran, error)
    assert snapshot(tmp_path / "runs" / "old") == {k[len("runs/old/"):]: v for k, v in trained["before"].items()
                                                   if k.startswith("runs/old/")}


# ------------------------------------------------------------------ 2. overwrite keeps the old run until the new one saved
def test_failed_overwrite_keeps_old_run(trained, tmp_path):
    p = train_here(
        trained["cfg"],
        "--run_name",
        "old",
        "--overwrite",
        "true",
        # the largest step sizes the config allows: the weights overflow within a few steps
        "--learning_rate",
        "10",
        "--weight_decay",
        "100",
        "--adam_beta2",
        "0",
        "--max_grad_norm",
        "1e30",
        "--max_steps",
        "8",
        "--save_every_steps",
        "null",
    )
    assert p.returncode == 2 and "non-finite" in p.stderr, p.stderr[-3000:]
    assert snapshot(tmp_path) == trained["before"]


def test_killed_overwrite_restores_old_run_on_next_start(trained, tmp_path):
    runs = trained["runs"]
    proc = launch_train(["--config", trained["cfg"], "--run_name", "old", "--overwrite", "true", "--save_every_steps", "1"],
                        env={"DOMINO_FAULT_SLEEP": "checkpoint-step-1:300"})
    _wait_for(lambda: (runs / "old" / "checkpoints" / ".tmp-step-1" / "contract.json").exists(), proc)
    proc.kill()
    proc.wait()
    assert (runs / ".old.replaced").is_dir()                      # the old run is set aside, not gone
    p = train_here(trained["cfg"], "--run_name", "old", "--resume", "latest", "--max_steps", "2")
    assert p.returncode == 0, p.stderr[-3000:]
    assert "restored" in p.stdout and "resumed from" in p.stdout  # settled back, then resumed the old run's step 2
    assert not (runs / ".old.replaced").exists()


def test_successful_overwrite_replaces_old_run(trained, tmp_path):
    p = train_here(trained["cfg"], "--run_name", "old", "--overwrite", "true", "--max_steps", "1")
    assert p.returncode == 0, p.stderr[-3000:]
    rows = [json.loads(l) for l in (trained["runs"] / "old" / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows if "loss" in r] == [1]       # the new run only: nothing of the old one mixed in
    assert not (trained["runs"] / ".old.replaced").exists()
    assert snapshot(trained["runs"] / "sibling") == {"results.json": trained["before"]["runs/sibling/results.json"]}


# ------------------------------------------------------------------ 3. one training per run folder
def test_second_training_on_same_run_refused(tiny, tmp_path):
    cfg = write_config(tmp_path / "c.yaml", {**tiny["base"], "output_dir": str(tmp_path / "runs"), "max_steps": 2,
                                             "save_every_steps": 1, "run_name": "busy"})
    proc = launch_train(["--config", cfg], env={"DOMINO_FAULT_SLEEP": "checkpoint-step-1:300"})
    try:
        _wait_for(lambda: (tmp_path / "runs" / "busy" / "checkpoints" / ".tmp-step-1" / "contract.json").exists(), proc)
        for extra in ([], ["--resume", "latest"], ["--overwrite", "true"]):
            one_line_error(train_here(cfg, *extra), "is in use by pid", "busy")
    finally:
        proc.kill()
        proc.wait()
    p = train_here(cfg, "--resume", "latest")                      # the killed holder left no stale lock
    assert p.returncode == 0, p.stderr[-3000:]


# ------------------------------------------------------------------ 5. code in a checkpoint is never run
def test_planted_state_pt_is_refused_and_not_run(trained, tmp_path):
    import torch
    class Planted:                                                # unpickling it runs a shell command
        def __reduce__(self): return (os.system, (f"touch {marker}",))
    marker = tmp_path / "pwned"
    ck = trained["runs"] / "old" / "checkpoints" / "step-2"
    torch.save({"optimizer": Planted()}, ck / "state.pt")
    files = json.loads((ck / "files.json").read_text())
    files["state.pt"] = (ck / "state.pt").stat().st_size
    (ck / "files.json").write_text(json.dumps(files))             # a consistent manifest: only the pickle gives it away
    p = train_here(trained["cfg"], "--run_name", "old", "--resume", "latest")
    one_line_error(p, "refusing", "state.pt")
    assert not marker.exists()


# ------------------------------------------------------------------ 6, 7. silent wrong results
def test_block_that_never_fits_fails(tiny, tmp_path):
    cfg = write_config(tmp_path / "c.yaml", {**tiny["base"], "output_dir": str(tmp_path / "runs"), "run_name": "big"})
    one_line_error(train_here(cfg, "--block_size", "95"), "block_size", "seq_length=96")
    assert not (tmp_path / "runs" / "big").exists()


def test_resume_with_changed_hyperparameter_refused(trained, tmp_path):
    p = train_here(trained["cfg"], "--run_name", "old", "--resume", "latest", "--learning_rate", "3e-3")
    one_line_error(p, "learning_rate: checkpoint 0.001 vs now 0.003")
    assert snapshot(tmp_path) == trained["before"]                # config.yaml does not claim what the run did not do


# ------------------------------------------------------------------ 9. damaged files: fall back, trim, go on
@pytest.fixture(scope="module")
def straight_4_steps(tiny, tmp_path_factory):
    "The uninterrupted 4-step run both damage cases compare against (trained once per module and worker)."
    root = tmp_path_factory.mktemp("straight")
    cfg = write_config(root / "c.yaml", {**tiny["base"], "output_dir": str(root / "runs"), "max_steps": 4,
                                         "save_every_steps": 1, "keep_checkpoints": 3})
    assert train_here(cfg, "--run_name", "straight").returncode == 0
    return root / "runs" / "straight"


@pytest.mark.xdist_group("straight_4_steps")                      # both cases on one worker: one straight run
@pytest.mark.parametrize("damage", ["state.pt", "draft/model.safetensors"])
def test_damaged_latest_checkpoint_falls_back(tiny, tmp_path, damage, straight_4_steps):
    base = {**tiny["base"], "output_dir": str(tmp_path / "runs"), "max_steps": 4, "save_every_steps": 1, "keep_checkpoints": 3}
    # a run of the same settings, killed while saving step 4; then its newest checkpoint (step 3) is damaged
    cfg2 = write_config(tmp_path / "c2.yaml", {**base, "run_name": "hurt"})
    proc = launch_train(["--config", cfg2], env={"DOMINO_FAULT_SLEEP": "checkpoint-step-4:60"})
    run = tmp_path / "runs" / "hurt"
    _wait_for(lambda: (run / "checkpoints" / ".tmp-step-4" / "contract.json").exists(), proc)
    proc.kill()
    proc.wait()
    f = run / "checkpoints" / "step-3" / damage
    f.write_bytes(f.read_bytes()[: f.stat().st_size // 2])
    with open(run / "metrics.jsonl", "a") as m: m.write('{"step": 4, "loss": 1.2')    # a torn last line
    p = train_here(cfg2, "--resume", "latest")
    assert p.returncode == 0, p.stderr[-3000:]
    assert "step-3" in p.stderr and damage.split("/")[-1] in p.stderr and "falling back" in p.stderr
    assert "not JSON" in p.stderr and "Traceback" not in p.stderr
    assert "resumed from" in p.stdout and "step-2" in p.stdout
    a, b = _weights(straight_4_steps), _weights(run)
    assert all((a[k] == b[k]).all() for k in a)                   # and the result is the uninterrupted run's, bit for bit
    rows = [json.loads(l) for l in (run / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows if "loss" in r] == [1, 2, 3, 4]


# ------------------------------------------------------------------ 11. the tracker fails fast
def test_wandb_without_credentials_fails_fast(tiny, tmp_path):
    cfg = write_config(tmp_path / "c.yaml", {**tiny["base"], "output_dir": str(tmp_path / "runs"), "run_name": "wb"})
    env = {k: v for k, v in ENV.items() if k not in ("WANDB_MODE", "WANDB_API_KEY")}
    home = tmp_path / "home"
    home.mkdir()
    t0 = time.time()
    p = subprocess.run([sys.executable, "-m", "domino_research.train", "--config", cfg, "--wandb_project", "x"], cwd=home,
                       env={**env, "HOME": str(home), "NETRC": str(home / ".netrc")}, capture_output=True, text=True, timeout=120)
    one_line_error(p, "wandb_project", "no W&B credentials", "WANDB_MODE=offline")
    assert time.time() - t0 < 60 and not (home / "wandb").exists() and not (tmp_path / "runs" / "wb").exists()


# ------------------------------------------------------------------ 12. messages that point the right way
def test_command_line_numbers_and_blame(tiny, tmp_path):
    cfg = write_config(tmp_path / "c.yaml", {**tiny["base"], "output_dir": str(tmp_path / "runs"), "run_name": "n"})
    err = one_line_error(train_here(cfg, "--seq_length", "long"), "seq_length")
    assert "command line" in err and "c.yaml" not in err
    err = one_line_error(train_here(cfg, "--blok_size", "4"), "unknown key --blok_size", "did you mean --block_size")
    assert "c.yaml" not in err                                   # the flag is the command line's mistake, not the file's
    p = train_here(cfg, "--learning_rate", "1e-3", "--max_steps", "1")
    assert p.returncode == 0, p.stderr[-3000:]


# ------------------------------------------------------------------ the fault matrix
def _check_intact(run):
    "After a kill: every checkpoint the run lists is complete and loads; an exported draft, if any, is complete."
    from safetensors.torch import load_file
    from domino_research.lifecycle import list_checkpoints, checkpoint_damage, load_checkpoint_state
    for ck in list_checkpoints(run):
        assert checkpoint_damage(ck) is None, checkpoint_damage(ck)
        load_checkpoint_state(ck)
        load_file(ck / "draft" / "model.safetensors")
    if (run / "draft").exists(): load_file(run / "draft" / "model.safetensors")


def test_fault_matrix_kill9_then_resume(tiny, tmp_path):
    """`kill -9` at 10 random points — during start-up, training steps, each stage of a checkpoint save, the final export —
    each followed by `--resume latest`: no checkpoint is ever left damaged, and the final draft is bitwise equal to an
    uninterrupted run's."""
    import random
    from domino_research.lifecycle import list_checkpoints
    base = {**tiny["base"], "output_dir": str(tmp_path / "runs"), "save_every_steps": 1, "max_steps": 12, "keep_checkpoints": 2,
            "micro_batch_size": 2, "grad_accumulation_steps": 2, "num_epochs": 2}   # 6 steps per epoch: crosses an epoch
    cfg = write_config(tmp_path / "c.yaml", base)
    p = train_here(cfg, "--run_name", "straight")
    assert p.returncode == 0, p.stderr[-3000:]
    seed = int(os.environ.get("FAULT_SEED", os.getpid()))
    rng = random.Random(seed)
    saves = ["checkpoint-step", "checkpoint-written", "checkpoint-renamed"]
    plan = saves + [rng.choice(["startup", "step", "step", rng.choice(saves)]) for _ in range(6)]
    # the export can only be the last kill
    rng.shuffle(plan)
    plan.append("export-draft")
    run, log = tmp_path / "runs" / "killed", []

    def fresh(rel):                                                   # written by this attempt, not left by a killed one
        f = run / rel
        return lambda: f.exists() and f.stat().st_mtime >= t_launch
    for kind in plan:
        saved = int(list_checkpoints(run)[-1].name.split("-")[1]) if list_checkpoints(run) else 0
        nxt = saved + 1
        if kind == "step" and nxt >= 12: kind = "startup"              # too little training left to land a timed kill in
        fault, ready = {}, None
        if kind in saves:
            fault = {"DOMINO_FAULT_SLEEP": f"{kind}-{nxt}:120"}
            ready = fresh({"checkpoint-step": f"checkpoints/.tmp-step-{nxt}/contract.json",
                           "checkpoint-written": f"checkpoints/.tmp-step-{nxt}/files.json",
                           "checkpoint-renamed": f"checkpoints/step-{nxt}/files.json"}[kind])
        elif kind == "export-draft":
            fault, ready = {"DOMINO_FAULT_SLEEP": "export-draft:120"}, fresh(".draft.tmp/model.safetensors")
        elif kind == "step":      # steps slowed to ~0.1 s so that a random moment lands in a step or a save, not after the end
            fault, ready = {"DOMINO_FAULT_SLEEP": "optimiser-step:0.05"}, fresh("metrics.jsonl")
        t_launch = time.time()
        proc = launch_train(["--config", cfg, "--run_name", "killed", "--resume", "latest"], env=fault)
        if kind == "startup": time.sleep(rng.uniform(0.0, 0.5))    # config, lock, target, data: ~0.4 s forked preloaded
        else: _wait_for(ready, proc)
        if kind == "step": time.sleep(rng.uniform(0.0, 0.3))
        assert proc.poll() is None, f"seed {seed}: run finished before the {kind} kill; plan {plan}, done {log}"
        proc.kill()
        proc.wait()
        log.append(f"{kind}@{saved}+{time.time() - t_launch:.1f}s")
        _check_intact(run)
    p = train_here(cfg, "--run_name", "killed", "--resume", "latest")
    assert p.returncode == 0, (seed, log, p.stderr[-3000:])
    a, b = _weights(tmp_path / "runs" / "straight"), _weights(run)
    assert a.keys() == b.keys()
    for k in a: assert (a[k] == b[k]).all(), f"seed {seed}: {k} differs after kills {log}"
    rows = [json.loads(l) for l in (run / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows if "loss" in r] == list(range(1, 13)), (seed, log)
    assert len(log) == 10
    print(f"fault matrix seed {seed}: {log}")


# ------------------------------------------------------------------ found by a careless-user pass
def test_resume_latest_never_restarts_over_a_finished_run(trained, tmp_path):
    "Checkpoints deleted to save disk: `--resume latest` must not start over on top of the draft, summary and plots."
    import shutil
    shutil.rmtree(trained["runs"] / "old" / "checkpoints")
    before = snapshot(tmp_path)
    one_line_error(train_here(trained["cfg"], "--run_name", "old", "--resume", "latest"), "nothing to resume from", "draft")
    assert snapshot(tmp_path) == before


def test_resume_latest_with_every_checkpoint_damaged_refuses(trained, tmp_path):
    for ck in (trained["runs"] / "old" / "checkpoints").iterdir():
        f = ck / "state.pt"
        f.write_bytes(f.read_bytes()[:100])
    before = snapshot(tmp_path)
    one_line_error(train_here(trained["cfg"], "--run_name", "old", "--resume", "latest"), "every checkpoint", "damaged")
    assert snapshot(tmp_path) == before


def test_saved_config_reused_does_not_overwrite(trained, tmp_path):
    "A run's config.yaml used as --config: it records no overwrite, so the run it came from is refused, not replaced."
    import yaml
    saved = yaml.safe_load((trained["runs"] / "old" / "config.yaml").read_text())
    assert saved["overwrite"] is False and saved["resume"] is None
    before = snapshot(tmp_path)
    one_line_error(train_here(str(trained["runs"] / "old" / "config.yaml"), "--learning_rate", "0.01"), "already exists")
    assert snapshot(tmp_path) == before


def test_foreign_checkpoint_into_an_existing_run_refused(trained, tmp_path):
    p = train_here(trained["cfg"], "--run_name", "src")
    assert p.returncode == 0, p.stderr[-2000:]
    before = snapshot(tmp_path)
    one_line_error(
        train_here(trained["cfg"], "--run_name", "old", "--resume", str(trained["runs"] / "src" / "checkpoints" / "step-2")),
        "another run's checkpoint",
    )
    assert snapshot(tmp_path) == before


@pytest.mark.parametrize("case", ["not_a_run", "symlink"])
def test_overwrite_replaces_runs_only(trained, tmp_path, case):
    precious = tmp_path / "precious"
    precious.mkdir()
    (precious / "thesis.tex").write_text("important\n")
    if case == "not_a_run":
        (trained["runs"] / "notes").mkdir()
        (trained["runs"] / "notes" / "thesis.tex").write_text("mine\n")
    else: (trained["runs"] / "notes").symlink_to(precious)
    before = snapshot(tmp_path)
    one_line_error(train_here(trained["cfg"], "--run_name", "notes", "--overwrite", "true"),
                   "not a training run" if case == "not_a_run" else "symbolic link")
    assert snapshot(tmp_path) == before


def test_contradictions_and_late_failures_caught_up_front(trained, tmp_path, capsys):
    before = snapshot(tmp_path)
    cases = [(["--run_name", "old", "--resume", "latest", "--overwrite", "true"], ["overwrite"]),
             (["--run_name", "a" * 300], ["run_name", "at most 200 bytes"]),
             (["--run_name", "old", "--overwrite", "true", "--n_eval_prompts", "2", "--decode_prompts",
               str(tmp_path / "typo.jsonl")], ["decode_prompts", "typo.jsonl"])]
    for argv, needles in cases:                                    # in this process: `cli` as the user runs it
        code, err, lines = cli_lines(capsys, ["--config", trained["cfg"], *argv])
        assert code == 2 and len(lines) == 1 and "Traceback" not in err, err[-3000:]
        for n in needles: assert n in lines[0], lines[0]
    assert snapshot(tmp_path) == before                            # the old run was not replaced by a doomed one


# ------------------------------------------- faults that end in one line (in-process: `cli` as the user runs it)
def cli_lines(capsys, argv) -> tuple[int, str, list[str]]:
    "Run the training command line in this process: (exit status, stderr, its `error:` lines)."
    from domino_research.train import cli
    with pytest.raises(SystemExit) as e: cli([str(a) for a in argv])
    err = capsys.readouterr().err
    return e.value.code, err, [l for l in err.splitlines() if l.startswith("error: ")]


@pytest.fixture
def small_disk(tmp_path):
    "A 4 MiB tmpfs: a disk that really fills up (needs root and mount; skipped where it cannot be made)."
    mnt = tmp_path / "disk"
    mnt.mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=4m", "tmpfs", str(mnt)], capture_output=True).returncode != 0:
        pytest.skip("cannot mount a tmpfs here (needs root)")
    yield mnt
    subprocess.run(["umount", "-l", str(mnt)], check=True)


def _fill(folder, leave: int = 0) -> Path:
    "Fill the disk of `folder` up to `leave` free bytes with a new file (returned, to free the space again)."
    import shutil
    filler = Path(folder) / f"filler-{len(list(Path(folder).glob('filler-*')))}.bin"
    with open(filler, "wb") as f:
        try:
            while shutil.disk_usage(folder).free > leave:
                f.write(b"\0" * min(65536, shutil.disk_usage(folder).free - leave or 1))
                f.flush()
        except OSError: pass                                     # full
    return filler


def test_full_disk_at_save_and_resume_is_one_line(tiny, tmp_path, small_disk, capsys, monkeypatch):
    """The disk fills up just before the second checkpoint: one line naming the checkpoint and the space it needs, no
    `.tmp-step-2` left, step-1 intact. A resume on the still-full disk: one line, no `.config.yaml.tmp`. With space
    again, `--resume latest` finishes from step-1."""
    import domino_research.train as T
    cfg = write_config(tmp_path / "c.yaml", {**tiny["base"], "output_dir": str(small_disk), "run_name": "full", "max_steps": 3,
                                             "save_every_steps": 1, "data_cache_dir": str(tmp_path / "cache")})
    real, filler = T.save_checkpoint, []
    def save_then_fill(run_dir, step, *a, **k):
        if step == 2:         # room for the draft's weights but not for state.pt: torch's writer is the one that fails
            draft = Path(run_dir) / "checkpoints" / "step-1" / "draft"
            filler.append(_fill(small_disk, leave=sum(f.stat().st_size for f in draft.iterdir()) + 2 ** 16))
        return real(run_dir, step, *a, **k)
    monkeypatch.setattr(T, "save_checkpoint", save_then_fill)
    code, err, lines = cli_lines(capsys, ["--config", cfg])
    assert code == 2 and len(lines) == 1 and "Traceback" not in err, err[-3000:]
    run = small_disk / "full"
    assert f"no space left on the device of {run / 'checkpoints' / 'step-2'}" in lines[0] and "needs about" in lines[0], lines
    assert "--resume latest" in lines[0]
    assert sorted(p.name for p in (run / "checkpoints").iterdir()) == ["step-1"]   # no .tmp-step-2
    _check_intact(run)
    monkeypatch.setattr(T, "save_checkpoint", real)
    filler.append(_fill(small_disk, leave=0))                   # the removed temp folder's space taken too: nothing free
    code, err, lines = cli_lines(capsys, ["--config", cfg, "--resume", "latest"])  # the same disk, still full
    assert code == 2 and len(lines) == 1 and "Traceback" not in err, err[-3000:]
    # the first file the resume writes in the run folder is named (which one depends on how full tmpfs lets the disk get)
    assert f"no space left on the device of {run}" in lines[0], lines
    assert not [p.name for p in run.iterdir() if p.name.endswith(".tmp")]   # no empty .config.yaml.tmp
    for f in filler: f.unlink()
    assert T.main(cfg, resume="latest")["step"] == 3              # space again: it finishes from step-1
    _check_intact(run)


def test_ctrl_c_during_save_and_export_is_one_line_and_resumes(tiny, tmp_path, capsys, monkeypatch):
    """A real SIGINT (Ctrl-C) while a checkpoint is being written, then while the draft is exported: each time one line
    saying where it stopped and to continue with `--resume latest`, and no temp folder left. The run then finishes,
    and resuming the finished run again adds no second final row to metrics.jsonl."""
    import signal
    import domino_research.lifecycle as L, domino_research.train as T
    cfg = write_config(tmp_path / "c.yaml", {**tiny["base"], "output_dir": str(tmp_path / "runs"), "run_name": "int",
                                             "max_steps": 2, "save_every_steps": 1})
    run, real = tmp_path / "runs" / "int", L.fault_point      # checkpoints and the export are the lifecycle's
    def ctrl_c_at(point): return lambda name: signal.raise_signal(signal.SIGINT) if name == point else None
    monkeypatch.setattr(L, "fault_point", ctrl_c_at("checkpoint-step-2"))
    code, err, lines = cli_lines(capsys, ["--config", cfg])
    assert code == 130 and len(lines) == 1 and "Traceback" not in err, err[-3000:]
    assert "interrupted while saving checkpoint step-2" in lines[0] and str(run / "checkpoints" / "step-1") in lines[0]
    assert "--resume latest" in lines[0]
    assert sorted(p.name for p in (run / "checkpoints").iterdir()) == ["step-1"]   # the half-written step-2 is gone
    monkeypatch.setattr(L, "fault_point", ctrl_c_at("export-draft"))
    code, err, lines = cli_lines(capsys, ["--config", cfg, "--resume", "latest"])
    assert code == 130 and len(lines) == 1 and "Traceback" not in err, err[-3000:]
    assert "interrupted while exporting the draft" in lines[0] and "step-2" in lines[0] and "--resume latest" in lines[0]
    assert not (run / ".draft.tmp").exists() and not (run / "draft").exists()
    monkeypatch.setattr(L, "fault_point", real)
    for _ in range(2):                                            # stopped during export, then finished: resume both
        assert T.main(cfg, resume="latest")["step"] == 2
        rows = [json.loads(l) for l in (run / "metrics.jsonl").read_text().splitlines()]
        assert [r["step"] for r in rows if r.get("final")] == [2], rows
        assert [r["step"] for r in rows if "loss" in r] == [1, 2]
    _check_intact(run)


def _follow(argv: list[str], advice: str) -> list[str]:
    "The command line a user types on reading `advice` ('[X in place of Y, ]plus Z' after 'the same command'), word for word."
    m = re.fullmatch(r"(?:(.+) in place of (.+), )?plus (.+)", advice)
    assert m, advice
    out = " ".join(argv)
    if m[1]: out = out.replace(m[2], m[1])
    return out.split() + m[3].split()


def test_ctrl_c_during_an_overwrite_gives_advice_that_works(tiny, tmp_path, capsys, monkeypatch):
    """Ctrl-C in a run started with `--overwrite true`, after it saved: the one-line advice, followed word for word,
    finishes the run. It said "the same command plus --resume latest", and overwrite beside resume=latest is refused."""
    import signal
    import domino_research.lifecycle as L
    cfg = write_config(tmp_path / "c.yaml", {**tiny["base"], "output_dir": str(tmp_path / "runs"), "run_name": "ow",
                                             "max_steps": 2, "save_every_steps": 1})
    from domino_research.train import cli
    cli(["--config", cfg])                                               # a finished run, then its replacement
    real = L.fault_point
    ctrl_c = lambda name: signal.raise_signal(signal.SIGINT) if name == "checkpoint-step-2" else None
    monkeypatch.setattr(L, "fault_point", ctrl_c)
    argv = ["--config", cfg, "--overwrite", "true"]
    code, err, lines = cli_lines(capsys, argv)
    assert code == 130 and len(lines) == 1 and "Traceback" not in err, err[-3000:]
    monkeypatch.setattr(L, "fault_point", real)
    followed = _follow(argv, lines[0].split("continue with the same command ", 1)[1])
    try: cli(followed)                                                   # exits only on a refusal
    except SystemExit as e: raise AssertionError(f"{followed}: {capsys.readouterr().err[-3000:]}") from e
    rows = [json.loads(l) for l in (tmp_path / "runs" / "ow" / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows if "loss" in r] == [1, 2] and rows[-1].get("final"), rows   # resumed, not restarted
