"""Helpers shared by test modules (a uniquely named module: every test folder has its own conftest)."""

from pathlib import Path

FIXTURES = Path(__file__).parent / "fixtures"


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
