"""Thin alias: ``python train.py --config X`` == ``rlft train --config X``."""

import sys

from rlft.cli.main import main

if __name__ == "__main__":
    sys.exit(main(["train", *sys.argv[1:]]))
