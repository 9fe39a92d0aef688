"""Thin alias: ``python serve.py --port 8000`` == ``rlft serve --port 8000`` (the job service and dashboard)."""

import sys

from rlft.cli.main import main

if __name__ == "__main__":
    sys.exit(main(["serve", *sys.argv[1:]]))
