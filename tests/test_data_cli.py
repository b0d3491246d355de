"""`python -m domino_research.data build`: builds the cache a training run then only maps; bad arguments are one line."""
import contextlib, io, os, subprocess, sys

from conftest import write_jsonl, _chat

ENV = {**os.environ, "OMP_NUM_THREADS": "1"}


def test_prebuild_cli_builds_the_runs_cache(tiny, tmp_path):
    import random
    from domino_research.data import cached_chat_dataset
    data = write_jsonl(tmp_path / "d.jsonl", [_chat(random.Random(2), i) for i in range(5)])
    target, cache = tiny["root"] / "target", tmp_path / "cache"
    cmd = [sys.executable, "-m", "domino_research.data", "build", str(data), "--tokenizer", str(target), "--seq_length", "96",
           "--cache_dir", str(cache), "--num_proc", "1"]
    p = subprocess.run(cmd, env=ENV, capture_output=True, text=True, timeout=120)
    assert p.returncode == 0 and "5/5 rows kept" in p.stdout and "built in" in p.stdout, p.stderr[-3000:]
    with contextlib.redirect_stdout(io.StringIO()) as out:            # what the run does with the same values
        ds, _ = cached_chat_dataset(data, tiny["tokenizer"], 96, cache)
    assert "cached in" in out.getvalue() and len(ds) == 5
    for args, msg in ((["--seq_length", "0"], "argument --seq_length: must be >= 1, got 0"),
                      (["--seq_length", "96", "--tokenizer", str(tmp_path / "nope")], "error: "),
                      (["--seq_length", "96", "--num_proc", "-2"], "argument --num_proc: must be >= 1, got -2")):
        base = [str(data), "--tokenizer", str(target), "--cache_dir", str(cache)]
        p = subprocess.run([sys.executable, "-m", "domino_research.data", "build", *base, *args], env=ENV, capture_output=True,
                           text=True, timeout=120)
        assert p.returncode == 2 and msg in p.stderr and "Traceback" not in p.stderr, p.stderr[-2000:]
        assert len(p.stderr.strip().splitlines()) <= 2, p.stderr          # argparse: usage line + error line
