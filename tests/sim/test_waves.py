"""Waveforms (docs/sim.md, "Waveforms"): ``--waves`` writes one FST file at a known path with
a GTKWave view beside it, ``--waves-from``/``--waves-to`` limit it to a window of simulated
time, and moving the window never rebuilds the simulator.

The two RTL tests are the slow ones of this file: ``test_port_loop_window_under_each_simulator``
builds a small design under Icarus and Verilator, and ``test_two_nics_window_without_rebuild``
runs the main job twice on the NIC pair of ``tests/hdl/test_nic_rtl.py`` (the export in
``build/tests/nic_pair`` is shared with that file; the traced model is built once, in its
``trace/`` folder, and kept).
"""

import shutil
import struct
from pathlib import Path

import pytest

from sim import cli, mainjob
from sim.env import BUILD
from sim.mainjob import run_scenario
from sim.scenario import Scenario
from sim.tb.fst import read_header, signal_names
from sim.tb.gtkw import view_groups, write_view
from sim.tb.runner import WavesWindow, run_cocotb
from tests.hdl.test_ports import PortLoop


def _span_us(path):
    header = read_header(path)
    return header.seconds(header.start) * 1e6, header.seconds(header.end) * 1e6


# -- the window and the flags (no simulation) -------------------------------------------------

@pytest.mark.parametrize("window, message", [
    ((-1.0, None), "--waves-from: must be a number of microseconds, 0 or more, not -1.0"),
    ((None, float("nan")), "--waves-to: must be a number of microseconds"),
    ((10.0, 10.0), r"--waves-to: must be later than --waves-from \(10.0 us\), not 10.0"),
])
def test_a_window_that_is_negative_or_empty_names_its_flag(window, message):
    with pytest.raises(ValueError, match=message):
        WavesWindow(Path("waves.fst"), *window)


def test_window_in_simulator_units():
    window = WavesWindow(Path("waves.fst"), 1.5, 20)
    assert (window.from_ps, window.to_ps) == (1_500_000, 20_000_000)
    assert WavesWindow(Path("waves.fst")).to_ps is None
    assert WavesWindow(Path("waves.fst"), None, 3).describe() == "from the start to 3 us"


def test_sim_flags_write_out_waves_fst(monkeypatch, tmp_path, capsys):
    """``mrc-nic sim --waves-from A --waves-to B``: the window implies --waves, the file is
    OUT/waves.fst, and neither the waves nor the window enter the build folder's key."""
    seen = {}

    def fake_run(scn, out, **kwargs):
        seen.update(scn=scn, waves=mainjob._waves_window(scn, out))
        raise SystemExit(0)

    monkeypatch.setattr(mainjob, "run_scenario", fake_run)
    with pytest.raises(SystemExit):
        cli.main(["sim", "--scenario", "clean", "--planes", "2", "--waves-from", "5",
                  "--waves-to", "12.5", "--out", str(tmp_path)])
    scn, waves = seen["scn"], seen["waves"]
    assert scn.waves and (scn.waves_from_us, scn.waves_to_us) == (5.0, 12.5)
    assert waves == WavesWindow(tmp_path / "waves.fst", 5.0, 12.5)
    assert mainjob._build_dir(scn) == mainjob._build_dir(
        scn.replace(waves=False, waves_from_us=None, waves_to_us=None))


@pytest.mark.parametrize("argv, message", [
    (["--waves-from", "10", "--waves-to", "4"],
     "mrc-nic sim: --waves-to: must be later than 10.0 us"),
    (["--waves-from", "-3"], "mrc-nic sim: --waves-from: must be a number from 0 to"),
    (["--waves", "--backend", "model"], "mrc-nic sim: --waves: the model backend has no"),
])
def test_sim_rejects_a_bad_window_in_one_line(argv, message, capsys):
    assert cli.main(["sim", *argv]) == 2
    err = capsys.readouterr().err
    assert err.startswith(message) and err.count("\n") == 1


def test_replay_rejects_an_empty_window(tmp_path, capsys):
    from sim.samples import write_sample_pcap
    write_sample_pcap(tmp_path / "in.pcap")
    assert cli.main(["replay", str(tmp_path / "in.pcap"), "--waves-from", "3",
                     "--waves-to", "1"]) == 2
    assert capsys.readouterr().err.startswith(
        "mrc-nic replay: --waves-to: must be later than --waves-from (3.0 us), not 1.0")


# -- reading FST files and the saved view -----------------------------------------------------

