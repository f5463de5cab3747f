"""Two attacks on WHIP signaling, measured against the real app (security items 5 and 7).

The app runs in this process (``tests.support.in_process.running``: no reply pipeline, no
video, ICE on 127.0.0.1) so the benchmark can count what its ICE sends; the clients are plain
HTTP calls with a real aiortc offer stripped of its candidates (a WHIP client that would
trickle them, so the server's ICE has nobody to check until a PATCH names someone).

- ``hold-slots`` (item 5): can one client keep every session slot? With
  ``transport.max_sessions = 4`` and the other defaults (per-client share, ICE connect timeout,
  60 sessions/min per address), the attacker POSTs 4 offers that never connect every 20 s for 3
  rounds (60 s), spread over the addresses of ``--attackers`` (one address by default, then two);
  meanwhile 15 other addresses each POST one offer, 4 s apart, and DELETE their session at once.
  Reports every status both sides got and how many of the 15 got ``201``. The clients are named
  by ``X-Forwarded-For`` from a trusted proxy (127.0.0.1), so one process plays every address.
- ``stun-spray`` (item 7): can a client make the server spray STUN checks? One session, then 5
  trickle PATCHes of N host candidates each at 127.0.0.1 (``--candidate-address``), every one on
  its own port (N = 150: the issue's attack, 750 candidates; N = 6: 30, under the default cap of
  32 distinct candidates). Counts, over 10 s from the first PATCH, the STUN packets the server's
  ICE sends (``aioice.ice.StunProtocol.send_stun``), the distinct ports they go to and the most
  asyncio tasks alive, with the PATCH statuses and the remote candidates that reached aiortc.
  Once as a loopback client (the client is 127.0.0.1 itself) and once as a public one (a trusted
  proxy names 1.2.3.4; ``transport.private_candidates = auto`` then drops loopback candidates).

Runs in its own network namespace (loopback only) where it can; writes
``benchmarks/results/attacks.json`` (``--out``).

Run: ``.venv/bin/python -m benchmarks.attacks`` (``--only hold-slots|stun-spray``;
``--attackers 1.2.3.4,5.6.7.8``, repeatable: one hold-slots run per list; ``--quick``: one
10 s round with 5 others, a 3 s spray window, a smoke run whose figures are not for reporting).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any
from unittest import mock

import aiohttp
from aioice import stun
from aioice.ice import StunProtocol

from benchmarks import source_commit
from benchmarks.netns import isolate
from server.http.signaling import REGISTRY_KEY
from server.http.whip import SDPFRAG_TYPE
from server.machine import this_machine
from tests.support.in_process import running
from tests.support.offers import first_mid, host_candidate, trickle_offer

RESULT = Path("benchmarks/results/attacks.json")
SDP = {"Content-Type": "application/sdp"}
PROXY = "127.0.0.1"  # the benchmark's own address, trusted to name clients by X-Forwarded-For
MAX_SESSIONS = 4
ATTACKER_POSTS = 4  # offers per round, spread over the attacker's addresses
DEFAULT_ATTACKERS = [["1.2.3.4"], ["1.2.3.4", "5.6.7.8"]]
PUBLIC_CLIENT = "1.2.3.4"
FIRST_PORT = 40_000
SAMPLE_S = 0.05


async def post(
    http: aiohttp.ClientSession, url: str, offer: str, address: str
) -> tuple[int, str, str | None]:
    """POST /whip as ``address`` (named by the trusted proxy): (status, error code or '',
    Location)."""
    headers = {**SDP, "X-Forwarded-For": address}
    async with http.post(url + "/whip", data=offer, headers=headers) as resp:
        code = (await resp.json())["code"] if resp.content_type == "application/json" else ""
        return resp.status, code, resp.headers.get("Location")


async def hold_slots(
    offer: str, attackers: list[str], period_s: float, rounds: int, others: int
) -> dict[str, Any]:
    """One attacker (``attackers``: its addresses) holding slots while ``others`` clients come
    and go; every answer each side got."""
    settings = {"server.trusted_proxies": PROXY, "transport.max_sessions": str(MAX_SESSIONS)}
    attacker_rounds: list[list[str]] = []
    other_answers: list[dict[str, Any]] = []
    delete_failed = 0
    async with running(settings) as (url, _), aiohttp.ClientSession() as http:
        started = time.monotonic()

        async def attacker() -> None:
            for _ in range(rounds):
                answers = []
                for i in range(ATTACKER_POSTS):
                    status, code, _ = await post(http, url, offer, attackers[i % len(attackers)])
                    answers.append(f"{status} {code}".strip())
                attacker_rounds.append(answers)
                await asyncio.sleep(period_s)

        async def other_clients() -> None:
            nonlocal delete_failed
            await asyncio.sleep(1.0)  # after the attacker's first round
            for i in range(others):
                address = f"5.6.7.{10 + i}"
                at = round(time.monotonic() - started, 1)
                status, code, location = await post(http, url, offer, address)
                other_answers.append({"t_s": at, "status": status, "code": code})
                if location:
                    headers = {"X-Forwarded-For": address}
                    async with http.delete(url + location, headers=headers) as resp:
                        delete_failed += resp.status != 200
                await asyncio.sleep(period_s * rounds / others)

        await asyncio.gather(attacker(), other_clients())
    refused = Counter(f"{a['status']} {a['code']}".strip() for a in other_answers)
    del refused["201"]
    return {
        "attackers": attackers,
        "attacker_answers": attacker_rounds,
        "others": other_answers,
        "others_created": sum(a["status"] == 201 for a in other_answers),
        "others_refused": dict(refused),
        "others_delete_failed": delete_failed,
    }


@contextmanager
def counting_stun() -> Iterator[list[tuple[str, int]]]:
    """The (address, port) of every STUN message ICE sends in this process while open."""
    sent: list[tuple[str, int]] = []
    original = StunProtocol.send_stun

    def counting(self: StunProtocol, message: stun.Message, addr: tuple[str, int]) -> None:
        sent.append((addr[0], addr[1]))
        original(self, message, addr)

    with mock.patch.object(StunProtocol, "send_stun", counting):
        yield sent


async def stun_spray(
    offer: str, client: str, patches: int, per_patch: int, window_s: float, target: str
) -> dict[str, Any]:
    """``patches`` PATCHes of ``per_patch`` candidates at ``target`` to one session, as
    ``client`` ('loopback' or 'public'); what the server's ICE does in the ``window_s`` that
    follow."""
    public = client == "public"
    settings = {"server.trusted_proxies": PROXY} if public else {}
    named = {"X-Forwarded-For": PUBLIC_CLIENT} if public else {}
    mid = first_mid(offer)
    with counting_stun() as sent:
        async with running(settings) as (url, app), aiohttp.ClientSession() as http:
            async with http.post(url + "/whip", data=offer, headers={**SDP, **named}) as resp:
                assert resp.status == 201, await resp.text()
                location = resp.headers["Location"]
            session_id = location.rsplit("/", 1)[-1]
            sent.clear()
            tasks_before = most_tasks = len(asyncio.all_tasks())
            started = time.monotonic()
            answers = []
            for p in range(patches):
                lines = ["m=audio 9 UDP/TLS/RTP/SAVPF 0", f"a=mid:{mid}"]
                for i in range(per_patch):
                    port = FIRST_PORT + p * per_patch + i
                    lines.append("a=" + host_candidate(target, port, f"s{port}"))
                body = "\r\n".join(lines) + "\r\n"
                headers = {"Content-Type": SDPFRAG_TYPE, **named}
                async with http.patch(url + location, data=body, headers=headers) as resp:
                    code = (
                        (await resp.json())["code"]
                        if resp.content_type == "application/json"
                        else ""
                    )
                    answers.append(f"{resp.status} {code}".strip())
                most_tasks = max(most_tasks, len(asyncio.all_tasks()))
            pc = app[REGISTRY_KEY].get(session_id).pc
            ice = pc.getTransceivers()[0].receiver.transport.transport
            reached = len(ice.getRemoteCandidates())
            while time.monotonic() - started < window_s:
                most_tasks = max(most_tasks, len(asyncio.all_tasks()))
                await asyncio.sleep(SAMPLE_S)
            packets = list(sent)
    return {
        "client": client,
        "candidate_address": target,
        "patches": patches,
        "per_patch": per_patch,
        "patch_answers": answers,
        "remote_candidates": reached,
        "stun_packets": len(packets),
        "distinct_ports": len({port for _, port in packets}),
        "tasks_before": tasks_before,
        "most_tasks": most_tasks,
    }


async def run(args: argparse.Namespace) -> dict[str, Any]:
    offer = await trickle_offer()
    results: dict[str, Any] = {}
    if args.only in (None, "hold-slots"):
        period_s, rounds, others = (10.0, 1, 5) if args.quick else (20.0, 3, 15)
        runs = []
        for attackers in args.attackers or DEFAULT_ATTACKERS:
            row = await hold_slots(offer, attackers, period_s, rounds, others)
            print(
                f"hold-slots, attacker {','.join(attackers)}: {row['others_created']}/{others}"
                f" others got 201; refused {row['others_refused']};"
                f" attacker {row['attacker_answers']}",
                flush=True,
            )
            runs.append(row)
        results["hold_slots"] = {
            "max_sessions": MAX_SESSIONS,
            "attacker_posts_per_round": ATTACKER_POSTS,
            "period_s": period_s,
            "rounds": rounds,
            "others_count": others,
            "runs": runs,
        }
    if args.only in (None, "stun-spray"):
        window_s = 3.0 if args.quick else 10.0
        runs = []
        for per_patch in args.per_patch:
            for client in ("loopback", "public"):
                row = await stun_spray(
                    offer, client, args.patches, per_patch, window_s, args.candidate_address
                )
                print(
                    f"stun-spray {args.patches}x{per_patch}, {client} client:"
                    f" PATCH {row['patch_answers']}, {row['remote_candidates']} candidates in"
                    f" aiortc, {row['stun_packets']} STUN packets to {row['distinct_ports']}"
                    f" ports, tasks {row['tasks_before']} -> at most {row['most_tasks']}",
                    flush=True,
                )
                runs.append(row)
        results["stun_spray"] = {"window_s": window_s, "runs": runs}
    return results


def addresses(text: str) -> list[str]:
    found = [a.strip() for a in text.split(",") if a.strip()]
    if not found:
        raise argparse.ArgumentTypeError("no address")
    return found


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", choices=("hold-slots", "stun-spray"), help="one part only")
    parser.add_argument(
        "--attackers",
        type=addresses,
        action="append",
        help="the attacker's addresses, comma-separated; repeat for several runs"
        " (default: 1.2.3.4, then 1.2.3.4,5.6.7.8)",
    )
    parser.add_argument("--patches", type=int, default=5, help="stun-spray: PATCHes")
    parser.add_argument(
        "--per-patch",
        type=int,
        nargs="+",
        default=[150, 6],
        help="stun-spray: candidates per PATCH, one run (x2 clients) per value",
    )
    parser.add_argument(
        "--candidate-address",
        default="127.0.0.1",
        help="stun-spray: the address of every candidate (one port each)",
    )
    parser.add_argument("--quick", action="store_true", help="short (a smoke run)")
    parser.add_argument("--out", type=Path, default=RESULT, help="where the JSON goes")
    args = parser.parse_args(argv)
    isolate("benchmarks.attacks", argv)
    print(f"machine: {this_machine().describe()}")
    started = time.monotonic()
    results: dict[str, Any] = {"machine": this_machine().to_dict(), "quick": args.quick}
    results.update(asyncio.run(run(args)))
    results["commit"] = source_commit()
    results["wall_s"] = round(time.monotonic() - started, 1)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(results, indent=2) + "\n")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
