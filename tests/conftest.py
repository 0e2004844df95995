"""Shared test settings: one torch thread (the CI machine has two cores), and how many pytest-xdist
worker processes run the suite (``-n auto`` in setup.cfg)."""

from __future__ import annotations

import os
import sys

import torch

sys.path.insert(0, os.path.dirname(__file__))
torch.set_num_threads(1)


import pytest  # noqa: E402
from hypothesis import HealthCheck, settings  # noqa: E402

# Hypothesis draws the same examples on every run ("suite", the default: a test that passed once cannot
# fail later on new random draws, so the suite is never flaky); `--hypothesis-profile=explore` draws
# new ones each run (do that when you change index, plan or schedule arithmetic, and keep what it finds
# as an @example). No deadline and no too-slow check in either: timing is not what these tests assert,
# and a loaded 2-core machine would make it fail.
_QUIET = dict(deadline=None, suppress_health_check=[HealthCheck.too_slow])
settings.register_profile("suite", derandomize=True, **_QUIET)
settings.register_profile("explore", derandomize=False, **_QUIET)
settings.load_profile("suite")

# Suite workers (pytest-xdist): most slow tests wait on processes, sockets or sleeps, so more workers
# than the CI machine's two cores pay. DASK_WINDOWS_TEST_WORKERS overrides; `-n N` on the command line too.
SUITE_WORKERS = 4

# Files that take longest, started first so that none of them starts last and alone (each file's
# tests run in one worker: --dist loadfile). Measured with `--durations=0` (a run of the suite, 4 workers),
# each file's tests summed; test_convert.py first: its LocalCluster test alone is the longest in the suite.
SLOW_FILES = (
    "test_convert.py",
    "test_cli.py",
    "test_cache.py",
    "test_examples.py",
    "test_layout.py",
    "test_hostile_reads.py",
    "test_pytorch_forecasting.py",
    "test_package.py",
    "test_mixture.py",
    "test_docs.py",
    "test_resume.py",
    "test_example_ddp.py",
    "test_slots.py",
    "test_checks.py",
    "test_lightning.py",
    "test_plan.py",
)


def _test_files(config) -> int:
    """How many test files the command line names (a folder counts its test files)."""
    count = 0
    for arg in config.args or ["tests"]:
        path = os.path.join(str(config.invocation_params.dir), arg.split("::")[0])
        if os.path.isdir(path):
            count += sum(
                name.startswith("test_") and name.endswith(".py") for _, _, names in os.walk(path) for name in names
            )
        else:
            count += 1
    return count


@pytest.hookimpl(optionalhook=True)  # a pytest-xdist hook
def pytest_xdist_auto_num_workers(config) -> int:
    """``-n auto``: no worker process for a file or two (they run in this process, as without
    xdist), SUITE_WORKERS for more."""
    if os.environ.get("DASK_WINDOWS_TEST_WORKERS"):
        return int(os.environ["DASK_WINDOWS_TEST_WORKERS"])
    return SUITE_WORKERS if _test_files(config) > 2 else 0


