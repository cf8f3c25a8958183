"""Real torchrun on CPU over gloo: ranks, OMP_NUM_THREADS, a preloaded allocator really mapped, NUMA
binding through real numactl, and two "nodes" on this host joining one world over c10d."""

from __future__ import annotations


from launch_helpers import WORKERS, free_port, read_reports, run_launch, start_launch

REPORT = str(WORKERS / "rank_report.py")


def test_two_processes_over_gloo_with_jemalloc_and_numa_binding(tmp_path, child_env, system_packages):
    args = ["--nproc-per-node", "2", "--allocator", "jemalloc", "--numa", "node", "--nofile", "4096",
            "--", REPORT, str(tmp_path), "--gloo"]
    result = run_launch(args, child_env)
    assert result.returncode == 0, result.stderr[-3000:]
    reports = read_reports(tmp_path)
    assert sorted(reports) == [0, 1]
    for rank, report in reports.items():
        assert (report["rank"], report["world_size"], report["sum"]) == (rank, 2, 2.0)
        assert report["env"]["OMP_NUM_THREADS"] == "1" and report["torch_threads"] == 1  # 2 cores / 2 ranks
        assert "libjemalloc.so" in report["maps"] and report["env"]["MALLOC_CONF"]
        assert report["affinity"] == [rank]  # numactl gave each rank its own CPU
        assert report["env"]["GOMP_CPU_AFFINITY"] == str(rank)
        assert report["nofile"][0] == 4096
        assert "TORCHPACE_LAUNCH_BINDINGS" not in report["env"]


def test_tcmalloc_is_really_mapped_in_a_plain_exec(tmp_path, child_env, system_packages):
    result = run_launch(["--allocator", "tcmalloc", "--", REPORT, str(tmp_path)], child_env)
    assert result.returncode == 0, result.stderr
    report = read_reports(tmp_path)[0]
    assert "libtcmalloc" in report["maps"] and "libjemalloc" not in report["maps"]
    assert report["env"]["OMP_NUM_THREADS"] == "2"


def test_auto_allocator_preloads_jemalloc_when_installed(tmp_path, child_env, system_packages):
    result = run_launch(["--", REPORT, str(tmp_path)], child_env)
    assert result.returncode == 0, result.stderr
    assert "libjemalloc.so" in read_reports(tmp_path)[0]["maps"]


def test_two_nodes_on_this_host_form_one_world_of_four(tmp_path, child_env):
    endpoint = f"127.0.0.1:{free_port()}"
    common = ["--nnodes", "2", "--nproc-per-node", "2", "--rdzv-endpoint", endpoint, "--allocator", "system"]
    nodes = [start_launch([*common, "--node-rank", str(rank), "--", REPORT, str(tmp_path), "--gloo"], child_env)
             for rank in (0, 1)]
    outputs = []
    try:
        for node in nodes:
            outputs.append(node.communicate(timeout=120))
    finally:
        for node in nodes:
            if node.poll() is None:
                node.kill()
    assert [n.returncode for n in nodes] == [0, 0], [err[-2000:] for _, err in outputs]
    reports = read_reports(tmp_path)
    assert sorted(reports) == [0, 1, 2, 3]
    assert {(r["world_size"], r["sum"]) for r in reports.values()} == {(4, 4.0)}
    assert sorted(r["rank"] for r in reports.values()) == [0, 1, 2, 3]
    assert {r["env"]["OMP_NUM_THREADS"] for r in reports.values()} == {"1"}
