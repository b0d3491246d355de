"""`python -m domino_research.gpu_check`: without a GPU it says so and exits 0, but a GPU that torch cannot use (or none
with `--require_gpu`) is one line and exit 1; `--cpu` runs its driver (parity, kill -9 and resume, one step's cost, the
trained draft's decoding) on the CPU and assembles the one JSON line."""
import contextlib, json, os, subprocess, sys
from types import SimpleNamespace

import pytest
import torch

from conftest import REPO

ENV = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}
ENV.pop("CUDA_VISIBLE_DEVICES", None)                   # "no GPU expected" below; the GPU-expected cases set it
needs_no_gpu = pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has a GPU")


def gpu_check(*args, timeout=400):
    return subprocess.run([sys.executable, "-m", "domino_research.gpu_check", *args], env=ENV, capture_output=True,
                          text=True, timeout=timeout, cwd=REPO)


@needs_no_gpu
def test_no_gpu_says_so_and_exits_0():
    from domino_research.gpu_check import NO_GPU
    p = gpu_check()
    assert p.returncode == 0, p.stderr[-3000:]
    lines = p.stdout.splitlines()
    assert lines[0] == NO_GPU and json.loads(lines[1]) == {"gpu": False, "ok": True, "reason": "no CUDA device"}
    assert len(lines) == 2, p.stdout


def test_cpu_mode_runs_the_driver(capsys):
    """Kill -9 mid-run + --resume latest finishes all steps with validation; Flex == SDPA (forward); one JSON line. The
    driver runs in this process (`python -m` calls the same `main`; test_no_gpu_says_so_and_exits_0 keeps the launch):
    a new Python adds ~6 s of imports. Its kill/resume part still launches and kills its own training processes."""
    from domino_research.gpu_check import main
    with contextlib.chdir(REPO): code = main(["--cpu", "--parts", "flex_vs_sdpa,kill_resume,step_cost,decode_efficiency"])
    p = SimpleNamespace(returncode=code, **dict(zip(("stdout", "stderr"), capsys.readouterr())))
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    assert len(p.stdout.splitlines()) == 1, p.stdout
    r = json.loads(p.stdout)
    assert r["ok"] and r["gpu"] is False and r["device"] == "cpu", r
    kr = r["kill_resume"]
    assert kr["ok"] and kr["final_step"] == 6 and kr["steps_logged"] == [1, 2, 3, 4, 5, 6] and kr["eval_loss"] is not None, kr
    assert r["shard_target"]["skipped"] and r["flex_vs_sdpa"]["loss_max_abs_diff"] < 1e-4
    assert r["step_cost"]["sdpa"]["step_s"] > 0 and r["step_cost"]["sdpa"]["peak_gib"] is None
    de = r["decode_efficiency"]          # the shipped trained draft: τ above the untrained ~1, no real mismatch
    assert de["tau"] >= de["min_tau"] and de["efficiency"] > 0 and de["mismatches"] == [] and de["draft"] == "gpu_check_draft", de
    assert all(isinstance(r[p]["compiles"], int) for p in ("flex_vs_sdpa", "step_cost", "decode_efficiency")), r
    assert r["kill_resume"]["compiles"] is None and r["budget"]["total"] <= 600, r
    for part in ("flex_vs_sdpa", "kill_resume", "step_cost", "decode_efficiency"): assert f"gpu_check: {part} ok" in p.stderr
    assert r["step_cost"]["sdpa"]["memory"] == {**r["step_cost"]["sdpa"]["memory"], "ok": True, "compared": False}, r
    assert de["dtype"] == "float32" and r["flex_vs_sdpa"]["gradients_compared"] is False, r


