"""The OPC UA sink: the station as an OPC UA server, read and triggered by a real asyncua client over
TCP on 127.0.0.1."""

from __future__ import annotations

import asyncio
import json
import math
import time
from pathlib import Path
from typing import Any

import yaml
from helpers import TINY_CONFIG, folder_station, free_port, png

from hetmm_ray.config import DetectorConfig
from hetmm_ray.data.synthetic import SyntheticProduct
from hetmm_ray.station import load_line
from hetmm_ray.station.runner import build_station
from hetmm_ray.store import open_store
from hetmm_ray.workflows import operations

NAMESPACE = "urn:hetmm-ray:test-line"


async def read_station(url: str, station: str, *, trigger: bool = False) -> dict[str, Any]:
    from asyncua import Client

    async with Client(url=url, timeout=30) as client:
        idx = await client.get_namespace_index(NAMESPACE)
        node = await client.nodes.objects.get_child([f"{idx}:{station}"])
        names = (
            "PartId",
            "Status",
            "Verdict",
            "Score",
            "Threshold",
            "Version",
            "Late",
            "Counter",
            "State",
            "LastResult",
        )
        values = {n: await (await node.get_child([f"{idx}:{n}"])).read_value() for n in names}
        if trigger:
            values["trigger"] = await node.call_method(f"{idx}:Trigger")
        return values


def test_a_plc_reads_each_stations_last_result_and_calls_trigger(tmp_path: Path) -> None:
    part = SyntheticProduct(seed=3, size=64)
    operations.fit(
        open_store(tmp_path / "store"), "p", DetectorConfig.from_dict(TINY_CONFIG), [part.good(i) for i in range(4)]
    )
    port = free_port()
    url = f"opc.tcp://127.0.0.1:{port}/hetmm"
    opcua = {"kind": "opcua", "endpoint": url, "namespace": NAMESPACE}
    stations = [folder_station(tmp_path, name, opcua) for name in ("s1", "s2")]  # two stations on one server
    (tmp_path / "line.yaml").write_text(yaml.safe_dump({"service": {"in_process": "store"}, "stations": stations}))
    line = load_line(tmp_path / "line.yaml")
    runners = [build_station(st, tmp_path) for st in line.stations]
    try:
        for i, name in enumerate(("a", "b")):
            (tmp_path / "s1" / f"{name}.png").write_bytes(png(part.good(60 + i)))
        (tmp_path / "s2" / "only.png").write_bytes(png(part.defective(61, "hole")[0]))
        end = time.monotonic() + 120
        while sum(runners[0].counts.values()) < 2 or sum(runners[1].counts.values()) < 1:
            for r in runners:
                r.step()
            assert time.monotonic() < end, "the stations did not score their parts"
            time.sleep(0.02)
        one = asyncio.run(read_station(url, "s1", trigger=True))
        two = asyncio.run(read_station(url, "s2"))
        last = runners[0].recent[-1]
        assert (one["PartId"], one["Verdict"], one["Counter"], one["State"]) == ("b", last.verdict, 2, "ok")
        assert one["Status"] == last.status == "scored" and last.verdict in ("ok", "review", "reject")
        assert one["Score"] == last.score and one["Version"] == 1 and one["Late"] is False
        assert json.loads(one["LastResult"]) == last.to_dict()
        assert one["trigger"] == 1  # Trigger counts the triggers asked for
        assert runners[0].sinks[1].triggers == 1
        assert (two["PartId"], two["Counter"]) == ("only", 1) and not math.isnan(two["Score"])
    finally:
        runners[0].close()
    assert asyncio.run(read_station(url, "s1"))["State"] == "offline"  # the server stays for s2
    runners[1].close()
