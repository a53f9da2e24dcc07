"""The control of path select: the command FSM (``mrc_ctl.h`` semantics).

One command at a time: DRAIN (the entry update empties) -> READ (the command's profile is
read into registers) -> SELECT (the entry's bits and the comparisons, into registers) ->
LOOKUP (the reductions over them, into registers) -> EXEC (checks, in the documented order,
on flags only; the outcome into registers) -> DISPATCH (acts on it) -> the command's states
-> RESPOND.
"""

from amaranth import *
from amaranth.lib import data, enum, stream, wiring
from amaranth.lib.memory import WritePort
from amaranth.lib.wiring import In, Out

from ..config import NicConfig
from ..interfaces import (
    EV_VALUE_BITS,
    ev_fields_layout,
    expand_request_layout,
    expand_response_layout,
    generate_request_layout,
    generate_response_layout,
)
from ..protocol import Errno, EvMode, EvState, ProfileState
from ..util import validating
from .pathdefs import (
    COUNT_BITS,
    EV_PORT_BITS,
    HASH_MULTIPLIER,
    EntryOp,
    PathCommand,
    binding_layout,
    choose,
    entry_op_layout,
    entry_word_layout,
    entry_words,
    fields_word_layout,
    path_command_layout,
    path_response_layout,
    profile_params_layout,
)

__all__ = ["PathControl"]


class _Action(enum.Enum, shape=4):
    """What a command does once EXEC has checked it."""
    RESPOND = 0                 #: answer (an error, or a read's data)
    SET_PROFILE = 1             #: PROFILE_SET: store the parameters, forget the entries
    SET_STATE = 2               #: PROFILE_STATE: change the state
    GENERATE = 3                #: GENERATED profile going ONLINE: generate the array
    EXPAND = 4                  #: ENTRY_WRITE: expand the value, then store
    SET_ENTRY_STATE = 5         #: ENTRY_STATE through the entry update
    READ_ENTRY = 6              #: ENTRY_READ through the entry update
    BIND = 7                    #: QP_PROFILE: write the binding