def test_one_gpu_says_what_was_not_checked(monkeypatch, capsys):
    """A machine that shows torch one GPU (device count mocked): the multi-GPU part is skipped, and the JSON line and the
    last line say exactly what was not checked. No CUDA work runs: only the multi_gpu part is asked for."""
    import domino_research.gpu_check as g
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda *a: "NVIDIA H100 80GB HBM3")
    monkeypatch.setattr(g, "gpu_gate", lambda require_gpu: None)                  # as if torch could use the GPU
    monkeypatch.setattr(g, "_bound_compiles", lambda: None)
    assert g.main(["--parts", "multi_gpu"]) == 0
    out = capsys.readouterr()
    r = json.loads(out.out)
    want = [f"multi_gpu: {c}" for c in g.MULTI_GPU_CHECKS]
    assert r["not_checked"] == want and r["multi_gpu"]["skipped"].startswith("1 GPU visible"), r
    assert out.err.splitlines()[-1] == "gpu_check: NOT CHECKED on this machine: " + "; ".join(want), out.err
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    monkeypatch.setattr(g, "multi_gpu", lambda root, timeout: {"ok": True, "checked": list(g.MULTI_GPU_CHECKS)})
    assert g.main(["--parts", "multi_gpu"]) == 0                                    # two GPUs: it runs
    out = capsys.readouterr()
    assert json.loads(out.out)["not_checked"] == [] and out.err.splitlines()[-1] == "gpu_check: every check ran", out


def test_unknown_part_is_one_line(capsys):
    from domino_research.gpu_check import main
    assert main(["--cpu", "--parts", "memory"]) == 2
    out = capsys.readouterr()
    assert out.out == "" and out.err == ("gpu_check: error: --parts: unknown ['memory']; choose from "
                                         "notebooks, flex_vs_sdpa, kill_resume, step_cost, decode_efficiency, multi_gpu\n"), out


def fake_nvidia_smi(tmp_path):
    "A folder with an `nvidia-smi` that lists one GPU, as a machine with a driver and a GPU would."
    smi = tmp_path / "nvidia-smi"
    smi.write_text("#!/bin/sh\necho 'GPU 0: NVIDIA H100 80GB HBM3 (UUID: GPU-00000000-0000-0000-0000-000000000000)'\n")
    smi.chmod(0o755)
    return tmp_path


@needs_no_gpu
@pytest.mark.parametrize("how", ["nvidia-smi", "CUDA_VISIBLE_DEVICES"])
def test_gpu_that_torch_cannot_use_fails_in_one_line(how, tmp_path, monkeypatch, capsys):
    """A GPU is there (nvidia-smi lists one / CUDA_VISIBLE_DEVICES=0) but this torch cannot use it: exit 1, one line naming the
    build."""
    from domino_research.gpu_check import main
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    if how == "nvidia-smi": monkeypatch.setenv("PATH", f"{fake_nvidia_smi(tmp_path)}:{os.environ['PATH']}")
    else: monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0")
    assert main([]) == 1
    out = capsys.readouterr()
    assert out.out == "" and out.err.count("\n") == 1, out
    assert out.err.startswith("gpu_check: error: this machine has a GPU") and "torch cannot use it" in out.err, out.err
    assert f"torch {torch.__version__}" in out.err and (torch.version.cuda or "torch.version.cuda is None") in out.err, out.err


@needs_no_gpu
def test_require_gpu_makes_no_gpu_a_failure(monkeypatch, capsys):
    from domino_research.gpu_check import main
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    assert main(["--require_gpu"]) == 1
    out = capsys.readouterr()
    assert out.out == "" and out.err.startswith("gpu_check: error: --require_gpu") and out.err.count("\n") == 1, out


# ---- flex_vs_sdpa's comparison must fail on a wrong attention mask -------------------------------------------------

def _additive(allowed, dtype): return torch.zeros(allowed.shape, dtype=dtype).masked_fill(~allowed, float("-inf"))[:, None]


def _grid(mod, B, Q, K):
    return mod(torch.arange(B)[:, None, None], None, torch.arange(Q)[None, :, None], torch.arange(K)[None, None, :])


