# amaranth: UnusedElaboratable=no
"""EvExpander: hardware expansion, generation and profile validation equal the reference
(``hdl.path.ev``) bit for bit, with random bubbles and backpressure on every stream."""

import pytest
from amaranth.sim import Simulator
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

from hdl import protocol as P
from hdl.config import NicConfig
from hdl.path import ev as ref
from hdl.path.expand import DefineOp, EvExpander
from hdl.protocol import Errno, EvFormatMode, EvMode
from sim.tb.amsim import StreamCollector, StreamDriver

CONFIG = NicConfig(ev_profiles=4)
EV_BITS = 256


def examples(strategy, count):
    """``count`` examples of ``strategy``, drawn by Hypothesis (derandomized, so a run is
    repeatable), to stream through ONE simulation: a simulator per example would cost more than
    the examples. A failure names the example in its assertion message."""
    found = []

    @settings(max_examples=count, deadline=None, database=None, derandomize=True,
              phases=(Phase.generate,), suppress_health_check=list(HealthCheck))
    @given(strategy)
    def gather(example):
        found.append(example)

    gather()
    return found


# ---------------------------------------------------------------------------------------------
# Define requests
# ---------------------------------------------------------------------------------------------

def _request(op, profile, **values):
    request = {"op": op, "profile": profile, "widths": [0] * P.EV_FORMAT_MAX_FIELDS}
    request.update(values)
    return request


def op_clear(profile):
    return _request(DefineOp.CLEAR, profile)


def op_format(profile, mode, widths, *, count=None):
    padded = (list(widths) + [0] * P.EV_FORMAT_MAX_FIELDS)[:P.EV_FORMAT_MAX_FIELDS]
    return _request(DefineOp.SET_FORMAT, profile, format_mode=int(mode),
                    count=len(widths) if count is None else count, widths=padded)


def op_field(profile, index, width, *, init_val=0, mask=0, min_val=0, max_val=0):
    return _request(DefineOp.SET_FIELD, profile, index=index, width=width, init_val=init_val,
                    mask=mask, min_val=min_val, max_val=max_val)


def op_field_of(profile, index, field):
    return op_field(profile, index, field.width, init_val=field.init_val, mask=field.mask,
                    min_val=field.min_val, max_val=field.max_val)


def op_commit(profile, ev_mode):
    return _request(DefineOp.COMMIT, profile, ev_mode=int(ev_mode))


def define_ops(slot, profile, ev_mode=None):
    """The ops that define ``profile`` (an EvProfile) in ``slot`` and commit it."""
    ops = [op_format(slot, profile.format.mode, profile.format.widths)]
    ops += [op_field_of(slot, i, f) for i, f in enumerate(profile.fields)]
    ops.append(op_commit(slot, profile.mode if ev_mode is None else ev_mode))
    return ops


def ref_errno(build):
    """The errno the reference gives for building something (OK when it builds)."""
    try:
        build()
    except ref.EvProfileError as error:
        return Errno[error.errno_name]
    return Errno.OK


# ---------------------------------------------------------------------------------------------
# Expected results
# ---------------------------------------------------------------------------------------------

def value_of(ev_bytes):
    return int.from_bytes(bytes(ev_bytes).ljust(P.EV_MAX_BYTES, b"\0"), "big")


def expected_expansion(profile, value):
    """(errno, image, fields) of expanding EV ``value`` (256-bit int) with ``profile``."""
    no_fields = {"flow_label": 0, "udp_sport": 0, "srv6_valid": 0, "srv6_dst": 0,
                 "srh_valid": 0, "srh_segment": 0}
    try:
        expanded = ref.expand(profile, value.to_bytes(P.EV_MAX_BYTES, "big"))
    except ref.EvProfileError as error:
        return Errno[error.errno_name], 0, no_fields
    header = ref.header_fields(profile.format, expanded)
    fields = dict(no_fields)
    if profile.format.mode == EvFormatMode.SRV6:
        fields.update(srv6_valid=1, srv6_dst=int.from_bytes(header["srv6_dst"], "big"))
        if header["srv6_segment"] is not None:
            fields.update(srh_valid=1, srh_segment=int.from_bytes(header["srv6_segment"], "big"))
    else:
        fields.update(header)
    return Errno.OK, int.from_bytes(expanded, "big"), fields


