"""python -m perfpredict.importers --shared ../shared/data/public --out datasets/public

(--shared: the folder holding the upstream copies; `perfpredict import-public` defaults to that relative path.)"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from perfpredict.importers import IMPORTERS, TRANSCRIBED, import_public


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m perfpredict.importers",
                                 description="Import the published measurements into datasets/public.")
    ap.add_argument("--shared", type=Path, required=True, help="folder holding the upstream folders (data/public)")
    ap.add_argument("--out", type=Path, default=Path("datasets/public"), help="output folder (default datasets/public)")
    ap.add_argument("--only", nargs="*", choices=sorted({*IMPORTERS, *TRANSCRIBED}), help="import only these source folders")
    args = ap.parse_args(argv)
    counts = import_public(shared_root=args.shared, out_root=args.out, only=args.only)
    total = 0
    for name, n in sorted(counts.items()):
        print(f"{n:8d}  {args.out / name}")
        total += n
    print(f"{total:8d}  rows in {len(counts)} files")
    return 0


if __name__ == "__main__":
    sys.exit(main())
