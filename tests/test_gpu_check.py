"""`python -m domino_research.gpu_check`: without a GPU it says so and exits 0, but a GPU that torch cannot use (or none
with `--require_gpu`) is one line and exit 1; `--cpu` runs its driver (parity, kill -9 and resume, one step's cost, the
trained draft's decoding) on the CPU and assembles the one JSON line."""
import json, os, subprocess, sys

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


def test_cpu_mode_runs_the_driver():
    "Kill -9 mid-run + --resume latest finishes all steps with validation; Flex == SDPA (forward); one JSON line."
    p = gpu_check("--cpu", "--parts", "flex_vs_sdpa,kill_resume,step_cost,decode_efficiency")
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


def test_unknown_part_is_one_line(capsys):
    from domino_research.gpu_check import main
    assert main(["--cpu", "--parts", "memory"]) == 2
    out = capsys.readouterr()
    assert out.out == "" and out.err == ("gpu_check: error: --parts: unknown ['memory']; choose from "
                                         "notebooks, flex_vs_sdpa, kill_resume, step_cost, decode_efficiency\n"), out


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
