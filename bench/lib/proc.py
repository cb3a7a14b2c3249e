"""What /proc tells about CPU time and memory: of the whole box, of processes, and a meter of
both over a timed part."""

import os
import time

TICKS = os.sysconf("SC_CLK_TCK")


def box_cpu():
    """(busy_ticks, total_ticks) of the whole box from /proc/stat."""
    with open("/proc/stat") as f:
        fields = [int(x) for x in f.readline().split()[1:]]
    # user nice system idle iowait irq softirq steal guest guest_nice; guest* are in user/nice.
    total = sum(fields[:8])
    idle = fields[3] + fields[4]
    return total - idle, total


def _stat_fields(pid):
    """The fields of /proc/PID/stat after the command name (state first), or None if the
    process is gone."""
    try:
        with open("/proc/%s/stat" % pid) as f:
            data = f.read()
    except OSError:
        return None
    return data[data.rindex(")") + 2:].split()


def proc_cpu_faults(pid):
    """(utime+stime ticks, minor page faults) of a process, all its threads, or None if it
    is gone."""
    rest = _stat_fields(pid)
    return None if rest is None else (int(rest[11]) + int(rest[12]), int(rest[7]))


def proc_cpu(pid):
    """utime+stime ticks of a process (all its threads), or None if it is gone."""
    both = proc_cpu_faults(pid)
    return None if both is None else both[0]


def proc_status(pid):
    """VmRSS, RssAnon, RssFile, RssShmem and VmHWM of a process in kB, or None if it is gone."""
    out = {}
    try:
        with open("/proc/%d/status" % pid) as f:
            for line in f:
                k, _, v = line.partition(":")
                if k in ("VmRSS", "RssAnon", "RssFile", "RssShmem", "VmHWM"):
                    out[k] = int(v.split()[0])  # kB
    except OSError:
        return None
    return out


def children_of(ppid):
    """The pids whose parent is ppid."""
    pids = []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        rest = _stat_fields(name)
        if rest is not None and int(rest[1]) == ppid:
            pids.append(int(name))
    return pids


class CpuMeter:
    """CPU used between start() and stop(): whole box, and named process groups (their minor
    page faults too)."""

    def __init__(self, groups):
        self.groups = groups  # name -> callable returning a list of pids

    def _sample(self):
        per_pid = {}
        for name, pids_fn in self.groups.items():
            for pid in pids_fn():
                t = proc_cpu_faults(pid)
                if t is not None:
                    per_pid[(name, pid)] = t
        return box_cpu(), per_pid

    def start(self):
        self.t0 = time.monotonic()
        self.s0 = self._sample()

    def stop(self):
        """{"box_s", "box_total_s", "wall_s", "<group>_s" for each group} in seconds, and
        "<group>_faults" (minor page faults) for each group."""
        s1 = self._sample()
        self.elapsed = time.monotonic() - self.t0
        (b0, tot0), p0 = self.s0
        (b1, tot1), p1 = s1
        res = {"box_s": (b1 - b0) / TICKS, "box_total_s": (tot1 - tot0) / TICKS,
               "wall_s": self.elapsed}
        for name in self.groups:
            used = faults = 0
            for (n, pid), (t, f) in p1.items():
                if n == name:
                    t0, f0 = p0.get((n, pid), (0, 0))  # processes born mid-run count from 0
                    used += t - t0
                    faults += f - f0
            res[name + "_s"] = used / TICKS
            res[name + "_faults"] = faults
        return res
