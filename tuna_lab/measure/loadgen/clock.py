"""The open loop's clock: a ``timerfd`` armed at each send time, and how late this machine wakes.

:func:`tuna_lab.measure.loadgen.wire.drive` sleeps in ``epoll`` until the next
scheduled send of an open loop, on one :class:`TimerFd`; :func:`wake_lag`
sleeps through a schedule the same way and sends nothing, which gives the
floor of an open loop's send lag on this machine.

Examples
--------
>>> timer = TimerFd()
>>> timer.arm(1.5); timer.armed
1.5
>>> timer.close()
"""

import ctypes
import os
import select
import time

__all__ = ["MAX_WAIT", "TimerFd", "wake_lag"]

#: Longest wait of one epoll call when nothing is due (s): bounds how late a
#: deadline is noticed if the clock and the timeouts disagree.
MAX_WAIT = 1.0


class TimerFd:
    """A ``timerfd`` on CLOCK_MONOTONIC (the clock of :func:`time.monotonic`), armed at absolute times.

    Python 3.11 has no ``os.timerfd_*``: the two calls go through ctypes
    (they release the GIL, as any foreign call).
    """

    class _Timespec(ctypes.Structure):
        _fields_ = [("tv_sec", ctypes.c_long), ("tv_nsec", ctypes.c_long)]

    class _Itimerspec(ctypes.Structure):
        _fields_ = [("it_interval", ctypes.c_long * 2), ("it_value", ctypes.c_long * 2)]

    def __init__(self):
        libc = ctypes.CDLL(None, use_errno=True)
        self._settime = libc.timerfd_settime
        self._spec = self._Itimerspec()
        # CLOCK_MONOTONIC = 1; TFD_NONBLOCK | TFD_CLOEXEC.
        self.fd = libc.timerfd_create(1, os.O_NONBLOCK | os.O_CLOEXEC)
        if self.fd < 0:
            raise OSError(ctypes.get_errno(), "timerfd_create failed")
        self._ref = ctypes.byref(self._spec)
        self.armed = None

    def arm(self, when):
        """Fire at monotonic time ``when`` (seconds); re-arming replaces the previous time."""
        if when == self.armed:
            return
        sec = int(when)
        # it_value 0 would disarm: a time at 0 s cannot be meant, but keep it > 0.
        self._spec.it_value[0], self._spec.it_value[1] = sec, max(1, int((when - sec) * 1e9))
        # TFD_TIMER_ABSTIME = 1. Re-arming also clears an expiry not yet read.
        if self._settime(self.fd, 1, self._ref, None) != 0:
            raise OSError(ctypes.get_errno(), "timerfd_settime failed")
        self.armed = when

    def close(self):
        os.close(self.fd)


def wake_lag(rate=1000.0, duration=3.0, seed=0):
    """How late this machine wakes a thread at a timer's time: the send lag of a generator that sends nothing.

    Sleeps through a Poisson schedule at ``rate`` per second the way
    :func:`drive` does (one ``timerfd`` armed at each time, waited for in
    ``epoll``) and records how late each wake-up is. An open loop's send lag
    cannot be lower: when this p99 is high, the machine is busy (other
    runnable threads on the same CPUs), not the generator slow.

    Parameters
    ----------
    rate : float
        Wake-ups per second.
    duration : float
        Seconds.
    seed : int

    Returns
    -------
    dict
        ``wakeups``, ``lag_p50``, ``lag_p99``, ``lag_max`` (seconds).

    Examples
    --------
    >>> wake_lag(rate=200.0, duration=0.2)["lag_p99"] >= 0
    True
    """
    import random

    draw = random.Random(seed).expovariate
    timer, ep = TimerFd(), select.epoll()
    lags = []
    try:
        ep.register(timer.fd, select.EPOLLIN | select.EPOLLET)
        start = time.monotonic()
        due = start
        while True:
            due += draw(rate)
            if due - start >= duration:
                break
            timer.arm(due)
            while (now := time.monotonic()) < due:
                ep.poll(MAX_WAIT)
            lags.append(now - due)
    finally:
        ep.close()
        timer.close()
    lags.sort()
    if not lags:
        return {"wakeups": 0, "lag_p50": float("nan"), "lag_p99": float("nan"), "lag_max": float("nan")}

    def pick(q):  # linear interpolation, as numpy.percentile
        pos = q * (len(lags) - 1)
        low = int(pos)
        high = min(low + 1, len(lags) - 1)
        return lags[low] + (lags[high] - lags[low]) * (pos - low)

    return {"wakeups": len(lags), "lag_p50": pick(0.5), "lag_p99": pick(0.99), "lag_max": lags[-1]}
