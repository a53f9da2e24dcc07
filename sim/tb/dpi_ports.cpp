// The stream agents of the two-NIC bench in C++, called through DPI once per clock edge
// from the generated wrapper of sim/tb/dpi.py, and driven from Python through ctypes.
//
// They do what the Python agents of sim/tb/harness.py do, in the same order and with the same
// handshake (a beat moves at an edge where valid and ready were both high): network frame
// sources and sinks, the work-request source, the completion sink, and host memory (payload
// fetches answered a fixed latency after their request, placement written into regions).
// Sources may insert random bubbles and sinks random backpressure, by the same rules as the
// Python agents (a bubble is drawn before each beat a source could present, a sink's ready is
// drawn at every edge), from a seeded generator of their own (not Python's: a run with
// bubbles or backpressure is not beat for beat the Python agents' run). Python wakes only when something it must see happened: a
// frame left a NIC, a completion arrived, or an access fell outside host memory (the
// attention counter of the wrapper changes).
//
// Two watches serve the fuzzer (sim/fuzz.py), both off unless asked for: the placement log
// (one record per placed packet: its address span, byte count, the bytes that fell outside
// every host region, counted instead of stopping the run, and its first bytes) and the stall
// watch (a source whose beat has waited for ready a given number of cycles raises an event).

#include <cstdint>
#include <cstring>
#include <deque>
#include <queue>
#include <string>
#include <vector>

#include "svdpi.h"

