"""`python -m torchpace.docs_gen [--check] [--root DIR]`: write (or check) the generated reference.

Exit codes: 0 written or current; 1 `--check` found stale pages (it names them); 2 `--root` is not a
torchpace checkout (no `docs/` folder).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from torchpace.docs_gen import stale_docs, write_docs


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m torchpace.docs_gen", description=__doc__.splitlines()[0])
    parser.add_argument("--root", type=Path, default=Path.cwd(), help="the repository root (default: this folder)")
    parser.add_argument("--check", action="store_true", help="write nothing; exit 1 when a generated page is stale")
    args = parser.parse_args(argv)
    if not (args.root / "docs").is_dir():
        print(f"docs_gen: error: {args.root} has no docs/ folder; run it from the torchpace repository root "
              "or pass --root DIR", file=sys.stderr)
        return 2
    if args.check:
        stale = stale_docs(args.root)
        for rel in stale:
            print(f"stale: {rel} (run `make docs`)", file=sys.stderr)
        return 1 if stale else 0
    for rel in write_docs(args.root):
        print(f"wrote {rel}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
