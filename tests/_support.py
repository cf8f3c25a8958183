"""Helpers shared by test modules (a uniquely named module: every test folder has its own conftest)."""

from pathlib import Path

FIXTURES = Path(__file__).parent / "fixtures"
# Variables the launcher decides on; launch and script-mode tests start children without them, so
# "auto" (or the config) is what the children see.
DECIDED_ENV = ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "LD_PRELOAD", "MALLOC_CONF", "GOMP_CPU_AFFINITY", "KMP_AFFINITY",
               "PYTHONPATH", "TORCHPACE_LAUNCH_CONFIG", "TORCHPACE_LAUNCH_BINDINGS", "TORCH_NCCL_ASYNC_ERROR_HANDLING",
               "TORCHPACE_SCRIPT_MEASURE")


def fixture_workload(name: str) -> str:
    """Workload spec of a planted workload in tests/fixtures/workloads.py."""
    return f"{FIXTURES / 'workloads.py'}:{name}"


def sigint_as_at_a_terminal() -> None:
    """`preexec_fn` of a child that a test interrupts with SIGINT: SIGINT at its default. A test suite
    started in the background (`make test &`) inherits SIGINT ignored, and a child keeps an ignored
    signal ignored (as nohup relies on): then there would be no Ctrl-C to deliver."""
    import signal

    signal.signal(signal.SIGINT, signal.SIG_DFL)


_APT_TIMEOUT_S = 600


def apt_install(packages: tuple[str, ...], present) -> str | None:
    """Install Debian `packages` with apt-get unless `present()` already holds (root only).

    Returns:
        None when they are present (now), else why not: the reason a test skips with.
    """
    import os
    import shutil
    import subprocess

    if present():
        return None
    if os.geteuid() != 0 or shutil.which("apt-get") is None:
        return f"needs {', '.join(packages)}: install them, or run as root where apt-get is available"
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    argv = ["apt-get", "install", "-y", "--no-install-recommends", *packages]
    done = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=_APT_TIMEOUT_S)
    if done.returncode != 0:  # a fresh image has no package lists yet
        subprocess.run(["apt-get", "update"], env=env, capture_output=True, text=True, timeout=_APT_TIMEOUT_S)
        done = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=_APT_TIMEOUT_S)
    return None if present() else f"apt-get install {' '.join(packages)} failed: {done.stderr.strip()[-500:]}"


def restore_recorded_study(path: Path, url: str, host, workload: str) -> str:
    """The study recorded in `path` (tests/fixtures/studies), restored into Optuna storage `url` as if tuned
    on this host with `workload`; returns its name."""
    import json

    import optuna
    from optuna.distributions import json_to_distribution

    doc = json.loads(Path(path).read_text())
    meta = {**doc["user_attrs"]["torchpace"], "workload": workload, "host_fingerprint": host.fingerprint(),
            "host": host.summary()}
    study = optuna.create_study(study_name=doc["study_name"], storage=url, direction="maximize")
    study.set_user_attr("torchpace", meta)
    for trial in doc["trials"]:
        study.add_trial(optuna.trial.create_trial(
            state=optuna.trial.TrialState[trial["state"]], value=trial["value"], params=trial["params"],
            distributions={k: json_to_distribution(v) for k, v in trial["distributions"].items()},
            user_attrs=trial["user_attrs"], system_attrs=trial["system_attrs"]))
    return doc["study_name"]


