"""``dask_windows.settings.config``: the keywords as three frozen values, the command line's table, ``tuning``."""

from __future__ import annotations

import ast
import dataclasses
import inspect
import pathlib
import warnings

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import dask_windows as dw
from dask_windows.cli import keywords as cli_keywords
from dask_windows.cli.main import build_parser
from dask_windows.errors import ConfigError
from dask_windows.opening.checks import SERIES_FROM_MANIFEST
from dask_windows.settings import config, tuning
from dask_windows.settings.config import DEPRECATED_KEYWORDS, KEYWORDS, OrderConfig, ReadConfig, WindowConfig
from dask_windows.settings.spec import WindowSpec
from tests.helpers import make_frames, write_parquet

SIGNATURE = inspect.signature(dw.WindowDataset.__init__).parameters


@pytest.fixture(scope="module")
def path(tmp_path_factory):
    root = tmp_path_factory.mktemp("config") / "data"
    write_parquet(make_frames(seed=3, num_files=3, num_series=6, min_len=20, max_len=60), str(root))
    return str(root)


def _epoch(ds) -> list[list[np.ndarray]]:
    return [[t.numpy() for t in (b if isinstance(b, (tuple, list)) else (b,))] for b in ds]


def test_the_keywords_are_the_fields_of_the_three_values_with_the_same_defaults():
    assert set(KEYWORDS) == set(SIGNATURE) - {"self", "data", *DEPRECATED_KEYWORDS}
    for group, kind in (("window", WindowConfig), ("order", OrderConfig), ("read", ReadConfig)):
        for f in dataclasses.fields(kind):
            if not f.init:
                continue
            assert KEYWORDS[f.name] == group
            expected = SIGNATURE[f.name].default
            default = inspect.Parameter.empty if f.default is dataclasses.MISSING else f.default
            assert default is expected or default == expected, (f.name, default, expected)


def test_the_values_are_frozen(path):
    ds = dw.WindowDataset(path, features=["f0"], series="sid", window=4)
    for value, name in ((ds.config.window, "window"), (ds.config.order, "seed"), (ds.config.read, "threads")):
        with pytest.raises(dataclasses.FrozenInstanceError):
            setattr(value, name, 1)
    assert ds.config.read.retry.retries == 3 and ds.config.read.retry.timeout == tuning.DEFAULT_TIMEOUT


def _keywords():
    """A draw of valid ``WindowDataset`` keywords over the test data (the order: pool or pieces)."""
    order = st.one_of(
        st.fixed_dictionaries({"buffer_bytes": st.sampled_from([None, 1 << 14, 1 << 20])}),
        st.fixed_dictionaries({"pieces_per_partition": st.integers(1, 3)}),
    )
    optional = {
        "stride": st.integers(1, 4),
        "batch_size": st.integers(1, 48),
        "drop_last": st.booleans(),
        "shuffle": st.booleans(),
        "seed": st.integers(0, 5),
        "buffer_partitions": st.integers(1, 3),
        "prefetch_partitions": st.integers(0, 2),
        "layout": st.sampled_from(["NCL", "NLC"]),
        "return_index": st.booleans(),
        "nan": st.sampled_from(["raise", "drop"]),
        "threads": st.integers(1, 4),
        "retries": st.integers(0, 3),
        "on_error": st.sampled_from(["raise", "skip"]),
        "strict": st.booleans(),
        "timeout": st.sampled_from([None, 5.0]),
        "partition_bytes": st.sampled_from([None, 2_000]),
        "next_pass_seconds": st.sampled_from([0.0, 1.5]),
        "rank": st.just(0),
        "world_size": st.sampled_from([None, 1]),
    }
    window = st.fixed_dictionaries(
        {"window": st.integers(2, 12), "features": st.sampled_from([["f0"], ["f0", "f2"], ("f1", "f0")])},
        optional={"horizon": st.integers(0, 3), **optional},
    )
    return st.tuples(window, order).map(lambda parts: {**parts[0], **parts[1]})


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(kw=_keywords())
def test_the_values_agree_with_the_keywords_and_reopen_the_same_dataset(path, kw):
    if kw.get("horizon"):
        kw["targets"] = ["y"]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # short series and small pool budgets are warned about
        ds = dw.WindowDataset(path, series="sid", **kw)
        for name, value in kw.items():
            if value is None and name == "buffer_bytes":
                continue  # resolved: the pool order's default budget (checked below)
            if name == "pieces_per_partition" and value > 1:  # deprecated: the pool order serves it
                assert ds.config.order.pieces_per_partition is None and ds.config.order.buffer_bytes is not None
                continue
            held = getattr(getattr(ds.config, KEYWORDS[name]), name)
            assert held == (tuple(value) if isinstance(value, list) else value), name
        for f in dataclasses.fields(WindowSpec):  # the one value holds every keyword, as the groups show it
            if f.name in ("code_features", "code_dtype", "lookback", "given_series"):  # derived (none here): defaults
                assert getattr(ds.spec, f.name) == f.default, f.name
            elif f.name != "pieces_per_partition":
                assert getattr(ds.spec, f.name) == getattr(getattr(ds.config, KEYWORDS[f.name]), f.name), f.name
        order = ds.config.order
        assert (order.buffer_bytes is None) != (order.pieces_per_partition is None)  # one order, named once
        assert ds.spec.pieces_per_partition == (order.pieces_per_partition or 1)
        again = dw.WindowDataset(path, **ds.config.keywords())
        assert again.config == ds.config and again.spec == ds.spec
        first, second = _epoch(ds), _epoch(again)
    assert len(first) == len(second) == len(ds)
    assert all(len(a) == len(b) and all(np.array_equal(u, v) for u, v in zip(a, b)) for a, b in zip(first, second))


