"""A stand-in for nvidia-smi used by the sampler tests.

Usage: python fake_nvidia_smi.py SCRIPT.json <nvidia-smi arguments...>
SCRIPT.json: {"gpu": str|null, "gpu_exit": int, "apps": str|null, "apps_exit": int,
              "sleep_gpu": seconds, "sleep_apps": seconds}. Every call is appended to
SCRIPT.json.calls so tests can check the exact argv (no shell involved).
"""

import json
import sys
import time

script_path, args = sys.argv[1], sys.argv[2:]
with open(script_path) as fh:
    script = json.load(fh)
with open(script_path + ".calls", "a") as fh:
    fh.write(json.dumps(args) + "\n")
kind = "gpu" if args and args[0].startswith("--query-gpu=") else "apps"
time.sleep(script.get(f"sleep_{kind}", 0))
out = script.get(kind)
if out is not None:
    sys.stdout.write(out)
sys.exit(script.get(f"{kind}_exit", 0))