class PathControl(wiring.Component):
    """Execute path-select commands, one at a time, and answer each in order.

    Latency: a few cycles per command (the entry update drains first), plus the expander's
    time for ENTRY_WRITE and for a GENERATED profile going ONLINE. While a command runs
    (``ctl_busy``) the entry update takes only its operations; QP_PROFILE also holds the
    selector (``sel_hold``) and writes the binding only once the selector is idle.

    Hazards: the profile's registers and the entry's bits are read in READ and SELECT, after
    the entry update has drained, and nothing else writes them while the command runs; an entry
    operation's result is read when it reaches the entry update's deciding stage
    (``result_valid``).

    Parameters
    ----------
    config : NicConfig
    modify_online : bool
    hash_seed : int

    Members
    -------
    ctl : ``In(stream.Signature(path_command_layout(config)))``
    ctl_resp : ``Out(stream.Signature(path_response_layout(config)))``
    exp_req, exp_resp, gen_req, gen_resp : to the EV expander
    state, params, good, written, denied, good_count : ``In``, the profile table
    set_en, set_profile, set_params, state_en, state_profile, state_value, clear_en,
    clear_profile : ``Out``, to the profile table
    ctl_busy : ``Out(1)``; ctl_op : ``Out(stream.Signature(entry_op_layout, always_ready=True))``
    engine_busy, result_valid, result, result_skip : ``In``, from the entry update
    fields_wr : the fields RAM's write port
    binding_wr : ``Out``, the binding RAM's write port (QP_PROFILE); sel_hold : ``Out(1)``
    selector_idle : ``In(1)``
    """

    def __init__(self, *, config, modify_online=False, hash_seed=0):
        with validating(self):
            if not isinstance(config, NicConfig):
                raise TypeError(f"Config must be a NicConfig, not {config!r}")
        self._config = config
        self._modify_online = modify_online
        self._hash_seed = hash_seed
        n, evs = config.ev_profiles, config.evs_per_profile
        addr_bits = (entry_words(config) - 1).bit_length()
        super().__init__({
            "ctl": In(stream.Signature(path_command_layout(config))),
            "ctl_resp": Out(stream.Signature(path_response_layout(config))),
            "exp_req": Out(stream.Signature(expand_request_layout(config))),
            "exp_resp": In(stream.Signature(expand_response_layout(config))),
            "gen_req": Out(stream.Signature(generate_request_layout(config))),
            "gen_resp": In(stream.Signature(generate_response_layout(config))),
            "state": In(data.ArrayLayout(unsigned(2), n)),
            "params": In(data.ArrayLayout(profile_params_layout(config), n)),
            "good": In(data.ArrayLayout(unsigned(evs), n)),
            "written": In(data.ArrayLayout(unsigned(evs), n)),
            "denied": In(data.ArrayLayout(unsigned(evs), n)),
            "good_count": In(data.ArrayLayout(unsigned(COUNT_BITS), n)),
            "set_en": Out(1),
            "set_profile": Out(4),
            "set_params": Out(profile_params_layout(config)),
            "state_en": Out(1),
            "state_profile": Out(4),
            "state_value": Out(2),
            "clear_en": Out(1),
            "clear_profile": Out(4),
            "ctl_busy": Out(1),
            "ctl_op": Out(stream.Signature(entry_op_layout(config), always_ready=True)),
            "engine_busy": In(1),
            "result_valid": In(1),
            "result": In(entry_word_layout(config)),
            "result_skip": In(1),
            "fields_wr": Out(WritePort.Signature(addr_width=addr_bits,
                                                 shape=fields_word_layout(config))),
            "binding_wr": Out(WritePort.Signature(addr_width=config.qpn_bits,
                                                  shape=binding_layout(config))),
            "sel_hold": Out(1),
            "selector_idle": In(1),
        })

    def _lookup(self, m, cmd):
        """The command's profile and entry in registers, over three cycles, so that EXEC only
        combines flags: READ takes the profile's registers (``raw``), SELECT the entry's bits,
        the mask of the indices below ``num_evs`` and the comparisons (``part``), LOOKUP the
        reductions over them (``look``)."""
        cfg = self._config
        n_profiles, n_evs = cfg.ev_profiles, cfg.evs_per_profile
        raw = Signal(data.StructLayout({
            "state": 2, "params": profile_params_layout(cfg), "good_count": COUNT_BITS,
            "good": n_evs, "written": n_evs, "denied": n_evs}))
        raw_now = Signal.like(raw)
        m.d.comb += [
            raw_now.state.eq(choose(m, [self.state[p] for p in range(n_profiles)], cmd.profile,
                                    "cmd_state")),
            raw_now.params.eq(choose(m, [self.params[p].as_value() for p in range(n_profiles)],
                                     cmd.profile, "cmd_params")),
            raw_now.good_count.eq(choose(m, [self.good_count[p] for p in range(n_profiles)],
                                         cmd.profile, "cmd_good_count")),
            raw_now.good.eq(choose(m, [self.good[p] for p in range(n_profiles)], cmd.profile,
                                   "cmd_good")),
            raw_now.written.eq(choose(m, [self.written[p] for p in range(n_profiles)],
                                      cmd.profile, "cmd_written")),
            raw_now.denied.eq(choose(m, [self.denied[p] for p in range(n_profiles)],
                                     cmd.profile, "cmd_denied")),
        ]
        common = {"state": 2, "params": profile_params_layout(cfg), "good_count": COUNT_BITS,
                  "index_ok": 1, "entry_good": 1, "entry_written": 1, "entry_denied": 1}
        part = Signal(data.StructLayout({**common, "unwritten": n_evs, "at_floor": 1,
                                         "below_floor": 1}))
        part_now = Signal.like(part)
        params = raw.params
        m.d.comb += [
            part_now.state.eq(raw.state), part_now.params.eq(params),
            part_now.good_count.eq(raw.good_count),
            part_now.index_ok.eq((cmd.index < params.num_evs) & (cmd.index < n_evs)),
            part_now.entry_good.eq(raw.good.bit_select(cmd.index, 1)),
            part_now.entry_written.eq(raw.written.bit_select(cmd.index, 1)),
            part_now.entry_denied.eq(raw.denied.bit_select(cmd.index, 1)),
            # The indices below num_evs not written yet (one comparison with a constant each,
            # not a shifter).
            part_now.unwritten.eq(Cat(*((params.num_evs > i) & ~raw.written[i]
                                        for i in range(n_evs)))),
            part_now.at_floor.eq(raw.good_count <= params.min_active),
            part_now.below_floor.eq(raw.good_count < params.min_active),
        ]
        ev_state_ok = ((cmd.state == EvState.GOOD) | (cmd.state == EvState.ASSUMED_BAD)
                       | (cmd.state == EvState.DENIED))
        look = Signal(data.StructLayout({
            **common, "profile_ok": 1, "populated": 1, "floor_blocks": 1, "below_floor": 1,
            "bad_mode": 1, "too_many": 1, "bad_min_active": 1, "bad_entry": 1,
            "ev_state_ok": 1, "offset_ok": 1}))
        loaded = Signal.like(look)
        m.d.comb += [
            *(getattr(loaded, name).eq(getattr(part, name)) for name in common),
            loaded.profile_ok.eq(cmd.profile < n_profiles),
            loaded.populated.eq(~part.unwritten.any()),
            loaded.floor_blocks.eq(part.entry_good & part.at_floor),
            loaded.below_floor.eq(part.below_floor),
            loaded.bad_mode.eq((cmd.mode > EvMode.AUTO) | (cmd.num_evs == 0)),
            loaded.too_many.eq(cmd.num_evs > n_evs),
            loaded.bad_min_active.eq(cmd.min_active > cmd.num_evs),
            loaded.bad_entry.eq((cmd.port == 0) | (cmd.port > cfg.ports)
                                | ((cmd.state != EvState.GOOD) & (cmd.state != EvState.DENIED))),
            loaded.ev_state_ok.eq(ev_state_ok),
            loaded.offset_ok.eq(cmd.offset < n_evs),
        ]
        return raw, raw_now, part, part_now, look, loaded

    def elaborate(self, platform):
        m = Module()
        cfg = self._config
        index_bits = cfg.ev_index_bits
        cmd = Signal(path_command_layout(cfg))
        resp = Signal(path_response_layout(cfg))
        raw, raw_now, part, part_now, look, loaded = self._lookup(m, cmd)
        c_params = look.params
        entry_state = Mux(look.entry_good, EvState.GOOD,
                          Mux(look.entry_denied, EvState.DENIED, EvState.ASSUMED_BAD))

        generating = Signal()
        gen_k = Signal(COUNT_BITS)
        gen_port = Signal(EV_PORT_BITS)
        value = Signal(EV_VALUE_BITS)
        w_index = Signal(index_bits)
        w_port = Signal(EV_PORT_BITS)
        w_state = Signal(3)
        w_fields = Signal(ev_fields_layout(cfg))
        hash_x = Signal(16)
        hash_lo = Signal(32)
        hash_hi = Signal(16)
        hash_h = Signal(16)
        auto_pointer = Signal(index_bits)
        # The AUTO hash of the command's QP, in three registered steps (``cmd`` holds still
        # while the command runs; QP_PROFILE uses it at least five cycles after IDLE): the
        # constant multiply as two 16-bit halves, then their sum (bits 16..31 of the product).
        m.d.sync += [
            hash_x.eq((cmd.qpn ^ self._hash_seed)[:16]),
            hash_lo.eq(hash_x * (HASH_MULTIPLIER & 0xFFFF)),
            hash_hi.eq(hash_x * (HASH_MULTIPLIER >> 16)),
            hash_h.eq(hash_lo[16:] + hash_hi),
        ]

        m.d.comb += [
            self.ctl_op.payload.profile.eq(cmd.profile), self.ctl_op.payload.index.eq(w_index),
            self.ctl_op.payload.state.eq(w_state), self.ctl_op.payload.port.eq(w_port),
            self.ctl_op.payload.bound.eq(1),
            self.set_profile.eq(cmd.profile), self.state_profile.eq(cmd.profile),
            self.clear_profile.eq(cmd.profile),
            self.set_params.mode.eq(cmd.mode), self.set_params.num_evs.eq(cmd.num_evs),
            self.set_params.min_active.eq(cmd.min_active),
            self.set_params.adaptive.eq(cmd.adaptive),
            self.set_params.recovery.eq(cmd.recovery), self.set_params.fate.eq(cmd.fate),
            self.state_value.eq(cmd.state),
        ]

        def respond(errno, word=0):
            m.d.sync += [resp.errno.eq(errno), resp.data.eq(word)]
            m.next = "RESPOND"

        def issue(op):
            m.d.comb += [self.ctl_op.valid.eq(1), self.ctl_op.payload.op.eq(op)]

        # EXEC's outcome, registered: the response (``resp``) and what to do next.
        action = Signal(_Action)

        def decided(errno, word=0):
            m.d.sync += [resp.errno.eq(errno), resp.data.eq(word), action.eq(_Action.RESPOND)]

        def go(what):
            m.d.sync += action.eq(what)

        with m.FSM(name="control") as control:
            m.d.comb += self.ctl_busy.eq(~control.ongoing("IDLE"))
            with m.State("IDLE"):
                m.d.comb += self.ctl.ready.eq(1)
                with m.If(self.ctl.valid):
                    m.d.sync += [cmd.eq(self.ctl.payload), generating.eq(0)]
                    m.next = "DRAIN"
            with m.State("DRAIN"):
                # Lets the entry update finish what it took while the command arrived.
                m.d.sync += [
                    w_index.eq(cmd.index), w_port.eq(cmd.port), w_state.eq(cmd.state),
                    value.eq(cmd.value),
                ]
                with m.If(~self.engine_busy):
                    m.next = "READ"
            with m.State("READ"):
                m.d.sync += raw.eq(raw_now)
                m.next = "SELECT"
            with m.State("SELECT"):
                m.d.sync += part.eq(part_now)
                m.next = "LOOKUP"
            with m.State("LOOKUP"):
                m.d.sync += look.eq(loaded)
                m.next = "EXEC"
            with m.State("EXEC"):
                self._execute(m, cmd, look, decided, go, generating, gen_k, gen_port,
                              w_index, w_state)
                m.next = "DISPATCH"
            with m.State("DISPATCH"):
                with m.Switch(action):
                    with m.Case(_Action.RESPOND):
                        m.next = "RESPOND"
                    with m.Case(_Action.SET_PROFILE):
                        m.d.comb += [self.set_en.eq(1), self.clear_en.eq(1)]
                        m.next = "RESPOND"
                    with m.Case(_Action.SET_STATE):
                        m.next = "SET_PROFILE_STATE"
                    with m.Case(_Action.GENERATE):
                        m.d.comb += self.clear_en.eq(1)
                        m.next = "GEN_REQ"
                    with m.Case(_Action.EXPAND):
                        m.next = "EXP_REQ"
                    with m.Case(_Action.SET_ENTRY_STATE):
                        issue(EntryOp.SET_STATE)
                        m.next = "ENGINE"
                    with m.Case(_Action.READ_ENTRY):
                        issue(EntryOp.READ)
                        m.next = "ENGINE"
                    with m.Case(_Action.BIND):
                        m.next = "QP_WAIT"

            with m.State("SET_PROFILE_STATE"):
                m.d.comb += self.state_en.eq(1)
                respond(Errno.OK)

            # -- GENERATED profile going ONLINE: gen_req(k) -> exp_req(value) -> store -------
            with m.State("GEN_REQ"):
                m.d.comb += [
                    self.gen_req.valid.eq(1),
                    self.gen_req.payload.profile.eq(cmd.profile),
                    self.gen_req.payload.index.eq(gen_k),
                ]
                with m.If(self.gen_req.ready):
                    m.next = "GEN_RESP"
            with m.State("GEN_RESP"):
                m.d.comb += self.gen_resp.ready.eq(1)
                with m.If(self.gen_resp.valid):
                    with m.If(self.gen_resp.payload.errno != Errno.OK):
                        m.d.comb += self.clear_en.eq(1)
                        respond(self.gen_resp.payload.errno)
                    with m.Else():
                        m.d.sync += [value.eq(self.gen_resp.payload.value),
                                     w_index.eq(gen_k), w_port.eq(gen_port)]
                        m.next = "EXP_REQ"

            with m.State("EXP_REQ"):
                m.d.comb += [
                    self.exp_req.valid.eq(1),
                    self.exp_req.payload.profile.eq(cmd.profile),
                    self.exp_req.payload.value.eq(value),
                    self.exp_req.payload.tag.eq(w_index),
                ]
                with m.If(self.exp_req.ready):
                    m.next = "EXP_RESP"
            with m.State("EXP_RESP"):
                m.d.comb += self.exp_resp.ready.eq(1)
                with m.If(self.exp_resp.valid):
                    with m.If(self.exp_resp.payload.errno != Errno.OK):
                        with m.If(generating):
                            m.d.comb += self.clear_en.eq(1)
                            respond(self.exp_resp.payload.errno)
                        with m.Else():
                            respond(Errno.EINVAL)
                    with m.Else():
                        m.d.sync += w_fields.eq(self.exp_resp.payload.fields)
                        m.next = "STORE"
            with m.State("STORE"):
                m.d.comb += [
                    self.fields_wr.en.eq(1),
                    self.fields_wr.addr.eq(Cat(w_index, cmd.profile)),
                    self.fields_wr.data.fields.eq(w_fields),
                    self.fields_wr.data.port.eq(w_port - 1),       # 0-based, as decisions
                ]
                issue(EntryOp.WRITE)
                with m.If(generating):
                    m.d.sync += [
                        gen_k.eq(gen_k + 1),
                        gen_port.eq(Mux(gen_port == cfg.ports, 1, gen_port + 1)),
                    ]
                    m.next = "GEN_NEXT"
                with m.Else():
                    m.next = "ENGINE"
            with m.State("GEN_NEXT"):
                # Once the entry update has committed the write.
                with m.If(self.result_valid):
                    with m.If(gen_k == c_params.num_evs):
                        m.next = "SET_PROFILE_STATE"
                    with m.Else():
                        m.next = "GEN_REQ"

            with m.State("ENGINE"):
                # The command's entry operation is in the deciding stage: its entry is read.
                with m.If(self.result_valid):
                    respond(Errno.OK, Mux(cmd.cmd == PathCommand.ENTRY_READ,
                                          Cat(entry_state, C(0, 5), self.result.port, C(0, 3),
                                              self.result.penalty, self.result_skip), 0))

            with m.State("QP_WAIT"):
                m.d.comb += self.sel_hold.eq(1)
                m.d.sync += auto_pointer.eq(
                    (hash_h * c_params.num_evs)[16:16 + index_bits])
                with m.If(self.selector_idle):
                    m.next = "QP_WRITE"
            with m.State("QP_WRITE"):
                m.d.comb += [
                    self.sel_hold.eq(1), self.binding_wr.en.eq(1),
                    self.binding_wr.addr.eq(cmd.qpn),
                    self.binding_wr.data.bound.eq(1),
                    self.binding_wr.data.profile.eq(cmd.profile),
                    self.binding_wr.data.pointer.eq(Mux(c_params.mode == EvMode.AUTO,
                                                        auto_pointer, cmd.offset)),
                ]
                respond(Errno.OK)

            with m.State("RESPOND"):
                m.d.comb += [self.ctl_resp.valid.eq(1), self.ctl_resp.payload.eq(resp)]
                with m.If(self.ctl_resp.ready):
                    m.next = "IDLE"
        return m

    def _execute(self, m, cmd, look, respond, go, generating, gen_k, gen_port, w_index,
                 w_state):
        """EXEC: the command's checks in the documented order; the first failure answers.
        The outcome is registered (the response and an ``_Action``); DISPATCH acts on it."""
        c_state, c_params = look.state, look.params
        with m.Switch(cmd.cmd):
            with m.Case(PathCommand.PROFILE_SET):
                with m.If(~look.profile_ok):
                    respond(Errno.ENOENT)
                with m.Elif(c_state == ProfileState.ONLINE):
                    respond(Errno.EBUSY)
                with m.Elif(look.bad_mode):
                    respond(Errno.EINVAL)
                with m.Elif(look.too_many):
                    respond(Errno.E2BIG)
                with m.Elif(look.bad_min_active):
                    respond(Errno.EINVAL)
                with m.Else():
                    respond(Errno.OK)
                    go(_Action.SET_PROFILE)
            with m.Case(PathCommand.PROFILE_STATE):
                with m.If(~look.profile_ok):
                    respond(Errno.ENOENT)
                with m.Elif(((c_state == ProfileState.INIT)
                             & (cmd.state == ProfileState.OFFLINE))
                            | ((c_state == ProfileState.OFFLINE)
                               & (cmd.state == ProfileState.INIT))
                            | ((c_state == ProfileState.ONLINE)
                               & (cmd.state == ProfileState.OFFLINE))):
                    go(_Action.SET_STATE)
                with m.Elif((c_state == ProfileState.OFFLINE)
                            & (cmd.state == ProfileState.ONLINE)):
                    with m.If(c_params.num_evs == 0):
                        respond(Errno.EINVAL)
                    with m.Elif((c_params.mode == EvMode.GENERATED) & ~look.populated):
                        m.d.sync += [generating.eq(1), gen_k.eq(0), gen_port.eq(1),
                                     w_index.eq(0), w_state.eq(EvState.GOOD)]
                        go(_Action.GENERATE)
                    with m.Elif(~look.populated | look.below_floor):
                        respond(Errno.EINVAL)
                    with m.Else():
                        go(_Action.SET_STATE)
                with m.Else():
                    respond(Errno.EINVAL)
            with m.Case(PathCommand.ENTRY_WRITE):
                with m.If(~look.profile_ok):
                    respond(Errno.ENOENT)
                with m.Elif((c_state == ProfileState.ONLINE) & (not self._modify_online)):
                    respond(Errno.EBUSY)
                with m.Elif(c_params.mode == EvMode.GENERATED):
                    respond(Errno.EINVAL)
                with m.Elif(~look.index_ok):
                    respond(Errno.E2BIG)
                with m.Elif(look.bad_entry):
                    respond(Errno.EINVAL)
                with m.Elif((c_state == ProfileState.ONLINE) & look.floor_blocks
                            & (cmd.state != EvState.GOOD)):
                    respond(Errno.EBUSY)
                with m.Else():
                    go(_Action.EXPAND)
            with m.Case(PathCommand.ENTRY_STATE):
                with m.If(~look.profile_ok):
                    respond(Errno.ENOENT)
                with m.Elif(~look.index_ok):
                    respond(Errno.E2BIG)
                with m.Elif(~look.ev_state_ok):
                    respond(Errno.EINVAL)
                with m.Elif(~look.entry_written):
                    respond(Errno.ENOENT)
                with m.Elif(look.floor_blocks & (cmd.state != EvState.GOOD)):
                    respond(Errno.EBUSY)
                with m.Else():
                    go(_Action.SET_ENTRY_STATE)
            with m.Case(PathCommand.ENTRY_READ):
                with m.If(~look.profile_ok):
                    respond(Errno.ENOENT)
                with m.Elif(~look.index_ok):
                    respond(Errno.E2BIG)
                with m.Elif(~look.entry_written):
                    respond(Errno.ENOENT)
                with m.Else():
                    go(_Action.READ_ENTRY)
            with m.Case(PathCommand.QP_PROFILE):
                with m.If(~look.profile_ok | (c_state == ProfileState.INIT)):
                    respond(Errno.ENOENT)
                with m.Elif(~look.offset_ok):
                    respond(Errno.EINVAL)
                with m.Else():
                    go(_Action.BIND)
            with m.Case(PathCommand.PROFILE_READ):
                with m.If(~look.profile_ok):
                    respond(Errno.ENOENT)
                with m.Else():
                    respond(Errno.OK, Cat(
                        c_state, c_params.mode, c_params.adaptive, c_params.recovery,
                        look.populated, c_params.fate, C(0, 8),
                        c_params.num_evs, C(0, 16 - COUNT_BITS),
                        c_params.min_active, C(0, 16 - COUNT_BITS), look.good_count))
            with m.Default():
                respond(Errno.EINVAL)
