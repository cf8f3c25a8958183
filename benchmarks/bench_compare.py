"""Paired comparisons against comparing two separate runs (run: `make bench-compare`, `ARGS="--busy 2"`).

Each case asks "is B faster than A?" `--repeats` times, two ways, interleaved:

- paired (`torchpace compare`): A and B as two trial processes taking turns on the host, the median of
  the per-round ratios with its 95% CI (`torchpace.trial.pair.run_pair`);
- separate (the method before): A measured, then B measured, each a trial process of its own, the
  ratio of their two figures (each with its own CI).

Each paired line also gives the same turns as rounds centred on B alone (each B turn against the mean
of the A turns on either side, as paired rounds were made before every three turns became a round):
there each A turn frames two rounds and each B turn one, which leans the median towards B when some
turns are many times slower than the rest.

The cases: `aa` (tabular against itself: the ratio should be 1, and its CI should contain 1 and be
narrow), `aav` (the same for `vision`, whose convolutions work on far more memory per step: run with a
short `--max-time`, such as a tune's 6-8 s trials, and many `--repeats`, it shows whether the CIs of
short comparisons hold 1 as often as a 95% CI should, 19 times in 20), `aa1` (the same with one intra-op thread: beside busy processes two OpenMP threads switch
between a fast and a 20-100x slower regime from one turn to the next, one thread does not),
`workers` (a loader whose items sleep 25 ms, 1 DataLoader worker against 2: a 2x effect that does
not depend on the CPU), `threads` (tabular with 2 intra-op threads against 1: an effect that depends
on how many cores other processes leave free), `kept` (tabular against itself, arm A a process kept from
a comparison before, as a tune's incumbent is, arm B a new one with guard steps, as a tune's candidate
is: the ratio should be 1, else a kept arm is not measured like a new one), `aalat` (the built-in `inference`
against itself under the latency objective: each turn times single batch-1 calls and counts as 1 / its median
call; separate runs compare the two runs' p50s). `--busy N` runs N processes that spin
(`while True: pass`) for the whole benchmark, as another user's jobs would.

`--plain-loop SECONDS` first times the `tabular` step in a plain loop with no torchpace in it
(`plain_loop.py`), with 2 intra-op threads and with 1, alternately `--repeats` times, each a fresh
process beside the same busy processes: steps/s over each quarter second, their range, and the share of
quarter seconds slower than a third of the run's fastest. It tells what the step does on such a host
apart from how it is measured.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

from torchpace.host import probe_host
from torchpace.measure.stats import summarize
from torchpace.trial.arms import KeptArms
from torchpace.trial.pair import run_pair
from torchpace.trial.schedule import PairOptions
from torchpace.protocol import TrialSpec
from torchpace.trial.runner import run_trial

from _args import BusyLoops, busy, count, seconds

HERE = Path(__file__).resolve().parent
SLEEPY = f"{HERE / 'compare_workloads.py'}:sleepy_loader"
CASES = {
    "aa": ("tabular", {}, {}, (1.0, 1.0)),
    "aav": ("vision", {}, {}, (1.0, 1.0)),
    "aa1": ("tabular", {"threads.intra_op": 1}, {"threads.intra_op": 1}, (1.0, 1.0)),
    "workers": (SLEEPY, {"data.num_workers": 1}, {"data.num_workers": 2}, (1.8, 2.2)),
    "threads": ("tabular", {"threads.intra_op": 2}, {"threads.intra_op": 1}, None),
    "kept": ("tabular", {}, {}, (1.0, 1.0)),
    "aalat": ("inference", {}, {}, (1.0, 1.0)),
}
OBJECTIVES = {"aalat": "latency"}  # the cases judged by another figure than samples/s
KEPT_GUARD_STEPS = 10  # a tune's candidate runs its guard steps first: arm B is then a process of its own


def paired(workload: str, a: dict, b: dict, max_time_s: float, host, kept: bool = False,
           objective: str = "throughput") -> dict:
    spec_a = TrialSpec(workload=workload, config=a, max_time_s=max_time_s, objective=objective)
    spec_b = TrialSpec(workload=workload, config=b, max_time_s=max_time_s, guard_steps=KEPT_GUARD_STEPS if kept else 0,
                       objective=objective)
    options = PairOptions(rounds_s=max_time_s)
    with KeptArms() as kept_arms:
        if kept:  # a first comparison, as a tune's before, whose arm A the measured one takes back
            run_pair(spec_a, spec_a, host, timeout_s=3 * max_time_s + 120, options=options, kept_arms=kept_arms)
        pair = run_pair(spec_a, spec_b, host, timeout_s=3 * max_time_s + 120, options=options,
                        kept_arms=kept_arms if kept else None)
    if kept and pair.reused != ("a",):
        raise SystemExit(f"kept: arm A was not taken back (reused {pair.reused})")
    s = pair.summary
    loads = [x for x in (pair.other_load_a, pair.other_load_b) if x is not None]
    centred = b_centred(pair.a_rates, pair.b_rates)
    c = summarize(centred) if centred else None
    return {"ok": pair.ok, "ratio": s.median if s else None, "low": s.ci_low if s else None, "high": s.ci_high if s else None,
            "rounds": s.n if s else 0, "above": _share_above(pair.ratios), "load": max(loads) if loads else None,
            "wall_s": pair.wall_time_s, "b_centred": {"ratio": c.median, "low": c.ci_low, "high": c.ci_high, "rounds": c.n,
                                                      "above": _share_above(centred)} if c else None}


def b_centred(a_rates, b_rates) -> list[float]:
    """The rounds as paired comparisons made them before: B's k-th turn over the mean of A's k-th and (k+1)-th."""
    return [b / ((a_rates[k] + a_rates[k + 1]) / 2) for k, b in enumerate(b_rates[:len(a_rates) - 1])
            if min(a_rates[k], a_rates[k + 1], b) > 0]


def _share_above(ratios) -> float | None:
    return sum(1 for r in ratios if r > 1) / len(ratios) if ratios else None


def separate(workload: str, a: dict, b: dict, max_time_s: float, host, objective: str = "throughput") -> dict:
    """The method before: A alone, then B alone, each for the same time a paired arm gets; B over A of the
    objective's score (for latency, A's p50 over B's)."""
    started = time.perf_counter()
    results = [run_trial(TrialSpec(workload=workload, config=config, max_time_s=max_time_s), host,
                         timeout_s=max_time_s + 120) for config in (a, b)]
    if not all(r.ok for r in results):
        return {"ok": False, "ratio": None, "wall_s": time.perf_counter() - started}
    fa, fb = (r.bench.objective_for(objective).score for r in results)
    ca, cb = (r.bench.objective_for(objective).ci_rel_halfwidth for r in results)
    loads = [r.bench.other_load_cores for r in results if r.bench.other_load_cores is not None]
    return {"ok": True, "ratio": fb / fa, "ci_rel": ca + cb, "load": max(loads) if loads else None,
            "wall_s": time.perf_counter() - started}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cases", default="aa,aa1,workers,threads", help="comma-separated (empty: none): " + ", ".join(CASES))
    parser.add_argument("--repeats", type=count, default=3)
    parser.add_argument("--max-time", type=seconds, default=20.0, help="seconds of rounds per comparison")
    parser.add_argument("--busy", type=busy, default=0, metavar="N", help="processes that spin meanwhile (0-8)")
    parser.add_argument("--plain-loop", type=seconds, metavar="SECONDS",
                        help="first time the tabular step in a plain loop, 2 threads then 1, for this long each")
    args = parser.parse_args(argv)
    cases = [c.strip() for c in args.cases.split(",") if c.strip()]  # "": the plain loop alone
    unknown = [c for c in cases if c not in CASES]
    if unknown:
        parser.error(f"--cases: unknown {unknown}; valid: {', '.join(CASES)}")
    host = probe_host()
    with BusyLoops(args.busy):
        print(f"# bench-compare: {args.repeats} repeats, {args.max_time:g} s of rounds, {args.busy} busy process(es), "
              f"{host.usable_cores} usable cores")
        if args.plain_loop:
            plain_loops(args.plain_loop, args.repeats)
        for case in cases:
            run_case(case, args, host)
    return 0


