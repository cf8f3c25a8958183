import warnings

import pytest
import torch
from torch import nn

from torchpace.errors import UsageError
from torchpace.runtime import prepare
from torchpace.workload import Workload

from fixtures.workloads import tiny_inference, tiny_mlp, tiny_mlp_with_workers


def test_prepare_from_parts_runs_a_users_own_loop(host):
    dataset = torch.utils.data.TensorDataset(torch.randn(64, 4), torch.randn(64, 1))
    with prepare(model=nn.Linear(4, 1), dataset=dataset, loss=lambda out, b: nn.functional.mse_loss(out, b[1]),
                 batch_size=16, host=host) as run:
        losses = [run.step(batch) for batch in run.loader]
    assert len(losses) == 4 and all(loss.dim() == 0 and not loss.requires_grad for loss in losses)


def test_step_trains_steps_the_scheduler_and_clips(host):
    workload = tiny_mlp()
    workload.scheduler = lambda opt: torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.5)
    workload.clip_grad_norm = 1e-6
    with prepare(workload, host=host) as run:
        before = [p.detach().clone() for p in run.model.parameters()]
        batch = next(iter(run.loader))
        run.step(batch)
        assert run.optimizer.param_groups[0]["lr"] == pytest.approx(0.5e-3)
        norm = torch.nn.utils.get_total_norm([p.grad for p in run.model.parameters()])
        assert norm <= 1e-6 * 1.01  # clipped in place before the optimizer step
        assert any(not torch.equal(a, b) for a, b in zip(before, run.model.parameters()))


def test_same_seed_gives_the_same_data_order(host):
    orders = []
    for _ in range(2):
        with prepare(tiny_mlp(), host=host) as run:
            orders.append(torch.cat([b[1] for b in run.loader]))
    assert torch.equal(*orders)


def test_inference_step_returns_outputs_without_grad(host):
    with prepare(tiny_inference(), host=host) as run:
        assert run.optimizer is None and not run.model.training
        out = run.step(next(iter(run.loader)))
    assert out.shape == (32, 4) and not out.requires_grad


def test_global_state_is_restored_when_prepare_fails(host):
    before = torch.get_num_threads()
    class CannotMove(nn.Linear):
        def to(self, *args, **kwargs):
            raise RuntimeError("planted: this model cannot move")

    broken = Workload(model=CannotMove(8, 4), dataset=tiny_mlp().dataset, loss=lambda o, b: o.sum())
    with pytest.raises(RuntimeError, match="planted"):
        prepare(broken, {"threads.intra_op": 1}, host=host)
    assert torch.get_num_threads() == before


def test_process_level_knob_is_reported_as_needing_launch(host):
    import dataclasses

    with_jemalloc = dataclasses.replace(host, allocators=(("jemalloc", "/usr/lib/libjemalloc.so.2"),))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with prepare(tiny_mlp(), {"system.allocator": "jemalloc"}, host=with_jemalloc) as run:
            assert run.needs_launch == ["system.allocator"]
    assert any("torchpace launch" in str(w.message) for w in caught)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="fp16 autocast + GradScaler needs CUDA")
def test_fp16_unscales_before_clipping(host):
    workload = tiny_mlp()
    workload.clip_grad_norm = 0.5
    with prepare(workload, {"precision.amp": "fp16"}, host=host) as run:
        assert run._scaler is not None
        loss = run.step(next(iter(run.loader)))
        assert torch.isfinite(loss)
        norm = torch.nn.utils.get_total_norm([p.grad for p in run.model.parameters()])
        assert norm <= 0.5 * 1.01  # true (unscaled) gradients were clipped


def test_step_after_the_with_block_is_refused_with_a_reason(host):
    with prepare(tiny_mlp(), host=host) as run:
        batch = next(iter(run.loader))
        run.step(batch)

    with pytest.raises(UsageError, match="after the `with prepare"):
        run.step(batch)


@pytest.mark.parametrize("call, message", [
    (lambda host: prepare(tiny_mlp(), 42, host=host), "config 42 is a int; expected a RunConfig"),
    (lambda host: prepare(tiny_mlp(), model=nn.Linear(8, 4), host=host), "got a Workload and also model="),
    (lambda host: prepare(model=nn.Linear(8, 4), host=host), "missing part(s) ['dataset']"),
    (lambda host: prepare(model=nn.Linear(8, 4), datset=[1], host=host), "unknown part(s) ['datset']"),
    (lambda host: prepare("tabular", host=host), "expected a torchpace.Workload, got str"),
])
def test_prepare_misuse_is_a_usage_error_that_says_what_to_pass(host, call, message):
    from torchpace.errors import UsageError

    with pytest.raises(UsageError) as err:
        call(host)
    assert message in str(err.value)


# ---- a workload's own DataLoader arguments (Workload.loader_options) -----------------------------------


def test_a_workloads_own_loader_arguments_run_where_the_config_sets_none(host):
    with prepare(tiny_mlp_with_workers(), host=host) as run:
        assert (run.loader.num_workers, run.loader.persistent_workers) == (2, True)
        # what the run had, as its record shows it: the workload's own values beside the knobs' defaults
        assert run.config.non_default() == {"data.num_workers": 2, "data.persistent_workers": True}
    with prepare(tiny_mlp_with_workers(), {"data.num_workers": 0, "data.persistent_workers": False}, host=host) as run:
        assert (run.loader.num_workers, run.loader.persistent_workers) == (0, False)  # the config's, over its own
        assert run.config.non_default() == {}


def test_a_knob_that_needs_workers_goes_with_the_workloads_own(host):
    with prepare(tiny_mlp_with_workers(), {"data.prefetch_factor": 4}, host=host) as run:
        assert (run.loader.num_workers, run.loader.prefetch_factor) == (2, 4)
    with pytest.raises(UsageError, match="needs data.num_workers > 0"):
        prepare(tiny_mlp(), {"data.prefetch_factor": 4}, host=host)


@pytest.mark.parametrize("options, message", [
    ({"shuffle": False}, "'shuffle' cannot be given there; the DataLoader arguments a workload may set itself are "
                         "num_workers, pin_memory, prefetch_factor, persistent_workers"),
    ({"num_workers": -1}, "Workload.loader_options['num_workers']: knob 'data.num_workers': -1 is not valid"),
    ({"pin_memory": "yes"}, "Workload.loader_options['pin_memory']: knob 'data.pin_memory': 'yes' is not valid"),
])
def test_loader_options_no_knob_owns_or_its_knob_refuses_are_usage_errors(host, options, message):
    workload = tiny_mlp()
    workload.loader_options = options
    with pytest.raises(UsageError) as err:
        prepare(workload, host=host)
    assert message in str(err.value)


def test_loader_options_that_are_not_a_mapping_are_named(host):
    workload = tiny_mlp()
    workload.loader_options = [("num_workers", 2)]
    with pytest.raises(UsageError, match="Workload.loader_options is a list; expected a dict of DataLoader arguments"):
        prepare(workload, host=host)