def expected_generation(profile, index):
    try:
        evs = ref.generate(profile, index + 1)
    except ref.EvProfileError as error:
        return Errno[error.errno_name], 0
    return Errno.OK, value_of(evs[index])


# ---------------------------------------------------------------------------------------------
# Bench: one simulator, requests in batches
# ---------------------------------------------------------------------------------------------

class Bench:
    """Drives an EvExpander through its three request streams, with bubbles on the inputs
    and backpressure on the outputs. Batches are awaited in turn, so a definition is complete
    before the expansions that use it start."""

    def __init__(self, config=CONFIG, *, bubbles=0.3, backpressure=0.3, seed=0):
        self.dut = dut = EvExpander(config=config)
        self.define = StreamDriver(dut.define, bubbles=bubbles, seed=seed)
        self.define_resp = StreamCollector(dut.define_resp, backpressure=backpressure,
                                           seed=seed + 1)
        self.exp = StreamDriver(dut.exp_req, bubbles=bubbles, seed=seed + 2)
        self.exp_resp = StreamCollector(dut.exp_resp, backpressure=backpressure, seed=seed + 3)
        self.gen = StreamDriver(dut.gen_req, bubbles=bubbles, seed=seed + 4)
        self.gen_resp = StreamCollector(dut.gen_resp, backpressure=backpressure, seed=seed + 5)
        self.cycles = 0

    def run(self, script):
        sim = Simulator(self.dut)
        sim.add_clock(1e-8)
        for part in (self.define, self.define_resp, self.exp, self.exp_resp, self.gen,
                     self.gen_resp):
            sim.add_process(part.process)

        async def bench(ctx):
            await script(ctx, self)

        sim.add_testbench(bench)
        sim.run()

    async def _batch(self, ctx, driver, collector, payloads, per_request):
        start = len(collector.items)
        driver.send(payloads)
        items = await collector.wait(ctx, start + len(payloads),
                                     timeout=1000 + 3 * per_request * len(payloads))
        return items[start:]

    async def define_ops(self, ctx, ops):
        items = await self._batch(ctx, self.define, self.define_resp, ops, 300)
        return [Errno(int(item.errno)) for item in items]

    async def expand(self, ctx, profile_slot, values, *, tag_base=0):
        requests = [{"profile": profile_slot, "value": value, "tag": (tag_base + n) % 512}
                    for n, value in enumerate(values)]
        return await self._batch(ctx, self.exp, self.exp_resp, requests, 300)

    async def generate(self, ctx, profile_slot, indices):
        requests = [{"profile": profile_slot, "index": index} for index in indices]
        return await self._batch(ctx, self.gen, self.gen_resp, requests, 480)


def check_expansions(profile, values, responses, *, tag_base=0):
    assert len(responses) == len(values)
    for n, (value, got) in enumerate(zip(values, responses, strict=True)):
        errno, image, fields = expected_expansion(profile, value)
        assert Errno(int(got.errno)) == errno, f"EV {value:#066x}"
        assert int(got.tag) == (tag_base + n) % 512
        assert int(got.image) == image, f"EV {value:#066x}"
        assert {name: int(got.fields[name]) for name in fields} == fields, f"EV {value:#066x}"


def check_generations(profile, indices, responses):
    for index, got in zip(indices, responses, strict=True):
        errno, value = expected_generation(profile, index)
        assert (Errno(int(got.errno)), int(got.value)) == (errno, value), f"index {index}"


# ---------------------------------------------------------------------------------------------
# Strategies: valid profiles of every format mode, and EVs for them
# ---------------------------------------------------------------------------------------------

# Format field counts are kept small so that a list of profiles fits one short simulation
# (SET_FIELD takes 260 cycles); test_sixteen_fields covers the largest format.
MAX_TEST_FIELDS = 5


@st.composite
def formats(draw, mode, srh=False):
    capacity = P.EV_FORMAT_CAPACITY_BITS[mode]
    count = draw(st.integers(1, MAX_TEST_FIELDS))
    if mode == EvFormatMode.SRV6:
        low, high = (129, capacity) if srh else (count, 128)
    else:
        low, high = count, capacity
    total = draw(st.integers(max(low, count), high))
    cuts = sorted(draw(st.lists(st.integers(1, total - 1), unique=True,
                                min_size=count - 1, max_size=count - 1))) if count > 1 else []
    bounds = [0, *cuts, total]
    widths = [bounds[i + 1] - bounds[i] for i in range(count)]
    return ref.EvFormat(mode=mode, widths=widths)


