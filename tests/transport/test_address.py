"""Addresses as learners listen on them: a replica's own host in place of replica 0's."""

from __future__ import annotations

import pytest

from seedbed.transport.address import on_host


@pytest.mark.parametrize(
    ("address", "host", "expected"),
    [
        ("10.0.0.1:0", "10.0.0.2", "10.0.0.2:0"),
        ("127.0.0.1:5000", "10.0.0.2", "10.0.0.2:5000"),
        ("[::1]:5000", "fe80::1", "[fe80::1]:5000"),  # IPv6 in brackets, as gRPC takes it
    ],
)
def test_on_host_keeps_the_port_and_swaps_the_host(address, host, expected):
    assert on_host(address, host) == expected
