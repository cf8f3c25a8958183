"""`torchpace doctor`: is this host set up right for PyTorch?

Three layers, as in ``torch.utils.collect_env``:

- `probes` touch the world (``/proc``, ``/sys``, ``/etc`` under an injectable root, NVML, one
  Python child process that imports torch) and return a frozen `DoctorFacts`; they never raise;
- `checks` are pure functions ``DoctorFacts -> list[Finding]``;
- `render` turns findings into Rich text grouped by area, or the JSON document of `schema`.

Nothing here imports torch in the doctor's own process: torch is probed in a child process with
a timeout, so a torch import or CUDA initialisation that crashes or hangs cannot take doctor down.

Entry points: `torchpace.doctor.probes.collect_facts`, `torchpace.doctor.checks.run_checks`,
`torchpace.doctor.render.render_text` / `render_json`. This package imports nothing at import time.
"""
