"""The training recipe end to end: CLI, multi-process (gloo) symmetry, kill/resume, atomic checkpoints,
gradient accumulation, skipped micro-batches, bad configs and the papermill notebook."""
import contextlib, io, json, os, random, re, shutil, signal, socket, subprocess, sys, time
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
import yaml
from safetensors.torch import load_file

from conftest import REPO, run_module, write_config, write_jsonl, _chat
from _preloaded import launch_train
from domino_research.export import self_description_problems

ENV = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


GLOO_EXIT_ABORT = "terminate called without an active exception"

def finished(p, out_dir, nproc: int) -> bool:
    """Whether a launch did its work: exit 0, or gloo's abort at teardown after every rank wrote its result file (the
    workers write it just before closing). That abort (a C++ thread still joinable when the process exits) hits a rank
    now and then on a loaded 2-core machine, after the work is done; it is tolerated here and nowhere else."""
    if p.returncode == 0: return True
    return nproc > 1 and GLOO_EXIT_ABORT in p.stderr and all((Path(out_dir) / f"rank{r}.json").is_file() for r in range(nproc))


@contextlib.contextmanager
def one_thread():
    "torch at one thread for a block, as OMP_NUM_THREADS=1 gives a launched process: the launched runs' sums, bit for bit."
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try: yield
    finally: torch.set_num_threads(threads)


def eval_here(cfg_path) -> dict:
    "tests/_recipe_worker.py's `eval` on one process, run in this one: a launch adds ~6 s of imports and checks nothing."
    from domino_research.train import RECIPES, load_train_config
    with one_thread():
        cfg = load_train_config(cfg_path)
        recipe = RECIPES[cfg.recipe](cfg).setup()
        try: return json.loads(json.dumps({"world": recipe.accelerator.num_processes, **recipe.validate()}))
        finally: recipe.close()


def train_cli(cfg_path, *args, timeout=300, **popen):
    "The real launch, `python -m domino_research.train --config ...`: for the tests of the launch itself."
    cmd = [sys.executable, "-m", "domino_research.train", "--config", cfg_path, *args]
    return subprocess.run(cmd, env=ENV, capture_output=True, text=True, timeout=timeout, **popen)


@contextlib.contextmanager
def warnings_as_a_process_shows_them():
    """Warnings written to stderr under Python's default filters, each once, as a new process shows them (pytest would
    record them instead: the messages a test reads on stderr, such as a damaged checkpoint's, would be missing)."""
    import warnings
    with warnings.catch_warnings():
        warnings.resetwarnings()
        for quiet in (DeprecationWarning, PendingDeprecationWarning, ImportWarning, ResourceWarning):
            warnings.simplefilter("ignore", quiet)
        warnings.showwarning = lambda message, category, filename, lineno, file=None, line=None: sys.stderr.write(
            warnings.formatwarning(message, category, filename, lineno, line))
        yield


def train_here(cfg_path, *args):
    """The same command in this process (conftest.run_module) with one torch thread, as `train_cli`'s OMP_NUM_THREADS=1
    gives its run (bitwise comparisons with launched runs need the same thread count), and its warnings on its stderr:
    a new Python spends ~6 s on imports and checks nothing more. test_cli_trains_and_writes_run_dir keeps the real launch."""
    with one_thread(), warnings_as_a_process_shows_them():
        return run_module("domino_research.train", "--config", cfg_path, *args)


# ------------------------------------------------------------------ multi-process symmetry
VALIDATION_CASES = [(False, False), (True, False), (True, True)]    # (shard_target, packing)
PACKED = {"packing": True, "seq_length": 192}


# Session scope: at most one launch per worker. Under pytest 9.2 with xdist 3.8, `--dist loadgroup` does not keep an
# xdist_group on one worker (xdist renames item._nodeid, pytest 9 reads item._id), and a module fixture is set up
# again whenever another module's test runs between two of its tests on a worker: four launches in a full run.
@pytest.fixture(scope="session")
def two_ranks(tiny, tmp_path_factory):
    """Every two-rank evaluation and training of the tests below, in one launch (tests/_recipe_worker.py `jobs`): a launch
    of two ranks costs ~15 s of imports and process-group set-up, and the recipes it runs one after another each build
    their own target, data and draft (as test_shard.py's eight trainings in one launch do). -> job -> per-rank results."""
    root = tmp_path_factory.mktemp("two_ranks")
    base = {**tiny["base"], "output_dir": str(root / "runs")}
    rng = random.Random(1)
    short_row_data = write_jsonl(root / "d.jsonl", [_chat(rng, i) for i in range(3)] + [_chat(rng, 3, short=True)])
    jobs = {f"ev-{shard}-{packing}": ("eval", {"shard_target": shard, **(PACKED if packing else {})})
            for shard, packing in VALIDATION_CASES}
    jobs |= {f"ev1-{shard}": ("eval", {"max_eval_samples": 1, "shard_target": shard}) for shard in (False, True)}
    jobs |= {f"shard{shard}": ("train", {"max_steps": 3, "shard_target": shard}) for shard in (False, True)}
    jobs["skip"] = ("train", {"train_data": str(short_row_data), "block_size": 8, "micro_batch_size": 1})
    listed = [[name, job, write_config(root / f"{name}.yaml", {**base, "run_name": name, **over})]
              for name, (job, over) in jobs.items()]
    out = root / "out"
    out.mkdir()
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node=2", "--master_addr=127.0.0.1",
           f"--master_port={free_port()}", str(REPO / "tests" / "_recipe_worker.py"), "jobs", json.dumps(listed), str(out)]
    p = subprocess.run(cmd, env=ENV, capture_output=True, text=True, timeout=600)
    assert finished(p, out, 2), p.stdout[-3000:] + p.stderr[-5000:]
    ranks = [json.loads((out / f"rank{r}.json").read_text()) for r in range(2)]
    return {"ranks": {name: [r[name] for r in ranks] for name in jobs}, "runs": root / "runs"}


