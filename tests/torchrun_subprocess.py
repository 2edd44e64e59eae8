"""A torchrun worker that runs swcli as a subprocess, as a pipeline started by torchrun may:
`torchrun ... tests/torchrun_subprocess.py CASES RESULT`.

Rank 0 runs `python -m swcli ARGV` for each argv of the JSON list CASES, in a subprocess that inherits its
environment (torchrun's RANK, WORLD_SIZE, MASTER_ADDR... included), and writes [{"code", "stdout",
"stderr", "parent"}] to RESULT (parent: this process's pid); "code" is null where the subprocess did not end within a minute. The other ranks
only wait (they start no process group): a subprocess that took torchrun's variables for its own would
wait for them in vain.
"""

import json
import os
import subprocess
import sys
from pathlib import Path


def run(argv: list[str]) -> dict:
    try:
        done = subprocess.run([sys.executable, "-m", "swcli", *argv], capture_output=True, text=True, timeout=60)
    except subprocess.TimeoutExpired as exc:
        return {"code": None, "stdout": "", "stderr": str(exc), "parent": os.getpid()}
    return {"code": done.returncode, "stdout": done.stdout, "stderr": done.stderr, "parent": os.getpid()}


if __name__ == "__main__":
    cases, result = json.loads(Path(sys.argv[1]).read_text()), Path(sys.argv[2])
    if os.environ["RANK"] == "0":
        result.write_text(json.dumps([run(argv) for argv in cases]))
