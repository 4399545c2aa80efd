"""Another process holding a lock while a test runs."""

import contextlib
import subprocess
import sys


@contextlib.contextmanager
def holding(make_lock: str, path):
    """A process that runs ``lock = <make_lock>(path)`` (a dotted ``module:function``) and holds
    that lock until the block ends."""
    module, func = make_lock.split(":")
    code = (
        f"import sys; from {module} import {func} as make; lock = make(sys.argv[1]); "
        "print('held', flush=True); sys.stdin.read()"
    )
    proc = subprocess.Popen(
        [sys.executable, "-c", code, str(path)], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
        text=True,
    )  # fmt: skip
    try:
        assert proc.stdout.readline().strip() == "held"
        yield proc
    finally:
        proc.stdin.close()
        proc.wait(timeout=30)