def test_fst_header_and_a_view_from_the_names_in_the_file(tmp_path):
    """A minimal FST file: a header block and an LZ4 hierarchy block, as Verilator writes."""
    hierarchy = (b"\xfe\x00nic_pair\x00nic_pair\x00"
                 + b"\xfe\x00nic_a\x00mrc_nic\x00"
                 + b"".join(b"\x00\x00" + name + b"\x00" + bytes([width, 0])
                            for name, width in [(b"bus__addr [11:0]", 12), (b"bus__w_en", 1),
                                                (b"rx__0__valid", 1), (b"rx__0__ready", 1),
                                                (b"tx__0__valid", 1), (b"ignored", 1)])
                 + b"\xff\xff")
    lz4 = bytes([0xF0, len(hierarchy) - 15]) + hierarchy       # literals only
    header = struct.pack(">QQdQQQQQb", 2_000_000, 7_000_000, 0.0, 0, 2, 6, 6, 0, -12)
    header += bytes(329 - 8 - len(header))
    path = tmp_path / "waves.fst"
    path.write_bytes(b"\x00" + struct.pack(">Q", 329) + header
                     + b"\x06" + struct.pack(">QQ", 8 + 8 + len(lz4), len(hierarchy)) + lz4)
    assert _span_us(path) == (2.0, 7.0)
    names = signal_names(path)
    assert names[0] == ("nic_pair.nic_a.bus__addr [11:0]", 12)
    groups = dict(view_groups(names))
    assert groups["nic_a: register bus"] == ["nic_pair.nic_a.bus__addr [11:0]",
                                            "nic_pair.nic_a.bus__w_en"]
    assert groups["nic_a: RX ports"] == ["nic_pair.nic_a.rx__0__valid",
                                        "nic_pair.nic_a.rx__0__ready"]
    view = write_view(path).read_text()
    assert f'[dumpfile] "{path.resolve()}"' in view
    assert "nic_pair.nic_a.bus__addr[11:0]" in view and "ignored" not in view


# -- RTL: a small design under each simulator -------------------------------------------------

@pytest.mark.parametrize("sim", ["icarus", "verilator"])
def test_port_loop_window_under_each_simulator(sim, tmp_path, capsys):
    """Slow (a small build per simulator). Two windows, one build: each file holds only its
    window, and under Verilator the simulator binary is the same file afterwards."""
    if sim == "verilator" and shutil.which("verilator") is None:
        pytest.skip("no verilator")
    build = tmp_path / "build"
    stamps = []
    for window in ((1.0, 3.0), (4.0, 6.5)):
        fst = tmp_path / f"out-{window[0]}" / "waves.fst"
        run_cocotb(PortLoop(data_width=64, ports=2), toplevel="port_loop",
                   test_module="sim.tb.cocotb_ports", build_dir=build, sim=sim, reuse=True,
                   quick_build=True, extra_env={"PORTS": 2, "DATA_WIDTH": 64},
                   waves=WavesWindow(fst, *window))
        start, end = _span_us(fst)
        assert window[0] - 1e-6 <= start < end <= window[1] + 1e-6
        assert fst.with_suffix(".gtkw").exists()
        assert f"waves: {fst}" in capsys.readouterr().out
        if sim == "verilator":
            stamps.append((build / "trace" / "port_loop").stat().st_mtime_ns)
    assert len(set(stamps)) <= 1, "moving the window rebuilt the simulator"


# -- RTL: the main job ------------------------------------------------------------------------

def test_two_nics_window_without_rebuild(tmp_path):
    """Slow (the NIC pair of tests/hdl/test_nic_rtl.py, its export shared, the traced model built
    once into trace/). The main job with a window writes OUT/waves.fst and OUT/waves.gtkw; a
    second run with only another window reuses the build as it is and gives the same
    report."""
    if shutil.which("verilator") is None:
        pytest.skip("no verilator")
    # tests/hdl/test_nic_rtl.py's folder: the same export (the same NIC configuration). Under
    # --dist loadfile that file may run beside this one: run_cocotb locks the folder while it
    # exports, and each file builds in its own subfolder (this one in trace/).
    build = BUILD / "tests" / "nic_pair"
    scn = Scenario(name="waves", planes=4, mtu=512, evs=16, qps=1, bytes=8 * 1024,
                   msg_size=4 * 1024, fail_plane=None, fail_at_us=None, recover_at_us=None,
                   max_us=500.0, seed=3, waves=True, waves_from_us=2.0, waves_to_us=6.0)
    logs = []
    first = run_scenario(scn, tmp_path / "first", build_dir=build, quick_build=True,
                         log=logs.append)
    binary = (build / "trace" / "nic_pair").stat().st_mtime_ns
    fst = tmp_path / "first" / "waves.fst"
    start, end = _span_us(fst)
    assert 2.0 - 1e-6 <= start < end <= 6.0 + 1e-6
    names = {name for name, _ in signal_names(fst)}
    assert "nic_pair.nic_b.rx__3__valid" in names
    assert any(name.startswith("nic_pair.nic_a.bus__addr") for name in names)
    view = (tmp_path / "first" / "waves.gtkw").read_text()
    for group in ("nic_a: register bus", "nic_b: RX ports", "nic_a: TX ports",
                  "nic_a: requester: ACKs in, QP state"):
        assert f"-{group}" in view
    assert any(f"waves: {fst}" in line for line in logs)
    assert any("the transfer started at" in line for line in logs)

    second = run_scenario(scn.replace(waves_from_us=8.0, waves_to_us=9.0), tmp_path / "second",
                          build_dir=build, quick_build=True, log=lambda *_: None)
    assert (build / "trace" / "nic_pair").stat().st_mtime_ns == binary, \
        "a new window rebuilt the NICs"
    start, end = _span_us(tmp_path / "second" / "waves.fst")
    assert 8.0 - 1e-6 <= start < end <= 9.0 + 1e-6
    for key in ("bytes_delivered", "packets_sent", "retransmissions", "duration_us"):
        assert first[key] == second[key]