def test_defaults_resolved_from_the_data_are_held_and_reopen_the_same_dataset(tmp_path):
    arrays = [np.arange(60, dtype=np.float32).reshape(30, 2), np.ones((25, 2), np.float32)]
    ds = dw.WindowDataset(arrays, window=5, batch_size=4)
    assert ds.config.window.features == ds.spec.features == (0, 1)  # all columns of the arrays
    assert ds.config.window.series is SERIES_FROM_MANIFEST  # as given: there is no manifest
    assert dw.WindowDataset(arrays, **ds.config.keywords()).config == ds.config
    assert ds.config.order.buffer_bytes == tuning.BUFFER_BYTES and ds.config.order.pieces_per_partition is None


@pytest.mark.parametrize(
    "bad, message",
    [
        ({"threads": 0}, "threads=0 must be >= 1"),
        ({"partition_bytes": -1}, "partition_bytes=-1 must be >= 1"),
        ({"on_error": "ignore"}, "on_error='ignore' must be one of"),
        ({"next_pass_seconds": -1}, r"next_pass_seconds=-1 must be a number of seconds >= 0"),
        ({"timeout": "soon"}, "timeout='soon' must be a number of seconds > 0"),
        ({"retries": 1.5}, r"retries=1.5 must be an int >= 0"),
        ({"batch_size": 0}, "batch_size=0 must be >= 1"),
        ({"layout": "LNC"}, "layout='LNC' must be one of"),
        ({"buffer_bytes": 1 << 20, "pieces_per_partition": 1}, "ask for two orders"),
    ],
)
def test_errors_name_the_keyword_as_before(path, bad, message):
    with pytest.raises((ConfigError, ValueError), match=message):
        dw.WindowDataset(path, features=["f0"], series="sid", window=4, **bad)


def test_each_keyword_reaches_its_value_by_name():
    """``WindowDataset.__init__`` hands every keyword, by name and as itself, to the value that holds it
    (no ``locals()``: a keyword left out would silently take the value's default)."""
    init = next(
        node
        for node in ast.walk(ast.parse(inspect.getsource(dw.WindowDataset)))
        if isinstance(node, ast.FunctionDef) and node.name == "__init__"
    )
    passed: dict[str, set] = {}
    for call in (n for n in ast.walk(init) if isinstance(n, ast.Call) and isinstance(n.func, ast.Name)):
        for keyword in call.keywords:
            if isinstance(keyword.value, ast.Name) and keyword.value.id == keyword.arg:
                passed.setdefault(call.func.id, set()).add(keyword.arg)
    for group, kind in (("window", "WindowConfig"), ("order", "OrderConfig"), ("read", "ReadConfig")):
        assert passed.get(kind) == {name for name, g in KEYWORDS.items() if g == group}, kind
    assert "locals" not in {
        n.func.id for n in ast.walk(init) if isinstance(n, ast.Call) and isinstance(n.func, ast.Name)
    }


