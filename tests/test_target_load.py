"""A target loads straight to its device: its weights are never materialised whole in a rank's host memory first, and a
sharded target's rank reads only the rows it keeps.

A Qwen3 laid out as the hub ships Qwen3-8B (its config fields and generation config, bf16 weights in several safetensors
files with an index; only the sizes are smaller: a few hundred MB of random weights) is saved to disk, then loaded in
fresh processes while a thread samples each process's private (anonymous) memory; the whole-process peak is the
kernel's high-water mark (VmHWM, /proc/self/status).
- One rank: the `meta` device stands in for a GPU on a CPU machine (a device that is not host memory). The old way
  (`from_pretrained` on the host, then `.to(device)`) must break the bound: the fault the test exists for.
- Two gloo ranks with the target sharded (`shard_target: true`): each rank builds it on the CPU in fp32 as the CPU
  recipe does, so its private memory is the rank's "device" memory. `load_sharded_target` must hold only the unsharded
  modules plus this rank's rows of each layer; the old way (`shard_target(load_target(...))`) holds the whole target
  first and must break that bound."""
import json, os, subprocess, sys

import pytest

from conftest import REPO
from qwen3_snapshot import QWEN3_8B_CONFIG, QWEN3_8B_GENERATION_CONFIG
from test_train import finished, free_port

ENV = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO)}
MB = 2**20

# sampling private memory while a load runs; the baseline is taken just before it
SAMPLER = r"""
import threading, time
def status_mb():
    rows = dict(line.split(":", 1) for line in open("/proc/self/status"))
    return {k: int(rows[k].split()[0]) / 1024 for k in ("RssAnon", "VmRSS", "VmHWM")}
class Peak:
    def __enter__(self):
        self.base, self.peak, self.stop = status_mb(), 0.0, threading.Event()
        self.thread = threading.Thread(target=self.sample, daemon=True); self.thread.start(); return self
    def sample(self):
        while not self.stop.is_set(): self.peak = max(self.peak, status_mb()["RssAnon"]); time.sleep(0.001)
    def __exit__(self, *exc):
        self.stop.set(); self.thread.join(); end = status_mb()
        self.anon_mb = round(max(self.peak, end["RssAnon"]) - self.base["RssAnon"])
        self.rss_mb = round(end["VmHWM"] - self.base["VmRSS"])     # the process's peak RSS over the load, above its start
"""

MEASURE = SAMPLER + r"""
import json, sys, torch
from transformers import AutoModelForCausalLM
from domino_research.target import load_target
path, how, dtype, device = sys.argv[1], sys.argv[2], getattr(torch, sys.argv[3]), sys.argv[4]
with Peak() as peak:
    if how == "load_target": model = load_target(path, dtype=dtype, device=device)
    else: model = AutoModelForCausalLM.from_pretrained(path, dtype=dtype).to(device)   # the old way: whole on the host first
    if device == "cpu":                                                                   # every page of the weights touched
        for p in model.parameters(): p.view(torch.int16).max() if p.dtype == torch.bfloat16 else p.max()
weights = sum(p.numel() * p.element_size() for p in model.parameters()) / 2**20
print(json.dumps({"anon_peak_mb": peak.anon_mb, "weights_mb": round(weights), "rss_peak_mb": peak.rss_mb,
                  "device": str(next(model.parameters()).device)}))
"""

MEASURE_SHARDED = SAMPLER + r"""
import json, sys, torch, torch.distributed as dist
from domino_research.shard import load_sharded_target, shard_target
from domino_research.target import load_target
path, how, out = sys.argv[1], sys.argv[2], sys.argv[3]
dist.init_process_group("gloo")
rank = dist.get_rank()
dist.barrier()
with Peak() as peak:
    if how == "load_sharded_target": model = load_sharded_target(path, "cpu")
    else: model = shard_target(load_target(path, device="cpu"))      # the old way: whole on the rank, then sharded
    dist.barrier()
local = [p.to_local() if hasattr(p, "to_local") else p for p in model.parameters()]
resident = sum(t.numel() * t.element_size() for t in local) / 2**20   # the tensors this rank holds (FSDP2's own shards)
# the same values as the whole target, every weight gathered (after the measurement: that gathers the whole model)
whole = load_target(path, device="cpu").state_dict()
def same_values(model):
    return all(torch.equal(v.full_tensor() if hasattr(v, "full_tensor") else v, whole[k]) for k, v in model.state_dict().items())
same = same_values(model)
# the fault that comparison exists for: every rank holding the first rows of each layer tensor instead of its own
for k, v in model.state_dict().items():
    if hasattr(v, "to_local"): v.to_local().copy_(whole[k][:v.to_local().shape[0]])
rec = {"anon_peak_mb": peak.anon_mb, "rss_peak_mb": peak.rss_mb, "resident_mb": round(resident, 1), "same_values": same,
       "same_values_with_first_rows": same_values(model)}
open(f"{out}/rank{rank}.json", "w").write(json.dumps(rec))
dist.barrier()
dist.destroy_process_group()
"""

# Qwen3-8B's config with smaller sizes, its 32:8 query:key-value head ratio kept: 1024 wide, 8 layers, a 32k vocabulary
# (Qwen3's 152k rows would make the unsharded embedding and LM head most of the bytes): 166 M parameters, 332 MB in bf16.
SIZES = dict(hidden_size=1024, intermediate_size=3072, num_hidden_layers=8, num_attention_heads=8, num_key_value_heads=2,
             head_dim=128, max_window_layers=8, vocab_size=32000)
WORLD = 2