namespace {

enum Role { RX = 0, TX = 1, BEAT_SOURCE = 2, BEAT_SINK = 3, FETCH_REQ = 4, FETCH = 5, PLACE = 6 };

constexpr int BUSY_WORDS = 4;       // at most 128 streams (bit [127:0] busy)
constexpr int MAX_WORDS = 16;       // the wrapper passes every payload as bit [511:0]
constexpr int MAX_SIDES = 16;       // NICs (the pair's a and b, or a group's a, b, c, ...)

using Beat = std::vector<uint32_t>;

struct Field {
    int at = -1;
    int width = 0;
};

struct Pending {                    // a frame the fabric delivers at cycle `release`
    int64_t release;
    int64_t arrival_ps;
    uint64_t serial;
    std::vector<uint8_t> bytes;
    bool operator<(const Pending &other) const {    // std::priority_queue: largest first
        if (arrival_ps != other.arrival_ps) return arrival_ps > other.arrival_ps;
        return serial > other.serial;
    }
};

struct Request {
    int64_t due;
    uint64_t addr;
    uint64_t length;
};

struct Stream {
    int role = -1;
    int side = 0;
    int width = 0;
    Field data, keep, last, first, addr, length;
    // sources
    bool valid = false;
    Beat current;
    std::deque<Beat> queue;
    std::priority_queue<Pending> pending;
    // sinks
    std::vector<uint8_t> parts;
    uint64_t beats = 0;
    // random bubbles (sources) or backpressure (sinks): probability in 1/2**32, generator state
    uint64_t chance = 0;
    uint64_t rng = 0;
    // the stall watch (sources): cycles the current beat has waited for ready, the longest wait
    int64_t stall = 0;
    int64_t max_stall = 0;
    // the placement log (placement sinks): the packet being placed
    uint64_t place_lo = UINT64_MAX, place_hi = 0, place_bytes = 0, place_outside = 0;
    std::vector<uint8_t> place_head;
};

struct Region {
    uint64_t base;
    std::vector<uint8_t> bytes;
};

struct Side {
    std::vector<Region> regions;
    std::deque<Request> requests;
    int fetch = -1;                 // the stream of this side's fetch beats
    int latency = 4;
};

struct BusOp {
    bool read;
    uint32_t addr;
    uint32_t data;
};

// A register-bus master: the timing of sim.tb.cocotb_host.CocotbBus (a write holds w_en for
// one edge, a read holds r_en for one edge and takes r_data after the next), with each
// access's end signalled at the falling edge after it, so that the next access, given then,
// starts at the next rising edge as it would have from Python.
struct BusMaster {
    std::deque<BusOp> ops;
    int state = 0;          // 0 idle, 1 write driven, 2 read driven, 3 read waiting for r_data
    uint32_t addr = 0, w_data = 0, result = 0, done = 0;
};

std::vector<Stream> streams;
Side sides[MAX_SIDES];
BusMaster buses[MAX_SIDES];
int64_t edge = 0;                   // every rising edge
int64_t first_edge = INT64_MAX;     // the edge the agents first step at (cycle 1)
int64_t cycle = 0;                  // cycles since stepping began, as the Python loop counts
int64_t start_cycle = -1;           // the transfer's start (backlog samples from there)
int64_t backlog_every = 0;
uint32_t attention = 0;
std::vector<uint8_t> events;        // serialised records for Python (mrc_drain)
std::string error;

bool any_backpressure = false;
bool place_log = false;             // record every placed packet (mrc_set_place_log)
int64_t stall_bound = 0;            // raise a stall event after this many cycles (0: off)
constexpr size_t PLACE_HEAD = 16;   // first bytes of a placed packet kept in its record

// Event kinds of mrc_drain (sim/tb/dpi.py).
// (0 frame, 1 completion, 2 backlog sample, 3 error: written as numbers where they are made.)
enum Event { EVENT_PLACEMENT = 4, EVENT_STALL = 5 };

bool stepping() { return edge >= first_edge; }

// splitmix64: small, seedable, and good enough for bubbles.
uint64_t next_random(uint64_t &state) {
    uint64_t z = (state += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

// True with the stream's probability (a bubble for a source, ready low for a sink).
bool draw(Stream &s) { return s.chance && (next_random(s.rng) >> 32) < s.chance; }

uint64_t get_bits(const uint32_t *words, int at, int width) {
    uint64_t value = 0;
    for (int i = 0; i < width; i++) {
        int bit = at + i;
        value |= (uint64_t)((words[bit >> 5] >> (bit & 31)) & 1) << i;
    }
    return value;
}

void set_bits(Beat &words, int at, int width, uint64_t value) {
    for (int i = 0; i < width; i++) {
        int bit = at + i;
        if (value >> i & 1) words[bit >> 5] |= 1u << (bit & 31);
    }
}

// Byte lanes are at whole-byte offsets in every layout here only when `at` is a multiple of
// 8; bit by bit keeps it general.
uint8_t get_byte(const uint32_t *words, int at) { return (uint8_t)get_bits(words, at, 8); }

void put_event(uint8_t kind, int stream, int64_t when, const uint8_t *data, uint32_t length) {
    size_t at = events.size();
    events.resize(at + 1 + 2 + 8 + 4 + length);
    uint8_t *p = events.data() + at;
    p[0] = kind;
    uint16_t s = (uint16_t)stream;
    std::memcpy(p + 1, &s, 2);
    std::memcpy(p + 3, &when, 8);
    std::memcpy(p + 11, &length, 4);
    if (length) std::memcpy(p + 15, data, length);
    attention++;
}

Region *find(int side, uint64_t address, uint64_t length) {
    for (auto &region : sides[side].regions) {
        if (region.base <= address && address + length <= region.base + region.bytes.size())
            return &region;
    }
    if (error.empty()) {
        char text[160];
        std::snprintf(text, sizeof text,
                      "NIC %c: host access [0x%llx, +%llu) outside every region",
                      (char)('a' + side), (unsigned long long)address,
                      (unsigned long long)length);
        error = text;
        put_event(3, 0, cycle, nullptr, 0);
    }
    return nullptr;
}

// The region holding byte `address`, or none (no error: the placement log counts it).
Region *lookup(int side, uint64_t address) {
    for (auto &region : sides[side].regions)
        if (region.base <= address && address - region.base < region.bytes.size()) return &region;
    return nullptr;
}

Beat frame_beat(const Stream &s, const uint8_t *chunk, int count, bool first, bool last) {
    Beat beat((s.width + 31) / 32, 0);
    for (int lane = 0; lane < count; lane++) set_bits(beat, s.data.at + 8 * lane, 8, chunk[lane]);
    set_bits(beat, s.keep.at, s.keep.width, count >= 64 ? ~0ull : (1ull << count) - 1);
    if (last) set_bits(beat, s.last.at, 1, 1);
    if (first && s.first.at >= 0) set_bits(beat, s.first.at, 1, 1);
    return beat;
}

void enqueue_frame(Stream &s, const std::vector<uint8_t> &frame) {
    int lanes = s.data.width / 8;
    size_t count = frame.empty() ? 1 : (frame.size() + lanes - 1) / lanes;
    for (size_t index = 0; index < count; index++) {
        size_t from = index * lanes;
        int chunk = (int)std::min<size_t>(lanes, frame.size() > from ? frame.size() - from : 0);
        s.queue.push_back(frame_beat(s, frame.data() + from, chunk, index == 0,
                                     index == count - 1));
    }
}

void release_frames(int64_t upto) {
    for (auto &s : streams) {
        if (s.role != RX) continue;
        while (!s.pending.empty() && s.pending.top().release <= upto) {
            enqueue_frame(s, s.pending.top().bytes);
            s.pending.pop();
        }
    }
}

void copy_out(const Beat &beat, svBitVecVal *payload) {
    std::memset(payload, 0, MAX_WORDS * sizeof(svBitVecVal));
    for (size_t i = 0; i < beat.size() && i < (size_t)MAX_WORDS; i++) payload[i] = beat[i];
}

void memory_step(int side_index) {
    Side &side = sides[side_index];
    if (side.fetch < 0) return;
    Stream &out = streams[side.fetch];
    int lanes = out.data.width / 8;
    while (!side.requests.empty() && side.requests.front().due <= cycle) {
        Request request = side.requests.front();
        side.requests.pop_front();
        Region *region = find(side_index, request.addr, request.length);
        std::vector<uint8_t> data(request.length, 0);
        if (region) std::memcpy(data.data(), region->bytes.data() + (request.addr - region->base),
                                request.length);
        uint64_t count = (request.length + lanes - 1) / lanes;
        for (uint64_t index = 0; index < count; index++) {
            uint64_t from = index * lanes;
            int chunk = (int)std::min<uint64_t>(lanes, request.length - from);
            out.queue.push_back(frame_beat(out, data.data() + from, chunk, false,
                                           index == count - 1));
        }
    }
}

}  // namespace

// -- called from the wrapper, once per rising edge, in the Python agents' order --------------

extern "C" {

// Returns, in `busy`, the sources whose step may change something (a beat held or queued):
// the wrapper steps only those; in `backpressure`, whether any sink has backpressure (the
// wrapper then asks every sink for its ready, mrc_sink_ready; otherwise every ready stays high).
void mrc_edge_begin(svBitVecVal *busy, svBit *backpressure) {
    std::memset(busy, 0, BUSY_WORDS * sizeof(svBitVecVal));
    *backpressure = any_backpressure;
    edge++;
    if (!stepping()) return;
    cycle++;
    release_frames(cycle - 1);
    for (size_t id = 0; id < streams.size(); id++) {
        const Stream &s = streams[id];
        if (s.valid || !s.queue.empty()) busy[id >> 5] |= 1u << (id & 31);
    }
}

// A source's step: returns valid for the next cycle and its payload.
svBit mrc_source(int id, svBit ready, svBitVecVal *payload) {
    Stream &s = streams[id];
    if (!stepping()) {
        copy_out(s.current, payload);
        return 0;
    }
    if (s.valid) {
        if (!ready) {
            if (++s.stall > s.max_stall) s.max_stall = s.stall;
            if (stall_bound && s.stall == stall_bound) put_event(EVENT_STALL, id, cycle, nullptr, 0);
            copy_out(s.current, payload);
            return 1;
        }
        s.stall = 0;
        s.beats++;
    } else if (s.queue.empty()) {
        copy_out(s.current, payload);
        return 0;
    }
    if (!s.queue.empty() && !draw(s)) {
        s.current = std::move(s.queue.front());
        s.queue.pop_front();
        s.valid = true;
    } else {
        s.valid = false;
    }
    copy_out(s.current, payload);
    return s.valid;
}

// A sink's ready for the next cycle, drawn at every edge (after mrc_sink, if a beat moved).
svBit mrc_sink_ready(int id) {
    if (!stepping()) return 1;
    return !draw(streams[id]);
}

// A sink's step at an edge where its valid and its ready were high.
void mrc_sink(int id, const svBitVecVal *payload) {
    if (!stepping()) return;
    Stream &s = streams[id];
    s.beats++;
    switch (s.role) {
    case TX: {
        int lanes = s.data.width / 8;
        uint64_t keep = get_bits(payload, s.keep.at, s.keep.width);
        for (int lane = 0; lane < lanes; lane++)
            if (keep >> lane & 1) s.parts.push_back(get_byte(payload, s.data.at + 8 * lane));
        if (get_bits(payload, s.last.at, 1)) {
            put_event(0, id, cycle, s.parts.data(), (uint32_t)s.parts.size());
            s.parts.clear();
        }
        break;
    }
    case BEAT_SINK: {
        uint32_t words[MAX_WORDS];
        int count = (s.width + 31) / 32;
        std::memcpy(words, payload, count * 4);
        put_event(1, id, cycle, reinterpret_cast<uint8_t *>(words), count * 4);
        break;
    }
    case FETCH_REQ: {
        Side &side = sides[s.side];
        side.requests.push_back({cycle + side.latency,
                                 get_bits(payload, s.addr.at, s.addr.width),
                                 get_bits(payload, s.length.at, s.length.width)});
        break;
    }
    case PLACE: {
        int lanes = s.data.width / 8;
        uint64_t address = get_bits(payload, s.addr.at, s.addr.width);
        uint64_t keep = get_bits(payload, s.keep.at, s.keep.width);
        for (int lane = 0; lane < lanes; lane++) {
            if (!(keep >> lane & 1)) continue;
            uint8_t value = get_byte(payload, s.data.at + 8 * lane);
            Region *region = place_log ? lookup(s.side, address + lane) : find(s.side, address + lane, 1);
            if (region) region->bytes[address + lane - region->base] = value;
            if (!place_log) continue;
            // The span of a packet that wraps the 64-bit address space is not one interval:
            // its bytes at the top count as outside (no region reaches 2**64).
            if (address + lane < s.place_lo) s.place_lo = address + lane;
            if (address + lane + 1 > s.place_hi) s.place_hi = address + lane + 1;
            s.place_bytes++;
            if (!region) s.place_outside++;
            if (s.place_head.size() < PLACE_HEAD) s.place_head.push_back(value);
        }
        if (place_log && get_bits(payload, s.last.at, 1)) {
            uint8_t record[4 * 8 + PLACE_HEAD] = {};
            uint64_t fields[4] = {s.place_bytes ? s.place_lo : address, s.place_hi,
                                  s.place_bytes, s.place_outside};
            std::memcpy(record, fields, sizeof fields);
            std::memcpy(record + sizeof fields, s.place_head.data(), s.place_head.size());
            // Not an attention event: the records are read at Python's next wake.
            size_t at = events.size();
            uint32_t length = (uint32_t)(sizeof fields + s.place_head.size());
            events.resize(at + 15 + length);
            uint8_t *p = events.data() + at;
            p[0] = EVENT_PLACEMENT;
            uint16_t stream = (uint16_t)id;
            std::memcpy(p + 1, &stream, 2);
            std::memcpy(p + 3, &cycle, 8);
            std::memcpy(p + 11, &length, 4);
            std::memcpy(p + 15, record, length);
            s.place_lo = UINT64_MAX;
            s.place_hi = s.place_bytes = s.place_outside = 0;
            s.place_head.clear();
        }
        break;
    }
    default:
        break;
    }
}

void mrc_memory_step(int side) {
    if (stepping()) memory_step(side);
}

// After every agent: frames due this cycle join their ports' queues (the Python bench's
// delivery hook), and the receive backlog is sampled.
int mrc_edge_end() {
    if (stepping()) {
        release_frames(cycle);
        if (backlog_every && start_cycle >= 0 && cycle > start_cycle && cycle % backlog_every == 0) {
            std::vector<uint32_t> sample;
            for (auto &s : streams)
                if (s.role == RX) sample.push_back((uint32_t)s.queue.size());
            // Not an attention event: read at the end of the run.
            size_t at = events.size();
            uint32_t length = (uint32_t)(sample.size() * 4);
            events.resize(at + 15 + length);
            uint8_t *p = events.data() + at;
            p[0] = 2;
            uint16_t s = 0;
            std::memcpy(p + 1, &s, 2);
            std::memcpy(p + 3, &cycle, 8);
            std::memcpy(p + 11, &length, 4);
            std::memcpy(p + 15, sample.data(), length);
        }
    }
    return (int)attention;
}

// The bus master's rising-edge step: the bus's inputs for the next cycle.
void mrc_bus_step(int side, svBitVecVal *addr, svBitVecVal *w_data, svBit *w_en, svBit *r_en) {
    BusMaster &bus = buses[side];
    *w_en = 0;
    *r_en = 0;
    if (bus.state == 2) {
        bus.state = 3;
    } else if (bus.state == 0 && !bus.ops.empty()) {
        BusOp op = bus.ops.front();
        bus.ops.pop_front();
        bus.addr = op.addr;
        if (op.read) {
            *r_en = 1;
            bus.state = 2;
        } else {
            bus.w_data = op.data;
            *w_en = 1;
            bus.state = 1;
        }
    }
    addr[0] = bus.addr;
    w_data[0] = bus.w_data;
}

// The falling-edge step: ends a write driven at the last rising edge, or a read whose data
// the bus now shows. Returns the count of ended accesses.
int mrc_bus_sample(int side, const svBitVecVal *r_data) {
    BusMaster &bus = buses[side];
    if (bus.state == 1) {
        bus.state = 0;
        bus.done++;
    } else if (bus.state == 3) {
        bus.result = r_data[0];
        bus.state = 0;
        bus.done++;
    }
    return (int)bus.done;
}

// -- called from Python (ctypes) -------------------------------------------------------------

void mrc_reset(int64_t first_step_edge, int64_t backlog_cycles) {
    streams.clear();
    for (auto &side : sides) side = Side();
    for (auto &bus : buses) bus = BusMaster();
    any_backpressure = false;
    place_log = false;
    stall_bound = 0;
    edge = 0;
    first_edge = first_step_edge;
    cycle = 0;
    start_cycle = -1;
    backlog_every = backlog_cycles;
    attention = 0;
    events.clear();
    error.clear();
}

int64_t mrc_edge() { return edge; }
int64_t mrc_cycle() { return cycle; }

void mrc_set_start(int64_t at) { start_cycle = at; }
void mrc_set_first_edge(int64_t at) { first_edge = at; }

// fields: data, keep, last, first, addr, length as (at, width) pairs; at -1 for none.
int mrc_add_stream(int role, int side, int width, const int *fields) {
    Stream s;
    s.role = role;
    s.side = side;
    s.width = width;
    Field *f[] = {&s.data, &s.keep, &s.last, &s.first, &s.addr, &s.length};
    for (int i = 0; i < 6; i++) {
        f[i]->at = fields[2 * i];
        f[i]->width = fields[2 * i + 1];
    }
    s.current.assign((width + 31) / 32, 0);
    streams.push_back(std::move(s));
    int id = (int)streams.size() - 1;
    if (role == FETCH) sides[side].fetch = id;
    return id;
}

void mrc_set_latency(int side, int latency) { sides[side].latency = latency; }

// Random bubbles (a source) or backpressure (a sink) with `probability`, seeded.
void mrc_set_random(int id, double probability, uint64_t seed) {
    Stream &s = streams[id];
    s.chance = probability <= 0 ? 0 : probability >= 1 ? (1ull << 32)
                                                         : (uint64_t)(probability * 4294967296.0);
    s.rng = seed;
    if (s.chance && (s.role == TX || s.role == BEAT_SINK || s.role == FETCH_REQ
                     || s.role == PLACE))
        any_backpressure = true;
}

void mrc_add_region(int side, uint64_t base, uint64_t size) {
    sides[side].regions.push_back({base, std::vector<uint8_t>(size, 0)});
}

int mrc_memory_write(int side, uint64_t address, const uint8_t *data, uint64_t length) {
    Region *region = find(side, address, length);
    if (!region) return -1;
    std::memcpy(region->bytes.data() + (address - region->base), data, length);
    return 0;
}

int mrc_memory_read(int side, uint64_t address, uint8_t *data, uint64_t length) {
    Region *region = find(side, address, length);
    if (!region) return -1;
    std::memcpy(data, region->bytes.data() + (address - region->base), length);
    return 0;
}

// A frame for receive port `id`, due at the end of cycle `release` (ordered by arrival time,
// then by the fabric's serial number, as the fabric's heap orders them).
void mrc_deliver(int id, int64_t release, int64_t arrival_ps, uint64_t serial,
                 const uint8_t *data, uint32_t length) {
    streams[id].pending.push({release, arrival_ps, serial,
                              std::vector<uint8_t>(data, data + length)});
}

// Beats (packed, `words` 32-bit words each) for a beat source.
void mrc_send_beats(int id, const uint32_t *words, int count, int per_beat) {
    Stream &s = streams[id];
    for (int i = 0; i < count; i++)
        s.queue.emplace_back(words + i * per_beat, words + (i + 1) * per_beat);
}

// The placement log (on: one PLACEMENT record per placed packet; bytes outside every region
// are counted in it instead of stopping the run).
void mrc_set_place_log(int on) { place_log = on != 0; }

// The stall watch: a STALL event when a source's beat has waited `cycles` cycles for ready.
void mrc_set_stall_bound(int64_t cycles) { stall_bound = cycles; }

// The longest a beat of source `id` waited for ready, in cycles.
int64_t mrc_max_stall(int id) { return streams[id].max_stall; }

uint64_t mrc_queued(int id) { return streams[id].queue.size() + streams[id].pending.size(); }
uint64_t mrc_beats(int id) { return streams[id].beats; }

// The serialised events since the last call: returns their size; copies them when `out` has
// room (call with capacity 0 to learn the size).
uint64_t mrc_drain(uint8_t *out, uint64_t capacity) {
    uint64_t size = events.size();
    if (size <= capacity) {
        if (size) std::memcpy(out, events.data(), size);
        events.clear();
    }
    return size;
}

const char *mrc_error() { return error.c_str(); }

void mrc_bus_access(int side, int read, uint32_t addr, uint32_t data) {
    buses[side].ops.push_back({read != 0, addr, data});
}

uint32_t mrc_bus_result(int side) { return buses[side].result; }

}  // extern "C"
