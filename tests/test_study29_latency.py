"""Study 29's latency script (runs/ablations/study29/latency/latency.py): it runs end to end at tiny shapes, and its
straight-line extrapolation to the real target's layer count is exact where the answer is known."""
import json
import subprocess
import sys
from pathlib import Path

import pytest
from _scripts import load_script

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "runs/ablations/study29/latency/latency.py"


def _latency():
    return load_script(SCRIPT, "study29_latency")


class FakeClock:
    "A clock that advances `intercept + slope * layers` per timed step: the timings a perfectly linear target would give."
    def __init__(self): self.now, self.cost = 0.0, 0.0
    def __call__(self): return self.now
    def step(self): self.now += self.cost


def _fake_timings(lat, layers, intercept, slope):
    "Seconds per step at each layer count, measured by the script's own `median_seconds` against the fake clock."
    clock, out = FakeClock(), []
    for n in layers:
        clock.cost = intercept + slope * n
        out.append(lat.median_seconds(clock.step, reps=3, clock=clock))
    return out


def test_line_recovers_slope_and_intercept():
    lat = _latency()
    intercept, slope, T = 0.031, 0.0045, 36         # LM head + embedding; one decoder layer; Qwen3-8B's layer count
    secs = _fake_timings(lat, [2, 4], intercept, slope)
    line = lat.fit_line([2, 4], secs)
    assert line == pytest.approx((intercept, slope), rel=1e-9)
    assert lat.at_layers(line, T) == pytest.approx(intercept + slope * T, rel=1e-9)
    assert lat.at_layers(lat.fit_line([2, 4, 6], _fake_timings(lat, [2, 4, 6], intercept, slope)), 6) == \
        pytest.approx(intercept + slope * 6, rel=1e-9)   # the check at 6 layers agrees on a linear cost
    # the fault it exists to catch: a fit told the wrong layer counts (the timings of 2 and 4 layers read as 1 and 2)
    wrong = lat.fit_line([1, 2], secs)
    assert lat.at_layers(wrong, T) != pytest.approx(intercept + slope * T, rel=1e-3)
    with pytest.raises(ValueError, match="two or more layer counts"): lat.fit_line([4, 4], secs)


def test_projection_formula():
    lat = _latency()
    p = lat.projection(t_plain=2.0, t_draft=0.5, t_verify=2.5)       # speed-up = τ · 2 / 3
    assert p["per_tau"] == pytest.approx(2 / 3) and p["break_even_tau"] == pytest.approx(1.5)
    assert p["draft_over_verify"] == pytest.approx(0.2)
    # the fault: a draft step left out of the cost would claim τ · 0.8 instead
    assert lat.projection(2.0, 0.0, 2.5)["per_tau"] != pytest.approx(p["per_tau"])


def test_tiny_run(tmp_path):
    out = tmp_path / "latency.json"
    cmd = [sys.executable, str(SCRIPT), "--tiny", "--reps", "2", "--layers", "2", "4", "--check_layers", "--tau", "dflash=2",
           "--out", str(out)]
    r = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    res = json.loads(out.read_text())
    assert set(res["draft"]) == {"domino", "dflash", "eagle3", "lookup"}
    assert {d: res["draft"][d]["block_size"] for d in res["draft"]} == dict(domino=16, dflash=16, eagle3=8, lookup=16)
    for name, p in res["projection"].items():      # each drafter's verify is the line's value at its block, 36 layers
        line = res["lines"][str(res["draft"][name]["block_size"])]
        assert p["t_verify"] == pytest.approx(line["intercept"] + 36 * line["slope"])
        assert p["per_tau"] == pytest.approx(p["t_plain"] / (p["t_draft"] + p["t_verify"]))
    assert res["projection"]["dflash"]["speed_up"] == pytest.approx(2 * res["projection"]["dflash"]["per_tau"])
    assert "speed_up" not in res["projection"]["domino"]           # no τ given: the factor only, no invented figure
    bad = subprocess.run([sys.executable, str(SCRIPT), "--tiny", "--tau", "domino"], cwd=ROOT, capture_output=True, text=True)
    assert bad.returncode == 2 and "DRAFTER=TAU" in bad.stderr.strip().splitlines()[-1]


def test_tiny_run_times_eagle3_at_a_chosen_chain(tmp_path):
    "--eagle3_block_size: EAGLE-3's chain of 15 is timed and projected with the verify of 16; an untimed width is refused."
    out, base = tmp_path / "latency.json", [sys.executable, str(SCRIPT), "--tiny", "--reps", "1", "--layers", "2", "4",
                                           "--check_layers", "--drafters", "eagle3"]
    r = subprocess.run(base + ["--eagle3_block_size", "16", "--out", str(out)], cwd=ROOT, capture_output=True, text=True,
                       timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    res = json.loads(out.read_text())
    line = res["lines"]["16"]
    assert res["draft"]["eagle3"]["block_size"] == 16
    assert res["projection"]["eagle3"]["t_verify"] == pytest.approx(line["intercept"] + 36 * line["slope"])
    bad = subprocess.run(base + ["--eagle3_block_size", "12"], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert bad.returncode == 2 and "add it to --blocks" in bad.stderr.strip().splitlines()[-1]