def test_an_unknown_keyword_is_named_as_python_names_it():
    with pytest.raises(TypeError, match=r"inspect_dataset\(\) got an unexpected keyword argument 'windows'"):
        config.group_of("windows", "inspect_dataset")


# -- the command line's table ------------------------------------------------------------------


def test_every_dataset_keyword_has_a_command_line_decision(monkeypatch):
    assert cli_keywords.check_table() == []
    monkeypatch.setitem(KEYWORDS, "new_knob", "read")  # a keyword added to WindowDataset without a decision
    assert cli_keywords.check_table() == ["new_knob: a WindowDataset keyword without a command-line decision"]


@pytest.mark.parametrize("command", ["inspect", "bench"])
def test_the_commands_offer_each_flag_of_the_table_and_forward_it(path, command):
    parser = build_parser()
    sub = parser._subparsers._group_actions[0].choices[command]
    dests = {a.dest: a for a in sub._actions}
    flagged = [o for o in cli_keywords.OPTIONS if o.flag is not None]
    for option in flagged:
        assert option.flag in dests[option.keyword].option_strings
    argv = [command, path, "--features", "f0", "f1", "--series", "sid", "--window", "6", "--stride", "2"]
    argv += ["--batch-size", "8", "--partition-bytes", "2kB", "--pieces-per-partition", "1", "--nan", "drop"]
    given = cli_keywords.dataset_keywords(parser.parse_args(argv))
    assert given == {
        "features": ["f0", "f1"],
        "series": "sid",
        "window": 6,
        "stride": 2,
        "horizon": 0,
        "batch_size": 8,
        "buffer_partitions": 2,
        "prefetch_partitions": 1,
        "pieces_per_partition": 1,
        "nan": "drop",
        "on_error": "raise",
        "retries": 3,
        "partition_bytes": 2000,
    }
    ds = dw.WindowDataset(path, **given)  # the keywords the command hands the dataset
    assert ds.config.read.partition_bytes == 2000 and ds.config.order.pieces_per_partition == 1


def test_the_flag_defaults_are_the_dataset_defaults():
    for option in cli_keywords.OPTIONS:
        if option.flag is not None and "default" in option.settings:
            assert option.settings["default"] == SIGNATURE[option.keyword].default, option.keyword


# -- tuning ----------------------------------------------------------------------------------------


def test_every_tuning_constant_says_why_and_is_a_number():
    source = pathlib.Path(tuning.__file__).read_text(encoding="utf-8")
    lines = source.splitlines()
    names = []
    for node in ast.parse(source).body:
        if isinstance(node, ast.Assign) and isinstance(node.targets[0], ast.Name) and node.targets[0].id != "__all__":
            name = node.targets[0].id
            names.append(name)
            assert lines[node.lineno - 2].startswith("#: "), f"{name} has no line saying why"
            assert isinstance(getattr(tuning, name), (int, float)) and not isinstance(getattr(tuning, name), bool)
    assert sorted(names) == sorted(n for n in tuning.__all__ if n.isupper())


def test_the_modules_read_the_tuning_constants():
    from dask_windows.runtime import batch, pool
    from dask_windows.sources import retry

    assert pool.BUFFER_BYTES is tuning.BUFFER_BYTES
    assert batch._LANE_RATIO is tuning.LANE_RATIO
    assert retry.RetryPolicy().retries == tuning.RETRIES and retry.RetryPolicy().max_delay == tuning.RETRY_MAX_DELAY
    assert SIGNATURE["threads"].default == tuning.OPEN_THREADS


