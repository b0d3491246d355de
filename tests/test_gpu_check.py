"""`python -m domino_research.gpu_check`: without a GPU it says so and exits 0; `--cpu` runs its driver (parity, kill -9 and
resume, one step's cost) on the CPU and assembles the one JSON line."""
import json, os, subprocess, sys

import pytest
import torch

from conftest import REPO

ENV = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}


def gpu_check(*args, timeout=400):
    return subprocess.run([sys.executable, "-m", "domino_research.gpu_check", *args], env=ENV, capture_output=True,
                          text=True, timeout=timeout, cwd=REPO)


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has a GPU")
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
    assert r["decode_efficiency"]["tau"] >= 1 and r["decode_efficiency"]["efficiency"] > 0
    for part in ("flex_vs_sdpa", "kill_resume", "step_cost", "decode_efficiency"): assert f"gpu_check: {part} ok" in p.stderr


def test_unknown_part_is_one_line(capsys):
    from domino_research.gpu_check import main
    assert main(["--cpu", "--parts", "memory"]) == 2
    out = capsys.readouterr()
    assert out.out == "" and out.err == ("gpu_check: error: --parts: unknown ['memory']; choose from "
                                         "notebooks, flex_vs_sdpa, kill_resume, step_cost, decode_efficiency\n"), out
