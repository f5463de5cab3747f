"""ICE servers for peers and clients: static TURN credentials, or issued ones (TURN REST API)."""

from __future__ import annotations

import pytest

from server.config import TransportConfig, load_config
from server.errors import ConfigError
from server.rtc.ice import IceServer, ice_servers, rest_credential

STUN = "stun:stun.example.net:3478"
TURN = "turn:turn.example.net:3478?transport=udp"


def test_static_credentials_go_with_turn_urls_only() -> None:
    config = TransportConfig(ice_urls=(STUN, TURN), ice_username="u", ice_credential="p")
    stun, turn = ice_servers(config, 1_700_000_000, "client")
    assert stun == IceServer((STUN,)) and stun.to_json() == {"urls": [STUN]}
    assert turn == IceServer((TURN,), "u", "p")
    assert turn.to_json() == {"urls": [TURN], "username": "u", "credential": "p"}
    assert ice_servers(TransportConfig(), 1_700_000_000, "client") == ()


def test_issued_credentials_follow_the_turn_rest_scheme() -> None:
    """username ``<expiry>:<label>``, credential base64(HMAC-SHA1(secret, username)); the
    expected value was computed with ``openssl dgst -sha1 -hmac north-wind -binary | base64``."""
    config = TransportConfig(
        ice_urls=(STUN, TURN), ice_auth_secret="north-wind", ice_credential_ttl_s=86_400
    )
    stun, turn = ice_servers(config, 1_700_000_000.7, "client")
    assert stun == IceServer((STUN,))
    assert turn == IceServer((TURN,), "1700086400:client", "Y6A7JDuij9jFTA55aQ9EUca27xA=")
    assert rest_credential("north-wind", "1700086400:client") == turn.credential
    # each request gets a fresh expiry; a shorter lifetime shortens it
    short = TransportConfig(ice_urls=(TURN,), ice_auth_secret="north-wind", ice_credential_ttl_s=60)
    (turn,) = ice_servers(short, 1_700_000_000, "server-abcd1234")
    assert turn.username == "1700000060:server-abcd1234"


def test_issued_and_static_credentials_exclude_each_other_and_stay_out_of_logs() -> None:
    with pytest.raises(ConfigError, match="ice_auth_secret"):
        load_config(
            overrides={"transport.ice_auth_secret": "north-wind", "transport.ice_username": "u"}
        )
    with pytest.raises(ConfigError, match="ice_credential_ttl_s"):
        load_config(overrides={"transport.ice_credential_ttl_s": "10"})
    config = load_config(
        env={"AVATAR_TRANSPORT_ICE_AUTH_SECRET": "north-wind", "AVATAR_TRANSPORT_ICE_URLS": TURN}
    )
    assert config.transport.ice_auth_secret == "north-wind"
    assert "north-wind" not in repr(config)
    static = load_config(overrides={"transport.ice_credential": "hunter2-relay"})
    assert "hunter2-relay" not in repr(static)
