"""`make lab` as a user meets it: Lab starts at the repository root, in the user's own environment (not the offline test
settings), and a notebook it saves leaves the git tree clean. Lab's REST API stands in for the browser: it is the call
the browser's save makes, with the metadata Lab adds on opening a notebook (its kernel's display name, `language_info`)."""
import json, os, shutil, signal, socket, subprocess, time, urllib.request

import pytest
from conftest import REPO

NOTEBOOK = "nbs/06_reduce.ipynb"                       # any notebook; this one is small
TOKEN = "lab-test"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _api(port, path, method="GET", body=None):
    req = urllib.request.Request(f"http://127.0.0.1:{port}/api/{path}", method=method,
                                 data=None if body is None else json.dumps(body).encode(),
                                 headers={"Authorization": f"token {TOKEN}", "Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=30) as r: return json.loads(r.read() or b"null")


def _as_lab_opens_it(nb: dict) -> dict:
    "The notebook as Lab holds it once opened with the python3 kernel (what it autosaves or saves)."
    from ipykernel.ipkernel import IPythonKernel
    nb = json.loads(json.dumps(nb))
    nb["metadata"]["kernelspec"]["display_name"] = "Python 3 (ipykernel)"
    nb["metadata"]["language_info"] = IPythonKernel.language_info | {"version": "3.11.2"}
    return nb


@pytest.fixture
def repo_copy(tmp_path):
    "The files `make lab` reads, in a git repository of their own (the real tree is never written); the real .venv."
    for f in ("Makefile", "settings.ini", "pyproject.toml", "constraints.txt", ".gitignore", NOTEBOOK):
        (tmp_path / f).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(REPO / f, tmp_path / f)
    (tmp_path / ".venv").symlink_to(REPO / ".venv")
    git = lambda *a: subprocess.run(["git", "-C", str(tmp_path), *a], check=True, capture_output=True)
    git("init", "-q")
    git("add", "-A")
    git("-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "copy")
    return tmp_path


@pytest.mark.skipif(not (REPO / ".venv/bin/jupyter").exists(), reason="make lab runs the .venv's jupyter (make env)")
def test_make_lab_saves_clean_notebooks_in_the_users_environment(repo_copy):
    port = _free_port()
    env = {k: v for k, v in os.environ.items() if k not in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE", "WANDB_MODE")}
    args = f"--no-browser --allow-root --port={port} --IdentityProvider.token={TOKEN}"
    # -o: the copy's pyproject.toml is newer than the real .venv's stamp; never reinstall from the copy
    lab = subprocess.Popen(["make", "-s", "-C", str(repo_copy), "-o", ".venv/bin/.installed", "lab", f"LAB_ARGS={args}"],
                           env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, start_new_session=True)
    try:
        for _ in range(120):                                                       # Lab starts in a few seconds
            try:
                _api(port, "status")
                break
            except OSError:
                time.sleep(0.5)
        else: pytest.fail(f"make lab did not start: {lab.stderr.read1().decode()[-2000:]}")
        committed = json.loads((repo_copy / NOTEBOOK).read_text())
        assert _api(port, "contents")["path"] == "", "Lab's root is the repository's root"
        assert "nbs" in {c["name"] for c in _api(port, "contents")["content"]}
        opened = _as_lab_opens_it(_api(port, f"contents/{NOTEBOOK}?content=1")["content"])
        assert opened["metadata"] != committed["metadata"]                       # what Lab would write without the hook
        _api(port, f"contents/{NOTEBOOK}", "PUT", {"type": "notebook", "format": "json", "content": opened})
        status = subprocess.run(["git", "-C", str(repo_copy), "status", "--porcelain"], capture_output=True, text=True)
        assert status.stdout == "", f"saving in Lab left the tree dirty:\n{status.stdout}"
        # the kernels Lab starts inherit its environment: the user's, not the offline settings of the jobs and tests
        server = [int(p) for p in open(f"/proc/{lab.pid}/task/{lab.pid}/children").read().split()]
        lab_env = dict(kv.split("=", 1) for kv in open(f"/proc/{server[0]}/environ").read().split("\0") if "=" in kv)
        assert not {"HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE", "WANDB_MODE"} & lab_env.keys(), lab_env
    finally:
        os.killpg(lab.pid, signal.SIGTERM)
        lab.wait(30)


def test_clean_check_says_how_to_restore_a_run_notebook(repo_copy):
    "A notebook saved with outputs stops `make test` at its first check, which names it and says how to restore it."
    (repo_copy / "tests").mkdir()
    shutil.copy(REPO / "tests/run_all.sh", repo_copy / "tests/run_all.sh")
    nb = json.loads((repo_copy / NOTEBOOK).read_text())
    code = next(c for c in nb["cells"] if c["cell_type"] == "code")
    code["outputs"] = [{"output_type": "stream", "name": "stdout", "text": ["ran in Lab\n"]}]
    (repo_copy / NOTEBOOK).write_text(json.dumps(nb, indent=1))
    run = subprocess.run(["bash", "tests/run_all.sh"], cwd=repo_copy, capture_output=True, text=True, timeout=120)
    assert run.returncode == 1 and NOTEBOOK in run.stdout, run.stdout + run.stderr
    assert "git restore <notebook>" in run.stdout and "Clear Outputs" in run.stdout, run.stdout
    subprocess.run(["git", "restore", NOTEBOOK], cwd=repo_copy, check=True)        # the advice, followed, works
    assert subprocess.run(["git", "diff", "--quiet"], cwd=repo_copy).returncode == 0
