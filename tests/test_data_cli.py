"""`python -m domino_research.data build`: builds the cache a training run then only maps; bad arguments are one line."""
import contextlib, errno, io, os, random, shutil, signal, subprocess, sys, time
from pathlib import Path

import pytest

from conftest import run_module, write_jsonl, _chat
from domino_research import data as data_mod

ENV = {**os.environ, "OMP_NUM_THREADS": "1"}


def test_prebuild_cli_builds_the_runs_cache(tiny, tmp_path):
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
        p = run_module("domino_research.data", "build", *base, *args)       # in this process; the build above is launched
        assert p.returncode == 2 and msg in p.stderr and "Traceback" not in p.stderr, p.stderr[-2000:]
        assert len(p.stderr.strip().splitlines()) <= 2, p.stderr          # argparse: usage line + error line


# ------------------------------------------------------------------ faults of the cache folder, through `main([...])` in-process
def _rows(n, seed=3):
    rng = random.Random(seed)
    return [_chat(rng, i) for i in range(n)]


def _build(tiny, src, cache, *extra, seq_length=96):
    data_mod.main(["build", str(src), "--tokenizer", str(tiny["root"] / "target"), "--seq_length", str(seq_length),
                   "--cache_dir", str(cache), "--num_proc", "1", *map(str, extra)])


def _one_error_line(capsys, excinfo, *needles, code=2):
    err = capsys.readouterr().err
    assert excinfo.value.code == code and "Traceback" not in err, err
    lines = [l for l in err.splitlines() if l.startswith(("error:", "interrupted:"))]
    assert len(lines) == 1, err
    for n in needles: assert str(n) in lines[0], (n, lines[0])
    return lines[0]


def _tree(folder):
    "Every path under `folder` with its size and modification time: what a read-only use must leave alone."
    return {str(p.relative_to(folder)): (p.stat().st_size, p.stat().st_mtime_ns) for p in Path(folder).rglob("*")}


