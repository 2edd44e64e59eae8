"""One rank of tests/test_distributed.py's runs: `torchrun ... tests/distributed_worker.py CASES RESULTS`.

Runs swcli's main(argv) once per case of the JSON file CASES ({"name", "argv", "env"}), in this process,
so that one torchrun start serves many commands (the ranks keep their process group between them), and
writes {name: {"code", "stdout", "stderr"}} to RESULTS/rank<RANK>.json. stdout is what the command wrote
there (bytes, latin-1 in the JSON); stderr what it printed.

A case's "fault" ({"rank", "call", "errno"}) makes os.<call> fail with that errno on that rank during
the case: a disk that fills (fsync: ENOSPC), a folder that becomes read-only (replace: EACCES).
"""

import errno
import io
import json
import os
import sys
from contextlib import ExitStack, redirect_stderr
from pathlib import Path
from unittest import mock

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from swcli.cli import main  # noqa: E402


def run_case(case: dict) -> dict:
    saved_env = {name: os.environ.get(name) for name in case.get("env", {})}
    os.environ.update(case.get("env", {}))
    saved_stdout, stdout, stderr = sys.stdout, io.BytesIO(), io.StringIO()
    sys.stdout = io.TextIOWrapper(stdout, encoding="utf-8", write_through=True)  # .buffer: the TSV's bytes
    fault = case.get("fault")
    try:
        with ExitStack() as stack:
            if fault and str(fault["rank"]) == os.environ["RANK"]:
                number = getattr(errno, fault["errno"])
                stack.enter_context(mock.patch.object(os, fault["call"], side_effect=OSError(number, os.strerror(number))))
            stack.enter_context(redirect_stderr(stderr))
            code = main(case["argv"])
    finally:
        sys.stdout.flush()
        sys.stdout.detach()  # not closing the BytesIO with it
        sys.stdout = saved_stdout
        for name, value in saved_env.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value
    return {"code": code, "stdout": stdout.getvalue().decode("latin-1"), "stderr": stderr.getvalue()}


if __name__ == "__main__":
    cases, results = json.loads(Path(sys.argv[1]).read_text()), Path(sys.argv[2])
    outcome = {case["name"]: run_case(case) for case in cases}
    (results / f"rank{os.environ['RANK']}.json").write_text(json.dumps(outcome))
