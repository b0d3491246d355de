"""Train a finished tuning run again up to its last kept step and keep the drafts of its checkpoints at `steps`, proving
they are the original run's: the loss logged at every step up to there must equal the committed `metrics.jsonl`'s, bit
for bit. Why: the kept step drafts (`draft_bf16_step720`, `_step1440`) are bf16 weights the repository does not keep
(.gitignore), and the machine that trained piece 1's first runs was replaced before piece 5 (`curve`) decoded them.

    python runs/ablations/study29/regen_steps.py runs/ablations/study29/embedded/tune/runs/domino_lr0.003/seed0

It trains in a scratch folder (`--scratch`, default /tmp/study29_regen/<run>), from the run's own resolved
`config.yaml` (every setting as it ran; only the folders differ), stops once the last of `--steps` is saved, compares
the logs and only then writes `<run>/draft_bf16_step<s>/model.safetensors`; it refuses to touch a run whose kept
draft exists or whose logs differ.
"""
import argparse, json, os, subprocess, sys, time
from pathlib import Path

import yaml

from domino_research.study_run import keep_draft, kept_step_draft


def logged_losses(metrics: Path, last: int) -> dict:
    "{step: loss} of the training rows of a metrics.jsonl up to `last` (a resumed run logs a step again: the last wins)."
    out = {}
    for line in metrics.read_text().splitlines():
        r = json.loads(line)
        if "loss" in r and "step" in r and r["step"] <= last and "eval/loss" not in r: out[r["step"]] = r["loss"]
    return out


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("run", type=Path, help="a finished run folder (<...>/runs/<name>/seed0) with config.yaml, metrics.jsonl")
    p.add_argument("--steps", type=int, nargs="+", default=[720, 1440])
    p.add_argument("--scratch", type=Path)
    a = p.parse_args(argv)
    run, last = a.run.resolve(), max(a.steps)
    kept = [kept_step_draft(run, s) / "model.safetensors" for s in a.steps]
    if any(k.exists() for k in kept): sys.exit(f"regen_steps: {[str(k) for k in kept if k.exists()]} exist already")
    cfg = yaml.safe_load((run / "config.yaml").read_text())
    scratch = (a.scratch or Path("/tmp/study29_regen") / run.parent.name).resolve()
    cfg |= {"output_dir": str(scratch), "run_name": "seed0", "overwrite": True, "resume": None,
            "data_cache_dir": str(scratch / ".data_cache"), "keep_checkpoints": 100}
    scratch.mkdir(parents=True, exist_ok=True)
    (scratch / "config.yaml").write_text(yaml.safe_dump(cfg, sort_keys=False))
    ck = {s: scratch / "seed0" / "checkpoints" / f"step-{s}" / "draft" for s in a.steps}
    env = dict(os.environ, OMP_NUM_THREADS="1", MKL_NUM_THREADS="1")   # one thread, as the study's runs
    proc, t0 = subprocess.Popen([sys.executable, "-m", "domino_research.train", "--config", str(scratch / "config.yaml")],
                                env=env), time.time()
    try:            # until step `last`'s checkpoint exists: written whole (a temp folder renamed), after its loss's row
        while not ck[last].parent.is_dir():
            if proc.poll() is not None: sys.exit(f"regen_steps: training stopped (rc {proc.returncode}) before step {last}")
            time.sleep(1)
    finally:
        proc.terminate()
        proc.wait()
    print(f"regen_steps: trained to step {last} in {time.time() - t0:.0f}s")
    mine, theirs = logged_losses(scratch / "seed0" / "metrics.jsonl", last), logged_losses(run / "metrics.jsonl", last)
    differ = [s for s in range(1, last + 1) if mine.get(s) != theirs.get(s)]
    if differ: sys.exit(f"regen_steps: the loss differs from {run / 'metrics.jsonl'} at {len(differ)} steps "
                        f"(first {differ[0]}: {mine.get(differ[0])} against {theirs.get(differ[0])}): nothing written")
    for s in a.steps:
        committed = json.loads((kept_step_draft(run, s) / "config.json").read_text())
        if json.loads((ck[s] / "config.json").read_text()) != committed: sys.exit(f"regen_steps: step {s}'s config differs")
        keep_draft(ck[s], kept_step_draft(run, s))
        print(f"regen_steps: {kept_step_draft(run, s) / 'model.safetensors'} (every loss of steps 1-{last} equal)")


if __name__ == "__main__":
    main()
