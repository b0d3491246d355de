"""Run by tests under `torchrun` (or called in the test's process for one rank): train, logging which training rows every
optimiser step used, per rank; with STOP_AFTER=N the run stops (like a crash) once N steps are done, leaving its
checkpoints."""
import json, os, sys
from pathlib import Path

from domino_research.train import TrainDominoRecipe, load_train_config


class Stop(Exception): pass


class SampleLog(TrainDominoRecipe):
    def _train_window(self, window, step):
        if step == int(os.environ.get("STOP_AFTER", -1)): raise Stop()
        if not hasattr(self, "row_of"): self.row_of = {tuple(ids): i for i, ids in enumerate(self.train_set["input_ids"])}
        rows = [self.row_of[tuple(ids[m.bool()].tolist())] for b in window for ids, m in zip(b["input_ids"], b["attention_mask"])]
        with open(Path(self.samples_dir) / f"samples-rank{self.accelerator.process_index}.jsonl", "a") as f:
            f.write(json.dumps({"step": step + 1, "rows": rows}) + "\n")
        return super()._train_window(window, step)


def train_logging_samples(config_path, out_dir):
    "The run, its samples per step and its result in `out_dir` (a one-process run can be called in the test's process)."
    recipe = SampleLog(load_train_config(config_path))
    recipe.samples_dir = out_dir
    recipe.setup()
    try: result = recipe.run()
    except Stop:                  # every rank stops at the same step; meet before the process group goes away
        result = {"stopped": True}
        recipe.accelerator.wait_for_everyone()
    (Path(out_dir) / f"rank{recipe.accelerator.process_index}.json").write_text(json.dumps(result))
    recipe.close()


if __name__ == "__main__": train_logging_samples(sys.argv[1], sys.argv[2])
