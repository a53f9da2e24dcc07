"""Every ``mrc-nic`` subcommand answers bad input with one line,
``mrc-nic <command>: <flag or field>: <what is wrong>``, and exit status 2, never a traceback;
``--help`` works for each and shows the defaults; ``--version`` prints the package's version.

Run in this process through :func:`sim.cli.main` (no subprocess, no simulation: every error
here is found before any work starts).
"""

import json
from importlib.metadata import version

import pytest

from sim import mainjob
from sim.cli import main
from sim.scenario import SCENARIOS, Scenario, scenario_names


def run(capsys, *argv):
    status = main([str(arg) for arg in argv])
    out, err = capsys.readouterr()
    return status, out, err


def assert_one_line_error(status, out, err, prefix):
    assert status == 2, err
    assert "Traceback" not in err and out == ""
    assert err.endswith("\n") and err.count("\n") == 1, err
    assert err.startswith(prefix), err


@pytest.fixture
def files(tmp_path):
    """Inputs that are wrong in one way each."""
    blocker = tmp_path / "blocker"            # a file where a folder is needed
    blocker.write_text("")
    bad_json = tmp_path / "bad.json"
    bad_json.write_text("{not json")
    bad_field = tmp_path / "qps.json"
    bad_field.write_text(json.dumps({"qps": 100}))
    text = tmp_path / "notes.pcap"
    text.write_text("not a capture\n")
    return {"missing": tmp_path / "absent.json", "blocker": blocker, "bad_json": bad_json,
            "bad_field": bad_field, "text": text, "tmp": tmp_path}


