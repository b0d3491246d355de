"""CPU seconds per optimiser step of a Domino draft trained on the shipped target and on a target of the second target's
shape (`trial.SECOND`, random weights: weights do not change timings), to project study 29's training
time on the second target.

    nice -n 10 python runs/ablations/study29/target2/draft_cost.py [--trial /tmp/study29_target2_trial]

Needs the trial's tokenizer and corpus (trial.py, run first). Each target trains `embedded_domino` (the project's
recipe, one thread) for 2 and for 12 steps in child processes; the difference of their CPU times over 10 steps is a
step's cost without start-up (a first 1-step run builds the data cache both then read).
Writes draft_cost.json beside this file."""
import argparse, json, resource, subprocess, sys, tempfile
from pathlib import Path

import torch
from transformers import Qwen3ForCausalLM

from domino_research.data import read_jsonl
from domino_research.embedded import TARGET_DIR, corpus_path, embedded_dataset_path
from domino_research.embedded_build import save_target, target_config, write_jsonl
from domino_research.target import load_tokenizer

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from trial import SECOND  # noqa: E402  (the second target's shape: one home, trial.py)


def child_cpu(args: list[str]) -> float:
    "CPU seconds (user + system) of one training process."
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    subprocess.run([sys.executable, "-m", "domino_research.train", *args], check=True, stdout=subprocess.DEVNULL)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def per_step(target: str, train_data: str, work: Path, name: str) -> float:
    common = ["--config", "embedded_domino", "--target", target, "--train_data", train_data, "--eval_data", "null",
              "--n_eval_prompts", "0", "--eval_every_steps", "100000", "--save_every_steps", "100000",
              "--output_dir", str(work), "--overwrite", "true"]
    child_cpu(common + ["--max_steps", "1", "--run_name", f"{name}_cache"])   # builds the tokenised-data cache the two share
    short = child_cpu(common + ["--max_steps", "2", "--run_name", f"{name}2"])
    long = child_cpu(common + ["--max_steps", "12", "--run_name", f"{name}12"])
    return (long - short) / 10


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--trial", type=Path, default=Path("/tmp/study29_target2_trial"))
    a = p.parse_args()
    torch.manual_seed(0)
    tok = load_tokenizer(a.trial / TARGET_DIR)
    save_target(Qwen3ForCausalLM(target_config(tok, **SECOND["model_kwargs"])), a.trial / TARGET_DIR)
    work = Path(tempfile.mkdtemp(prefix="study29_draft_cost_"))
    train2 = write_jsonl(read_jsonl(corpus_path(a.trial, "train")), work / "train2.jsonl")   # the train CLI reads .jsonl
    first = per_step("embedded", str(embedded_dataset_path("train")), work, "first")
    second = per_step(str(a.trial / TARGET_DIR), str(train2), work, "second")
    out = {"command": "nice -n 10 python runs/ablations/study29/target2/draft_cost.py", "config": "embedded_domino",
           "second_target_shape": SECOND["model_kwargs"], "second_target_parameters": sum(
               p.numel() for p in Qwen3ForCausalLM(target_config(tok, **SECOND["model_kwargs"])).parameters()),
           "torch_threads": "OMP_NUM_THREADS of the caller (1)", "cpu_s_per_step": {"first": first, "second": second},
           "ratio_second_to_first": second / first}
    (HERE / "draft_cost.json").write_text(json.dumps(out, indent=1) + "\n")
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