#: The tests marked ``slow`` (``python -m pytest -m "not slow"`` leaves them out: about a minute on 2 cores,
#: where the whole suite takes about six): file -> its slow tests by function name (every parametrisation),
#: or ``ALL``. Chosen from ``python -m pytest -n 0 --durations=0 tests/<folder>`` run one folder at a time;
#: a test of several seconds may carry ``@pytest.mark.slow`` itself instead. tests/test_package.py checks
#: that every name here is a test that exists.
ALL = "*"
SLOW_TESTS: dict[str, str | set[str]] = {
    "tests/cli/test_cli.py": ALL,
    "tests/cli/test_convert.py": {
        "test_avro_round_trip_with_nulls_and_timestamps",
        "test_csv_npy_and_structured_npy",
        "test_errors_are_clear_and_leave_nothing_behind",
        "test_failure_midway_removes_the_temporary_folder",
        "test_files_of_data_that_compresses_well_hold_at_most_four_partition_sizes_in_memory",
        "test_larger_than_memory_on_a_local_cluster",
        "test_long_series_split_on_tz_aware_and_nullable_int_times",
        "test_parquet_round_trip_is_exact_and_cut_at_series",
        "test_plan_files_packs_whole_series_and_splits_only_long_ones",
    },
    "tests/cli/test_hardening_cli.py": {
        "test_convert_unifies_date_second_and_fraction_csv_times",
    },
    "tests/cli/test_layout.py": {
        "test_a_longer_span_than_converted_for_loses_exactly_the_counted_windows",
        "test_a_spread_dataset_with_a_file_missing_raises",
        "test_cli_convert_sizes_the_overlap_from_window_and_horizon",
        "test_default_loader_on_converted_data_mixes_like_a_global_shuffle",
        "test_loader_yields_exactly_each_series_windows_on_converted_data",
        "test_longer_window_than_converted_for_warns_with_the_count",
        "test_nan_drop_on_converted_data_keeps_each_series_grid",
        "test_split_on_converted_data_cuts_each_series_by_its_rows",
        "test_spread_plan_keeps_exactly_the_windows_of_each_whole_series",
        "test_stats_of_a_spread_dataset_count_each_row_once",
        "test_version_1_manifests_and_the_contiguous_layout_still_open",
    },
    "tests/corpus/test_corpus.py": {
        "test_bulk_best_fit_is_best_fit_decreasing",
        "test_datasets_folder_and_arrow_equal_parquet",
        "test_items_cover_each_step_once_and_packing_keeps_items",
        "test_ranks_equal_and_disjoint_resume_and_workers",
        "test_s3_parquet_equals_local",
    },
    "tests/corpus/test_corpus_conformance.py": {
        "test_conformance",
    },
    "tests/corpus/test_corpus_elastic.py": ALL,
    "tests/corpus/test_corpus_formats.py": {
        "test_lotsa_fixed_size_list_is_read_as_multivariate",
    },
    "tests/corpus/test_corpus_patch_sizes.py": {
        "test_each_frequency_its_patch_every_observation_once",
    },
    "tests/integrations/test_fastai_stats.py": {
        "test_a_compute_bound_learner_logs_not_input_bound_each_epoch",
        "test_a_learner_waiting_on_slow_reads_logs_input_bound_by_fetch",
    },
    "tests/integrations/test_lightning.py": {
        "test_ddp_two_cpu_ranks_get_equal_disjoint_batches",
        "test_mid_epoch_resume_from_a_lightning_checkpoint",
        "test_two_epochs_differ_and_validate_without_len_warning",
    },
    "tests/integrations/test_pytorch_forecasting.py": {
        "test_each_model_trains_from_parquet_through_window_dataset",
        "test_a_model_trained_on_batches_cut_on_two_lanes_learns_exactly_as_on_one_thread",
    },
    "tests/ondevice/test_gpu_check.py": {
        "test_gpu_check_exit_codes_and_json",
        "test_gpu_check_exits_cleanly_without_cuda_and_imports_only_what_the_gpu_machine_has",
        "test_gpu_check_past_its_timeout_dumps_every_thread_and_exits_1",
    },
    "tests/ondevice/test_ondevice.py": {
        "test_an_early_break_leaves_no_thread_and_no_resident_buffer",
        "test_batch_cuts_across_buffers_match_the_host_path",
        "test_dataloader_workers_are_refused_with_the_remedy",
    },
    "tests/ondevice/test_ondevice_pool.py": {
        "test_an_early_break_leaves_no_thread_and_no_resident_pool",
        "test_device_pool_batches_are_the_host_pool_batches_over_whole_epochs",
        "test_random_layouts_and_budgets_match_the_host_pool",
        "test_two_ranks_and_an_elastic_resume_are_the_host_pool_orders",
    },
    "tests/planning/test_division.py": {
        "test_every_caller_gets_what_it_computed_before",
        "test_reader_share_matches_brute_force_and_the_contract",
        "test_round_robin_over_the_worker_blocks_is_the_dataloader_prefix",
    },
    "tests/planning/test_elastic.py": {
        "test_a_second_elastic_restart_in_the_same_epoch",
        "test_division_covers_the_rest_exactly_once",
        "test_len_is_the_states_batches_plus_what_the_rank_yields",
        "test_next_epochs_are_those_of_the_new_topology",
        "test_real_gloo_ranks_two_by_two_to_three_by_zero",
        "test_two_ranks_two_workers_to_three_ranks_and_to_one_worker",
    },
    "tests/planning/test_mixing_quality.py": ALL,
    "tests/opening/test_open_checks_columnar.py": {
        "test_left_out_columnar_equals_the_per_partition_runs",
        "test_series_order_columnar_equals_the_per_partition_loop",
    },
    "tests/planning/test_pieces.py": {
        "test_dask_reads_whole_partitions_by_default_as_files_do",
        "test_real_gloo_ranks_with_whole_partitions",
        "test_resume_at_every_batch",
    },
    "tests/planning/test_plan.py": ALL,
    "tests/planning/test_pool_plan.py": {
        "test_every_window_once_and_equal_shares",
        "test_resume_is_the_tail_and_plans_are_pure",
    },
    "tests/planning/test_pool_vectorised.py": {
        "test_merge_bounds_items_equals_merge_bounds_per_item",
        "test_vectorised_plan_pool_equals_the_per_unit_loops",
        "test_windows_before_items_equals_windows_before_per_item",
    },
    "tests/planning/test_ragged.py": {
        "test_grid_of_file_runs_equals_the_grid_of_each_partition",
        "test_restrict_equals_clipping_each_run",
    },
    "tests/planning/test_resume.py": {
        "test_resume_in_a_new_process_matches_the_uninterrupted_run",
        "test_resume_twice_with_a_plain_dataloader",
    },
    "tests/planning/test_units.py": ALL,
    "tests/planning/test_windows.py": {
        "test_join_runs_over_chunks_equals_runs_of_the_whole",
        "test_nan_drop_drops_only_windows_holding_a_nan",
        "test_origin_and_owned_place_runs_on_their_series_grid",
        "test_window_starts_enumerate_the_grid",
    },
    "tests/runtime/test_verdict_loops.py": ALL,  # real loops: sleeps, worker processes, two ranks
    "tests/runtime/test_blocks.py": {
        "test_all_finite_agrees_with_the_elementwise_check",
        "test_decoded_bad_rows_are_the_elementwise_bad_rows",
    },
    "tests/runtime/test_contract.py": {
        "test_the_slot_allocator_in_a_dataloader_worker_gives_the_same_batches",
    },
    "tests/runtime/test_epochs.py": {
        "test_pass_k_is_epoch_k_in_every_worker",
    },
    "tests/runtime/test_gather.py": {
        "test_kept_batches_equal_the_oracle",
        "test_through_a_dataloader_every_kept_batch_equals_the_oracle",
        "test_what_the_caller_keeps_is_never_overwritten",
    },
    "tests/runtime/test_gather_runs.py": {
        "test_a_held_batch_of_a_run_is_never_overwritten",
        "test_every_batch_equals_the_oracle",
    },
    "tests/runtime/test_pipeline.py": {
        "test_an_iterator_left_open_at_exit_ends_quietly",
        "test_no_thread_left_after_break_exhaustion_or_garbage_collection",
        "test_resume_yields_exactly_the_rest",
    },
    "tests/runtime/test_pool_memory.py": {
        "test_pool_rss_stays_within_the_budget_over_passes_of_tiny_row_groups",
    },
    "tests/runtime/test_pool_reads.py": {
        "test_s3_gets_about_one_per_row_group",
        "test_the_fill_of_a_remote_store_is_read_several_units_at_a_time_into_the_same_batches",
        "test_a_failed_read_of_the_fill_wakes_a_unit_waiting_on_another_thread_for_its_kept_rows",
    },
    "tests/runtime/test_telemetry.py": {
        "test_a_loader_slowed_by_its_reads_is_input_bound_by_fetch",
        "test_a_mixture_counts_the_loop_and_its_members_reads",
        "test_a_pool_order_loop_with_a_known_step_is_compute_bound",
        "test_a_loop_with_a_known_step_is_compute_bound",
    },
    "tests/runtime/test_thread_memory.py": {
        "test_a_lane_helper_that_cannot_start_leaves_the_work_to_the_consumer",
        "test_a_next_pass_timer_that_cannot_start_releases_the_read_ahead",
        "test_a_reader_or_builder_that_cannot_start_raises_memory_error",
    },
    "tests/runtime/test_window_table.py": {
        "test_batches_gathered_into_worker_slots_are_standardised_from_the_tables",
    },
    "tests/sources/test_arrays.py": {
        "test_memmaps_give_the_same_batches_and_pickle_by_reference",
        "test_streaming_a_memmap_larger_than_the_buffer_keeps_rss_bounded",
    },
    "tests/sources/test_arrow_sources.py": {
        "test_reading_parquet_numbers_does_not_import_pandas",
        "test_tables_in_memory_yield_every_window_once",
        "test_workers_ranks_and_resume_are_exact",
    },
    "tests/sources/test_cache.py": {
        "test_budget_is_never_exceeded",
        "test_budget_of_half_the_data_hits_about_half_in_epoch_two",
        "test_changed_object_is_fetched_again",
        "test_concurrent_processes_share_the_cache",
        "test_killed_writer_leaves_nothing_a_reader_takes",
        "test_oracle_still_holds_through_the_cache",
        "test_second_epoch_and_second_open_make_no_get",
    },
    "tests/opening/test_checks.py": {
        "test_random_byte_flips_with_page_checksums_never_give_silent_differences",
        "test_too_many_open_files_is_a_resource_error_not_skipped",
    },
    "tests/opening/test_checks_s3.py": ALL,
    "tests/sources/test_dask_source.py": {
        "test_avro_through_from_map_on_the_cluster",
        "test_cluster_computes_partitions_and_keeps_them_in_flight",
        "test_dataloader_workers_reconnect_to_the_scheduler",
        "test_read_csv_on_the_cluster",
    },
    "tests/errors/test_faults.py": {
        "test_skipped_partition_keeps_equal_batches_on_two_ranks",
    },
    "tests/sources/test_footer_index.py": {
        "test_same_windows_and_batches_with_the_index_and_no_footer_read",
    },
    "tests/sources/test_footer_share.py": ALL,
    "tests/sources/test_index_cluster.py": ALL,  # a LocalCluster for the module
    "tests/sources/test_footers.py": {
        "test_many_small_files_keep_small_footers",
    },
    "tests/sources/test_hostile_reads.py": {
        "test_a_file_rewritten_between_passes_is_not_served_from_kept_heads",
        "test_a_deleted_file_never_lets_reads_overwrite_rows_a_slow_loop_still_draws",
        "test_damaged_bytes_raise_naming_file_and_column_or_are_skipped",
        "test_damaged_cache_entries_are_fetched_again_not_taken_as_data",
        "test_damaged_rows_in_dataloader_workers_raise_or_keep_the_batch_count",
        "test_null_series_ids_are_one_series_not_a_crash",
        "test_random_row_group_layouts_against_the_oracle",
        "test_real_panel_in_small_row_groups_every_window_once",
        "test_real_panel_sample_normalised_from_the_window_table_around_nan_weeks",
        "test_resume_over_a_damaged_kept_head_gives_the_rest_of_the_pass",
        "test_row_group_shapes_against_the_oracle",
        "test_tiny_row_groups_open_with_a_read_per_file_not_per_row_group",
        "test_two_live_iterators_interleaved_each_give_their_exact_batches",
    },
    "tests/sources/test_index_flips.py": {
        "test_a_byte_flipped_anywhere_in_the_index_is_refused_or_changes_nothing",
    },
    "tests/sources/test_parquet_open.py": {
        "test_a_damaged_footer_never_aborts_the_process",
    },
    "tests/sources/test_stats_check.py": {
        "test_min_max_is_arrows_min_max",
    },
    "tests/sources/test_s3.py": {
        "test_corrupt_object_raises_or_is_skipped",
        "test_coverage_listing_once_and_requests_per_partition",
        "test_object_glob_and_list_of_urls",
        "test_one_get_per_object_at_open_when_the_tail_tells_the_runs",
        "test_persistent_failure_names_the_object",
        "test_pickled_dataset_does_not_list_again",
        "test_transient_faults_complete_the_epoch_with_identical_batches",
        "test_transient_faults_while_opening_are_retried",
    },
    "tests/sources/test_source_conformance.py": {
        "test_every_format_serves_or_refuses_every_hostile_value_as_the_oracle_says",
    },
    "tests/speedups/test_gather_pages.py": {
        "test_a_run_gathered_a_chunk_of_batches_at_a_time_equals_batch_by_batch",
        "test_run_gather_cuts_every_window_as_the_oracle",
    },
    "tests/speedups/test_lanes.py": {
        "test_a_pass_left_open_at_exit_lets_the_interpreter_exit",
        "test_by_default_only_made_batches_from_the_size_threshold_go_on_two_lanes",
        "test_named_batches_made_on_two_lanes_equal_one_thread_and_the_oracle",
        "test_two_lanes_give_the_oracle_and_the_one_thread_batches",
    },
    "tests/speedups/test_next_pass.py": {
        "test_an_object_store_dataset_reads_its_next_pass_ahead_too",
        "test_close_and_garbage_collection_release_it",
        "test_persistent_workers_over_three_epochs_equal_a_fresh_loader_per_epoch",
        "test_workers_that_are_not_persistent_end_cleanly",
    },
    "tests/speedups/test_piece_speed_paths.py": {
        "test_segment_runs_expand_to_segment_starts",
        "test_segment_starts_is_window_starts_range_by_range",
    },
    "tests/speedups/test_slots.py": {
        "test_a_killed_worker_raises_and_leaves_no_shared_memory",
        "test_a_mixture_through_workers_uses_slots_and_keeps_its_windows",
        "test_batches_kept_by_the_loop_are_never_overwritten",
        "test_persistent_workers_two_iterators_and_an_abandoned_one",
        "test_ranks_with_workers_cover_the_epoch_once",
        "test_same_seed_gives_the_same_batches_in_the_same_order",
        "test_spawned_workers_use_slots_too",
        "test_stateful_loader_resumes_mid_epoch_with_workers",
        "test_workers_yield_the_oracle_windows_through_slots_and_the_same_as_no_workers",
    },
    "tests/settings/test_config.py": {
        "test_only_tuning_reads_the_environment_switches",
        "test_the_keywords_of_a_workflow_dataset_reopen_it",
        "test_the_values_agree_with_the_keywords_and_reopen_the_same_dataset",
    },
    "tests/test_dataset.py": {
        "test_persistent_workers_follow_set_epoch_and_advance_without_it",
        "test_same_seed_and_epoch_give_identical_batches",
    },
    "tests/test_ddp.py": ALL,
    "tests/test_docs.py": {
        "test_page_snippets_run",
        "test_readme_commands_are_what_ci_and_the_demo_run",
    },
    "tests/test_example_ddp.py": ALL,
    "tests/test_example_mixture.py": ALL,
    "tests/test_examples.py": ALL,
    "tests/test_forkrun.py": {
        "test_a_child_past_its_time_is_killed_and_the_wait_raises",
        "test_a_variable_set_for_good_by_an_earlier_test_still_forks",
        "test_a_zygote_started_under_another_environment_is_started_again",
    },
    "tests/test_golden.py": {
        "test_kept_orders_reproduce_their_golden_hash",
    },
    "tests/test_hangs.py": {
        "test_forkserver_workers_end_with_a_training_process_that_dies_hard",
    },
    "tests/test_harden.py": {
        "test_a_spread_part_rewritten_with_the_same_rows_raises",
    },
    "tests/ondevice/test_masks.py": {
        "test_every_call_starts_masked_with_probability_r",
    },
    "tests/test_mixture.py": {
        "test_counts_streams_and_order_over_four_epochs",
        "test_dataloader_workers_yield_the_same_batches",
        "test_ddp_two_gloo_ranks",
        "test_each_pass_takes_the_next_epoch_and_workers_agree",
        "test_elastic_resume_from_two_ranks_with_two_workers",
        "test_resume_at_every_interruption_point",
        "test_schedule_arithmetic_matches_brute_force",
    },
    "tests/runtime/test_normalize.py": {
        "test_global_statistics_equal_the_reference",
        "test_hostile_values_equal_the_float64_reference_in_worker_processes",
        "test_windows_equal_the_float64_oracle_to_float32_precision",
    },
    "tests/test_package.py": {
        "test_import_rules_of_the_architecture_page",
        "test_imports_leave_torch_alone",
        "test_may_import_cells_of_the_architecture_page_are_the_real_imports",
        "test_no_import_cycle_but_the_known_ones",
        "test_old_module_paths_warn_and_are_the_new_modules",
        "test_the_slow_tests_conftest_names_exist",
        "test_threads_start_in_the_listed_modules_only_and_in_one_runtime_module",
        "test_torch_side_exports_resolve_on_access",
        "test_worker_and_rank_detection_live_in_one_module",
    },
    "tests/test_real_data.py": ALL,
    "tests/workflow/test_batch.py": {
        "test_fields_without_values_keep_their_shapes_and_dtypes",
    },
    "tests/workflow/test_mixing.py": {
        "test_members_that_differ_are_refused_naming_the_member_and_the_field",
        "test_named_mixture_through_two_workers_and_a_resume",
    },
    "tests/workflow/test_transform_cache.py": {
        "test_kept_reads_yield_the_batches_of_fresh_reads_every_epoch",
        "test_persistent_workers_yield_the_batches_of_fresh_reads",
    },
    "tests/workflow/test_transform_disk_cache.py": {
        "test_dataloader_workers_yield_the_batches_of_no_cache",
    },
    "tests/workflow/test_workflow.py": {
        "test_calendar_arithmetic_equals_pandas",
        "test_fastai_takes_the_named_batch_as_input_and_its_target_for_the_loss",
    },
    "tests/workflow/test_workflow_cli.py": {
        "test_fit_command_writes_what_python_fits",
    },
    "tests/workflow/test_workflow_regressions.py": {
        "test_missing_time_steps_are_refused_with_their_count",
    },
}


