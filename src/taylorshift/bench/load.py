"""Background load of the CPU (Linux ``/proc/stat``), to tell quiet timings from noisy ones.

On a shared machine other processes slow a timed call down and spread its times. The share
of the machine's CPUs they used while a point was timed is recorded with the point; a point
above :data:`NOISY_SHARE` can be timed again once they use at most :data:`QUIET_SHARE`.
"""

from __future__ import annotations

import os
import time

__all__ = ["NOISY_SHARE", "QUIET_SHARE", "CpuLoad"]

# Other processes using more than this share of the CPUs while a point is timed make it
# "noisy": it is timed once more after waiting for the machine to calm down (full runs).
NOISY_SHARE = 0.2
QUIET_SHARE = 0.1
MIN_LOAD_WINDOW_S = 0.2  # shorter timings get no load figure (other_cpu_share = None)


class CpuLoad:
    """The share of the machine's CPUs that *other* processes use, between two samples."""

    @staticmethod
    def sample() -> tuple[float, float, float] | None:
        """(wall s, busy CPU s of the machine, CPU s of this process), or None off Linux."""
        try:
            with open("/proc/stat") as f:
                fields = [int(x) for x in f.readline().split()[1:9]]
        except (OSError, ValueError):
            return None
        # user nice system idle iowait irq softirq steal: busy = all but idle, iowait, steal
        busy = sum(fields) - fields[3] - fields[4] - fields[7]
        own = os.times()
        return time.perf_counter(), busy / os.sysconf("SC_CLK_TCK"), own.user + own.system

    @staticmethod
    def other_share(before, after) -> float | None:
        if before is None or after is None:
            return None
        wall = after[0] - before[0]
        if wall < MIN_LOAD_WINDOW_S:  # /proc/stat counts in clock ticks (10 ms): too coarse
            return None
        others = (after[1] - before[1]) - (after[2] - before[2])
        return max(0.0, others) / (wall * (os.cpu_count() or 1))

    def wait_quiet(self, limit_s: float, window_s: float = 0.25) -> float:
        """Sleep in short windows until others use <= QUIET_SHARE or ``limit_s`` passed."""
        waited = 0.0
        while waited < limit_s:
            before = self.sample()
            time.sleep(window_s)
            waited += window_s
            share = self.other_share(before, self.sample())
            if share is None or share <= QUIET_SHARE:
                break
        return waited
