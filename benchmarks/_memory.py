"""Peak resident memory of this process, for the benchmarks' child processes."""

from __future__ import annotations

import resource


def peak_rss_kb() -> int:
    """This process's peak RSS so far, kB. VmHWM (Linux) belongs to the process image after
    its exec; `ru_maxrss` also keeps the RSS the process had before its exec, i.e. the
    parent's at fork, so it is only the fallback (other systems)."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1])
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
