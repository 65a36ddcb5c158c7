"""The main() of the CLI check scripts here: parses --megaton, runs each check with a scratch directory,
prints ok/FAIL per check, and returns the exit status (1 if any failed)."""
import argparse
import tempfile
from pathlib import Path


def run_checks(description, checks, tmp_prefix):
    """checks: (name, function(megaton_path, scratch_dir)) pairs, run in order in one scratch directory."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--megaton", required=True, help="path to the megaton binary")
    args = parser.parse_args()
    failures = 0
    with tempfile.TemporaryDirectory(prefix=tmp_prefix) as tmp_dir:
        for name, check in checks:
            try:
                check(args.megaton, Path(tmp_dir))
                print(f"ok: {name}")
            except (AssertionError, OSError) as e:
                failures += 1
                print(f"FAIL: {name}: {e}")
    return 1 if failures else 0
