"""A target loads straight to its device: its weights are never materialised whole in a rank's host memory first.

A real-layout Qwen3 (a few hundred MB of random bf16 safetensors weights) is saved to disk, then loaded in a fresh
process while a thread samples the process's private (anonymous) and total resident memory (/proc/self/status). The
`meta` device stands in for a GPU on a CPU machine: a device that is not host memory. The old way (`from_pretrained`
on the host, then `.to(device)`) is run the same way and must break the bound: that is the fault the test exists for."""
import json, os, subprocess, sys

import pytest

from conftest import REPO

ENV = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO)}

MEASURE = r"""
import json, sys, threading, time, torch
from transformers import AutoModelForCausalLM
from domino_research.target import load_target
path, how, dtype, device = sys.argv[1], sys.argv[2], getattr(torch, sys.argv[3]), sys.argv[4]
def status_mb():
    rows = dict(line.split(":", 1) for line in open("/proc/self/status"))
    return {k: int(rows[k].split()[0]) / 1024 for k in ("RssAnon", "VmRSS")}
peak, stop = {"RssAnon": 0.0, "VmRSS": 0.0}, threading.Event()
def sample():
    while not stop.is_set():
        for k, v in status_mb().items(): peak[k] = max(peak[k], v)
        time.sleep(0.001)
base = status_mb()
sampler = threading.Thread(target=sample, daemon=True); sampler.start()
if how == "load_target": model = load_target(path, dtype=dtype, device=device)
else: model = AutoModelForCausalLM.from_pretrained(path, dtype=dtype).to(device)      # the old way: whole on the host first
if device == "cpu":                                                                     # every page of the weights touched
    for p in model.parameters(): p.view(torch.int16).max() if p.dtype == torch.bfloat16 else p.max()
stop.set(); sampler.join()
weights = sum(p.numel() * p.element_size() for p in model.parameters()) / 2**20
print(json.dumps({"anon_peak_mb": round(peak["RssAnon"] - base["RssAnon"]), "weights_mb": round(weights),
                  "rss_peak_mb": round(peak["VmRSS"] - base["VmRSS"]),
                  "device": str(next(model.parameters()).device)}))
"""


@pytest.fixture(scope="module")
def qwen3_on_disk(tmp_path_factory):
    "A Qwen3 with real layer shapes (1024 wide, 8 layers, 32k vocabulary: 166 M parameters, 332 MB in bf16)."
    import torch
    from safetensors.torch import save_file
    from transformers import Qwen3Config, Qwen3ForCausalLM
    path = tmp_path_factory.mktemp("qwen3")
    cfg = Qwen3Config(vocab_size=32000, hidden_size=1024, intermediate_size=3072, num_hidden_layers=8, num_attention_heads=8,
                      num_key_value_heads=4, head_dim=128, tie_word_embeddings=False, dtype="bfloat16")
    with torch.device("meta"): shapes = {k: v.shape for k, v in Qwen3ForCausalLM(cfg).state_dict().items()}
    gen = torch.Generator().manual_seed(0)
    save_file({k: torch.randn(s, generator=gen).to(torch.bfloat16) for k, s in shapes.items()}, str(path / "model.safetensors"),
              metadata={"format": "pt"})
    cfg.save_pretrained(path)
    return path


def measure(path, how, dtype, device) -> dict:
    p = subprocess.run([sys.executable, "-c", MEASURE, str(path), how, dtype, device], env=ENV, capture_output=True,
                       text=True, timeout=600)
    assert p.returncode == 0, p.stderr[-3000:]
    return json.loads(p.stdout.strip().splitlines()[-1])


def test_load_to_a_device_keeps_no_host_copy(qwen3_on_disk):
    """fp32 on the device from a bf16 checkpoint (the conversion is where a host copy would be made): private host
    memory stays under a quarter of the weights; the old way holds them all on the host before moving them."""
    new = measure(qwen3_on_disk, "load_target", "float32", "meta")
    old = measure(qwen3_on_disk, "old", "float32", "meta")
    print("load_target:", new, "old way:", old)
    assert new["device"] == old["device"] == "meta"
    bound = 0.25 * new["weights_mb"]
    assert new["anon_peak_mb"] < bound, new
    assert old["anon_peak_mb"] > new["weights_mb"], old       # the fault: the whole converted model in host memory


def test_load_to_the_host_holds_the_weights_once(qwen3_on_disk):
    "On the CPU the model lives in host memory by design: once (the mapped file's pages), never a second whole copy."
    new = measure(qwen3_on_disk, "load_target", "bfloat16", "cpu")
    print("load_target on cpu:", new)
    assert new["device"] == "cpu"
    assert new["anon_peak_mb"] < 0.25 * new["weights_mb"], new                 # the tensors map the file: no private copy
    assert new["weights_mb"] * 0.9 < new["rss_peak_mb"] < 1.25 * new["weights_mb"] + 64, new   # its pages, once