# (argv with placeholders for the fixture's files, expected start of the error line)
CASES = [
    # pcap-sample
    (["pcap-sample"], "mrc-nic pcap-sample: OUT.pcap: required"),
    (["pcap-sample", "{blocker}/x.pcap"], "mrc-nic pcap-sample: {blocker}/x.pcap: cannot write"),
    (["pcap-sample", "x.pcap", "--list=yes"], "mrc-nic pcap-sample: --list: ignored explicit"),
    (["pcap-sample", "x.pcap", "--nope"], "mrc-nic pcap-sample: --nope: not an option"),
    # ev expand
    (["ev"], "mrc-nic ev: COMMAND: required"),
    (["ev", "expand"], "mrc-nic ev expand: PROFILE.json: required"),
    (["ev", "expand", "{missing}"], "mrc-nic ev expand: {missing}: cannot read"),
    (["ev", "expand", "{bad_json}"], "mrc-nic ev expand: {bad_json}: not valid JSON"),
    (["ev", "expand", "{bad_json}", "--json=1"], "mrc-nic ev expand: --json: ignored explicit"),
    # dissector
    (["dissector", "--out", "{blocker}/mrc.lua"], "mrc-nic dissector: --out: cannot write"),
    (["dissector", "--out"], "mrc-nic dissector: --out: expected one argument"),
    # wirecheck
    (["wirecheck"], "mrc-nic wirecheck: CAPTURE: required"),
    (["wirecheck", "{missing}"], "mrc-nic wirecheck: {missing}: cannot read"),
    (["wirecheck", "{text}"], "mrc-nic wirecheck: {text}: not a pcap or pcapng capture"),
    (["wirecheck", "{text}", "--report", "{bad_json}"],
     "mrc-nic wirecheck: {bad_json}: not valid JSON"),
    (["wirecheck", "{text}", "--trim-dscp", "64"],
     "mrc-nic wirecheck: --trim-dscp: must be from 0 to 63, not 64"),
    (["wirecheck", "{text}", "--tshark", "always"],
     "mrc-nic wirecheck: --tshark: invalid choice: 'always'"),
    # flow
    (["flow", "--bytes", "0"], "mrc-nic flow: --bytes: must be at least 1, not 0"),
    (["flow", "--msg-size", "0"], "mrc-nic flow: --msg-size: must be at least 1, not 0"),
    (["flow", "--mtu", "1500"], "mrc-nic flow: --mtu: must be one of 256, 512, 1024, 2048, 4096"),
    (["flow", "--planes", "40"], "mrc-nic flow: --planes: must be an integer from 1 to 16"),
    (["flow", "--evs", "0"], "mrc-nic flow: --evs: must be at least 1, not 0"),
    (["flow", "--ack-every", "0"], "mrc-nic flow: --ack-every: must be at least 1, not 0"),
    (["flow", "--profile", "{missing}"], "mrc-nic flow: --profile: cannot read EV profile"),
    (["flow", "--profile", "{bad_json}"], "mrc-nic flow: --profile: {bad_json}: not valid JSON"),
    (["flow", "--seed", "one"], "mrc-nic flow: --seed: must be an integer, not 'one'"),
    (["flow", "--out", "{blocker}/out"], "mrc-nic flow: --out: {blocker}/out: cannot create"),
    (["flow", "--sim", "xsim"], "mrc-nic flow: --sim: invalid choice: 'xsim'"),
    # sim: the flags that are not scenario fields (those are in SIM_FLAG_VALUES below)
    (["sim", "--scenario", "nope"], "mrc-nic sim: --scenario: must be a named scenario"),
    (["sim", "--scenario", "{missing}.toml"], "mrc-nic sim: --scenario: {missing}.toml: cannot "
                                              "read"),
    (["sim", "--config", "{missing}"], "mrc-nic sim: --config: {missing}: cannot read"),
    (["sim", "--config", "{bad_json}"], "mrc-nic sim: --config: {bad_json}: not valid JSON"),
    (["sim", "--config", "{bad_field}"], "mrc-nic sim: --config: {bad_field}: qps: must be one "
                                         "of 2, 4"),
    (["sim", "--backend", "fpga"], "mrc-nic sim: --backend: invalid choice: 'fpga'"),
    (["sim", "--baseline", "ospf"], "mrc-nic sim: --baseline: invalid choice: 'ospf'"),
    (["sim", "--sim", "xsim"], "mrc-nic sim: --sim: invalid choice: 'xsim'"),
    (["sim", "--waves=yes"], "mrc-nic sim: --waves: ignored explicit"),
    (["sim", "--one-way=yes"], "mrc-nic sim: --one-way: ignored explicit"),
    (["sim", "--list=yes"], "mrc-nic sim: --list: ignored explicit"),
    (["sim", "--backend", "model", "--out", "{blocker}/run"], "mrc-nic sim: --out: "
                                                              "{blocker}/run: cannot create"),
    (["sim", "--planes", "x"], "mrc-nic sim: --planes: must be an integer, not 'x'"),
    (["sim", "--loss", "x"], "mrc-nic sim: --loss: must be a number, not 'x'"),
    (["sim", "--plane", "2"], "mrc-nic sim: --plane: not an option"),        # no abbreviations
    # replay
    (["replay"], "mrc-nic replay: IN.pcap: required"),
    (["replay", "{missing}"], "mrc-nic replay: {missing}: no such file"),
    (["replay", "{text}"], "mrc-nic replay: {text}: not a pcap"),
    (["replay", "{text}", "--config", "{bad_field}"], "mrc-nic replay: --config: {bad_field}: "
                                                      "qps: must be one of"),
    (["replay", "{text}", "--port", "99"], "mrc-nic replay: --port: must be an integer from 0 "
                                           "to 7"),
    (["replay", "{text}", "--sim", "xsim"], "mrc-nic replay: --sim: invalid choice: 'xsim'"),
    (["replay", "{text}", "--json"], "mrc-nic replay: --json: expected one argument"),
    (["replay", "{text}", "--out"], "mrc-nic replay: --out: expected one argument"),
    # bench
    (["bench", "--widths", "65"], "mrc-nic bench: --widths: must be a comma-separated list of "
                                  "64, 128, 256, not '65'"),
    (["bench", "--sim", "xsim"], "mrc-nic bench: --sim: must be a comma-separated list of "
                                 "icarus, verilator, not 'xsim'"),
    (["bench", "--sims", "icarus,x"], "mrc-nic bench: --sims: must be"),
    (["bench", "--fabric-sims", "x"], "mrc-nic bench: --fabric-sims: must be"),
    (["bench", "--count", "0"], "mrc-nic bench: --count: must be at least 1, not 0"),
    (["bench", "--only", "all"], "mrc-nic bench: --only: invalid choice: 'all'"),
    (["bench", "--out", "{blocker}/x/packet.json"], "mrc-nic bench: --out: {blocker}/x: cannot "
                                                    "create"),
    # verilog
    (["verilog", "--config", "{missing}"], "mrc-nic verilog: --config: {missing}: cannot read"),
    (["verilog", "--config", "{bad_json}"], "mrc-nic verilog: --config: {bad_json}: not valid "
                                            "JSON"),
    (["verilog", "--config", "{bad_field}"], "mrc-nic verilog: --config: {bad_field}: qps: must "
                                             "be one of"),
    (["verilog", "--out", "{blocker}/x.sv"], "mrc-nic verilog: --out: {blocker}/x.sv: cannot "
                                             "write"),
    (["verilog", "--lint=1"], "mrc-nic verilog: --lint: ignored explicit"),
    # registers
    (["registers", "--config", "{missing}"], "mrc-nic registers: --config: {missing}: cannot "
                                             "read"),
    (["registers", "--config", "{bad_json}"], "mrc-nic registers: --config: {bad_json}: not "
                                              "valid JSON"),
    (["registers", "--format", "pdf"], "mrc-nic registers: --format: must be one of"),
    (["registers", "--out"], "mrc-nic registers: --out: expected one argument"),
    # boards and its subcommands
    (["boards"], "mrc-nic boards: ACTION: required"),
    (["boards", "bitstream"], "mrc-nic boards bitstream: --board: required"),
    (["boards", "bitstream", "--board", "nope"], "mrc-nic boards bitstream: --board: invalid "
                                                 "choice: 'nope'"),
    (["boards", "bitstream", "--board", "ulx3s", "--seed", "x"], "mrc-nic boards bitstream: "
                                                                 "--seed: must be an integer"),
    (["boards", "synth-report", "--boards", "nope"], "mrc-nic boards synth-report: --boards: "
                                                     "board must be one of"),
    (["boards", "synth-report", "--boards", "", "--benches", "nope"],
     "mrc-nic boards synth-report: --benches: bench must be one of"),
    (["boards", "synth-report", "--scaling", "--blocks", "nope"],
     "mrc-nic boards synth-report: --blocks: block must be one of"),
    (["boards", "synth-report", "--blocks", "requester"],
     "mrc-nic boards synth-report: --blocks: chooses the scaling runs: it needs --scaling"),
    (["boards", "synth-report", "--scaling", "--qps", "x"],
     "mrc-nic boards synth-report: --qps: must be comma-separated integers, not 'x'"),
    (["boards", "synth-report", "--scaling", "--qps", "100"],
     "mrc-nic boards synth-report: --qps: must be one of 2, 4,"),
    (["boards", "synth-report", "--timeout", "0"],
     "mrc-nic boards synth-report: --timeout: must be a positive number of minutes"),
    (["boards", "synth-report", "--place"],
     "mrc-nic boards synth-report: --place: places the scaling blocks: it needs --scaling"),
    (["boards", "list", "extra"], "mrc-nic boards list: extra: not an option"),
    # the command itself
    (["nope"], "mrc-nic: COMMAND: invalid choice: 'nope'"),
    ([], "mrc-nic: COMMAND: required"),
]


