"""Prepares benchmarks/gpu_side_by_side.sh here, where PyPI and the fetch mirrors are reachable: the
peers' own files, unmodified, into benchmarks/.gpu_peers/peers, and the wheels of every package
gpu_side_by_side.py's groups install into benchmarks/.gpu_peers/wheels/cpXY, for each Python asked.

    python benchmarks/gpu_prep.py                       # Python 3.12 and 3.11
    python benchmarks/gpu_prep.py --python 3.12         # only what the GPU node's Python needs
    python benchmarks/gpu_prep.py --cleanrl-git DIR --leanrl-git DIR   # other clones (bare or not)

gym 0.25.2 is published as source only: it is built into a wheel here. EnvPool's wheel holds every
env family it has (81 MB); it is rewritten keeping its Python files and its Atari part (the other
families' compiled modules and assets dropped, RECORD made anew), so the carried folder stays small.
Prints each folder's size: the device call carries benchmarks/.gpu_peers/peers and one wheels/cpXY.
"""

from __future__ import annotations

import argparse
import base64
import hashlib
import json
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from benchmarks.gpu_side_by_side import GROUPS, PEERS  # noqa: E402

FILES = {
    "cleanrl": ["cleanrl/ppo_atari.py", "cleanrl_utils/__init__.py", "cleanrl_utils/atari_wrappers.py"],
    "leanrl": ["leanrl/ppo_atari_envpool_torchcompile.py"],
}
PLATFORMS = ["manylinux_2_28_x86_64", "manylinux_2_27_x86_64", "manylinux_2_24_x86_64", "manylinux_2_17_x86_64"]
PLATFORMS += ["manylinux2014_x86_64"]


def copy_peers(args) -> dict:
    sources = {}
    for peer, git, rev in (
        ("cleanrl", args.cleanrl_git, args.cleanrl_commit),
        ("leanrl", args.leanrl_git, args.leanrl_commit),
    ):
        full = subprocess.run(["git", "-C", str(git), "rev-parse", rev], capture_output=True, text=True, check=True)
        sources[peer] = {"git": str(git), "commit": full.stdout.strip(), "files": FILES[peer]}
        for path in FILES[peer]:
            text = subprocess.run(["git", "-C", str(git), "show", f"{rev}:{path}"], capture_output=True, check=True)
            target = PEERS / "peers" / peer / path
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(text.stdout)
    (PEERS / "peers" / "SOURCES.json").write_text(json.dumps(sources, indent=1) + "\n")
    return sources


def download(python: str, folder: Path) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    for group, requirements in GROUPS.items():
        wanted = [r for r in requirements if not r.startswith("gym==")]
        pip = [sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--only-binary=:all:", "-d", str(folder)]
        pip += ["--python-version", python, "--implementation", "cp", *[f"--platform={p}" for p in PLATFORMS]]
        print(f"{folder.name} {group}: {' '.join(wanted)}", flush=True)
        subprocess.run([*pip, *wanted], check=True)
        for source_only in (r for r in requirements if r.startswith("gym==")):
            subprocess.run(
                [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "-w", str(folder), source_only], check=True
            )


def keep_atari(wheel: Path) -> None:
    """Rewrites EnvPool's wheel in place with its Python files, its dist-info and envpool/atari only."""
    with zipfile.ZipFile(wheel) as source:
        names = source.namelist()
        kept = [n for n in names if n.endswith(".py") or ".dist-info/" in n or n.startswith("envpool/atari/")]
        if len(kept) == len(names):
            return
        record = next(n for n in kept if n.endswith(".dist-info/RECORD"))
        with tempfile.NamedTemporaryFile(dir=wheel.parent, delete=False) as tmp:
            with zipfile.ZipFile(tmp, "w", zipfile.ZIP_DEFLATED) as target:
                rows = []
                for name in kept:
                    if name == record or name.endswith("/"):
                        continue
                    data = source.read(name)
                    target.writestr(name, data)
                    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
                    rows.append(f"{name},sha256={digest},{len(data)}")
                target.writestr(record, "\n".join([*rows, f"{record},,"]) + "\n")
    Path(tmp.name).replace(wheel)


def size(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--python", nargs="+", default=["3.12", "3.11"], help="the Pythons to fetch wheels for")
    parser.add_argument("--cleanrl-git", type=Path, default=Path("/work/.mirror/vwxyzjn+cleanrl/repo"))
    parser.add_argument("--cleanrl-commit", default="fe8d8a0", help="the commit train_speed.py was tested at")
    parser.add_argument("--leanrl-git", type=Path, default=Path("/work/.mirror/pytorch-labs+LeanRL/repo"))
    parser.add_argument("--leanrl-commit", default="8dbb633")
    args = parser.parse_args()
    for peer, source in copy_peers(args).items():
        print(f"{peer}: {source['commit']} {' '.join(source['files'])}")
    for python in args.python:
        folder = PEERS / "wheels" / f"cp{python.replace('.', '')}"
        download(python, folder)
        for wheel in folder.glob("envpool-*.whl"):
            keep_atari(wheel)
    print(f"peers: {size(PEERS / 'peers') / 2**20:.1f} MiB")
    for folder in sorted((PEERS / "wheels").iterdir()):
        print(f"wheels/{folder.name}: {size(folder) / 2**20:.1f} MiB ({len(list(folder.glob('*.whl')))} wheels)")


if __name__ == "__main__":
    main()
