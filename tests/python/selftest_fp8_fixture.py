"""The committed FP8 recipe fixture (tests/kernels/data/fp8_recipes_fixture.json) is exactly what the
independent reference (fp8_reference.py) computes, so the C++ test compares against the reference
and not against a snapshot of itself. Regenerate with:
    /usr/bin/python3 tests/python/fp8_reference.py > tests/kernels/data/fp8_recipes_fixture.json"""
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import fp8_reference  # noqa: E402

path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "kernels", "data", "fp8_recipes_fixture.json")
with open(path) as f:
    committed = json.load(f)
fresh = json.loads(json.dumps(fp8_reference.compute()))
if committed != fresh:
    for a, b in zip(committed["cases"], fresh["cases"]):
        if a != b:
            print("differs:", a["format"], a["granularity"], "pow2" if a["pow2"] else "")
    sys.exit("the committed FP8 fixture is not what fp8_reference.py computes")
print("fp8 fixture matches the reference:", len(fresh["cases"]), "cases")
