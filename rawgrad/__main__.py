"""`python -m rawgrad ...`: the command line lives in rawgrad/cli/main.py (the top layer); this file only
runs it, so the package root holds no tool code."""
import sys

from rawgrad.cli.main import run

if __name__ == "__main__":
    sys.exit(run())
