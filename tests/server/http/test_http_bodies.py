"""Hostile HTTP bodies get a typed 400 in JSON and change nothing (SECURITY.md): JSON nested
5,000 levels deep in ``/offer`` or in ``/v1/realtime/calls``' ``session`` raised RecursionError
(a plain-text 500 and a logged traceback); a ``resume_token`` named twice was read as the last
one here and as the first one by HAProxy; a non-ASCII multipart boundary raised
UnicodeEncodeError."""

from __future__ import annotations

import json
import logging

import aiohttp
import pytest
from aiortc import RTCConfiguration, RTCPeerConnection
from multidict import CIMultiDict

from server.http.signaling import REGISTRY_KEY
from tests.support.in_process import running

DEEP = "[" * 5000 + "]" * 5000


async def offer_sdp() -> str:
    pc = RTCPeerConnection(RTCConfiguration(iceServers=[]))
    pc.addTransceiver("audio", direction="sendrecv")
    await pc.setLocalDescription(await pc.createOffer())
    sdp = pc.localDescription.sdp
    await pc.close()
    return sdp


def multipart(boundary: str, fields: dict[str, str]) -> bytes:
    parts = [
        f'--{boundary}\r\nContent-Disposition: form-data; name="{name}"\r\n\r\n{value}\r\n'
        for name, value in fields.items()
    ]
    return ("".join(parts) + f"--{boundary}--\r\n").encode()


async def test_hostile_bodies_get_a_typed_400(caplog: pytest.LogCaptureFixture) -> None:
    sdp = await offer_sdp()
    caplog.set_level(logging.WARNING)
    async with running() as (url, app), aiohttp.ClientSession() as http:

        async def post(path: str, body: bytes | str, content_type: str) -> tuple[int, str]:
            headers = {"Content-Type": content_type}
            async with http.post(url + path, data=body, headers=headers) as resp:
                assert resp.content_type == "application/json", await resp.text()
                error = (await resp.json())["error"]  # OpenAI's shape on /v1/, ours elsewhere
                return resp.status, error["message"] if isinstance(error, dict) else error

        offer = {"type": "offer", "sdp": sdp}
        deep_offer = json.dumps(offer)[:-1] + f', "x": {DEEP}}}'
        status, message = await post("/offer", deep_offer, "application/json")
        assert status == 400 and "nested deeper than 32" in message
        status, message = await post("/offer", "[" * 100_000, "application/json")
        assert status in (400, 413)
        token = "h1.AAAA.BBBB"
        twice = json.dumps(offer)[:-1] + f', "resume_token": "x.y", "resume_token": "{token}"}}'
        status, message = await post("/offer", twice, "application/json")
        assert status == 400 and "'resume_token' appears twice" in message

        two = CIMultiDict([("Content-Type", "application/sdp")])
        two.add("Avatar-Resume-Token", "x.y")
        two.add("Avatar-Resume-Token", token)
        async with http.post(url + "/whip", data=sdp, headers=two) as resp:
            assert resp.status == 400
            assert "one Avatar-Resume-Token" in (await resp.json())["error"]

        calls = "/v1/realtime/calls"
        boundary = "b0undary"
        body = multipart(boundary, {"sdp": sdp, "session": DEEP})
        status, message = await post(calls, body, f"multipart/form-data; boundary={boundary}")
        assert status == 400 and "nested deeper" in message
        for bad in ("bö", "", "x" * 71, 'a"b'):
            body = multipart(bad or "x", {"sdp": sdp})
            status, message = await post(
                calls, body, f"multipart/form-data; boundary={bad}".encode().decode("latin-1")
            )
            assert status == 400 and "boundary" in message, bad
        nested = (
            "--outer\r\nContent-Type: multipart/mixed; boundary=inner\r\n\r\n"
            + "--inner\r\nContent-Type: multipart/mixed; boundary=inner\r\n\r\n" * 1100
            + "--outer--\r\n"
        ).encode()
        status, _ = await post(calls, nested, "multipart/form-data; boundary=outer")
        assert status == 400
        assert len(app[REGISTRY_KEY]) == 0  # nothing was created
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR]  # no traceback
