"""The EAGLE-3 recipe (notebooks 20 and 34) end to end on the tiny target: the CLI trains, checkpoints and resumes bitwise
(and a resume that loses the optimiser state is caught); on 2 gloo ranks the sharded draft trains like the DDP one and
resumes bitwise within its mode."""
import dataclasses, json, shutil, subprocess, sys

import pytest
import torch
from safetensors.torch import load_file

from conftest import write_config
from test_train import ENV, REPO, finished, free_port, train_here


@pytest.fixture
def base(tiny, tmp_path):
    "The tiny recipe config as an EAGLE-3 run: one draft layer over target layers [1, 3, 4] of 8, K = 3, blocks of 4."
    from domino_research.train_config import Eagle3TrainConfig
    keys = {f.name for f in dataclasses.fields(Eagle3TrainConfig)}
    return {**{k: v for k, v in tiny["base"].items() if k in keys}, "recipe": "eagle3", "draft_num_hidden_layers": 1,
            "ttt_steps": 3, "block_size": 4, "output_dir": str(tmp_path / "runs")}


def _weights(run_dir): return load_file(run_dir / "draft" / "model.safetensors")


def _cut_after_step_2(straight, name):
    "A copy of a finished run as if it had stopped after its step-2 checkpoint."
    resumed = straight.parent / name
    shutil.copytree(straight, resumed)
    for gone in ("checkpoints/step-3", "checkpoints/step-4", "draft"): shutil.rmtree(resumed / gone, ignore_errors=True)
    (resumed / "summary.json").unlink(missing_ok=True)
    return resumed


