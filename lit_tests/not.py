"""``not CMD...``: run CMD and invert its exit status, like LLVM's ``not`` (for lit)."""
import subprocess
import sys

if __name__ == "__main__":
    if len(sys.argv) < 2:
        sys.exit("usage: not.py COMMAND [ARGS...]")
    try:
        rc = subprocess.call(sys.argv[1:])
    except OSError as e:
        print(f"not.py: {e}", file=sys.stderr)
        sys.exit(1)
    sys.exit(0 if rc != 0 else 1)
