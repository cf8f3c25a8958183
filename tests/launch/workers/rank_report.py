"""A launched test worker: writes OUT_DIR/rank-<RANK>.json with what it runs with.

Usage: rank_report.py OUT_DIR [--gloo]. The report holds the env, /proc/self/maps (which shared
libraries are really loaded), the CPU affinity, RLIMIT_NOFILE and, with --gloo, the world it joined.
"""

import json
import os
import resource
import sys


def main(out_dir, gloo):
    report = {
        "pid": os.getpid(),
        "env": dict(os.environ),
        "maps": open("/proc/self/maps").read(),
        "affinity": sorted(os.sched_getaffinity(0)),
        "nofile": list(resource.getrlimit(resource.RLIMIT_NOFILE)),
    }
    if gloo:
        import torch
        import torch.distributed as dist

        dist.init_process_group("gloo")
        total = torch.ones(1)
        dist.all_reduce(total)
        report.update(rank=dist.get_rank(), world_size=dist.get_world_size(), sum=total.item(),
                      torch_threads=torch.get_num_threads())
        dist.destroy_process_group()
    path = os.path.join(out_dir, f"rank-{os.environ.get('RANK', '0')}.json")
    with open(path + ".tmp", "w") as f:
        json.dump(report, f)
    os.replace(path + ".tmp", path)


if __name__ == "__main__":
    main(sys.argv[1], "--gloo" in sys.argv[2:])
