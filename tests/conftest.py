"Shared fixtures: a tiny random Qwen3 target with a Qwen3-style chat tokenizer, chat JSONL data and a recipe config."
import contextlib, importlib, io, json, os, random, warnings
from pathlib import Path
from types import SimpleNamespace

import pytest
from _pytest.nodeid import coerce_node_id

os.environ.setdefault("WANDB_MODE", "disabled")
os.environ["HF_HUB_OFFLINE"] = "1"
os.environ["HF_DATASETS_OFFLINE"] = "1"
os.environ["TRANSFORMERS_OFFLINE"] = "1"
os.environ["TOKENIZERS_PARALLELISM"] = "false"
REPO = Path(__file__).resolve().parents[1]

# The longest tests start first (each launches processes: 2-rank gloo launches, kill/resume loops, papermill kernels; a
# whole file, or an xdist group, where its tests share one module fixture): with `pytest -n 2 --dist loadgroup`
# (tests/run_all.sh) the two workers take the next test as they finish one, so neither is left running a long one while
# the other idles. A group starts where its first test is listed. Order: `pytest -n 2 --durations=40` of the last full
# run, with each test's cost after its launches moved into the test's process (CPU seconds, measured one file at a time).
LONGEST_FIRST = [
    "test_study29.py",                                                     # group study29_tuned: piece 1, then pieces 2-5
    "test_shard.py",                                                       # one 2-rank launch of eight trainings
    "test_gpu_check.py::test_cpu_mode_runs_the_driver",                   # its kill/resume part sleeps 1 s a step
    "test_train.py::test_two_ranks_validation_equals_one_rank",           # group two_ranks: one 2-rank launch of seven jobs
    "test_target_load.py",
    "test_qwen3_e2e.py::test_shipped_config_end_to_end",
    "test_papermill_params.py::test_ctrl_c_under_papermill_is_one_line_that_resumes",
    "test_train.py::test_resume_on_another_number_of_processes",
    "test_ablations.py::test_ctrl_c_stops_a_worker_pool_at_once",
    "test_eagle3.py::test_two_gloo_ranks_sharded_draft_trains_like_ddp_and_resumes",
    "test_ablations.py::test_papermill_budget_curve",
    "test_drafters.py::test_eagle3_drafter_is_lossless_on_the_embedded_target",
    "test_safety.py::test_fault_matrix_kill9_then_resume",
    "test_ablations.py::test_papermill_ablations_notebook",
    "test_papermill_params.py::test_fault_ctrl_c_without_the_handler_loses_the_hint",
    "test_reduce_gloo.py",
    "test_safety.py::test_damaged_latest_checkpoint_falls_back",           # group straight_4_steps
]


@pytest.hookimpl(trylast=True)                  # after pytest-xdist's worker hook, which adds "@group" to `item._nodeid`
def pytest_collection_modifyitems(config, items):
    # pytest 9 reads a node's id from `item._id`, so xdist 3.8's renaming is lost and `--dist loadgroup` would spread an
    # xdist_group over both workers (each then runs the group's shared launch again): carry the group into the id
    for item in items:
        if getattr(item, "_nodeid", None) not in (None, item.nodeid):
            item._id = coerce_node_id(item._nodeid)
    rank = {name: i for i, name in enumerate(LONGEST_FIRST)}
    def key(item):
        test = item.nodeid.split("@")[0].split("[")[0].removeprefix("tests/")        # file::test, parameters and group cut
        return rank.get(test, rank.get(test.split("::")[0], len(rank)))
    items.sort(key=key)                                                               # stable: the rest keep their order


def pytest_configure(config):
    # a pytest-xdist worker is one of N processes on N cores: torch's default of one intra-op thread per core in each
    # would oversubscribe them (and OpenMP threads spin while they wait); the subprocesses they start inherit this too
    if os.environ.get("PYTEST_XDIST_WORKER"):
        import torch
        os.environ["OMP_NUM_THREADS"] = "1"
        torch.set_num_threads(1)


def _chat(rng, i, short=False):
    start = rng.randrange(100)
    n = 2 if short else rng.randrange(12, 30)
    answer = " ".join(str(start + k) for k in range(n))
    return {"messages": [{"role": "user", "content": f"count from {start}, {n} numbers"},
                         {"role": "assistant", "content": answer}]}


def write_jsonl(path, rows):
    Path(path).write_text("".join(json.dumps(r) + "\n" for r in rows))
    return Path(path)