@st.composite
def ev_fields(draw, format_width):
    width = draw(st.integers(1, format_width))
    kind = draw(st.sampled_from(["fixed", "random", "dense"]))
    if kind == "fixed":
        mask = 0
    elif kind == "dense":
        mask = (1 << width) - 1 ^ draw(st.integers(0, (1 << width) - 1)) & \
            draw(st.integers(0, (1 << width) - 1))
    else:
        mask = draw(st.integers(0, (1 << width) - 1))
    ones = mask.bit_count()
    max_val = draw(st.integers(0, (1 << ones) - 1))
    min_val = draw(st.integers(0, max_val))
    init_val = draw(st.integers(0, (1 << width) - 1))
    return ref.EvField(width=width, init_val=init_val, mask=mask, min_val=min_val,
                       max_val=max_val)


@st.composite
def profiles(draw, mode, srh=False, ev_mode=EvMode.EXPLICIT):
    fmt = draw(formats(mode, srh))
    count = len(fmt.widths) - draw(st.integers(0, len(fmt.widths) - 1))
    fields = [draw(ev_fields(fmt.widths[i])) for i in range(count)]
    return ref.EvProfile(format=fmt, mode=ev_mode, fields=fields)


@st.composite
def ev_values(draw, profile):
    """EVs for ``profile``: mostly valid (zero after the consumed bits), some with a stray 1."""
    consumed = profile.ev_bits
    value = draw(st.integers(0, (1 << consumed) - 1)) << (EV_BITS - consumed)
    if consumed < EV_BITS and draw(st.integers(0, 4)) == 0:
        value |= 1 << draw(st.integers(0, EV_BITS - consumed - 1))
    return value


@st.composite
def profile_cases(draw, mode, srh=False):
    profile = draw(profiles(mode, srh))
    values = draw(st.lists(ev_values(profile), min_size=1, max_size=3))
    return profile, values


def run_expansion_cases(cases, *, seed):
    bench = Bench(seed=seed)

    async def script(ctx, bench):
        for n, (profile, values) in enumerate(cases):
            slot = n % CONFIG.ev_profiles
            assert await bench.define_ops(ctx, define_ops(slot, profile)) == \
                [Errno.OK] * (len(profile.fields) + 2)
            check_expansions(profile, values, await bench.expand(ctx, slot, values,
                                                                 tag_base=n), tag_base=n)

    bench.run(script)


# ---------------------------------------------------------------------------------------------
# Expansion equals the reference
# ---------------------------------------------------------------------------------------------

@pytest.mark.parametrize("mode, srh", [(EvFormatMode.STEV, False), (EvFormatMode.UDP, False),
                                       (EvFormatMode.SRV6, False), (EvFormatMode.SRV6, True)],
                         ids=["stev", "udp", "srv6", "srv6-srh"])
def test_expansion_equals_reference(mode, srh):
    run_expansion_cases(examples(profile_cases(mode, srh), 25), seed=int(mode) * 2 + srh)


def test_documented_examples():
    """The worked examples of docs/ev-expansion.md, through the hardware."""
    udp = ref.EvProfile(
        format=ref.EvFormat(mode=EvFormatMode.UDP, widths=[8, 8]), mode=EvMode.EXPLICIT,
        fields=[ref.EvField(width=8, init_val=0xA5, mask=0x63, max_val=15),
                ref.EvField(width=4, init_val=0x9)])
    srh = ref.EvProfile(
        format=ref.EvFormat(mode=EvFormatMode.SRV6, widths=[32, 16, 16, 64, 32, 16]),
        mode=EvMode.EXPLICIT,
        fields=[ref.EvField(width=32, init_val=0xFC00_0000),
                ref.EvField(width=16, init_val=0xE000, mask=0x0007),
                ref.EvField(width=16, init_val=0xE100, mask=0x0030),
                ref.EvField(width=64),
                ref.EvField(width=32, init_val=0xFC00_0000),
                ref.EvField(width=16, init_val=0xE200, mask=0x00FF)])
    cases = [(udp, [value_of(b"\xb0"), value_of(b"\xb8"), value_of(b"\x00"), value_of(b"\xf0")]),
             (srh, [value_of(bytes.fromhex("b338")), value_of(bytes.fromhex("b339"))])]
    run_expansion_cases(cases, seed=7)
    # The reference says what the docs say; the hardware was compared with the reference.
    assert ref.expand(udp, b"\xb0").hex().startswith("c709")


