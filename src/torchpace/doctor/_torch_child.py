"""The torch probe and DataLoader smoke test, run by doctor as ``python -c <this text> NUM_WORKERS``.

Never imported by torchpace: doctor reads this file and runs it in a child process under a
timeout, so a torch import, CUDA initialisation or DataLoader worker that crashes or hangs cannot
take doctor down. The child imports nothing from torchpace and measures exactly what a fresh
training process would see in this interpreter and environment.

It prints JSON lines on stdout, each flushed as soon as it is known, so the parent keeps the torch
facts even when the smoke test that follows hangs and is killed:

    {"kind": "torch", ...}   versions, backends, the shared libraries mapped into this process
    {"kind": "smoke", ...}   whether the DataLoader produced its batches
"""

import ctypes
import json
import sys
import time

_SAMPLES = 64  # small enough to take milliseconds, large enough for several batches per worker
_FEATURES = 32
_BATCH_SIZE = 8
_WORKER_TIMEOUT_S = 15  # DataLoader's own per-batch timeout, below the parent's kill timeout


def _emit(kind, payload):
    sys.stdout.write(json.dumps(dict(payload, kind=kind)) + "\n")
    sys.stdout.flush()


def _mapped_libraries():
    """Shared libraries mapped into this process (from /proc/self/maps), Python extensions left out."""
    try:
        with open("/proc/self/maps") as maps:
            lines = maps.read().splitlines()
    except OSError:
        return []
    paths = {line.split(None, 5)[5] for line in lines if len(line.split(None, 5)) == 6}
    names = {p: p.rsplit("/", 1)[-1] for p in paths}
    return sorted(p for p, name in names.items() if ".so" in name and ".cpython-" not in name)


def _cudart_version(paths):
    """``major.minor`` of the libcudart mapped into this process, asked of the library itself."""
    for path in paths:
        if "/libcudart.so" in path:
            version = ctypes.c_int()
            if ctypes.CDLL(path).cudaRuntimeGetVersion(ctypes.byref(version)) == 0:
                return "%d.%d" % (version.value // 1000, version.value % 1000 // 10)
    return None


def _cudnn_versions(torch):
    """(compiled-against, loaded) cuDNN versions as ``major.minor.patch``; None without cuDNN."""
    cudnn = getattr(torch._C, "_cudnn", None)
    if cudnn is None or not torch.version.cuda:
        return None, None
    return ".".join(map(str, cudnn.getCompileVersion())), ".".join(map(str, cudnn.getRuntimeVersion()))


def _nccl_version(torch):
    """``major.minor.patch`` of the NCCL actually loaded; None on builds without NCCL."""
    if not torch.version.cuda or not hasattr(torch._C, "_nccl_version"):
        return None
    import torch.cuda.nccl

    version = torch.cuda.nccl.version()
    return ".".join(map(str, version[:3])) if isinstance(version, tuple) else str(version)


def _parallel_backend(torch):
    for line in torch.__config__.parallel_info().splitlines():
        if line.startswith("ATen parallel backend:"):
            return line.split(":", 1)[1].strip()
    return None


def _torch_facts(torch, import_s):
    facts = {
        "version": torch.__version__,
        "cuda_build": torch.version.cuda,
        "cuda_available": bool(torch.cuda.is_available()),
        "mkl": bool(torch.backends.mkl.is_available()),
        "mkldnn": bool(torch.backends.mkldnn.is_available()),
        "openmp": bool(torch.backends.openmp.is_available()),
        "parallel_backend": _parallel_backend(torch),
        "intra_op_threads": torch.get_num_threads(),
        "import_s": import_s,
        "errors": [],
    }
    facts["device_count"] = torch.cuda.device_count() if facts["cuda_available"] else 0
    for key, probe in (("cudnn", _cudnn_versions), ("nccl_loaded", _nccl_version)):
        try:
            value = probe(torch)
        except (RuntimeError, OSError, AttributeError) as err:
            facts["errors"].append("%s: %s" % (key, err))
            continue
        if key == "cudnn":
            facts["cudnn_build"], facts["cudnn_loaded"] = value
        else:
            facts[key] = value
    facts["loaded_libraries"] = _mapped_libraries()
    try:
        facts["cuda_runtime"] = _cudart_version(facts["loaded_libraries"])
    except (OSError, AttributeError) as err:
        facts["errors"].append("cuda_runtime: %s" % err)
    return facts


def _smoke(torch, num_workers):
    from torch.utils.data import DataLoader, TensorDataset

    pin = bool(torch.cuda.is_available())
    data = torch.arange(_SAMPLES * _FEATURES, dtype=torch.float32).reshape(_SAMPLES, _FEATURES)
    loader = DataLoader(
        TensorDataset(data, torch.arange(_SAMPLES)),
        batch_size=_BATCH_SIZE,
        num_workers=num_workers,
        pin_memory=pin,
        timeout=_WORKER_TIMEOUT_S,
    )
    result = {"num_workers": num_workers, "pin_memory": pin, "expected_batches": _SAMPLES // _BATCH_SIZE}
    start = time.perf_counter()
    batches, pinned = 0, True
    try:
        for features, _ in loader:
            batches += 1
            pinned = pinned and features.is_pinned()
    except (RuntimeError, OSError) as err:
        result["error"] = "%s: %s" % (type(err).__name__, err)
    result.update(batches=batches, pinned=pinned if pin else None, elapsed_s=time.perf_counter() - start)
    return result


def main(argv):
    num_workers = int(argv[1]) if len(argv) > 1 else 2
    start = time.perf_counter()
    try:
        import torch
    except (ImportError, OSError) as err:
        # Not installed is a different answer from installed-but-broken (a missing .so, say).
        missing = isinstance(err, ModuleNotFoundError) and err.name == "torch"
        _emit("torch", {"missing": missing, "error": "%s: %s" % (type(err).__name__, err)})
        return 0
    _emit("torch", _torch_facts(torch, time.perf_counter() - start))
    _emit("smoke", _smoke(torch, num_workers))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