def plain_loops(seconds_each: float, repeats: int) -> None:
    print(f"\n## plain loop: the tabular step alone, no torchpace, {seconds_each:g} s a run, steps/s per quarter second")
    for repeat in range(repeats):
        for threads in (2, 1):
            out = subprocess.run([sys.executable, str(HERE / "plain_loop.py"), str(threads), str(seconds_each)],
                                 capture_output=True, text=True, check=True)
            rates = json.loads(out.stdout.strip().splitlines()[-1])["rates"]
            slow = sum(1 for r in rates if r < max(rates) / 3) / len(rates)
            print(f"  {repeat + 1}: {threads} thread(s): median {statistics.median(rates):.0f}, range {min(rates):.0f}-"
                  f"{max(rates):.0f} ({max(rates) / max(min(rates), 1e-9):.0f}x), slower than a third of the fastest: "
                  f"{slow:.0%}", flush=True)
            print("     " + " ".join(f"{r:.0f}" for r in rates), flush=True)


def run_case(case: str, args, host) -> None:
    workload, a, b, band = CASES[case]
    print(f"\n## {case}: B {b or 'defaults'} / A {a or 'defaults'}" + (f"  (expected {band[0]:g}-{band[1]:g})" if band else ""))
    paired_runs, separate_runs = [], []
    for repeat in range(args.repeats):  # interleaved: paired, separate, paired, separate ...
        objective = OBJECTIVES.get(case, "throughput")
        p = paired(workload, a, b, args.max_time, host, kept=case == "kept", objective=objective)
        s = separate(workload, a, b, args.max_time, host, objective)
        paired_runs.append(p)
        separate_runs.append(s)
        print(f"  {repeat + 1}: paired {_fmt_pair(p)}   separate {_fmt_sep(s)}", flush=True)
        if p.get("b_centred"):
            print(f"     the same turns centred on B: {_fmt_pair({**p, **p['b_centred']})}", flush=True)
    ratios = [p["ratio"] for p in paired_runs if p["ratio"]]
    seps = [s["ratio"] for s in separate_runs if s["ratio"]]
    if ratios:
        print(f"  paired: median ratio {statistics.median(ratios):.3f}, spread over repeats "
              f"{min(ratios):.3f}-{max(ratios):.3f}, mean CI half-width "
              f"{statistics.fmean((p['high'] - p['low']) / 2 / p['ratio'] for p in paired_runs if p['ratio']):.1%}")
        if band:
            inside = sum(1 for p in paired_runs if p["ratio"] and _meets(p, band))
            centred = sum(1 for p in paired_runs if p.get("b_centred") and _meets(p["b_centred"], band))
            print(f"  paired meets the bar in {inside} of {len(paired_runs)} (the same turns centred on B: {centred})")
        if band == (1.0, 1.0):
            misses = sum(1 for p in paired_runs if p["ratio"] and not _holds_one(p))
            print(f"  paired CIs that leave 1 out: {misses} of {len(ratios)} (a 95% CI should, about 1 time in 20)")
    if seps:
        print(f"  separate: median ratio {statistics.median(seps):.3f}, spread over repeats {min(seps):.3f}-{max(seps):.3f}")


