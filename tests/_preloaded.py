"""Training runs that a test kills, launched without the ~6 s of imports a new Python spends before the run starts.

`launch_train(argv, env)` is `python -m domino_research.train argv...` with `env` added, as a separate process that can
be killed at any moment (SIGKILL included): multiprocessing's fork server imports the training code once, in a clean
single-threaded process, and forks each run from it. What a kill test checks is on disk (checkpoints, locks, the run
folder) and in the resume after it; nothing of that depends on the run having imported its modules itself. The real
`python -m` launch is kept by tests/test_train.py::test_cli_trains_and_writes_run_dir."""
import multiprocessing, os

_context = None


def _context_preloaded():
    global _context
    if _context is None:
        _context = multiprocessing.get_context("forkserver")
        _context.set_forkserver_preload(["torch", "domino_research.train"])
    return _context


def _train(argv, env):
    "In the forked process: the command line's own entry, its output dropped as the tests' Popen(..., DEVNULL) did."
    os.environ.update(env)
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, 1)
    os.dup2(devnull, 2)
    import torch
    torch.set_num_threads(1)                           # as OMP_NUM_THREADS=1 gives a launched run
    from domino_research.train import cli
    cli([str(a) for a in argv])


class Launched:
    "The started run, with the part of subprocess.Popen's interface the tests use."
    def __init__(self, process): self.process, self.pid = process, process.pid
    def poll(self): return None if self.process.is_alive() else self.process.exitcode
    def kill(self): self.process.kill()
    def send_signal(self, sig): os.kill(self.pid, sig)
    def wait(self):
        self.process.join()
        return self.process.exitcode


def launch_train(argv, env=None) -> Launched:
    process = _context_preloaded().Process(target=_train, args=(list(argv), dict(env or {})), daemon=True)
    process.start()
    return Launched(process)