def test_cli_trains_checkpoints_and_resumes_bitwise(base, tmp_path, monkeypatch):
    """`python -m domino_research.train` with an EAGLE-3 config: 4 steps with gradient accumulation, a checkpoint each
    step, the declared metrics logged, the exported draft named as SpecForge names it. Resumed from step 2 it ends
    bitwise where the uninterrupted run ended; resumed with a fresh AdamW state (the fault) it does not."""
    cfg = write_config(tmp_path / "c.yaml", {**base, "save_every_steps": 1, "keep_checkpoints": 4, "max_steps": 4,
                                             "grad_accumulation_steps": 2, "micro_batch_size": 1})
    p = train_here(cfg, "--run_name", "straight")
    assert p.returncode == 0, p.stderr[-4000:]
    straight = tmp_path / "runs" / "straight"
    rows = [json.loads(l) for l in (straight / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in rows if "loss" in r and "final" not in r]
    assert [r["step"] for r in steps] == [1, 2, 3, 4]
    assert {"accuracy", "accept_len", "accuracy_1", "accuracy_3"} <= set(steps[0]) and rows[-1]["eval/loss"] > 0
    assert 1 <= rows[-1]["eval/accept_len"] <= 4
    a = _weights(straight)
    assert "midlayer.self_attn.q_proj.weight" in a and "fc.weight" in a and a["fc.weight"].shape[1] == 3 * 32
    config = json.loads((straight / "draft" / "config.json").read_text())
    assert config["eagle_config"]["eagle_aux_hidden_state_layer_ids"] == [1, 3, 4]
    from domino_research.export import load_eagle3_export               # the serving export, read back without code
    served = load_eagle3_export(straight / "served")
    for k, v in served.state_dict().items(): assert torch.equal(v, a[k]), k
    assert "eval/loss" in json.loads((straight / "served" / "config.json").read_text())["domino_research"]

    resumed = _cut_after_step_2(straight, "resumed")
    p = train_here(cfg, "--run_name", "resumed", "--resume", "latest")
    assert p.returncode == 0, p.stderr[-4000:]
    b = _weights(resumed)
    for k in a: assert torch.equal(a[k], b[k]), k

    from domino_research import train                         # the fault: the resumed run forgets AdamW's moments
    from domino_research.shard import Parallel
    monkeypatch.setattr(Parallel, "load_optimizer_state", lambda *args, **kw: None)
    fresh = _cut_after_step_2(straight, "fresh_adam")
    train.main(cfg, run_name="fresh_adam", resume="latest")
    c = _weights(fresh)
    assert any(not torch.equal(a[k], c[k]) for k in a)


def test_resume_refuses_another_recipe_checkpoint(base, tiny, tmp_path):
    "A DFlash checkpoint is not an EAGLE-3 draft: resuming one is refused in one line naming the contract."
    dflash = {**tiny["base"], "recipe": "dflash", "output_dir": base["output_dir"], "max_steps": 1}
    dflash = {k: v for k, v in dflash.items() if k not in ("emb_dim", "gru_hidden_dim")}
    p = train_here(write_config(tmp_path / "d.yaml", dflash), "--run_name", "dfl")
    assert p.returncode == 0, p.stderr[-3000:]
    ckpt = tmp_path / "runs" / "dfl" / "checkpoints" / "step-1"
    p = train_here(write_config(tmp_path / "e.yaml", base), "--run_name", "e3", "--resume", str(ckpt))
    assert p.returncode == 2 and "Traceback" not in p.stderr, p.stderr[-3000:]
    assert "draft contract differs" in p.stderr and "draft" in p.stderr, p.stderr[-2000:]


WORLD = 2
RUNS = [["ddp", {}], ["fsdp", {"shard_draft": True}],
        ["fsdp_resumed", {"shard_draft": True, "resume": "fsdp/checkpoints/step-1"}]]


def test_two_gloo_ranks_sharded_draft_trains_like_ddp_and_resumes(base, tmp_path):
    """One 2-rank launch with the target FSDP2-sharded and accumulation 2: the sharded EAGLE-3 draft has the DDP run's
    losses and final weights (the same per-rank fp32 gradients, reduced in a different collective), and resuming the
    sharded run from its step-1 checkpoint ends bitwise where it ended."""
    runs_dir = tmp_path / "runs"
    cfg = write_config(tmp_path / "c.yaml", {**base, "shard_target": True, "max_steps": 3, "save_every_steps": 1,
                                             "keep_checkpoints": 3, "grad_accumulation_steps": 2, "max_eval_samples": 3})
    runs = [[n, {**o, **({"resume": str(runs_dir / o["resume"])} if "resume" in o else {})}] for n, o in RUNS]
    out = tmp_path / "out"
    out.mkdir()
    cmd = [sys.executable, "-m", "torch.distributed.run", f"--nproc_per_node={WORLD}", "--master_addr=127.0.0.1",
           f"--master_port={free_port()}", str(REPO / "tests" / "_eagle3_worker.py"), cfg, str(out), json.dumps(runs)]
    p = subprocess.run(cmd, env=ENV, capture_output=True, text=True, timeout=600)
    assert finished(p, out, WORLD), p.stdout[-3000:] + p.stderr[-5000:]
    ranks = [json.loads((out / f"rank{r}.json").read_text()) for r in range(WORLD)]
    assert all(r["ddp"]["world"] == WORLD for r in ranks)
    rows = {n: [json.loads(l) for l in (runs_dir / n / "metrics.jsonl").read_text().splitlines()] for n in ("ddp", "fsdp")}
    losses = {n: [r[k] for r in rs for k in ("loss", "eval/loss") if k in r] for n, rs in rows.items()}
    assert len(losses["ddp"]) >= 4                                  # 3 steps and the final validation
    assert losses["fsdp"] == pytest.approx(losses["ddp"], rel=1e-6)
    a, b, c = (_weights(runs_dir / n) for n in ("ddp", "fsdp", "fsdp_resumed"))
    for k in a:
        torch.testing.assert_close(b[k], a[k], rtol=1e-5, atol=1e-6, msg=k)
        assert torch.equal(c[k], b[k]), k


def test_cli_packed_rows_train(base, tmp_path):
    """`packing: true`: conversations packed into rows (positions restart per document, notebook 15) train through the
    EAGLE-3 trainer, whose TTT mask and labels stay inside each document (pinned in notebook 20)."""
    cfg = write_config(tmp_path / "c.yaml", {**base, "max_steps": 2, "seq_length": 192, "packing": True})
    p = train_here(cfg, "--run_name", "packed")
    assert p.returncode == 0, p.stderr[-4000:]
    assert "packing train_data" in p.stdout, p.stdout[-2000:]
    rows = [json.loads(l) for l in (tmp_path / "runs" / "packed" / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows if "loss" in r and "final" not in r] == [1, 2] and rows[-1]["eval/loss"] > 0
