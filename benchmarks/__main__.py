"""`python -m benchmarks NAME [args]`: run the benchmark module `benchmarks/NAME.py` (its `main`)."""
import importlib
import sys

if __name__ == "__main__":
    if len(sys.argv) < 2:
        sys.exit("usage: python -m benchmarks NAME [args]   (NAME: cuda, cpu, ...)")
    importlib.import_module(f"benchmarks.{sys.argv[1]}").main(sys.argv[2:])