def test_the_environment_switches_are_one_value():
    assert tuning.switches({}) == tuning.Switches()  # the defaults: every accelerator as measured best
    env = {
        "DASK_WINDOWS_TELEMETRY": "0",
        "DASK_WINDOWS_SLOTS": "0",
        "DASK_WINDOWS_LANES": "1",
        "DASK_WINDOWS_SHARE_FOOTERS": "0",
    }
    assert tuning.switches(env) == tuning.Switches(False, False, True, False)
    assert tuning.switches({"DASK_WINDOWS_LANES": "0"}).lanes is False
    assert tuning.switches({"DASK_WINDOWS_LANES": "2"}).lanes is None  # as unset
    with pytest.raises(dataclasses.FrozenInstanceError):
        tuning.switches().slots = False  # type: ignore[misc]


def test_the_removed_torch_gather_switch_warns_and_changes_nothing():
    with pytest.warns(FutureWarning, match="DASK_WINDOWS_TORCH_GATHER no longer does anything"):
        assert tuning.switches({"DASK_WINDOWS_TORCH_GATHER": "1"}) == tuning.Switches()


def test_only_tuning_reads_the_environment_switches():
    """``DASK_WINDOWS_*`` variables are read by ``tuning.switches()`` alone (one place, one value)."""
    package = pathlib.Path(tuning.__file__).parents[1]
    readers = sorted(
        str(path.relative_to(package))
        for path in package.rglob("*.py")
        if any(
            isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value.startswith("DASK_WINDOWS_")
            for node in ast.walk(ast.parse(path.read_text(encoding="utf-8")))
        )
    )
    assert readers == ["settings/tuning.py"], readers


def test_a_switch_set_after_import_still_counts(monkeypatch):
    from dask_windows.speedups import lanes, slots

    monkeypatch.setenv("DASK_WINDOWS_SLOTS", "0")
    assert not slots.enabled()
    monkeypatch.setenv("DASK_WINDOWS_LANES", "0")
    assert not lanes.lanes_wanted(1 << 30)


def test_one_settings_value_reaches_the_runtime(path):
    """``config.resolve`` makes one ``WindowSpec``: ``ds.config`` groups its fields, and the runtime's values
    carry it alone, no keyword's value beside it (``on_error`` and ``next_pass_seconds`` were held twice)."""
    ds = dw.WindowDataset(path, features=["f0"], series="sid", window=4, on_error="skip", next_pass_seconds=0)
    assert ds.config == config.Config.of(ds.spec)
    assert (ds.spec.on_error, ds.spec.next_pass_seconds, ds.spec.threads) == ("skip", 0, ds.config.read.threads)
    for values in (ds._read_values(), ds._next_pass()):
        held = {f.name for f in dataclasses.fields(values)} & set(KEYWORDS)
        assert held <= {"normalize"}, held  # (the next pass's: the statistics resolved from the keyword)


def test_the_keywords_of_a_workflow_dataset_reopen_it(tmp_path):
    """With a workflow, ``spec.window`` counts its look-back rows and a named batch's roles choose the columns:
    ``config`` shows the window asked for and no columns there, so ``keywords()`` reopens the same dataset."""
    import pandas as pd

    from dask_windows.workflow import Lag, Workflow

    rng = np.random.default_rng(0)
    frame = pd.DataFrame({"sid": np.repeat([1, 2], 60), "v": rng.standard_normal(120), "y": rng.standard_normal(120)})
    frame.to_parquet(path := str(tmp_path / "wf.parquet"))
    wf = Workflow([Lag("v", [1, 2])], series="sid", continuous=["v", "v_lag1", "v_lag2"], target=["y"])
    wf.fit(frame, scheduler="sync")
    for workflow in (wf, wf.named()):
        ds = dw.WindowDataset(path, window=8, horizon=2, workflow=workflow, batch_size=4, seed=1)
        assert ds.config.window.window == 8 and ds.spec.window == 8 + ds.spec.lookback > 8
        again = dw.WindowDataset(path, **ds.config.keywords())
        assert again.spec == ds.spec
        first, second = list(ds), list(again)
        assert len(first) == len(second) == len(ds)
        for a, b in zip(first, second):
            a, b = (a.values(), b.values()) if isinstance(a, dict) else (a, b)
            assert all(np.array_equal(u.numpy(), v.numpy()) for u, v in zip(a, b))