def test_same_size_damage_is_detected_and_rebuilt(tiny, tmp_path, capsys):
    "Zeroed bytes that keep the .arrow file's size: the checksum catches them, one warning, rebuilt rows equal a fresh build."
    src, cache = write_jsonl(tmp_path / "d.jsonl", _rows(40)), tmp_path / "cache"
    _build(tiny, src, cache)
    fresh, _ = data_mod.cached_chat_dataset(src, tiny["tokenizer"], 96, cache, verbose=False)
    fresh = [list(r) for r in fresh["input_ids"]]     # a Column reads the memory-mapped file lazily: copy it now
    arrow = next(cache.glob("chat-*/rows/*.arrow"))
    n = arrow.stat().st_size
    with open(arrow, "r+b") as f:
        f.seek(n // 4)
        f.write(bytes(n // 2 - n // 4))
    assert arrow.stat().st_size == n
    capsys.readouterr()
    with pytest.warns(UserWarning) as w: _build(tiny, src, cache)
    msgs = [str(x.message) for x in w if "is damaged" in str(x.message)]
    assert len(msgs) == 1 and "other bytes than were written" in msgs[0], msgs
    assert "built in" in capsys.readouterr().out
    again, _ = data_mod.cached_chat_dataset(src, tiny["tokenizer"], 96, cache, verbose=False)
    assert [list(r) for r in again["input_ids"]] == fresh


def test_empty_jsonl_is_named(tiny, tmp_path, capsys):
    empty = tmp_path / "empty.jsonl"
    empty.write_text("\n\n")
    with pytest.raises(SystemExit) as e: _build(tiny, empty, tmp_path / "cache")
    _one_error_line(capsys, e, f"{empty}: no rows", "write one chat per line")
    assert not (tmp_path / "cache").exists() or not any((tmp_path / "cache").iterdir())


@pytest.fixture
def read_only(monkeypatch):
    """Makes a folder read-only for real where it can: a read-only bind mount (root with mount rights) or chmod (not root).
    Root writes through chmod, so as root without mount rights the writability check the code uses (`os.access`, which
    does see a read-only mount) is told the folder is read-only; the test then also checks that nothing was written."""
    mounted = []
    def make(folder):
        folder = Path(folder)
        if os.geteuid() != 0:
            folder.chmod(0o555)
            return "chmod"
        if shutil.which("mount") and subprocess.run(["mount", "--bind", "-o", "ro", str(folder), str(folder)],
                                                    capture_output=True).returncode == 0:
            mounted.append(folder)
            if not os.access(folder, os.W_OK): return "mount"
        monkeypatch.setattr(data_mod, "_writable", lambda p: False)
        return "simulated"
    yield make
    for folder in mounted: subprocess.run(["umount", str(folder)], check=True)


def test_read_only_cache_is_served_and_a_missing_one_named(tiny, tmp_path, capsys, read_only):
    src, cache = write_jsonl(tmp_path / "d.jsonl", _rows(6)), tmp_path / "cache"
    _build(tiny, src, cache)
    before = _tree(cache)
    read_only(cache)
    capsys.readouterr()
    _build(tiny, src, cache)                                           # a finished cache: only read
    assert "cached in" in capsys.readouterr().out and _tree(cache) == before
    with pytest.raises(SystemExit) as e: _build(tiny, src, cache, seq_length=80)   # another key: would have to be built
    _one_error_line(capsys, e, f"data_cache_dir {cache} is read-only", "has no finished cache")
    assert _tree(cache) == before



def test_damaged_read_only_cache_is_one_line(tiny, tmp_path, capsys, read_only):
    "A damaged cache in a read-only folder cannot be set aside and rebuilt there: one line naming it, nothing written."
    src, cache = write_jsonl(tmp_path / "d.jsonl", _rows(6)), tmp_path / "cache"
    _build(tiny, src, cache)
    arrow = next(cache.glob("chat-*/rows/*.arrow"))
    n = arrow.stat().st_size
    with open(arrow, "r+b") as f:
        f.seek(n // 2)
        f.write(bytes(64))
    before = _tree(cache)
    read_only(cache)
    with pytest.raises(SystemExit) as e: _build(tiny, src, cache)
    _one_error_line(capsys, e, "is damaged", "other bytes than were written", f"{cache} is read-only")
    assert _tree(cache) == before

def test_training_reads_a_read_only_prebuilt_cache(tiny, tmp_path, read_only):
    "The recipe's data step (not only the data CLI) maps a shared read-only cache instead of refusing the folder."
    from types import SimpleNamespace
    from domino_research.train import TrainDFlashRecipe, load_train_config
    cache = tmp_path / "cache"
    cfg = load_train_config(**{**tiny["base"], "output_dir": str(tmp_path / "runs"), "data_cache_dir": str(cache),
                               "data_num_proc": 1})
    me = SimpleNamespace(cfg=cfg, accelerator=SimpleNamespace(is_local_main_process=True, is_main_process=True),
                         tokenizer=tiny["tokenizer"])
    with contextlib.redirect_stdout(io.StringIO()):
        built = TrainDFlashRecipe._build_datasets(me)
        before = _tree(cache)
        read_only(cache)
        again = TrainDFlashRecipe._build_datasets(me)
    assert [len(d) for d in again] == [len(d) for d in built] and _tree(cache) == before


@contextlib.contextmanager
def _full_disk(cache, monkeypatch):
    "The build's real writes fail with ENOSPC: a 1 MB tmpfs where mount works, else the Arrow writer every write goes through."
    cache.mkdir()
    if os.geteuid() == 0 and shutil.which("mount") and subprocess.run(
            ["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(cache)], capture_output=True).returncode == 0:
        try: yield
        finally: subprocess.run(["umount", "--lazy", str(cache)], check=True)   # the error's frames still map deleted files
        return
    import datasets.arrow_writer as aw
    real = aw.ArrowWriter.write_table
    def write_table(self, table, *a, **k):
        if sum(p.stat().st_size for p in cache.rglob("*") if p.is_file()) > 1_000_000:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return real(self, table, *a, **k)
    monkeypatch.setattr(aw.ArrowWriter, "write_table", write_table)
    yield


@pytest.mark.parametrize("copies", [2, 20])   # 0.2 MB of JSONL (~2 MB to build); 2 MB: full while reading the rows in
def test_full_cache_disk_is_one_line_and_leaves_nothing(tiny, tmp_path, monkeypatch, capsys, copies):
    "Full while tokenising, or already while `datasets` reads the rows in (it wraps the ENOSPC in its own error)."
    src, cache = write_jsonl(tmp_path / "big.jsonl", _rows(600) * copies), tmp_path / "full"
    with _full_disk(cache, monkeypatch):
        with pytest.raises(SystemExit) as e: _build(tiny, src, cache)
        line = _one_error_line(capsys, e, f"data_cache_dir {cache} is full", "No space left on device", "it needs about")
        assert list(cache.iterdir()) == [], line                         # temp folder removed


def test_full_cache_disk_in_training_is_one_line(tiny, tmp_path, monkeypatch):
    "The recipe's data step: the same fault is one ConfigError line naming the folder (was 58 lines of traceback)."
    from types import SimpleNamespace
    from domino_research.config import ConfigError
    from domino_research.train import TrainDFlashRecipe, load_train_config
    src, cache = write_jsonl(tmp_path / "big.jsonl", _rows(600) * 2), tmp_path / "full"
    cfg = load_train_config(**{**tiny["base"], "train_data": str(src), "output_dir": str(tmp_path / "runs"),
                               "data_cache_dir": str(cache), "data_num_proc": 1})
    me = SimpleNamespace(cfg=cfg, accelerator=SimpleNamespace(is_local_main_process=True, is_main_process=True),
                         tokenizer=tiny["tokenizer"])
    with _full_disk(cache, monkeypatch):
        with pytest.raises(ConfigError) as e, contextlib.redirect_stdout(io.StringIO()): TrainDFlashRecipe._build_datasets(me)
        assert str(e.value).startswith(f"train_data: data_cache_dir {cache} is full") and "\n" not in str(e.value)
        assert list(cache.iterdir()) == []


def test_ctrl_c_during_a_two_process_build(tiny, tmp_path):
    "Ctrl-C (SIGINT to the whole process group, as a terminal sends it) while 2 workers tokenise: one line, no temp folder."
    src, cache = write_jsonl(tmp_path / "d.jsonl", _rows(8000)), tmp_path / "cache"   # tokenising outlasts the 0.5 s wait
    err = tmp_path / "stderr.txt"
    with open(err, "w") as ef:
        p = subprocess.Popen([sys.executable, "-m", "domino_research.data", "build", str(src), "--tokenizer",
                              str(tiny["root"] / "target"), "--seq_length", "96", "--cache_dir", str(cache), "--num_proc", "2"],
                             env=ENV, stdout=subprocess.DEVNULL, stderr=ef, start_new_session=True)
        t0 = time.time()
        while "Map (num_proc=2)" not in err.read_text() and p.poll() is None and time.time() - t0 < 60: time.sleep(0.05)
        time.sleep(0.5)
        os.killpg(p.pid, signal.SIGINT)
        rc = p.wait(timeout=60)
    text = err.read_text()
    assert rc == 130 and "Traceback" not in text, text[-3000:]
    lines = [l for l in text.splitlines() if l.startswith("interrupted:")]
    assert len(lines) == 1 and "stopped while tokenising" in lines[0] and "run the same command again" in lines[0], text[-2000:]
    assert [q.name for q in cache.iterdir()] == []                      # no cache, no temp folder