@pytest.fixture(scope="session")
def tiny(tmp_path_factory):
    "A directory with target/ (random 8-layer Qwen3 + chat tokenizer), train/val JSONL and a base recipe config dict."
    import torch
    from transformers import Qwen3Config, Qwen3ForCausalLM
    from domino_research.data import toy_chat_tokenizer
    root = tmp_path_factory.mktemp("tiny")
    rng = random.Random(0)
    train = [_chat(rng, i) for i in range(24)]
    val = [_chat(rng, i) for i in range(6)]
    corpus = [m["content"] for r in train for m in r["messages"]]
    tok = toy_chat_tokenizer(corpus, vocab_size=300, extra_special_tokens=["<|mask|>"])
    torch.manual_seed(0)
    cfg = Qwen3Config(vocab_size=len(tok), hidden_size=32, intermediate_size=64, num_hidden_layers=8,
                      num_attention_heads=2, num_key_value_heads=1, head_dim=16, tie_word_embeddings=True,
                      max_position_embeddings=512)
    Qwen3ForCausalLM(cfg).save_pretrained(root / "target")
    tok.save_pretrained(root / "target")
    write_jsonl(root / "train.jsonl", train)
    write_jsonl(root / "val.jsonl", val)
    base = dict(recipe="domino", target=str(root / "target"), train_data=str(root / "train.jsonl"),
                eval_data=str(root / "val.jsonl"), seq_length=96, block_size=4, num_anchors=4,
                mask_token_id=tok.convert_tokens_to_ids("<|mask|>"), draft_num_hidden_layers=2,
                emb_dim=8, gru_hidden_dim=16, micro_batch_size=2, grad_accumulation_steps=1, num_epochs=1,
                learning_rate=1e-3, warmup_ratio=0.0, output_dir=str(root / "runs"))
    return {"root": root, "base": base, "tokenizer": tok}


def write_config(path, d):
    import yaml
    Path(path).write_text(yaml.safe_dump(d, sort_keys=False))
    return str(path)


# `python -m <module>` runs this function of the module with sys.argv[1:] (each module's `if __name__ == "__main__"` line)
ENTRY_POINTS = {"domino_research.bench": "main", "domino_research.train": "cli", "domino_research.regenerate": "cli",
                "domino_research.embedded_build": "main", "domino_research.data": "main", "domino_research.embedded": "main"}


def run_module(module: str, *argv, cwd=REPO) -> SimpleNamespace:
    """`python -m <module> argv...` in this process: the module's entry function with argv, run in `cwd` ->
    (returncode, stdout, stderr) as a finished process reports them. A new Python would add seconds of imports per call
    and nothing that is checked; one test per command keeps the real launch. Global state a command sets (torch's
    thread count, the warning format) is put back."""
    import torch
    entry = getattr(importlib.import_module(module), ENTRY_POINTS[module])
    out, err, code = io.StringIO(), io.StringIO(), 0
    threads, formatwarning = torch.get_num_threads(), warnings.formatwarning
    try:
        with contextlib.chdir(cwd), contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            try: entry([str(a) for a in argv])
            except SystemExit as e: code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
    finally:
        torch.set_num_threads(threads)
        warnings.formatwarning = formatwarning
    return SimpleNamespace(returncode=code, stdout=out.getvalue(), stderr=err.getvalue())


def run_notebook(nb: str, **params) -> tuple[int, Exception | None]:
    """`papermill nbs/<nb> -p k v ...` in this process: papermill's own typing of `-p` text values (non-text values are
    injected as they are, as `-y` does) and its injected-parameters cell, then the code cells in order, in nbs/, until
    one raises -> (code cells run, counting the raising one; the error or None). A kernel start adds seconds and
    nothing checked; tests that need the real launch (exit status, the executed notebook) run papermill itself."""
    from papermill.cli import _resolve_type
    from papermill.iorw import load_notebook_node
    from papermill.parameterize import parameterize_notebook
    values = {k: _resolve_type(v) if isinstance(v, str) else v for k, v in params.items()}
    book = parameterize_notebook(load_notebook_node(str(REPO / "nbs" / nb)), values)
    from transformers.utils import logging as hf_logging
    namespace, ran, bars = {}, 0, hf_logging.is_progress_bar_enabled()
    try:
        with contextlib.chdir(REPO / "nbs"):
            for cell in (c for c in book.cells if c.cell_type == "code"):
                ran += 1
                try: exec(compile(cell.source, f"{nb} code cell {ran}", "exec"), namespace)
                except Exception as e: return ran, e  # noqa: BLE001 - the notebook's refusal, whatever its type
        return ran, None
    finally:
        if bars: hf_logging.enable_progress_bar()          # a driver turns the weight-loading bars off for its process


# A suite started in the background by a non-interactive shell (`make test &`) inherits SIGINT ignored (POSIX), and so
# would every process the tests start: the Ctrl-C tests would test the launcher, not the code. Python's own handler back.
import signal as _signal  # noqa: E402
if _signal.getsignal(_signal.SIGINT) is _signal.SIG_IGN: _signal.signal(_signal.SIGINT, _signal.default_int_handler)


@pytest.fixture(autouse=True)
def _ctrl_c_handler_kept():
    """Tests run in-process share one interpreter: a test that leaves SIGINT handled otherwise (ignored, or a handler
    of its own) would make every later Ctrl-C test in that worker pass or fail by order. Fail the test that did it."""
    import signal
    before = signal.getsignal(signal.SIGINT)
    yield
    after = signal.getsignal(signal.SIGINT)
    if after is not before:
        signal.signal(signal.SIGINT, before)
        pytest.fail(f"this test left SIGINT's handler changed ({before!r} -> {after!r})")