def test_sixteen_fields_and_full_width():
    """The largest format (16 fields, 256 bits) and a 256-bit field with a full mask."""
    widths = [16] * 16
    fields = [ref.EvField(width=16, init_val=0x1234 + i, mask=0x8421 << (i % 4) & 0xFFFF)
              for i in range(16)]
    many = ref.EvProfile(format=ref.EvFormat(mode=EvFormatMode.SRV6, widths=widths),
                         mode=EvMode.EXPLICIT, fields=fields)
    full = ref.EvProfile(format=ref.EvFormat(mode=EvFormatMode.SRV6, widths=[256]),
                         mode=EvMode.EXPLICIT,
                         fields=[ref.EvField(width=256, mask=(1 << 256) - 1)])
    values = [0xDEADBEEF << 224, (1 << 256) - 1, 1]
    run_expansion_cases([(many, values[:1] + [1 << 255 >> 63, 1]), (full, values)], seed=8)


# ---------------------------------------------------------------------------------------------
# Generation equals the reference
# ---------------------------------------------------------------------------------------------

@st.composite
def generated_fields(draw, format_width):
    """A field for generation: mostly 1 to 10 EV bits over a range that is often the whole."""
    width = draw(st.integers(1, format_width))
    init_val = draw(st.integers(0, (1 << width) - 1))
    if draw(st.integers(0, 4)) == 0:
        return ref.EvField(width=width, init_val=init_val)
    # Hypothesis starts from the small end of a range; counting down from the top makes its
    # first examples wide ranges rather than single values.
    ones = min(width, 10) - draw(st.integers(0, min(width, 10) - 1))
    bits = draw(st.lists(st.integers(0, width - 1), unique=True, min_size=ones, max_size=ones))
    top = (1 << ones) - 1
    max_val = top - draw(st.integers(0, top))
    min_val = draw(st.one_of(st.just(0), st.integers(0, max_val)))
    return ref.EvField(width=width, init_val=init_val, mask=sum(1 << b for b in bits),
                       min_val=min_val, max_val=max_val)


@st.composite
def generated_cases(draw):
    mode = draw(st.sampled_from([EvFormatMode.STEV, EvFormatMode.UDP, EvFormatMode.SRV6]))
    fmt = draw(formats(mode))
    count = len(fmt.widths) - draw(st.integers(0, len(fmt.widths) - 1))
    profile = ref.EvProfile(format=fmt, mode=EvMode.GENERATED,
                            fields=[draw(generated_fields(fmt.widths[i])) for i in range(count)])
    distinct = profile.distinct_evs
    in_order = list(range(min(distinct, 4)))
    scattered = draw(st.lists(st.integers(0, min(distinct, 512) - 1), max_size=2))
    beyond = [distinct] if distinct < 512 else []     # E2BIG
    return profile, in_order + scattered + beyond


def test_generation_equals_reference():
    cases = examples(generated_cases(), 25)
    bench = Bench(seed=11)

    async def script(ctx, bench):
        for n, (profile, indices) in enumerate(cases):
            slot = n % CONFIG.ev_profiles
            assert await bench.define_ops(ctx, define_ops(slot, profile)) == \
                [Errno.OK] * (len(profile.fields) + 2)
            check_generations(profile, indices, await bench.generate(ctx, slot, indices))
            # A generated EV expands like any other.
            ok = [int(r.value) for r in bench.gen_resp.items[-len(indices):]
                  if int(r.errno) == Errno.OK][:2]
            check_expansions(profile, ok, await bench.expand(ctx, slot, ok))

    bench.run(script)


def test_generation_documented_example():
    profile = ref.EvProfile(
        format=ref.EvFormat(mode=EvFormatMode.UDP, widths=[8, 8]), mode=EvMode.GENERATED,
        fields=[ref.EvField(width=8, init_val=0xC0, mask=0x03, min_val=1, max_val=3),
                ref.EvField(width=8, init_val=0x10, mask=0x0F, min_val=0, max_val=1)])
    fixed = ref.EvProfile(
        format=ref.EvFormat(mode=EvFormatMode.UDP, widths=[16]), mode=EvMode.GENERATED,
        fields=[ref.EvField(width=16, init_val=0xBEEF)])
    bench = Bench(seed=12)

    async def script(ctx, bench):
        await bench.define_ops(ctx, define_ops(0, profile) + define_ops(1, fixed))
        got = await bench.generate(ctx, 0, [0, 1, 2, 3, 5, 4, 6, 511])
        check_generations(profile, [0, 1, 2, 3, 5, 4, 6, 511], got)
        assert [int(r.value) >> 248 for r in got[:4]] == [0x40, 0x44, 0x80, 0x84]
        assert Errno(int(got[6].errno)) == Errno.E2BIG
        # All fields fixed: one EV, a zero byte; the second is E2BIG.
        check_generations(fixed, [0, 1], await bench.generate(ctx, 1, [0, 1]))

    bench.run(script)