@pytest.mark.parametrize(("argv", "prefix"), CASES, ids=[" ".join(c[0]) for c in CASES])
def test_bad_input_is_one_line_and_status_2(capsys, files, argv, prefix):
    argv = [arg.format(**files) for arg in argv]
    assert_one_line_error(*run(capsys, *argv), prefix.format(**files))


# A value outside the allowed range for every scenario flag of `mrc-nic sim`.
SIM_FLAG_VALUES = {
    "--planes": ("40", "must be an integer from 1 to 16, not 40"),
    "--qps": ("17", "must be an integer from 1 to 16, not 17"),
    "--bytes": ("0", "must be an integer from 1 to 1073741824, not 0"),
    "--msg-size": ("-1", "must be an integer from 0 to 1073741824, not -1"),
    "--mtu": ("1500", "must be one of 256, 512, 1024, 2048, 4096, not 1500"),
    "--fail-plane": ("8", "must be an integer from 0 to 7 (one less than planes (set by "
                          "scenario 'default')), not 8"),
    "--fail-at": ("-5", "must be a number from 0 to 1000000000, not -5.0"),
    "--recover-at": ("10", "must be later than 40.0 us, the failure time fail_at_us (set by "
                           "scenario 'default'), not 10.0"),
    "--loss": ("0.6", "must be a number from 0.0 to 0.5, not 0.6"),
    "--trim-threshold": ("-1", "must be an integer from 0 to 1073741824, not -1"),
    "--ecn-threshold": ("-1", "must be an integer from 0 to 1073741824, not -1"),
    "--evs": ("65", "must be an integer from 1 to 64, not 65"),
    "--seed": ("-1", "must be an integer from 0 to 2147483647, not -1"),
    "--timeout": ("25", "must be an integer from 0 to 24, not 25"),
    "--infer-k": ("16", "must be an integer from 0 to 15, not 16"),
    "--reo-wnd": ("64", "must be an integer from 0 to 63, not 64"),
    "--port-wnd": ("64", "must be an integer from 0 to 63, not 64"),
    "--port-quiet": ("64", "must be an integer from 0 to 63, not 64"),
    "--ack-every": ("256", "must be an integer from 1 to 255, not 256"),
    "--ack-delay": ("0", "must be an integer from 1 to 4294967295, not 0"),
    "--coalesce-gaps": ("2", "must be an integer from 0 to 1, not 2"),
    "--ack-new-holes": ("2", "must be an integer from 0 to 1, not 2"),
    "--gap-depth": ("16", "must be an integer from 0 to 15, not 16"),
    "--fate": ("2", "must be an integer from 0 to 1, not 2"),
    "--cc": ("2", "must be one of ecn, nscc, off, not '2'"),
    "--nics": ("17", "must be an integer from 2 to 16, not 17"),
    "--pattern": ("ring", "must be one of pairs, incast, all-to-all, not 'ring'"),
    "--max-us": ("0.5", "must be a number from 1.0 to 10000000, not 0.5"),
}


