"""Thin alias: ``python inference.py --model X --prompt "..."`` == ``rlft generate --model X --prompt "..."``."""

import sys

from rlft.cli.main import main

if __name__ == "__main__":
    sys.exit(main(["generate", *sys.argv[1:]]))
