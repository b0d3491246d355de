"""The scripts of `runs/` are files, not modules of a package: the tests of what they compute load them by path."""
import importlib.util
from pathlib import Path


def load_script(path, name: str):
    "The module of the script at `path`, executed once under `name` (as `python path` would, without running its main)."
    spec = importlib.util.spec_from_file_location(name, Path(path))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod
