"""Compare two build folders: every file bit for bit; .gz by their decompressed bytes (gzip headers carry a time stamp);
train_log.jsonl without its wall-clock field elapsed_s."""
import sys, gzip, json, hashlib
from pathlib import Path
a, b = map(Path, sys.argv[1:3])
fa = sorted(p.relative_to(a).as_posix() for p in a.rglob("*") if p.is_file())
fb = sorted(p.relative_to(b).as_posix() for p in b.rglob("*") if p.is_file())
assert fa == fb, (set(fa) ^ set(fb))
def content(p):
    if p.suffix == ".gz": return gzip.decompress(p.read_bytes())
    if p.name == "train_log.jsonl":
        return "\n".join(json.dumps({k: v for k, v in json.loads(l).items() if k != "elapsed_s"}) for l in p.read_text().splitlines()).encode()
    if p.name == "MANIFEST.json":  # lists sha256 of the gz / log files; compare the other entries
        m = json.loads(p.read_text())["files"]
        return json.dumps({k: v for k, v in m.items() if not k.endswith((".gz", "train_log.jsonl"))}, sort_keys=True).encode()
    return p.read_bytes()
bad = 0
for f in fa:
    same = content(a / f) == content(b / f)
    exact = (a / f).read_bytes() == (b / f).read_bytes()
    print(f"{'identical' if exact else 'same content' if same else 'DIFFERENT':13s} {f}  {hashlib.sha256((b/f).read_bytes()).hexdigest()[:12]}")
    bad += not same
print("ALL SAME" if not bad else f"{bad} DIFFERENT")