def test_generation_needs_a_generated_profile():
    explicit = ref.EvProfile(format=ref.EvFormat(mode=EvFormatMode.UDP, widths=[16]),
                             mode=EvMode.EXPLICIT, fields=[ref.EvField(width=16, mask=0xFF)])
    bench = Bench(seed=13)

    async def script(ctx, bench):
        await bench.define_ops(ctx, define_ops(0, explicit) + define_ops(1, explicit, EvMode.AUTO)
                               + [op_format(2, EvFormatMode.UDP, [16])])
        for slot in (0, 1, 2, 3):       # explicit, AUTO, uncommitted, never defined
            (got,) = await bench.generate(ctx, slot, [0])
            assert (Errno(int(got.errno)), int(got.value)) == (Errno.EINVAL, 0)
        # AUTO still expands with its definitions (hardware choice; the reference has no AUTO).
        values = [0xAB << 248, 0xAB << 247]
        check_expansions(explicit, values, await bench.expand(ctx, 1, values))

    bench.run(script)


# ---------------------------------------------------------------------------------------------
# Validation: every rule refused with the reference's errno, and nothing changes
# ---------------------------------------------------------------------------------------------

GOOD = ref.EvProfile(format=ref.EvFormat(mode=EvFormatMode.STEV, widths=[20, 8, 8]),
                     mode=EvMode.GENERATED,
                     fields=[ref.EvField(width=20, init_val=0xABC00, mask=0xFF, max_val=200),
                             ref.EvField(width=6, init_val=0x21, mask=0x3, min_val=1)])
GOOD_VALUES = [0x2A8 << 246, 0x15B << 246, (0x3FF << 246) | 1]


def bad_ops():
    """(op, errno, reference check) for each rule; the check builds the same thing in Python."""
    fmt, fields = GOOD.format, list(GOOD.fields)

    def field_rule(**values):
        base = {"width": 6, "init_val": 0, "mask": 0x3, "min_val": 0, "max_val": 3}
        base.update(values)
        return base

    def with_field(index, values):
        return lambda: ref.EvProfile(format=fmt, mode=EvMode.GENERATED,
                                     fields=[*fields[:index], ref.EvField(**values)])

    cases = [
        (op_format(0, 3, [8]), lambda: ref.EvFormat(mode=3, widths=[8])),
        (op_format(0, EvFormatMode.UDP, [], count=0),
         lambda: ref.EvFormat(mode=EvFormatMode.UDP, widths=[])),
        (op_format(0, EvFormatMode.SRV6, [1] * 16, count=17),
         lambda: ref.EvFormat(mode=EvFormatMode.SRV6, widths=[1] * 17)),
        (op_format(0, EvFormatMode.UDP, [8, 0, 8]),
         lambda: ref.EvFormat(mode=EvFormatMode.UDP, widths=[8, 0, 8])),
        (op_format(0, EvFormatMode.STEV, [20, 17]),
         lambda: ref.EvFormat(mode=EvFormatMode.STEV, widths=[20, 17])),
        (op_format(0, EvFormatMode.UDP, [9, 8]),
         lambda: ref.EvFormat(mode=EvFormatMode.UDP, widths=[9, 8])),
        (op_format(0, EvFormatMode.SRV6, [200, 57]),
         lambda: ref.EvFormat(mode=EvFormatMode.SRV6, widths=[200, 57])),
    ]
    for index, values in [
        (1, field_rule(width=0, mask=0, max_val=0)),            # width below 1
        (1, field_rule(init_val=0x40)),                         # init_val wider than the field
        (1, field_rule(mask=0x43)),                             # mask outside the field
        (1, field_rule(max_val=4)),                             # max_val wider than the mask
        (1, field_rule(min_val=3, max_val=2)),                  # min_val over max_val
        (1, field_rule(width=9, init_val=0x100, mask=0)),       # wider than its format field
        (3, field_rule()),                                      # more fields than the format
        (0, field_rule(width=21, mask=0x100000, max_val=1)),    # field 0 over format field 0
    ]:
        if index == 3:
            check = lambda values=values: ref.EvProfile(  # noqa: E731
                format=fmt, mode=EvMode.GENERATED,
                fields=[*fields, ref.EvField(width=1), ref.EvField(**values)])
        else:
            check = with_field(index, values)
        cases.append((op_field(0, index, **values), check))
    cases.append((op_commit(0, 3), lambda: ref.EvProfile(format=fmt, mode=3, fields=fields)))
    return [(op, ref_errno(check)) for op, check in cases]