def assert_windows_match_stamps(bench: dict, stamps_path: Path) -> None:
    """A script-mode bench's measured windows each took as long as the same steps timed by the script's own
    clock (one timestamp per step, written by the script or its framework's callback, not by torchpace).

    The meter starts at the end of step 1 (the script's stamp 0), then `warmup_steps` steps, then
    windows of equal size; the hook ends the process inside the last step, so that window has no end
    stamp and is left out. The hook reads its clock inside a step (at its optimizer step) and the script
    stamps the step after it, so each end of a window lies inside the step whose stamp closes it; the
    meter's own bookkeeping between two windows lies inside that step too. A window therefore differs
    from the script's clock over its steps by less than the step at its start (the window may start
    later in it) or the step at its end (it may end earlier in it): exact, however busy the host, and
    tighter than any fixed share on a quiet host.
    """
    stamps = [float(line) for line in stamps_path.read_text().split()]
    size = bench["measured_steps"] // bench["windows"]
    first = bench["warmup_steps"]
    complete = min(bench["windows"], (len(stamps) - 1 - first) // size)
    assert first >= 1 and complete >= 1, (f"{bench['windows']} window(s) of {size} steps after {first} warm-up steps, "
                                          f"{len(stamps)} stamps; stopped by {bench['stopped_by']}")
    for index, rate in enumerate(bench["window_steps_per_s"][:complete]):
        start, end = first + index * size, first + (index + 1) * size
        inside_s, outside_s = size / rate, stamps[end] - stamps[start]
        start_step_s, end_step_s = stamps[start] - stamps[start - 1], stamps[end] - stamps[end - 1]
        # pytest does not rewrite this helper's asserts: the figures are in the message, so a failure explains itself
        assert -end_step_s - _CLOCK_SLACK_S < inside_s - outside_s < start_step_s + _CLOCK_SLACK_S, (
            f"window {index + 1} of {complete} ({size} steps) took {inside_s:.4f} s by torchpace's clock, "
            f"{outside_s:.4f} s by the script's over the same steps, beyond the steps at its ends "
            f"({start_step_s:.4f} s, {end_step_s:.4f} s); stopped by {bench['stopped_by']}, "
            f"other load {bench.get('other_load_cores')}")


_CLOCK_SLACK_S = 1e-6  # a window's time is recomputed from its rate, steps / seconds: float rounding only


# The hosts the knob-applicability tests run under (`TORCHPACE_HOST_FACTS`, or `override_host_facts`
# in-process): a test may assume only what the facts it runs under show, never the CPU it happens to run on.
FAKED_HOSTS = {
    "no-bf16, one NUMA node": {"bf16": False, "numa_nodes": 1},
    "native bf16": {"bf16": True},
}


def faked_host(name: str):
    """This machine's facts as faked host `name` shows them."""
    from torchpace.host import override_host_facts, probe_host

    return override_host_facts(probe_host(), FAKED_HOSTS[name])


def faked_host_env(name: str) -> dict[str, str]:
    """The environment variable that makes a torchpace process see faked host `name`."""
    import json

    from torchpace.host import HOST_FACTS_ENV

    return {HOST_FACTS_ENV: json.dumps(FAKED_HOSTS[name])}


def hosts_where_verdicts_differ(name: str, value, target, hosts: dict) -> list[str]:
    """The faked hosts a knob's check runs under: the first, and each other one where knob `name` with
    `value` gets another verdict (applies, or not) for `target`, so no check runs twice for nothing."""
    from torchpace.knobs import REGISTRY

    knob, seen, chosen = REGISTRY[name], set(), []
    for host_name, host in hosts.items():
        verdict = (knob.applies(host, target) or knob.value_applies(value, host, target)) is None
        if verdict not in seen:
            seen.add(verdict)
            chosen.append(host_name)
    return chosen


def fill_disk(directory) -> None:
    """Write into `directory` until its filesystem is full (the filler stays: the disk stays full)."""
    with open(directory / "filler", "wb", buffering=0) as fh:
        for size in (65536, 512, 1):  # large writes first, then the last bytes
            try:
                while True:
                    fh.write(b"\0" * size)
            except OSError:
                continue  # ENOSPC at this size: the smaller ones fill what is left


def temp_leftovers(root) -> list:
    """torchpace's temporary folders and files left under `root` (trial and profile folders, `.tmp-` files)."""
    from pathlib import Path

    root = Path(root)
    return sorted([*root.glob("torchpace-*"), *root.rglob(".*.tmp-*")])


def trial_snapshot(pid: int) -> tuple[list, list, list]:
    """The trial processes under `pid` at one moment, as (arms, their children, arms stopped for their turn).

    An arm is a process running `torchpace.trial` whose parent is not one (it runs under its keeper); its
    children are its DataLoader workers. A worker exits at each epoch's end and stays a zombie until its arm
    reaps it, so a process that ends or is a zombie while the snapshot is read is left out of it, not an error.
    """
    import psutil

    live = []
    for process in psutil.Process(pid).children(recursive=True):
        try:
            status = process.status()
            if status != psutil.STATUS_ZOMBIE:
                live.append((process, process.ppid(), status, " ".join(process.cmdline())))
        except psutil.NoSuchProcess:  # ZombieProcess is one: it ended between two reads
            continue
    trial_pids = {process.pid for process, _, _, cmdline in live if "torchpace.trial" in cmdline}
    arms = [(process, status) for process, ppid, status, _ in live if process.pid in trial_pids and ppid not in trial_pids]
    arm_pids = {process.pid for process, _ in arms}
    children = [process for process, ppid, _, _ in live if ppid in arm_pids]
    return [p for p, _ in arms], children, [p for p, status in arms if status == psutil.STATUS_STOPPED]


def still_running(pids, timeout_s: float = 30.0) -> list[int]:
    """The pids still running after up to `timeout_s` (one that ended, reaped or a zombie, counts as gone)."""
    import time

    import psutil

    deadline = time.monotonic() + timeout_s
    while True:
        alive = []
        for pid in pids:
            try:
                if psutil.Process(pid).status() != psutil.STATUS_ZOMBIE:
                    alive.append(pid)
            except psutil.NoSuchProcess:
                pass
        if not alive or time.monotonic() >= deadline:
            return alive
        time.sleep(0.05)
