"""The NIC driver's QP state machine against the block models: what it writes where, and
what it refuses (no bus: each command goes to the model of its block)."""

import asyncio

import pytest

from hdl import protocol as P
from hdl.config import NicConfig
from hdl.control.nicmap import nic_register_map
from sim.driver import DriverError
from sim.driver.nic import NicDriver
from sim.model.requester import RequesterModel
from sim.model.responder import ResponderModel

CONFIG = NicConfig(qps=8, mpr_units=1, mtu=256, wr_slots=4, max_wimm=2, evs_per_profile=8)
S = P.CompletionStatus


class ModelDriver(NicDriver):
    """:class:`NicDriver` whose commands go to the requester and responder models (and are
    answered OK by every other block); ``log`` lists ``(block, fields)``."""

    def __init__(self, config):
        super().__init__(nic_register_map(config), None, config)
        self.requester = RequesterModel(config)
        self.responder = ResponderModel(config)
        self.log = []

    async def command(self, block, *, check=True, **values):
        self.log.append((block, values))
        if block == "requester":
            fields = dict(values)
            errno, data = self.requester.control(fields.pop("cmd"), **fields)
        elif block == "responder":
            errno, data = self.responder.command(values)
        else:
            errno, data = P.Errno.OK, 0
        if check and errno:
            raise DriverError(errno, block, values)
        return {"errno": errno, "data": data}


def connect(driver, psn):
    return driver.connect_qp(0, ev_profile=0, remote_qpn=3, remote_mac=1, remote_ip=2,
                             psn=psn, remote_psn=psn, mpr=1, max_wimm=2, pd=1)


def test_error_flushes_the_requester_and_reset_then_reconnect_starts_over():
    """modify_qp(ERROR) reaches the requester: its outstanding WRs complete with WR_FLUSH_ERR.
    Any other state with WRs outstanding is refused (EBUSY, the driver's state unchanged);
    after the flush, RESET and a new connection with a new PSN."""
    driver = ModelDriver(CONFIG)

    async def run():
        await connect(driver, 0x40)
        for wr_id in (1, 2):
            driver.requester.post({"qpn": 0, "opcode": P.WrOpcode.RDMA_WRITE, "wr_id": wr_id,
                                   "length": 300})
        assert len(driver.requester.pull_all()) == 4
        with pytest.raises(DriverError) as refused:
            await driver.modify_qp(0, P.QpState.RTS)
        assert refused.value.errno_name == "EBUSY" and refused.value.block == "requester"
        assert driver.qps[0].state == P.QpState.RTS
        await driver.modify_qp(0, P.QpState.ERROR)
        block, fields = driver.log[-1]
        assert block == "requester" and fields["state"] == P.QpState.ERROR
        assert [(c["wr_id"], c["status"]) for c in driver.requester.completions] == [
            (1, S.WR_FLUSH_ERR), (2, S.WR_FLUSH_ERR)]
        assert driver.qps[0].state == P.QpState.ERROR
        assert driver.requester.pull_all() == []
        await driver.modify_qp(0, P.QpState.RESET)
        await connect(driver, 0x900)
        assert driver.requester.qp(0)["state"] == P.QpState.RTS
        assert driver.requester.qp(0)["next_psn"] == 0x900
        assert driver.responder.qp_read(0)[1] >> 8 & 0xFFFFFF == 0x900

    asyncio.run(run())