@pytest.mark.xdist_group("two_ranks")                           # one worker for the launch they read (see two_ranks)
@pytest.mark.parametrize("shard,packing", VALIDATION_CASES)
def test_two_ranks_validation_equals_one_rank(tiny, tmp_path, two_ranks, shard, packing):
    """Features and loss of two ranks, with the target's decoder layers FSDP2-sharded or not, equal one unsharded rank;
    also with packed rows (the setup's probe of the target's document mask is then a collective forward)."""
    extra = PACKED if packing else {}
    one = eval_here(write_config(tmp_path / "c.yaml", {**tiny["base"], "output_dir": str(tmp_path), "run_name": "ev", **extra}))
    two = two_ranks["ranks"][f"ev-{shard}-{packing}"]
    assert two[0]["world"] == 2 and one["world"] == 1
    keys = [k for k in one if k.startswith("eval/")]
    assert {"eval/loss", "eval/accept_len", "eval/final_loss", "eval/base_accept_len"} <= set(keys)
    for r in two:
        for k in keys: assert r[k] == pytest.approx(one[k], rel=1e-9, abs=1e-12), k


@pytest.mark.xdist_group("two_ranks")
@pytest.mark.parametrize("shard", [False, True])
def test_rank_without_validation_batch(tiny, tmp_path, two_ranks, shard):
    """One validation row, two ranks: rank 1 sees nothing, still joins the all-reduce and reports the same numbers;
    with a sharded target it also joins the one target forward (on a row it then drops)."""
    one = eval_here(write_config(tmp_path / "c.yaml", {**tiny["base"], "output_dir": str(tmp_path), "run_name": "ev1",
                                                       "max_eval_samples": 1}))
    two = two_ranks["ranks"][f"ev1-{shard}"]
    assert two[0]["world"] == 2
    for r in two:
        for k in one:
            if k.startswith("eval/"): assert r[k] == pytest.approx(one[k], rel=1e-9, abs=1e-12), k


@pytest.mark.xdist_group("two_ranks")
def test_sharded_target_trains_like_a_whole_one(two_ranks):
    """Two ranks, 3 optimiser steps: the draft trained against an FSDP2-sharded target is bitwise the one trained against a
    whole target."""
    weights = {}
    for shard in (False, True):
        assert [r["step"] for r in two_ranks["ranks"][f"shard{shard}"]] == [3, 3]
        weights[shard] = load_file(two_ranks["runs"] / f"shard{shard}" / "draft" / "model.safetensors")
    for k in weights[False]: assert torch.equal(weights[False][k], weights[True][k]), k


@pytest.mark.xdist_group("two_ranks")
def test_no_anchor_microbatch_on_one_rank_skipped_by_both(two_ranks):
    # 4 rows over 2 ranks = 2 windows; the one holding the short row (no anchor candidate) is skipped on both ranks
    assert [r["step"] for r in two_ranks["ranks"]["skip"]] == [1, 1]


