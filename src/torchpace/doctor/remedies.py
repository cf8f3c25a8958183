"""Remedies that depend on the distribution: which package manager, which package name.

Pure functions of `DistroInfo` (from /etc/os-release): Debian and Ubuntu use apt-get; RHEL,
CentOS, Rocky, Alma, Oracle Linux, Amazon Linux and Fedora use dnf, or yum on the releases that
predate dnf (RHEL/CentOS/Oracle 7, Amazon Linux 2). Package names differ between the families and,
after Debian's 64-bit time_t transition, between releases of the same family.
"""

from __future__ import annotations

from torchpace.host import DistroInfo

# package key -> {family or distro id -> package name(s)}. A distro id entry beats its family's.
_PACKAGES: dict[str, dict[str, str]] = {
    "jemalloc": {"debian": "libjemalloc2", "rhel": "jemalloc"},
    "tcmalloc": {"debian": "libgoogle-perftools4", "rhel": "gperftools-libs"},
    "numactl": {"debian": "numactl", "rhel": "numactl"},
    "cpupower": {"debian": "linux-cpupower", "ubuntu": "linux-tools-common linux-tools-generic", "rhel": "kernel-tools"},
    "nvidia-smi": {"debian": "nvidia-smi", "rhel": "nvidia-driver-cuda"},
    "python-venv": {"debian": "python3-venv"},
}

# Releases from which a library package carries the t64 suffix (Debian's 64-bit time_t transition).
_T64_SINCE = {"debian": (13,), "ubuntu": (24, 4)}
_T64_PACKAGES = {"libgoogle-perftools4": "libgoogle-perftools4t64"}

# RHEL-family releases older than these still use yum.
_DNF_SINCE = {"rhel": (8,), "centos": (8,), "ol": (8,), "amzn": (2022,)}


def _version_tuple(version_id: str) -> tuple[int, ...]:
    """``"24.04"`` -> ``(24, 4)``; non-numeric parts end the tuple."""
    parts = []
    for part in version_id.split("."):
        if not part.isdigit():
            break
        parts.append(int(part))
    return tuple(parts)


def package_manager(distro: DistroInfo) -> str | None:
    """``apt-get``, ``dnf``, ``yum``, or None when the distribution is not one doctor knows."""
    if distro.family == "debian":
        return "apt-get"
    if distro.family != "rhel":
        return None
    since = _DNF_SINCE.get(distro.id)
    version = _version_tuple(distro.version_id)
    if since is not None and version and version < since:
        return "yum"
    return "dnf"


def package_name(distro: DistroInfo, key: str) -> str | None:
    """The distribution's package name(s) for `key` (e.g. ``jemalloc``), or None when unknown."""
    names = _PACKAGES.get(key, {})
    name = names.get(distro.id) or names.get(distro.family)
    if name is None:
        return None
    since = _T64_SINCE.get(distro.id)
    if since is not None and _version_tuple(distro.version_id) >= since:
        name = " ".join(_T64_PACKAGES.get(n, n) for n in name.split())
    return name


def as_admin(command: str, is_root: bool) -> str:
    """`command` prefixed with ``sudo`` unless doctor already runs as root."""
    return command if is_root else f"sudo {command}"


def install_command(distro: DistroInfo, key: str, is_root: bool = False) -> str | None:
    """The exact install command for `key` on this distribution, or None when there is none.

    Examples: ``sudo apt-get install -y libjemalloc2`` on Debian, ``sudo dnf install -y jemalloc``
    on Rocky 9, ``sudo yum install -y jemalloc`` on CentOS 7.
    """
    manager, name = package_manager(distro), package_name(distro, key)
    if manager is None or name is None:
        return None
    return as_admin(f"{manager} install -y {name}", is_root)


def nvidia_smi_install_command(distro: DistroInfo, driver_version: str | None, is_root: bool = False) -> str | None:
    """Install command for ``nvidia-smi``: on Ubuntu it comes in ``nvidia-utils-<driver branch>``."""
    if distro.id == "ubuntu" and driver_version:
        branch = driver_version.split(".")[0]
        return as_admin(f"apt-get install -y nvidia-utils-{branch}", is_root)
    return install_command(distro, "nvidia-smi", is_root)


def install_hint(key: str) -> str:
    """Package names for both families, for hosts whose distribution doctor does not know."""
    names = _PACKAGES.get(key, {})
    return ", ".join(f"{family}: {name}" for family, name in names.items())
