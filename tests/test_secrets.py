"""Nothing is open or shown that the operator did not choose: the endpoints listen on loopback unless set."""

from __future__ import annotations

import ipaddress

from relay.settings import Settings


def test_the_metrics_endpoints_listen_on_loopback_unless_set(tmp_path, monkeypatch):
    monkeypatch.delenv("ANIMEGAMER_METRICS_ADDRESS", raising=False)
    monkeypatch.chdir(tmp_path)  # no .env here
    assert ipaddress.ip_address(Settings().metrics_address).is_loopback
