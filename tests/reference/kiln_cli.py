"""kiln_cli.py — running the kiln binary from the Python tests ($KILN, default ./kiln)."""
import os
import subprocess
import sys

KILN = os.environ.get("KILN", "./kiln")


def run(*args, ok=True):
    """kiln ARGS; exits the test with kiln's stderr when it fails (ok) or succeeds (not ok)."""
    p = subprocess.run([KILN, *args], capture_output=True, text=True)
    if ok and p.returncode != 0:
        sys.exit(f"kiln {' '.join(args)} failed: {p.stderr}")
    if not ok and p.returncode == 0:
        sys.exit(f"kiln {' '.join(args)} succeeded but should have failed")
    return p
