"""Run ``medproc.load`` and ``medproc inspect`` (JSON and table) on each input, in one process,
with a time limit per input; write what happened as JSON. Run by ``test_bad_inputs.py`` in a
subprocess under an address-space limit.

    python _bad_inputs_runner.py PATHS.json RESULTS.json
"""

import contextlib
import io
import json
import signal
import sys
import traceback
import warnings

PER_CASE_S = 20


class Hang(Exception):
    pass


def _alarm(signum, frame):
    raise Hang(f"no answer within {PER_CASE_S} s")


def _cli(args):
    from medproc.cli import main

    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        rc = main(args)
    return rc, out.getvalue(), err.getvalue()


def run_one(path: str) -> dict:
    import medproc

    res: dict = {}
    try:
        vol = medproc.load(path)
        res["load"] = {"ok": True, "dtype": str(vol.dtype), "shape": list(vol.array.shape)}
    except medproc.MedprocError as e:
        res["load"] = {"ok": False, "type": type(e).__name__, "message": str(e)}
    except BaseException as e:  # noqa: BLE001 - a crash or a hang is what this looks for
        res["load"] = {"crash": "".join(traceback.format_exception(e))[-3000:]}
    for key, args in (("inspect", [path, "--json"]), ("table", [path, "--width", "250"])):
        try:
            rc, out, err = _cli(["inspect", *args])
            res[key] = {"rc": rc, "out": out, "err": err}
        except BaseException as e:  # noqa: BLE001
            res[key] = {"crash": "".join(traceback.format_exception(e))[-3000:]}
    return res


def main(argv):
    paths = json.load(open(argv[0]))
    warnings.simplefilter("ignore")
    signal.signal(signal.SIGALRM, _alarm)
    results = {}
    for p in paths:
        signal.alarm(PER_CASE_S)
        try:
            results[p] = run_one(p)
        except Hang as e:
            results[p] = {"hang": str(e)}
        finally:
            signal.alarm(0)
        with open(argv[1], "w") as f:  # after every case: a killed run still tells
            json.dump(results, f)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