@pytest.hookimpl(tryfirst=True)  # before -m "not slow" deselects
def pytest_collection_modifyitems(config, items) -> None:
    """Mark ``SLOW_TESTS`` slow; the slowest files first (a stable sort keeps every file's own order)."""
    root = str(config.rootpath)
    for item in items:
        slow = SLOW_TESTS.get(os.path.relpath(str(item.path), root).replace(os.sep, "/"), ())
        if slow == ALL or getattr(item, "originalname", item.name) in slow:
            item.add_marker(pytest.mark.slow)
    rank = {name: i for i, name in enumerate(SLOW_FILES)}
    items.sort(key=lambda item: rank.get(os.path.basename(str(item.path)), len(rank)))


@pytest.fixture(autouse=True)
def _release_next_passes():
    """Each test's read-ahead of a next pass (``nextpass``) ends with the test: its threads and buffers
    must not show in the next test's thread or memory checks (a module-scoped dataset keeps one)."""
    yield
    from dask_windows.speedups import nextpass

    nextpass.release_all()


@pytest.fixture(autouse=True)
def _earlier_threads():
    """The threads alive when each test begins, for ``helpers.threads_started_here``."""
    import threading

    from helpers import EARLIER_THREADS

    EARLIER_THREADS.clear()
    EARLIER_THREADS.update(threading.enumerate())
    yield
    EARLIER_THREADS.clear()