def test_every_sim_flag_has_a_bad_value_case():
    assert set(SIM_FLAG_VALUES) == {flag for flag, *_ in mainjob.FLAGS}


@pytest.mark.parametrize("flag", sorted(SIM_FLAG_VALUES))
def test_sim_flag_out_of_range(capsys, tmp_path, flag):
    value, message = SIM_FLAG_VALUES[flag]
    status, out, err = run(capsys, "sim", flag, value, "--out", tmp_path / "run")
    assert_one_line_error(status, out, err, "mrc-nic sim: ")
    assert err == f"mrc-nic sim: {flag}: {message}\n"
    assert not (tmp_path / "run").exists()


def test_sim_names_the_scenario_that_set_a_value(capsys):
    """A value the user did not give is named by the scenario field that set it, and the flag
    that made it wrong by its flag."""
    status, out, err = run(capsys, "sim", "--planes", "2")
    assert_one_line_error(status, out, err, "mrc-nic sim: ")
    assert err == ("mrc-nic sim: fail_plane (set by scenario 'default'): must be an integer "
                   "from 0 to 1 (one less than --planes), not 3\n")
    status, out, err = run(capsys, "sim", "--scenario", "flap", "--recover-at", "20")
    assert err == ("mrc-nic sim: --recover-at: must be later than 30.0 us, the failure time "
                   "fail_at_us (set by scenario 'flap'), not 20.0\n")


def test_sim_config_bounds_the_scenario(capsys, tmp_path):
    """``--config`` sets the build: its ports and MTU become the scenario's, its QP and EV
    counts bound ``--qps`` and ``--evs``; the error names both sides."""
    config = tmp_path / "nic.json"
    config.write_text(json.dumps({"qps": 64, "ports": 4, "evs_per_profile": 128}))
    status, out, err = run(capsys, "sim", "--config", config, "--qps", "100")
    assert_one_line_error(status, out, err, "mrc-nic sim: ")
    assert err == ("mrc-nic sim: --qps: must be an integer from 1 to 64 (the qps of --config), "
                   "not 100\n")
    status, out, err = run(capsys, "sim", "--config", config, "--planes", "8")
    assert err == "mrc-nic sim: --planes: must be 4 (the ports of --config), not 8\n"
    small = tmp_path / "small.json"
    small.write_text(json.dumps({"qps": 64, "ports": 4, "evs_per_profile": 16}))
    status, out, err = run(capsys, "sim", "--config", small, "--fail-plane", "-1")
    assert err == ("mrc-nic sim: evs (set by scenario 'default'): must be an integer from 1 to "
                   "16 (the evs_per_profile of --config), not 32\n")
    status, out, err = run(capsys, "sim", "--config", small, "--evs", "8", "--qps", "32")
    assert err == ("mrc-nic sim: --qps: must be an integer from 1 to 16 (the evs_per_profile of "
                   "--config: QP n starts at EV n), not 32\n")