# ------------------------------------------------------------------ CLI, resume, fault injection
def test_cli_trains_and_writes_run_dir(tiny, tmp_path):
    cfg = write_config(tmp_path / "c.yaml", {**tiny["base"], "output_dir": str(tmp_path / "runs")})
    p = train_cli(cfg, "--run_name", "cli", "--max_steps", "3", "--save_every_steps", "2")
    assert p.returncode == 0, p.stderr[-4000:]
    run = tmp_path / "runs" / "cli"
    assert {"config.yaml", "metrics.jsonl", "checkpoints", "draft", "plots", "summary.json"} <= {q.name for q in run.iterdir()}
    assert set(load_file(run / "draft" / "model.safetensors")) >= {"fc.weight", "hidden_norm.weight", "norm.weight",
                                                                   "prefix_gru.weight_ih_l0", "embed_proj.2.weight"}
    rows = [json.loads(l) for l in (run / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows if "loss" in r] == [1, 2, 3]
    assert "[cli]" in p.stdout
    # the run ends with a self-describing draft folder: card with the target and data fingerprints and the figures
    draft = run / "draft"
    assert {"README.md", "generation_config.json", "modeling_dflash.py"} <= {q.name for q in draft.iterdir()}
    rec = json.loads((draft / "config.json").read_text())
    assert rec["auto_map"] == {"AutoModel": "modeling_dflash.DFlashDraftModel"}
    assert len(rec["domino_research"]["target_fingerprint"]) == 16 and len(rec["domino_research"]["data_fingerprint"]) >= 8
    card = (draft / "README.md").read_text()
    assert rec["domino_research"]["target_fingerprint"] in card and "## Key hyper-parameters" in card and "## Validation" in card
    # ... that tells the truth about itself: dtype and special tokens as the weights and generation_config say, all readable
    assert self_description_problems(draft) == [] and rec["domino_research"]["target_files_sha256"] in card


def _weights(run):
    return load_file(Path(run) / "draft" / "model.safetensors")


def _wait_for(pred, proc, timeout=240):
    t0 = time.time()
    while not pred():
        assert proc.poll() is None, "training ended before the point where the test kills it"
        assert time.time() - t0 < timeout, "timed out waiting"
        time.sleep(0.05)


def test_sigkill_and_resume_is_bitwise_identical(tiny, tmp_path):
    base = {**tiny["base"], "output_dir": str(tmp_path / "runs"), "save_every_steps": 1, "max_steps": 8,
            "micro_batch_size": 2, "grad_accumulation_steps": 2, "num_epochs": 2}
    cfg = write_config(tmp_path / "c.yaml", base)
    p = train_here(cfg, "--run_name", "straight")
    assert p.returncode == 0, p.stderr[-4000:]
    kill_at = random.Random(os.getpid()).randrange(2, 7)
    ck = tmp_path / "runs" / "killed" / "checkpoints"
    proc = launch_train(["--config", cfg, "--run_name", "killed"])
    _wait_for(lambda: (ck / f"step-{kill_at}" / "state.pt").exists(), proc)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    p = train_here(cfg, "--run_name", "killed", "--resume", "latest")
    assert p.returncode == 0, p.stderr[-4000:]
    a, b = _weights(tmp_path / "runs" / "straight"), _weights(tmp_path / "runs" / "killed")
    assert a.keys() == b.keys()
    for k in a: assert torch.equal(a[k], b[k]), f"{k} differs after kill at step {kill_at} + resume"
    steps = [json.loads(l)["step"] for l in (tmp_path / "runs" / "killed" / "metrics.jsonl").read_text().splitlines()
             if "loss" in json.loads(l)]
    assert steps == list(range(1, 9)), steps   # redone steps are not logged twice


def test_kill_during_checkpoint_save_keeps_previous(tiny, tmp_path):
    cfg = write_config(tmp_path / "c.yaml", {**tiny["base"], "output_dir": str(tmp_path / "runs"), "save_every_steps": 1,
                                             "max_steps": 4, "run_name": "crash"})
    ck = tmp_path / "runs" / "crash" / "checkpoints"
    proc = launch_train(["--config", cfg], env={"DOMINO_FAULT_SLEEP": "checkpoint-step-2:60"})
    _wait_for(lambda: (ck / ".tmp-step-2" / "contract.json").exists(), proc)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    from domino_research.lifecycle import list_checkpoints
    assert [p.name for p in list_checkpoints(tmp_path / "runs" / "crash")] == ["step-1"]
    p = train_here(cfg, "--resume", "latest")           # resumes from step-1, ignoring the partial save
    assert p.returncode == 0, p.stderr[-4000:]
    assert "resumed from" in p.stdout and "step-1" in p.stdout
    assert not (ck / ".tmp-step-2").exists()
    assert json.loads((tmp_path / "runs" / "crash" / "summary.json").read_text())["step"] == 4


def test_nonfinite_loss_stops_without_checkpoint(tiny, tmp_path):
    cfg = write_config(tmp_path / "c.yaml", {**tiny["base"], "output_dir": str(tmp_path / "runs"), "save_every_steps": 1,
                                             "max_steps": 6, "run_name": "nan", "max_grad_norm": 1e30,
                                             # the largest step sizes the config allows: the weights overflow in a few steps
                                             "learning_rate": 10, "weight_decay": 100, "adam_beta2": 0})
    p = train_here(cfg)
    assert p.returncode != 0
    # the loss, or weights an update from a finite loss overflowed: stopped before that checkpoint either way
    assert "non-finite" in p.stderr and "optimiser step" in p.stderr, p.stderr[-2000:]
    from domino_research.lifecycle import list_checkpoints
    for ck in list_checkpoints(tmp_path / "runs" / "nan"):
        for t in load_file(ck / "draft" / "model.safetensors").values(): assert torch.isfinite(t).all()


# ------------------------------------------------------------------ gradient accumulation
# The test replaces optimizer.step to capture gradients, so torch's "scheduler before optimizer" check fires.
@pytest.mark.filterwarnings("ignore:Detected call of `lr_scheduler.step\\(\\)` before `optimizer.step\\(\\)`:UserWarning")
def test_grad_accumulation_equals_big_batch(tiny, tmp_path):
    "4 micro-batches of 1 accumulated == 1 micro-batch of 4, same samples and anchors (fp32)."
    from domino_research.train import load_train_config, TrainDominoRecipe

    def fixed_blocks(batch, generator):         # the same per-row anchors however rows are batched
        first = batch["loss_mask"].argmax(1)    # first supervised token of each row (padding cannot move it)
        a = torch.stack([first, first + 3, first + 7], 1)
        return a, torch.ones_like(a, dtype=torch.bool)

    class FixedAnchors(TrainDominoRecipe):
        def _build_trainer_module(self):        # the trainer samples its batches' blocks: here, fixed ones
            trainer = super()._build_trainer_module()
            trainer.sample_blocks = fixed_blocks
            return trainer

    grads = {}
    for name, mbs, ga in (("acc", 1, 4), ("big", 4, 1)):
        cfg = load_train_config(None, **{**tiny["base"], "run_name": name, "micro_batch_size": mbs,
                                        "grad_accumulation_steps": ga, "output_dir": str(tmp_path)})
        r = FixedAnchors(cfg).setup()
        seen = []
        r.optimizer.step = lambda: seen.append({n: p.grad.clone() for n, p in r.trainer.named_parameters()})
        window = [r._collate(r.train_set, rows) for rows in ([[0], [1], [2], [3]] if ga == 4 else [[0, 1, 2, 3]])]
        assert r._train_window(window, step=3) is not None
        grads[name] = seen[0]
    assert any(g.abs().sum() > 0 for g in grads["acc"].values())
    assert grads["acc"].keys() == grads["big"].keys()
    for n in grads["acc"]:
        torch.testing.assert_close(grads["acc"][n], grads["big"][n], atol=1e-5, rtol=1e-4, msg=n)


# ------------------------------------------------------------------ bad configs
def _bad(tiny, tmp_path, **kw):
    from domino_research.train import main
    from domino_research.config import ConfigError
    run = Path(kw.get("output_dir", tmp_path / "runs")) / "bad"
    with pytest.raises(ConfigError) as e:
        main(None, **{**tiny["base"], "output_dir": str(tmp_path / "runs"), "run_name": "bad", **kw})
    assert not run.exists(), "a failed config left a run directory behind"
    return str(e.value)


@pytest.mark.parametrize("kw,needle", [
    ({"blok_size": 4}, "blok_size"),
    ({"seq_length": "long"}, "seq_length"),
    ({"target": "/nonexistent/target"}, "target"),
    ({"block_size": 1}, "block_size"),
    ({"mask_token_id": 10**7}, "mask_token_id"),
    ({"recipe": "dflash", "emb_dim": 8}, "emb_dim"),
    ({"target_layer_ids": [0, 99]}, "target_layer_ids"),
    ({"emb_dim": 0}, "emb_dim"),
    ({"train_data": "/nonexistent/data.jsonl"}, "data.jsonl"),
    ({"data_num_proc": -1}, "data_num_proc: must be >= 1"),
    ({"data_num_proc": 0}, "data_num_proc: must be >= 1"),
    ({"dataloader_num_workers": -1}, "dataloader_num_workers: must be >= 0"),
])
def test_bad_config_fails_before_training(tiny, tmp_path, kw, needle):
    assert needle in _bad(tiny, tmp_path, **kw)


def test_unwritable_output_dir(tiny, tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("x")
    assert "output_dir" in _bad(tiny, tmp_path, output_dir=str(blocker / "runs"))


def test_unwritable_data_cache_dir(tiny, tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("x")
    assert "data_cache_dir: cannot write" in _bad(tiny, tmp_path, data_cache_dir=str(blocker / "cache"))


def test_mismatched_resume_refused(tiny, tmp_path):
    from domino_research.train import main
    main(None, **{**tiny["base"], "output_dir": str(tmp_path / "runs"), "run_name": "r", "max_steps": 1})
    from domino_research.config import ConfigError
    with pytest.raises(ConfigError, match="block_size"):
        main(None, **{**tiny["base"], "output_dir": str(tmp_path / "runs"), "run_name": "r", "max_steps": 2,
                      "resume": "latest", "block_size": 8})


def test_bad_yaml_names_file(tiny, tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("recipe: domino\nseq_length: [unclosed\n")
    p = train_here(str(bad))
    assert p.returncode == 2 and "bad.yaml" in p.stderr and "Traceback" not in p.stderr


# ------------------------------------------------------------------ papermill
def test_papermill_train_notebook(tiny, tmp_path):
    cfg = write_config(tmp_path / "c.yaml", tiny["base"])
    out = tmp_path / "train.ipynb"
    cmd = [sys.executable, "-m", "papermill", str(REPO / "nbs" / "train.ipynb"), str(out), "--cwd", str(REPO / "nbs"),
           "-p", "config", cfg, "-p", "output_dir", str(tmp_path / "runs"), "-p", "run_name", "pm", "-p", "max_steps", "2",
           "-p", "seq_length", "96", "-p", "extra", "{num_anchors: 4}",
           "-p", "n_eval_prompts", "0"]   # its random target has no decode prompts: no decoding
    p = subprocess.run(cmd, env=ENV, capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr[-4000:]
    rows = [json.loads(l) for l in (tmp_path / "runs" / "pm" / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows if "loss" in r] == [1, 2]      # max_steps=2 reached the recipe: parameters were injected
    assert (tmp_path / "runs" / "pm" / "plots" / "training.png").exists()


# ------------------------------------------------------------------ packing
def test_cli_packing_trains_and_resumes_bitwise(tiny, tmp_path):
    """`--packing true`: the conversations are packed (fewer rows, the step count follows them), training runs from the
    CLI, and resuming a packed run from a mid-run checkpoint ends bitwise where the uninterrupted run ended."""
    cfg = write_config(tmp_path / "c.yaml", {**tiny["base"], "output_dir": str(tmp_path / "runs"), "save_every_steps": 1,
                                             "keep_checkpoints": 4, "max_steps": 4, "seq_length": 192})
    p = train_here(cfg, "--run_name", "straight", "--packing", "true")
    assert p.returncode == 0, p.stderr[-4000:]
    m = re.search(r"packing train_data: (\d+) conversations → (\d+) rows", p.stdout)
    assert m and int(m.group(2)) < int(m.group(1)) == 24, p.stdout[-2000:]
    straight = tmp_path / "runs" / "straight"
    assert yaml.safe_load((straight / "config.yaml").read_text())["packing"] is True
    rows = [json.loads(l) for l in (straight / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows if "loss" in r] == [1, 2, 3, 4] and rows[-1]["eval/loss"] > 0
    resumed = tmp_path / "runs" / "resumed"                       # the same run, as if it had stopped after step 2
    shutil.copytree(straight, resumed)
    for gone in ("checkpoints/step-3", "checkpoints/step-4", "draft"): shutil.rmtree(resumed / gone, ignore_errors=True)
    (resumed / "summary.json").unlink(missing_ok=True)
    p = train_here(cfg, "--run_name", "resumed", "--packing", "true", "--resume", "latest")
    assert p.returncode == 0, p.stderr[-4000:]
    a, b = _weights(straight), _weights(resumed)
    for k in a: assert torch.equal(a[k], b[k]), k


def test_cli_packing_block_too_long_for_every_conversation(tiny, tmp_path):
    "No packed conversation holds a block: one line naming block_size and packing, before training."
    cfg = write_config(tmp_path / "c.yaml", {**tiny["base"], "output_dir": str(tmp_path / "runs")})
    p = train_here(cfg, "--run_name", "big", "--packing", "true", "--block_size", "90")
    assert p.returncode == 2 and "Traceback" not in p.stderr, p.stderr[-3000:]
    errors = [l for l in p.stderr.splitlines() if l.startswith("error:")]      # (above it: the data cache's progress bars)
    assert len(errors) == 1 and "block_size" in errors[0] and "packing: true" in errors[0], p.stderr
    assert not (tmp_path / "runs" / "big").exists()


# ------------------------------------------------------------------ resume on another number of processes
def _sample_run(cfg_path, out_dir, nproc, stop_after=None, timeout=240):
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    if nproc == 1 and not stop_after:          # in this process, its stdout kept as a launch's is
        from _sample_worker import train_logging_samples
        out = io.StringIO()
        with one_thread(), contextlib.redirect_stdout(out): train_logging_samples(cfg_path, out_dir)
        return SimpleNamespace(stdout=out.getvalue())
    worker = str(REPO / "tests" / "_sample_worker.py")
    cmd = [sys.executable, worker] if nproc == 1 else [sys.executable, "-m", "torch.distributed.run", f"--nproc_per_node={nproc}",
                                                        "--master_addr=127.0.0.1", f"--master_port={free_port()}", worker]
    env = {**ENV, **({"STOP_AFTER": str(stop_after)} if stop_after else {})}
    p = subprocess.run(cmd + [cfg_path, str(out_dir)], env=env, capture_output=True, text=True, timeout=timeout)
    assert finished(p, out_dir, nproc), p.stdout[-3000:] + p.stderr[-5000:]
    return p


def _samples_per_step(*out_dirs) -> dict:
    "step -> sorted rows that all ranks of all the given runs used in it"
    steps = {}
    for d in out_dirs:
        for f in Path(d).glob("samples-rank*.jsonl"):
            for line in f.read_text().splitlines():
                r = json.loads(line)
                steps.setdefault(r["step"], []).extend(r["rows"])
    return {s: sorted(v) for s, v in sorted(steps.items())}


def test_resume_on_another_number_of_processes(tiny, tmp_path):
    """2 ranks × accumulation 1 stop after 2 steps; 1 rank × accumulation 2 resumes: every step uses the same samples as
    the uninterrupted 2-rank run, and the run ends at the same step. Other accumulation: refused, naming the value to use."""
    from domino_research.train import main
    from domino_research.config import ConfigError
    base = {**tiny["base"], "output_dir": str(tmp_path / "runs"), "save_every_steps": 1, "eval_data": None}  # 24 rows, 4 per step
    _sample_run(write_config(tmp_path / "straight.yaml", {**base, "run_name": "straight"}), tmp_path / "straight", nproc=2)
    moved = {**base, "run_name": "moved"}
    _sample_run(write_config(tmp_path / "m2.yaml", moved), tmp_path / "first", nproc=2, stop_after=2)
    assert sorted(p.name for p in (tmp_path / "runs" / "moved" / "checkpoints").iterdir()) == ["step-1", "step-2"]
    with pytest.raises(ConfigError, match="set grad_accumulation_steps: 2 to keep it"):
        main(None, **{**moved, "resume": "latest"})
    p = _sample_run(write_config(tmp_path / "m1.yaml", {**moved, "resume": "latest", "grad_accumulation_steps": 2}),
                    tmp_path / "second", nproc=1)
    assert "on 1 processes (it had 2), sample 8 of epoch 0" in p.stdout
    straight, moved_steps = _samples_per_step(tmp_path / "straight"), _samples_per_step(tmp_path / "first", tmp_path / "second")
    assert list(straight) == list(range(1, 7)) and sorted(sum(straight.values(), [])) == list(range(24))
    assert moved_steps == straight
    assert json.loads((tmp_path / "second" / "rank0.json").read_text())["step"] == 6


def test_dataloader_workers_do_not_change_training(tiny, tmp_path):
    "Batches read by DataLoader worker processes: the same trained draft, bit for bit, as read in the training process."
    from domino_research.train import main
    for workers in (0, 2):
        main(None, **{**tiny["base"], "output_dir": str(tmp_path / "runs"), "run_name": f"w{workers}", "max_steps": 3,
                      "eval_data": None, "dataloader_num_workers": workers})
    a, b = _weights(tmp_path / "runs" / "w0"), _weights(tmp_path / "runs" / "w2")
    for k in a: assert torch.equal(a[k], b[k]), k


# ------------------------------------------------------------------ several nodes
def test_ranks_resume_rank0_checkpoint_or_all_stop(tiny, tmp_path):
    """Two ranks with their own output_dir each (node-local folders): rank 0 finds checkpoint step-2, rank 1 has none
    and would have started at step 0 with a fresh optimiser. Rank 0 decides for all, rank 1 cannot read it: every rank
    stops with the same one line naming rank 1, and nothing is trained."""
    from domino_research.train import main
    base = {**tiny["base"], "run_name": "mn", "max_steps": 2, "save_every_steps": 1, "eval_data": None,
            "data_cache_dir": str(tmp_path / "cache")}
    # one process accumulating 2 micro-batches: the same samples per step as 2 ranks × 1, so rank 0 accepts the resume
    main(None, **{**base, "output_dir": str(tmp_path / "node0"), "grad_accumulation_steps": 2})
    cfg = write_config(tmp_path / "c.yaml", {**base, "resume": "latest"})
    logs = tmp_path / "logs"
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node=2", "--master_addr=127.0.0.1",
           f"--master_port={free_port()}", "--log-dir", str(logs), "--redirects", "3",
           str(REPO / "tests" / "_recipe_worker.py"), "cli", cfg, str(tmp_path)]
    env = {**ENV, "RANK_OUTPUT_DIRS": f"{tmp_path / 'node0'},{tmp_path / 'node1'}"}
    t0 = time.time()
    p = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=240)
    assert p.returncode != 0 and time.time() - t0 < 200
    for rank in (0, 1):
        err = next(logs.rglob(f"attempt_0/{rank}/stderr.log")).read_text()
        lines = [l for l in err.splitlines() if l.startswith("error: ")]
        assert len(lines) == 1 and "Traceback" not in err, (rank, err[-3000:])
        assert "rank 1 cannot read the checkpoint rank 0 resumes (checkpoints/step-2)" in lines[0], lines[0]
        assert "same output_dir" in lines[0]
    assert not (tmp_path / "node1" / "mn").exists()


def test_resume_maps_state_instead_of_reading_it(tmp_path):
    "Loading a checkpoint's 128 MiB state.pt raises the peak RSS by far less than its size: it is memory-mapped."
    ck = tmp_path / "step-1"
    ck.mkdir()
    torch.save({"optimizer": {"state": {0: {"exp_avg": torch.ones(32 * 2 ** 20)}}}, "loop": {"step": 1}}, ck / "state.pt")
    probe = ("import resource, sys\nfrom domino_research.lifecycle import load_checkpoint_state\n"
             "peak = lambda: resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024\n"
             "before = peak(); state = load_checkpoint_state(sys.argv[1]); print(peak() - before)")
    p = subprocess.run([sys.executable, "-c", probe, str(ck)], env=ENV, capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr[-3000:]
    grown = int(p.stdout.split()[-1])
    assert grown < 16 * 2 ** 20, f"peak RSS grew by {grown / 2 ** 20:.0f} MiB loading a 128 MiB state.pt"


def test_dist_timeout_minutes_bounds_a_stalled_rank(tiny, tmp_path):
    """Rank 1 never reaches the first barrier: with dist_timeout_minutes 0.1, rank 0 gives up in about 6 s, not the default's
    minutes."""
    cfg = write_config(tmp_path / "c.yaml", {**tiny["base"], "run_name": "stall", "dist_timeout_minutes": 0.1,
                                             "output_dir": str(tmp_path / "runs")})
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node=2", "--master_addr=127.0.0.1",
           f"--master_port={free_port()}", str(REPO / "tests" / "_recipe_worker.py"), "stall", cfg, str(tmp_path)]
    p = subprocess.run(cmd, env=ENV, capture_output=True, text=True, timeout=300)
    m = re.search(r"gave up after ([\d.]+) s", p.stdout + p.stderr)
    assert p.returncode != 0 and m, (p.stdout[-2000:], p.stderr[-3000:])
    assert 5 <= float(m.group(1)) < 60, m.group(0)


# ------------------------------------------------------------------ progress of a long phase
def test_validation_ends_with_one_summary_line_on_the_main_process_only(tiny, tmp_path, capsys, monkeypatch):
    """Validation runs for minutes on a CPU: it draws a bar and ends with ONE summary line on stdout (rows, time, loss).
    Another rank draws and prints nothing, so 8 ranks do not print 8 lines. In-process: no launch is needed for this."""
    from domino_research.train import RECIPES, load_train_config
    monkeypatch.delenv("TQDM_DISABLE", raising=False)
    monkeypatch.setattr("domino_research.progress.bars_wanted", lambda show=True, stream=None: show)   # as on a terminal
    cfg = load_train_config(write_config(tmp_path / "c.yaml", {**tiny["base"], "run_name": "evline"}))
    recipe = RECIPES[cfg.recipe](cfg).setup()
    try:
        capsys.readouterr()
        res = recipe.validate()
        out, err = capsys.readouterr()
        lines = [line for line in out.splitlines() if line.startswith("validation:")]
        assert len(lines) == 1 and re.fullmatch(
            rf"validation: {len(recipe.eval_set)} rows in [\d.]+ s, loss {res['eval/loss']:.3f}", lines[0]
        ), out
        assert "validation" in err and "batch" in err, err                   # the bar, on stderr
        monkeypatch.setattr(type(recipe.accelerator), "is_main_process", property(lambda self: False))
        assert recipe.validate() == res                                      # the same numbers, silently
        out, err = capsys.readouterr()
        assert "validation" not in out + err, (out, err)
    finally: recipe.close()


# ------------------------------------------------------------------ the recipe's hooks (Automodel's train_domino)
def _mark_trainer(self):
    trainer = type(self).__mro__[1]._build_trainer_module(self)
    trainer.built_by_hook = True
    return trainer

HOOKS = {  # hook -> (override, what the run then shows)
    "setup": (lambda self: (type(self).__mro__[1].setup(self), setattr(self, "lambda_at", lambda step: 0.5))[0],
              lambda r, rows, ev: {x["lambda_base"] for x in rows} == {0.5}),
    "_build_trainer_module": (_mark_trainer, lambda r, rows, ev: r._bare_trainer().built_by_hook),
    "_run_trainer_step": (lambda self, b, f, model=None, lam=1.0: TrainDFlashRecipe._run_trainer_step(self, b, f, model, 0.25),
                          lambda r, rows, ev: {x["lambda_base"] for x in rows} == {0.25}),   # the curriculum's is 1, then 0
    "_extra_train_metric_sums": (lambda self, out: {"final_loss": (0.0, 1.0), "lambda_base": (0.0, 1.0)},
                                 lambda r, rows, ev: all(x["final_loss"] == 0.0 for x in rows)),
    "_empty_extra_eval_metric_sums": (lambda self: {"final_loss": (0.0, 0.0), "marker": (0.0, 0.0)},
                                      lambda r, rows, ev: ev["eval/marker"] == 0.0),
    "_extra_eval_metric_sums": (lambda self, out: {"final_loss": (0.0, 1.0)}, lambda r, rows, ev: ev["eval/final_loss"] == 0.0),
    "_log_extra_train_metrics": (lambda self, stats: {**stats, "extra_stat": 7.0},
                                 lambda r, rows, ev: all(x["extra_stat"] == 7.0 and "head_gain" not in x for x in rows)),
}

from domino_research.train import TrainDFlashRecipe, TrainDominoRecipe  # noqa: E402


@pytest.mark.parametrize("hook", list(HOOKS))
def test_each_recipe_hook_changes_the_run(hook, tiny, tmp_path):
    """TrainDominoRecipe defines each of Automodel's hooks, the loop calls it, and a subclass that overrides it changes
    what the run trains, sums or logs (the last rows of a 2-step run and its validation)."""
    assert hook in vars(TrainDominoRecipe), hook
    from domino_research.train import load_train_config
    override, shows = HOOKS[hook]
    Recipe = type("Recipe", (TrainDominoRecipe,), {hook: override})
    cfg = load_train_config(write_config(tmp_path / "c.yaml", {**tiny["base"], "run_name": "hooks", "max_steps": 2,
                                                               "output_dir": str(tmp_path / "runs")}))
    recipe = Recipe(cfg).setup()
    try:
        recipe.run()
        rows = [json.loads(l) for l in (cfg.run_dir / "metrics.jsonl").read_text().splitlines()]
        train = [x for x in rows if "loss" in x]
        assert train and shows(recipe, train, recipe.validate()), (hook, train[-1])
    finally: recipe.close()


# ------------------------------------------------------------------ one builder for what is trained and what is measured
def _as_on_a_gpu():
    "Shipped Qwen3-8B configs attend with flex_attention, which the loader refuses without CUDA: load them as a GPU would."
    import unittest.mock
    return unittest.mock.patch("domino_research.train_config._cuda", return_value=True)


@pytest.mark.parametrize("name", sorted(p.stem for p in (REPO / "domino_research" / "configs").glob("*.yaml")))
def test_memory_measures_the_draft_config_the_recipe_trains(name):
    """For every shipped config, `bench memory` (notebook 22) measures the draft config the recipe builds for training:
    both read the file with the one loader and build with notebook 21's `build_draft_config`."""
    from domino_research.build import build_draft_config
    from domino_research.memory import memory_run_config, memory_target_config
    from domino_research.train import RECIPES, load_train_config
    with _as_on_a_gpu(): cfg = load_train_config(name, train_data="chats.jsonl")   # the Qwen3-8B ones ship without data
    recipe = RECIPES[cfg.recipe](cfg)
    recipe.target_config = tc = memory_target_config(cfg.target)
    measured = memory_run_config(name)
    assert measured.recipe == cfg.recipe
    assert build_draft_config(measured, tc) == recipe._build_dflash_config()


def test_a_config_without_recipe_is_measured_as_it_trains(tmp_path):
    """A YAML without `recipe:` trains as DFlash (notebook 09); memory measures it so. The fault it catches: the former
    reader of memory, whose own default made such a file a Domino run (another draft config, another trainer)."""
    import dataclasses
    from domino_research.build import build_draft_config
    from domino_research.memory import memory_run_config, memory_target_config
    from domino_research.train import RECIPES, load_train_config
    from domino_research.train_config import DominoTrainConfig
    text = (REPO / "domino_research" / "configs" / "embedded_dflash.yaml").read_text()
    path = tmp_path / "no_recipe.yaml"
    path.write_text("\n".join(line for line in text.splitlines() if not line.startswith("recipe:")))
    cfg = load_train_config(path)
    recipe = RECIPES[cfg.recipe](cfg)
    recipe.target_config = tc = memory_target_config(cfg.target)
    trained = recipe._build_dflash_config()
    assert cfg.recipe == "dflash" and build_draft_config(memory_run_config(path), tc) == trained
    as_domino = DominoTrainConfig(**{f.name: getattr(cfg, f.name) for f in dataclasses.fields(cfg) if f.name != "recipe"})
    assert build_draft_config(as_domino, tc) != trained            # the former default: a head the run never trains