def test_every_rule_is_refused_and_changes_nothing():
    cases = bad_ops()
    assert {errno for _op, errno in cases} == {Errno.EINVAL, Errno.E2BIG}
    bench = Bench(seed=21)

    async def script(ctx, bench):
        assert await bench.define_ops(ctx, define_ops(0, GOOD)) == [Errno.OK] * 4
        before = await bench.expand(ctx, 0, GOOD_VALUES)
        check_expansions(GOOD, GOOD_VALUES, before)
        errnos = await bench.define_ops(ctx, [op for op, _errno in cases])
        assert errnos == [errno for _op, errno in cases]
        # Still committed, still the same definition.
        check_expansions(GOOD, GOOD_VALUES, await bench.expand(ctx, 0, GOOD_VALUES))
        check_generations(GOOD, [0, 1, 2, 88], await bench.generate(ctx, 0, [0, 1, 2, 88]))
        # A gap in the fields is EINVAL (fields are contiguous); not a rule of the reference,
        # whose fields are a list.
        assert await bench.define_ops(ctx, [op_format(1, EvFormatMode.UDP, [8, 8]),
                                            op_field(1, 1, 8)]) == [Errno.OK, Errno.EINVAL]
        # Profile-level rules: no format, no fields.
        assert await bench.define_ops(ctx, [
            op_commit(2, EvMode.EXPLICIT), op_field(2, 0, 8),
            op_format(2, EvFormatMode.UDP, [16]), op_commit(2, EvMode.EXPLICIT),
        ]) == [Errno.EINVAL, Errno.EINVAL, Errno.OK, Errno.EINVAL]
        assert ref_errno(lambda: ref.EvProfile(format=ref.EvFormat(mode=EvFormatMode.UDP,
                                                                   widths=[16]),
                                               mode=EvMode.EXPLICIT, fields=[])) == Errno.EINVAL

    bench.run(script)


@st.composite
def sparse_masks(draw, width, max_ones):
    ones = draw(st.integers(0, min(width, max_ones)))
    bits = draw(st.lists(st.integers(0, width - 1), unique=True, min_size=ones,
                         max_size=ones))
    return sum(1 << b for b in bits)


@st.composite
def field_ops(draw):
    """A SET_FIELD against GOOD's format (widths 20, 8, 8): index 0..3, a valid field for
    that index, or (half the time) one with one value pushed over one of the limits."""
    index = draw(st.integers(0, 3))
    format_width = GOOD.format.widths[min(index, 2)]
    width = draw(st.integers(1, format_width))
    mask = draw(sparse_masks(width, width))
    ones = mask.bit_count()
    max_val = draw(st.integers(0, (1 << ones) - 1))
    values = dict(width=width, init_val=draw(st.integers(0, (1 << width) - 1)), mask=mask,
                  min_val=draw(st.integers(0, max_val)), max_val=max_val)
    broken = draw(st.sampled_from([None, "width", "init_val", "mask", "max_val", "min_val",
                                   "wide"]))
    if broken == "width":
        values.update(width=0, init_val=0, mask=0, min_val=0, max_val=0)
    elif broken in ("init_val", "mask"):
        values[broken] |= 1 << draw(st.integers(width, 24))
    elif broken == "max_val":
        values["max_val"] |= 1 << draw(st.integers(ones, ones + 2))
    elif broken == "min_val":
        values["min_val"] = max_val + draw(st.integers(1, 3))
    elif broken == "wide":
        values["width"] = format_width + draw(st.integers(1, 4))
    return index, values


