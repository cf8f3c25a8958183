"""Distribution-specific remedies: package manager and package names from /etc/os-release facts."""

from __future__ import annotations

import pytest
from doctor_canned import FIXTURES

from torchpace.doctor import remedies
from torchpace.host import DistroInfo, parse_os_release

DEBIAN12 = DistroInfo(id="debian", version_id="12")
DEBIAN13 = DistroInfo(id="debian", version_id="13")
UBUNTU2204 = DistroInfo(id="ubuntu", id_like=("debian",), version_id="22.04")
UBUNTU2404 = DistroInfo(id="ubuntu", id_like=("debian",), version_id="24.04")
ROCKY9 = DistroInfo(id="rocky", id_like=("rhel", "centos", "fedora"), version_id="9.3")
ALMA8 = DistroInfo(id="almalinux", id_like=("rhel", "centos", "fedora"), version_id="8.9")
CENTOS7 = DistroInfo(id="centos", id_like=("rhel", "fedora"), version_id="7")
FEDORA40 = DistroInfo(id="fedora", version_id="40")
AMZN2 = DistroInfo(id="amzn", id_like=("centos", "rhel", "fedora"), version_id="2")
ARCH = DistroInfo(id="arch")


@pytest.mark.parametrize("distro, manager", [
    (DEBIAN12, "apt-get"), (UBUNTU2204, "apt-get"), (ROCKY9, "dnf"), (ALMA8, "dnf"), (FEDORA40, "dnf"),
    (CENTOS7, "yum"), (AMZN2, "yum"), (ARCH, None),
])
def test_package_manager(distro, manager):
    assert remedies.package_manager(distro) == manager


@pytest.mark.parametrize("distro, key, root, command", [
    (DEBIAN12, "jemalloc", True, "apt-get install -y libjemalloc2"),
    (UBUNTU2204, "jemalloc", False, "sudo apt-get install -y libjemalloc2"),
    (ROCKY9, "jemalloc", False, "sudo dnf install -y jemalloc"),
    (CENTOS7, "jemalloc", True, "yum install -y jemalloc"),
    (DEBIAN12, "tcmalloc", True, "apt-get install -y libgoogle-perftools4"),
    (DEBIAN13, "tcmalloc", True, "apt-get install -y libgoogle-perftools4t64"),  # 64-bit time_t rename
    (UBUNTU2404, "tcmalloc", True, "apt-get install -y libgoogle-perftools4t64"),
    (ROCKY9, "tcmalloc", True, "dnf install -y gperftools-libs"),
    (DEBIAN12, "cpupower", True, "apt-get install -y linux-cpupower"),
    (UBUNTU2204, "cpupower", True, "apt-get install -y linux-tools-common linux-tools-generic"),
    (FEDORA40, "cpupower", True, "dnf install -y kernel-tools"),
    (AMZN2, "numactl", True, "yum install -y numactl"),
    (ROCKY9, "python-venv", True, None),  # venv ships with python3 there
    (ARCH, "jemalloc", True, None),
])
def test_install_command(distro, key, root, command):
    assert remedies.install_command(distro, key, root) == command


def test_nvidia_smi_on_ubuntu_follows_the_driver_branch():
    assert remedies.nvidia_smi_install_command(UBUNTU2204, "535.183.01", True) == "apt-get install -y nvidia-utils-535"
    assert remedies.nvidia_smi_install_command(DEBIAN12, "535.183.01", True) == "apt-get install -y nvidia-smi"


def test_unknown_distro_gets_package_names_for_both_families():
    assert remedies.install_hint("jemalloc") == "debian: libjemalloc2, rhel: jemalloc"


@pytest.mark.parametrize("tree, manager", [("debian12-vm", "apt-get"), ("rocky9-numa-cgroup2", "dnf"),
                                           ("ubuntu2204-docker-cgroup1", "apt-get")])
def test_os_release_fixtures(tree, manager):
    distro = parse_os_release((FIXTURES / tree / "etc/os-release").read_text())
    assert remedies.package_manager(distro) == manager
