"""Run by tests/test_shard.py under `torchrun` (2 ranks): several short trainings in one launch, with the target sharded
(`shard_target`), each with the draft replicated (DDP) or sharded (`shard_draft`), some resumed from another's checkpoint.
Each rank writes, per run, its result and the bytes it holds: the target's parameters after its first forward and after
the first optimiser step, and the draft's parameters, gradients and AdamW state at that step."""
import json, sys
from pathlib import Path

import torch

from domino_research.train import TrainDominoRecipe, load_train_config


def storage_bytes(tensors) -> int:
    "Bytes of the distinct storages behind `tensors` (a DTensor counts its local shard): what is allocated, not viewed."
    seen = {}
    for t in tensors:
        if t is None: continue
        t = t.to_local() if hasattr(t, "to_local") else t
        s = t.untyped_storage()
        seen[s.data_ptr()] = max(seen.get(s.data_ptr(), 0), s.nbytes())
    return sum(seen.values())


def fsdp_held(module):
    """The storages FSDP2 keeps for `module`'s units besides the registered parameters: each parameter's sharded data
    and its unsharded copy (freed storage counts 0). Private attributes, read defensively: absent ones add nothing."""
    for m in module.modules():
        group = getattr(getattr(m, "_get_fsdp_state", lambda: None)(), "_fsdp_param_group", None)
        for fp in getattr(group, "fsdp_params", []):
            yield getattr(fp, "_sharded_param_data", None)
            yield getattr(fp, "_unsharded_param", None)


def resident(module) -> int:
    return storage_bytes([*module.parameters(), *fsdp_held(module)])


class Measured(TrainDominoRecipe):
    def _features(self, batch):
        feats = super()._features(batch)
        self.bytes.setdefault("target_after_forward", resident(self.target))
        return feats

    def _clip_grad_norm(self):
        self.bytes.setdefault("draft_grads", storage_bytes(p.grad for p in self.trainer.parameters()))
        return super()._clip_grad_norm()

    def _train_window(self, window, step):
        stats = super()._train_window(window, step)
        if "target_after_step" not in self.bytes:
            self.bytes["target_after_step"] = resident(self.target)
            self.bytes["draft_params"] = resident(self.trainer)
            self.bytes["optimizer_state"] = storage_bytes(v for s in self.optimizer.state.values() for v in s.values()
                                                          if torch.is_tensor(v))
        return stats


config, out_dir = sys.argv[1], Path(sys.argv[2])
runs = json.loads(sys.argv[3])          # [[run_name, {overrides}], ...], in order
results, recipe = {}, None
for name, overrides in runs:
    recipe = Measured(load_train_config(config, run_name=name, **overrides))
    recipe.bytes = {}
    recipe.setup()
    result = recipe.run()
    results[name] = {"result": result, "bytes": recipe.bytes, "world": recipe.accelerator.num_processes}
    recipe.lock and recipe.lock.release()
    recipe.accelerator.wait_for_everyone()
rank = recipe.accelerator.process_index
(out_dir / f"rank{rank}.json").write_text(json.dumps(results))
recipe.accelerator.wait_for_everyone()
recipe.close()
