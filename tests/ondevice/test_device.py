"""Tests of dask_windows.ondevice.prefetcher: DevicePrefetcher and standardize."""

from __future__ import annotations

from collections import namedtuple

import pytest
import torch

from dask_windows.ondevice.prefetcher import DevicePrefetcher, standardize

CUDA = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
Pair = namedtuple("Pair", ["x", "y"])


def _batches(count: int = 5) -> list[tuple[torch.Tensor, torch.Tensor]]:
    generator = torch.Generator().manual_seed(0)
    return [(torch.randn(4, 3, 16, generator=generator), torch.arange(4) + 10 * i) for i in range(count)]


# --------------------------------------------------------------------------- DevicePrefetcher on the CPU


def test_cpu_passes_batches_through_in_order() -> None:
    batches = _batches()
    out = list(DevicePrefetcher(batches, "cpu"))
    assert len(out) == len(batches)
    for (x, y), (x_out, y_out) in zip(batches, out):
        assert isinstance(x_out, torch.Tensor) and torch.equal(x, x_out) and torch.equal(y, y_out)


def test_nested_batches_keep_their_structure_and_other_values() -> None:
    x = torch.ones(2, 3)
    batch = {"pair": Pair(x, [x, "label"]), "n": 3}
    (out,) = list(DevicePrefetcher([batch], "cpu"))
    assert isinstance(out["pair"], Pair)
    assert out["pair"].y[1] == "label" and out["n"] == 3
    assert torch.equal(out["pair"].y[0], x)


def test_len_follows_the_loader_and_iteration_repeats() -> None:
    loader = torch.utils.data.DataLoader(torch.arange(10.0), batch_size=3)
    prefetcher = DevicePrefetcher(loader, "cpu")
    assert len(prefetcher) == 4
    first, second = list(prefetcher), list(prefetcher)
    assert all(torch.equal(a, b) for a, b in zip(first, second)) and len(first) == 4


def test_transform_runs_on_each_batch() -> None:
    out = list(DevicePrefetcher(_batches(2), "cpu", transform=standardize))
    x, y = out[0]
    assert torch.allclose(x.mean(-1), torch.zeros(4, 3), atol=1e-5)
    assert torch.equal(y, torch.arange(4))


def test_default_device_is_cuda_when_available() -> None:
    expected = "cuda" if torch.cuda.is_available() else "cpu"
    assert DevicePrefetcher([], None).device.type == expected


def test_loader_errors_reach_the_caller() -> None:
    def broken():
        yield torch.zeros(1)
        raise OSError("partition 3 is unreadable")

    with pytest.raises(OSError, match="partition 3"):
        list(DevicePrefetcher(broken(), "cpu"))


def test_bad_arguments_are_refused() -> None:
    with pytest.raises(ValueError, match="not a torch device"):
        DevicePrefetcher([], "gpu0")
    with pytest.raises(TypeError, match="not callable"):
        DevicePrefetcher([], "cpu", transform=3)
    if not torch.cuda.is_available():
        with pytest.raises(ValueError, match="CUDA is not available"):
            DevicePrefetcher([], "cuda")


# --------------------------------------------------------------------------- DevicePrefetcher on CUDA


@CUDA
@pytest.mark.parametrize("pin_memory", [False, True])
def test_cuda_batches_arrive_intact_and_in_order(pin_memory: bool) -> None:
    data = torch.randn(64, 3, 32)
    loader = torch.utils.data.DataLoader(
        torch.utils.data.TensorDataset(data, torch.arange(64)), batch_size=8, pin_memory=pin_memory
    )
    seen = []
    for x, index in DevicePrefetcher(loader, "cuda"):
        assert x.is_cuda and index.is_cuda
        x.mul_(2)  # the caller may modify a batch in place
        seen.append((x.cpu(), index.cpu()))
    assert torch.equal(torch.cat([x for x, _ in seen]), data * 2)
    assert torch.equal(torch.cat([i for _, i in seen]), torch.arange(64))


@CUDA
def test_cuda_copy_is_ordered_before_work_on_the_current_stream() -> None:
    # Slow work on the current stream after each batch would expose a missing wait_stream
    # or a reused buffer (missing record_stream) as wrong sums.
    batches = [torch.full((1024, 1024), float(i)) for i in range(6)]
    sums = []
    for x in DevicePrefetcher(batches, "cuda", transform=lambda t: t + 1):
        y = x
        for _ in range(20):
            y = y @ torch.eye(1024, device="cuda")
        sums.append(y.sum())
        del x, y
    torch.cuda.synchronize()
    assert [s.item() for s in sums] == [(i + 1) * 1024 * 1024 for i in range(6)]


# --------------------------------------------------------------------------- standardize


def test_standardize_gives_zero_mean_unit_variance_per_window_and_channel() -> None:
    x = torch.randn(8, 3, 100) * torch.tensor([1.0, 10.0, 1e3])[:, None] + 5.0
    z = standardize(x)
    assert torch.allclose(z.mean(-1), torch.zeros(8, 3), atol=1e-5)
    assert torch.allclose(z.var(-1, correction=0), torch.ones(8, 3), atol=1e-3)
    assert z.dtype == x.dtype and z.shape == x.shape


def test_standardize_stats_map_back_and_the_input_is_untouched() -> None:
    x = torch.randn(4, 2, 50)
    before = x.clone()
    z, mean, std = standardize(x, return_stats=True)
    assert mean.shape == (4, 2, 1) and std.shape == (4, 2, 1)
    assert torch.allclose(z * std + mean, x, atol=1e-5)
    assert torch.equal(x, before)


def test_standardize_other_axis_constant_windows_and_half_precision() -> None:
    x = torch.randn(4, 50, 2)
    assert torch.allclose(standardize(x, dim=1).mean(1), torch.zeros(4, 2), atol=1e-5)
    assert torch.equal(standardize(torch.full((2, 2, 10), 3.0)), torch.zeros(2, 2, 10))
    assert standardize(torch.randn(2, 2, 10, dtype=torch.bfloat16)).dtype == torch.bfloat16


def test_standardize_tuple_standardizes_the_inputs_only() -> None:
    x, y = torch.randn(2, 2, 10), torch.tensor([1.0, 2.0])
    z, y_out = standardize((x, y))
    assert torch.equal(y_out, y) and torch.allclose(z, standardize(x))
    pair = standardize(Pair(x, y))
    assert isinstance(pair, Pair) and torch.equal(pair.y, y) and torch.allclose(pair.x, z)


def test_standardize_refuses_integers_and_negative_eps() -> None:
    with pytest.raises(TypeError, match="floating-point"):
        standardize(torch.zeros(2, 2, 3, dtype=torch.int64))
    with pytest.raises(ValueError, match="eps=-1"):
        standardize(torch.zeros(2, 2, 3), eps=-1)


@CUDA
def test_standardize_on_cuda() -> None:
    z = standardize(torch.randn(4, 2, 64, device="cuda"))
    assert z.is_cuda and torch.allclose(z.mean(-1), torch.zeros(4, 2, device="cuda"), atol=1e-5)