def expected_field_errno(fields, index, values):
    """The reference's errno for setting field ``index`` of GOOD's format to ``values`` when
    ``fields`` are defined. The reference builds the field before the profile, so the field's
    own rules come first; a gap (a field index past the next one) has no reference form and is
    EINVAL after the format's field count is checked."""
    errno = ref_errno(lambda: ref.EvField(**values))
    if errno != Errno.OK:
        return errno
    if index >= len(GOOD.format.widths):
        return Errno.E2BIG
    if index > len(fields):
        return Errno.EINVAL
    candidate = [*fields[:index], ref.EvField(**values), *fields[index + 1:]]
    return ref_errno(lambda: ref.EvProfile(format=GOOD.format, mode=EvMode.GENERATED,
                                           fields=candidate))


def test_random_field_definitions_match_reference():
    """Random SET_FIELDs: the hardware's errno is the reference's; the accepted ones make the
    profile the reference builds, and it expands and generates the same."""
    ops = examples(field_ops(), 40)
    values = examples(ev_values(GOOD), 3)
    bench = Bench(seed=31)
    model = list(GOOD.fields)

    async def script(ctx, bench):
        await bench.define_ops(ctx, define_ops(0, GOOD))
        for index, field_values in ops:
            want = expected_field_errno(model, index, field_values)
            (got,) = await bench.define_ops(ctx, [op_field(0, index, **field_values)])
            assert got == want, (index, field_values)
            if got == Errno.OK:
                model[index:index + 1] = [ref.EvField(**field_values)]
        assert await bench.define_ops(ctx, [op_commit(0, EvMode.GENERATED)]) == [Errno.OK]
        profile = ref.EvProfile(format=GOOD.format, mode=EvMode.GENERATED, fields=model)
        check_expansions(profile, values, await bench.expand(ctx, 0, values))
        check_generations(profile, [0, 1, 7], await bench.generate(ctx, 0, [0, 1, 7]))

    bench.run(script)


# ---------------------------------------------------------------------------------------------
# Locks and profile ids
# ---------------------------------------------------------------------------------------------

def test_locked_profile_refuses_every_define_op_but_expands():
    bench = Bench(seed=41)

    async def script(ctx, bench):
        await bench.define_ops(ctx, define_ops(2, GOOD))
        ctx.set(bench.dut.locked, 0b0100)
        ops = [op_clear(2), op_format(2, EvFormatMode.UDP, [16]), op_field(2, 0, 8),
               op_commit(2, EvMode.EXPLICIT), op_field(2, 9, 0, mask=1)]
        assert await bench.define_ops(ctx, ops) == [Errno.EBUSY] * len(ops)
        assert await bench.define_ops(ctx, [op_format(1, EvFormatMode.UDP, [16])]) == [Errno.OK]
        check_expansions(GOOD, GOOD_VALUES, await bench.expand(ctx, 2, GOOD_VALUES))
        ctx.set(bench.dut.locked, 0)
        assert await bench.define_ops(ctx, [op_clear(2)]) == [Errno.OK]
        (got,) = await bench.expand(ctx, 2, GOOD_VALUES[:1])
        assert Errno(int(got.errno)) == Errno.EINVAL        # cleared: nothing to expand with

    bench.run(script)


def test_unknown_profile_is_enoent():
    config = NicConfig(ev_profiles=3)
    bench = Bench(config, seed=51)

    async def script(ctx, bench):
        assert await bench.define_ops(ctx, [op_format(3, EvFormatMode.UDP, [16]),
                                            op_commit(15, EvMode.EXPLICIT), op_clear(7)]) == \
            [Errno.ENOENT] * 3
        (got,) = await bench.expand(ctx, 3, [0])
        assert Errno(int(got.errno)) == Errno.ENOENT
        (got,) = await bench.generate(ctx, 3, [0])
        assert Errno(int(got.errno)) == Errno.ENOENT

    bench.run(script)


def test_full_speed_without_bubbles_or_backpressure():
    bench = Bench(bubbles=0, backpressure=0, seed=61)

    async def script(ctx, bench):
        await bench.define_ops(ctx, define_ops(0, GOOD))
        check_expansions(GOOD, GOOD_VALUES, await bench.expand(ctx, 0, GOOD_VALUES))
        check_generations(GOOD, list(range(6)), await bench.generate(ctx, 0, range(6)))

    bench.run(script)


def test_config_must_be_a_nic_config():
    with pytest.raises(TypeError, match="config must be a NicConfig, not 4"):
        EvExpander(config=4)