@pytest.fixture(scope="module")
def qwen3_on_disk(tmp_path_factory):
    "The hub's layout: config.json, generation_config.json, bf16 weights in model-0000k-of-0000n.safetensors + index."
    import torch
    from huggingface_hub import save_torch_state_dict
    from transformers import GenerationConfig, Qwen3Config, Qwen3ForCausalLM
    path = tmp_path_factory.mktemp("qwen3")
    cfg = Qwen3Config(**{**QWEN3_8B_CONFIG, **SIZES})
    with torch.device("meta"): shapes = {k: v.shape for k, v in Qwen3ForCausalLM(cfg).state_dict().items()}
    gen = torch.Generator().manual_seed(0)
    save_torch_state_dict({k: torch.randn(s, generator=gen).to(torch.bfloat16) for k, s in shapes.items()}, path,
                          max_shard_size="100MB")
    cfg.save_pretrained(path)
    GenerationConfig(**QWEN3_8B_GENERATION_CONFIG).save_pretrained(path)
    assert len(list(path.glob("model-*.safetensors"))) > 1 and (path / "model.safetensors.index.json").is_file()
    layers = {k for k in shapes if k.startswith("model.layers.")}
    numel = lambda s: s.numel()
    return {"path": path, "layers_mb": sum(numel(shapes[k]) for k in layers) / MB,           # parameters, in millions of
            "rest_mb": sum(numel(s) for k, s in shapes.items() if k not in layers) / MB,       # 2**20: x 4 bytes = fp32 MB
            "largest_mb": max(numel(s) for s in shapes.values()) / MB,
            "rows": {k: (shapes[k][0], numel(shapes[k]) // shapes[k][0]) for k in layers}}


def measure(path, how, dtype, device) -> dict:
    p = subprocess.run([sys.executable, "-c", MEASURE, str(path), how, dtype, device], env=ENV, capture_output=True,
                       text=True, timeout=600)
    assert p.returncode == 0, p.stderr[-3000:]
    return json.loads(p.stdout.strip().splitlines()[-1])


def measure_sharded(path, how, out) -> list[dict]:
    out.mkdir()
    script = out / "measure.py"
    script.write_text(MEASURE_SHARDED)
    cmd = [sys.executable, "-m", "torch.distributed.run", f"--nproc_per_node={WORLD}", "--master_addr=127.0.0.1",
           f"--master_port={free_port()}", str(script), str(path), how, str(out)]
    p = subprocess.run(cmd, env=ENV, capture_output=True, text=True, timeout=600)
    assert finished(p, out, WORLD), p.stdout[-3000:] + p.stderr[-5000:]
    return [json.loads((out / f"rank{r}.json").read_text()) for r in range(WORLD)]


def test_load_to_a_device_keeps_no_host_copy(qwen3_on_disk):
    """fp32 on the device from a bf16 checkpoint (the conversion is where a host copy would be made): private host
    memory stays under a quarter of the weights; the old way holds them all on the host before moving them."""
    new = measure(qwen3_on_disk["path"], "load_target", "float32", "meta")
    old = measure(qwen3_on_disk["path"], "old", "float32", "meta")
    print("\n1 rank, to a device (meta): load_target:", new, "old way:", old)
    assert new["device"] == old["device"] == "meta"
    bound = 0.25 * new["weights_mb"]
    assert new["anon_peak_mb"] < bound, new
    assert old["anon_peak_mb"] > new["weights_mb"], old       # the fault: the whole converted model in host memory


def test_load_to_the_host_holds_the_weights_once(qwen3_on_disk):
    "On the CPU the model lives in host memory by design: once (the mapped files' pages), never a second whole copy."
    new = measure(qwen3_on_disk["path"], "load_target", "bfloat16", "cpu")
    print("\n1 rank, on the cpu in bf16: load_target:", new)
    assert new["device"] == "cpu"
    assert new["anon_peak_mb"] < 0.25 * new["weights_mb"], new                 # the tensors map the file: no private copy
    assert new["weights_mb"] * 0.9 < new["rss_peak_mb"] < 1.25 * new["weights_mb"] + 64, new   # its pages, once


def test_sharded_target_loads_only_each_ranks_rows(qwen3_on_disk, tmp_path):
    """Two gloo ranks, fp32 on the CPU: each rank holds the unsharded modules (embedding, final norm, LM head) whole and
    ceil(rows / 2) rows of each decoder-layer tensor, and its private memory never went above that by more than one
    tensor read in flight (the largest, in bf16) and 64 MB; every weight, gathered, equals the whole target's (and would
    not if each rank held the first rows instead of its own). The old way holds the whole target on each rank first: it
    must break the bound."""
    q = qwen3_on_disk
    keeps = 4 * (q["rest_mb"] + sum(-(-rows // WORLD) * cols for rows, cols in q["rows"].values()) / MB)   # fp32 MB
    whole = 4 * (q["rest_mb"] + q["layers_mb"])
    new = measure_sharded(q["path"], "load_sharded_target", tmp_path / "new")
    old = measure_sharded(q["path"], "old", tmp_path / "old")
    print(f"\n2 ranks, fp32 on the cpu (whole target {whole:.0f} MB, a rank keeps {keeps:.0f} MB): "
          f"load_sharded_target: {new}; old way: {old}")
    bound = keeps + 2 * q["largest_mb"] + 64
    for rank in new:
        assert rank["same_values"] and not rank["same_values_with_first_rows"], rank
        assert abs(rank["resident_mb"] - keeps) < 1, (rank, keeps)
        assert rank["anon_peak_mb"] < bound, (rank, bound)
    for rank in old:
        assert rank["same_values"] and abs(rank["resident_mb"] - keeps) < 1, rank    # the same result...
        assert rank["anon_peak_mb"] > whole, (rank, whole)                           # ...by way of the whole target