@pytest.mark.parametrize(("text", "message"), [
    ("planes = 40\n", "{file}: planes: must be an integer from 1 to 16, not 40"),
    ("plane = 4\n", "{file}: plane: not a scenario field (did you mean 'planes'?)"),
    ("fail_kind = 3\n", "{file}: fail_kind: must be blackhole or flap, not 3"),
    ("waves = \"yes\"\n", "{file}: waves: must be true or false, not 'yes'"),
    ("base = \"nope\"\n", "{file}: base: must be a named scenario other than this one"),
    ("planes = 2\n", "fail_plane (set by scenario 'default'): must be an integer from 0 to 1 "
                     "(one less than planes in {file}), not 3"),
    ("planes = [\n", "{file}: not a valid TOML file"),
])
def test_bad_scenario_file(capsys, tmp_path, text, message):
    path = tmp_path / "run.toml"
    path.write_text(text)
    status, out, err = run(capsys, "sim", "--scenario", path)
    assert_one_line_error(status, out, err, "mrc-nic sim: ")
    assert err.startswith(f"mrc-nic sim: {message.format(file=path)}")


def test_flags_override_the_scenario_file_and_are_checked_against_it(capsys, tmp_path):
    path = tmp_path / "run.toml"
    path.write_text("planes = 4\nfail_plane = 3\n")
    status, _, err = run(capsys, "sim", "--scenario", path, "--fail-plane", "5")
    assert err == ("mrc-nic sim: --fail-plane: must be an integer from 0 to 3 (one less than "
                   f"planes in {path}), not 5\n")


# -- --help, --list and --version --------------------------------------------------------------

# Every subcommand, and a default its --help must show.
HELP = [
    (["pcap-sample"], "OUT.pcap"),
    (["ev"], "expand"),
    (["ev", "expand"], "PROFILE.json"),
    (["dissector"], "default: sim/wireshark/mrc.lua"),
    (["flow"], "(default: 262144)"),
    (["sim"], "(default: 8)"),
    (["fuzz"], "(default: 10000)"),
    (["replay"], "(default: 0)"),
    (["wirecheck"], "(default: 33)"),
    (["bench"], "(default: 40)"),
    (["verilog"], "mrc_nic.sv)"),
    (["registers"], "(default: md)"),
    (["boards"], "synth-report"),
    (["boards", "bitstream"], "(default: 1)"),
    (["boards", "synth-report"], "default requester,responder,path_select"),
    (["boards", "list"], "usage: mrc-nic boards list"),
]


@pytest.mark.parametrize(("argv", "shown"), HELP, ids=[" ".join(a) for a, _ in HELP])
def test_help(capsys, argv, shown):
    status, out, err = run(capsys, *argv, "--help")
    assert (status, err) == (0, "")
    assert out.startswith(f"usage: mrc-nic {' '.join(argv)}")
    assert shown in " ".join(out.split())           # as help wraps it


def test_every_subcommand_has_a_help_case():
    from sim.cli import build_parser
    parser = build_parser()
    commands = {name for action in parser._subparsers._group_actions
                for name in action.choices}
    assert commands == {argv[0] for argv, _ in HELP}


def test_sim_help_shows_ranges_and_defaults(capsys):
    _, out, _ = run(capsys, "sim", "--help")
    out = " ".join(out.split())
    assert "planes (NIC ports): an integer from 1 to 16; with --config, its ports (default: 8)" \
        in out
    assert "an integer from 0 to 15 (default: 8)" in out                 # --infer-k


def test_version(capsys):
    status, out, err = run(capsys, "--version")
    assert (status, err) == (0, "")
    assert out == f"mrc-nic {version('mrc-nic')}\n"


def test_sim_list_names_every_scenario_file(capsys):
    status, out, err = run(capsys, "sim", "--list")
    assert (status, err) == (0, "")
    lines = out.splitlines()
    assert [line.split()[0] for line in lines] == scenario_names()
    assert scenario_names()[0] == "default" and set(scenario_names()) == set(SCENARIOS)
    assert all(len(line.split(maxsplit=1)) == 2 for line in lines)    # a description each


def test_default_scenario_file_is_the_dataclass_default():
    """``make sim`` runs the same values as before scenarios were files."""
    assert SCENARIOS["default"] == Scenario()
