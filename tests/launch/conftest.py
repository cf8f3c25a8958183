"""The launch tests' setting: real processes, `torchpace launch` in a subprocess, real torchrun, real
numactl and allocators. jemalloc, tcmalloc-minimal and numactl come from apt (the session fixture
`system_packages` in tests/conftest.py installs them where the tests run as root with apt-get, which is
how they get onto CI); elsewhere the tests that need them skip with the reason. The clean child
environment (`child_env`) is shared with the script-mode tests, in tests/conftest.py.
"""
