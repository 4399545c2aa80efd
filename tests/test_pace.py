"""Pacing of the engine's background thread (medproc.pipeline.pace): the pacer's arithmetic on a
fake clock, the setting, and a stream whose batches start in the consumer's wait."""

import time

import numpy as np
import pytest

from medproc import Spec, make_plan
from medproc.pipeline import Engine, Graph, Job, pace
from medproc.sample_data import ct_phantom, grid_affine


class Clock:
    def __init__(self):
        self.t = 100.0

    def __call__(self):
        return self.t


def test_pacer_waits_a_fraction_of_the_consumers_interval_only_while_batches_are_ready():
    clock = Clock()
    p = pace.Pacer(0.5, clock=clock)
    p.took()
    clock.t += 2.0  # the first interval (start-up, a slow first step) is left out
    p.took()
    assert p.interval is None and p.delay(ready=4) == 0.0
    for _ in range(3):  # takes every 40 ms
        clock.t += 0.040
        p.took()
    assert p.interval == pytest.approx(0.040)
    clock.t += 0.005
    assert p.delay(ready=3) == pytest.approx(0.015)  # half the interval after the take
    assert p.delay(ready=pace.MIN_READY - 1) == 0.0  # behind: work at once
    clock.t += 0.030
    assert p.delay(ready=4) == 0.0  # that moment has passed
    clock.t += 1.0  # a pause (validation, a new epoch): one interval, the median ignores it
    p.took()
    assert p.interval == pytest.approx(0.040)
    for _ in range(pace.WINDOW):  # the loop slows down: the estimate follows
        clock.t += 0.080
        p.took()
    assert p.interval == pytest.approx(0.080)
    p._intervals.extend([10.0] * pace.WINDOW)  # never longer than MAX_WAIT
    assert p.delay(ready=4) == pytest.approx(pace.MAX_WAIT)
    assert pace.Pacer(0.0, clock=clock).delay(ready=4) == 0.0


def test_pace_setting_is_checked(monkeypatch):
    monkeypatch.delenv("MEDPROC_PACE", raising=False)
    assert pace.pace_fraction() == pace.FRACTION
    for good, value in (("0", 0.0), ("0.2", 0.2)):
        monkeypatch.setenv("MEDPROC_PACE", good)
        assert pace.pace_fraction() == value
    for bad in ("x", "-0.1", "1.5"):
        monkeypatch.setenv("MEDPROC_PACE", bad)
        with pytest.raises(ValueError, match="MEDPROC_PACE"):
            pace.pace_fraction()
    with pytest.raises(ValueError, match="pace must lie in"):
        pace.Pacer(5)


def _one_case():
    shape = (32, 32, 12)
    aff = grid_affine(shape, (3.0, 3.0, 4.0), (-50.0, -50.0, -30.0))
    img, _ = ct_phantom(shape, aff, [], seed=0)
    spec = Spec(spacing=3.0)
    return img, make_plan(shape, aff, spec), Graph.from_spec(spec)


def _run(pacer, step_s: float, n: int = 12):
    """Consume ``n`` batches, ``step_s`` each (asleep: the lock released, as in a loop's wait);
    returns each batch's start (its host work) minus the consumer's last take before it, for
    the batches started once the queue was full, and the total time."""
    img, plan, graph = _one_case()
    eng = Engine("cpu", batch_size=1)
    ref = eng.run([Job(img, plan)], graph)[0][0]
    started, took = [], []

    def items():
        for k in range(n):
            started.append(time.perf_counter())
            yield [Job(img, plan)], graph, k

    t0 = time.perf_counter()
    got = []
    for res, k in eng.stream(items(), as_torch=False, ahead=4, pacer=pacer):
        took.append(time.perf_counter())
        got.append(k)
        np.testing.assert_array_equal(res[0][0], ref)
        time.sleep(step_s)
    assert got == list(range(n))
    lags = [s - max(t for t in took if t <= s) for s in started if took and s > took[3]]
    return lags, time.perf_counter() - t0


def test_paced_stream_starts_each_batch_in_the_consumers_wait():
    """A consumer taking a batch every 60 ms: with a fraction of 0.5 the engine's thread starts
    each batch about 30 ms after a take, without pacing at once; results unchanged."""
    lags, _ = _run(None, 0.06)
    assert lags and float(np.median(lags)) < 0.010
    lags, _ = _run(pace.Pacer(0.5), 0.06)
    assert lags and 0.020 < float(np.median(lags)) < 0.050


def test_a_loader_bound_consumer_is_not_slowed():
    """A consumer that takes batches as fast as they come never has two waiting: the thread
    does not wait, and the run takes as long as without pacing."""
    pacer = pace.Pacer(0.5)
    _, paced = _run(pacer, 0.0, n=24)
    assert pacer.waited < 0.005
    _, plain = _run(None, 0.0, n=24)
    assert paced < 1.5 * plain + 0.05