def _all_keys(a, keep, S, bs, dtype=torch.float32, context_start=None):
    "Every query sees every key: context after its anchor, other blocks."
    from domino_research.masks import _dense_for
    return torch.zeros_like(_dense_for(a, keep, S, bs, dtype))


def _anchor_off_by_one(a, keep, S, bs, dtype=torch.float32, context_start=None):
    "A block sees the context up to and including its anchor."
    from domino_research.masks import _dense_for
    return _dense_for(a + 1, keep, S, bs, dtype)


def _no_attention_in_block(a, keep, S, bs, dtype=torch.float32, context_start=None):
    "Inside its block a query sees only itself."
    from domino_research.masks import _block_mask_mod
    B, N = a.shape
    Q, K = N * bs, S + N * bs
    q, kv = torch.arange(Q)[None, :, None], torch.arange(K)[None, None, :]
    return _additive(_grid(_block_mask_mod(a, keep, S, bs), B, Q, K) & ~((kv >= S) & (kv - S != q)), dtype)


def _half_block_size(a, keep, S, bs, dtype=torch.float32, context_start=None):
    "The rule evaluated with half the block size on the right grid."
    from domino_research.masks import _block_mask_mod
    B, N = a.shape
    return _additive(_grid(_block_mask_mod(a, keep, S, bs // 2), B, N * bs, S + N * bs), dtype)


WRONG_MASKS = {"all_keys_visible": _all_keys, "anchor_off_by_one": _anchor_off_by_one,
               "no_attention_in_block": _no_attention_in_block, "half_block_size": _half_block_size}


@pytest.fixture(scope="module")
def parity_inputs():
    "The check's own sizes (seq 512, 24 blocks of 16, a 2-layer draft of a random 8-layer target), fp32 on the CPU."
    from domino_research import gpu_check as g
    from domino_research.target import capture_features
    target = g.random_qwen3(seed=0)
    batch = g.parity_batch(target.config.vocab_size, 512, 16, 24)
    draft0 = g.domino_draft(target, num_layers=2, block_size=16)
    feats = capture_features(target, batch["input_ids"], draft0.dflash.target_layer_ids)
    run = lambda backend="sdpa", bf16=False: g.parity_run(target, draft0, batch, feats, backend, backward=True, bf16=bf16)
    return run, run()


def _margin(v):
    "How far past its tolerance the worse of the two gated differences is (> 1: the comparison fails)."
    return max(v["loss_max_abs_diff"] / v["loss_tolerance"], v["grad_rel_diff"] / v["grad_tolerance"])


@pytest.mark.parametrize("name", list(WRONG_MASKS))
def test_parity_fails_on_a_wrong_mask(parity_inputs, name):
    """Each wrong mask (SDPA reading it, against SDPA reading the right one) fails `parity_verdict` by at least 3x a
    tolerance: the gradients are gated as well as the loss (the anchor off by one passes the loss gate and fails on
    gradients)."""
    from unittest import mock
    from domino_research.gpu_check import parity_verdict
    from domino_research.masks import BLOCK_MASKS
    run, ref = parity_inputs
    with mock.patch.dict(BLOCK_MASKS._global_mapping, {"sdpa": WRONG_MASKS[name]}): wrong = run()
    v = parity_verdict(ref, wrong)
    print(name, {k: v[k] for k in ("loss_max_abs_diff", "grad_rel_diff")}, f"margin {_margin(v):.1f}x")
    assert not v["ok"] and _margin(v) >= 3, (name, v)


def test_parity_passes_two_correct_bf16_kernels(parity_inputs):
    """Two correct kernels in bf16 (SDPA and eager attention, under CPU bf16 autocast: different reduction orders, as flex
    and SDPA on a GPU) pass with room: each gated difference at most a third of its tolerance."""
    from domino_research.gpu_check import parity_verdict
    run, ref = parity_inputs
    v = parity_verdict(run("sdpa", bf16=True), run("eager", bf16=True))
    print("bf16 sdpa vs eager", {k: v[k] for k in ("loss_max_abs_diff", "grad_rel_diff")}, f"{_margin(v):.2f} of a tolerance",
          "| bf16 vs fp32:", {k: parity_verdict(ref, run("sdpa", bf16=True))[k] for k in ("loss_max_abs_diff", "grad_rel_diff")})
    assert v["ok"] and _margin(v) <= 1 / 3, v


# ---- kill_resume's FlexAttention compiles, counted on the CPU -------------------------------------------------------

class _Killed(Exception): "SIGKILL, in-process: raised where kill_and_resume's SIGKILL lands."


def _cycle_calls(tmp_path, eval_every_steps=None):
    """One kill_resume cycle in this process, CPU and SDPA (the pinned torch has no FlexAttention backward on the CPU): the
    run is 'killed' where kill_and_resume kills it (at the first step's fault point after checkpoint 2 exists), then
    resumed with --resume latest to the end. Returns each process's masked attention calls (q shape, k shape, grad
    mode): what compiled FlexAttention keys its graphs on (decoding calls, unmasked, run SDPA even under flex)."""
    import yaml
    from unittest import mock
    from domino_research import draft as D, train as T
    from domino_research.gpu_check import tiny_run_config
    cfg = {**tiny_run_config(tmp_path, cuda=False), **({"eval_every_steps": eval_every_steps} if eval_every_steps else {})}
    (tmp_path / "c.yaml").write_text(yaml.safe_dump(cfg))
    ckpt2 = tmp_path / "runs" / cfg["run_name"] / "checkpoints" / "step-2"
    sdpa, calls = D.ALL_ATTENTION_FUNCTIONS["sdpa"], []

    def recording(module, q, k, v, mask, *a, **kw):
        if mask is not None: calls[-1].append((tuple(q.shape), tuple(k.shape), torch.is_grad_enabled()))
        return sdpa(module, q, k, v, mask, *a, **kw)

    def kill_after_checkpoint_2(name):
        if name == "optimiser-step" and ckpt2.exists(): raise _Killed

    for resume, fault in ((None, kill_after_checkpoint_2), ("latest", lambda name: None)):
        calls.append([])
        recipe = T.TrainDominoRecipe(T.load_train_config(str(tmp_path / "c.yaml"), resume=resume))
        with mock.patch.dict(D.ALL_ATTENTION_FUNCTIONS._local_mapping, {"sdpa": recording}), \
             mock.patch.object(T, "fault_point", fault):
            try:
                recipe.setup()
                recipe.run()
            except _Killed: assert resume is None
            finally: recipe.close()
    return calls, cfg


def test_kill_resume_compiles_what_its_budget_counts(tmp_path):
    """The graphs compiled FlexAttention (dynamic shapes, one per grad mode) builds in one kill_resume cycle equal the
    compiles the budget gives the part: 1 in the killed process, 2 in the resumed one. The budget would be wrong on the
    two faults it guards against: the former validation every 2 steps (the killed process validates before its
    checkpoint: a 4th graph) and torch.compile's default static shapes when the lengths vary."""
    from domino_research.gpu_check import BUDGET, flex_graphs
    calls, cfg = _cycle_calls(tmp_path / "now")
    per_process = [flex_graphs(c) for c in calls]
    assert per_process == [1, 2] and sum(per_process) == BUDGET["kill_resume"][1], (per_process, calls)
    old, _ = _cycle_calls(tmp_path / "former", eval_every_steps=2)
    assert sum(flex_graphs(c) for c in old) == BUDGET["kill_resume"][1] + 1, old
    shapes = {(q, k) for c in calls for q, k, grad in c if grad}
    print("training shapes", sorted(shapes), "static graphs", [flex_graphs(c, dynamic=False) for c in calls])
    if len(shapes) > 1: assert sum(flex_graphs(c, dynamic=False) for c in calls) > BUDGET["kill_resume"][1]