def _meets(p: dict, band: tuple[float, float]) -> bool:
    if band == (1.0, 1.0):  # A/A: the CI contains 1 and is within ±5%
        return _holds_one(p) and (p["high"] - p["low"]) / 2 / p["ratio"] <= 0.05
    return band[0] <= p["ratio"] <= band[1]


def _holds_one(p: dict) -> bool:
    """Whether a comparison's CI contains 1 (as an A/A comparison's should, 19 times in 20)."""
    return p["low"] <= 1.0 <= p["high"]


def _fmt_pair(p: dict) -> str:
    if not p["ratio"]:
        return "failed"
    load = f", load {p['load']:.1f}" if p["load"] is not None else ""
    above = f", {p['above']:.0%} above 1" if p.get("above") is not None else ""
    return f"{p['ratio']:.3f} [{p['low']:.3f}, {p['high']:.3f}] {p['rounds']} rounds{above}{load} ({p['wall_s']:.0f} s)"


def _fmt_sep(s: dict) -> str:
    if not s["ratio"]:
        return "failed"
    load = f", load {s['load']:.1f}" if s["load"] is not None else ""
    return f"{s['ratio']:.3f} (±{s['ci_rel']:.1%} from the two CIs{load}; {s['wall_s']:.0f} s)"


if __name__ == "__main__":
    sys.exit(main())
