# torchpace: `make demo` and `make test` do all their own set-up on a fresh machine.
PYTHON ?= python3
VENV ?= .venv
# The CPU build by default; GPU users install the torch build for their CUDA first
# (or run `make TORCH_SPEC="torch==2.x.y" ...`).
TORCH_SPEC ?= torch==2.13.0
BIN = $(VENV)/bin
STAMP = $(VENV)/.torchpace-installed

.PHONY: install demo test docs bench bench-compare bench-coverage bench-tune bench-script bench-frameworks bench-jobs bench-data bench-inference bench-distributed bench-fleet bench-speedup gpu-check clean

$(STAMP): pyproject.toml Makefile
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q "$(TORCH_SPEC)"
	$(BIN)/python -m pip install -q -e ".[test]" "$(TORCH_SPEC)"  # TORCH_SPEC again: no extra may replace that torch
	touch $@

install: $(STAMP)

# The main job on the built-in example: check the host, tune `tabular` (a fresh demo study each
# time), measure the tuned config again and compare it with the defaults in alternation, then
# measure the same model as an unmodified script.
demo: $(STAMP)
	-$(BIN)/torchpace doctor
	rm -f .torchpace/demo.db
	$(BIN)/torchpace tune tabular --budget 4m --trial-time 8 --storage sqlite:///.torchpace/demo.db --out torchpace.toml
	$(BIN)/torchpace bench tabular --config torchpace.toml --max-time 20
	$(BIN)/torchpace compare tabular --config torchpace.toml --max-time 20
	$(BIN)/torchpace bench --max-time 20 -- python examples/scripts/tabular_train.py

# Three test processes (pytest-xdist), each test file on one of them: most tests wait on the real
# processes they start, and with two a 2-core host sat a fifth idle (31 CPU-minutes in a 19-minute run
# with three, against 21.7 minutes with two); the suite is checked to pass beside another process.
TEST_WORKERS ?= 3
test: $(STAMP)
	$(BIN)/python -m pytest -q -n $(TEST_WORKERS) --dist loadfile

# The reference pages (docs/reference/) and the "where is X" index of docs/architecture.md, from the code.
docs: $(STAMP)
	$(BIN)/python -m torchpace.docs_gen

bench: $(STAMP)
	$(BIN)/python benchmarks/bench_measurement.py
	$(BIN)/python benchmarks/bench_monitor.py --duration 30
	$(BIN)/python benchmarks/bench_profile.py

bench-compare: $(STAMP)  # make bench-compare ARGS="--busy 2 --cases aa,workers"
	$(BIN)/python benchmarks/bench_compare.py $(ARGS)

# how often an A/A comparison's 95% CI leaves 1 out, per thread count, at a tune's trial length and compare's default
bench-coverage: $(STAMP)  # make bench-coverage ARGS="--busy 2 --repeats 20"
	$(BIN)/python benchmarks/bench_coverage.py $(ARGS)

bench-script: $(STAMP)  # make bench-script ARGS="--workloads tabular --no-tune"
	$(BIN)/python benchmarks/bench_script.py $(ARGS)

# Lightning and HF Trainer scripts: torchpace's steps/s vs the framework's own clock, and compile's gain
bench-frameworks: $(STAMP)  # make bench-frameworks ARGS="--clients hf --rounds 5 --threads 1"
	$(BIN)/python benchmarks/bench_frameworks.py $(ARGS)

# 2-rank jobs (torchrun DDP, Lightning devices=2, HF Trainer under torchrun): the job's figures vs rank 0's own clock, and --scaling 1,2
bench-jobs: $(STAMP)  # make bench-jobs ARGS="--clients ddp --scaling 3"
	$(BIN)/python benchmarks/bench_jobs.py $(ARGS)

bench-tune: $(STAMP)  # make bench-tune ARGS="--keep DIR --workloads vision"
	$(BIN)/python benchmarks/bench_tune.py $(ARGS)

bench-data: $(STAMP)
	$(BIN)/python benchmarks/bench_data.py

bench-inference: $(STAMP)
	$(BIN)/python benchmarks/bench_inference.py

bench-distributed: $(STAMP)
	$(BIN)/python benchmarks/bench_distributed.py

# resnet and gpt as unmodified scripts: tuned, then compared with their defaults and an expert's config
bench-speedup: $(STAMP)  # make bench-speedup ARGS="--workloads resnet --budget 900"
	$(BIN)/python benchmarks/bench_speedup.py $(ARGS)

# one study tuned by 1, 2, 3 tuner processes on a throw-away PostgreSQL server, and 2 on SQLite
bench-fleet: $(STAMP)
	$(BIN)/python benchmarks/bench_fleet.py $(ARGS)

# On a CUDA host: doctor, bench, a short tune of language and vision, profile, monitor (NVML), in
# under 9 minutes, one table at the end; ARGS="--part speedup": resnet and gpt at full size tuned and
# compared with their defaults and an expert's config, with MFU, in 10 minutes. Exit 77 (skipped) on a
# host without CUDA.
gpu-check: $(STAMP)
	$(BIN)/python benchmarks/gpu_check.py $(ARGS)

clean:
	rm -rf $(VENV) .torchpace build src/*.egg-info
