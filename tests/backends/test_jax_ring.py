"""The jax-ring backend's host devices: importing it first in a process (as the backend's
own process of a run does) sets XLA_FLAGS before jax is imported, and keeps a device
count the user set; the ring then runs W = 2 and 4 under shard_map (tox -e jax-ring
certifies it on every sharded case)."""

import os
import subprocess
import sys

import pytest

pytest.importorskip("jax")

from _ring_tests import slow_ring  # noqa: E402

PROBE = ("import attention_conformance.backends.jax_ring as r, jax, os; "
         "print(len(jax.devices('cpu')), os.environ['XLA_FLAGS'])")


def _probe(flags=None) -> str:
    env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}
    if flags is not None:
        env["XLA_FLAGS"] = flags
    done = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True,
                          env=env, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout.strip()


@slow_ring
def test_imported_first_it_asks_for_host_devices_and_keeps_the_users():
    assert _probe() == "8 --xla_force_host_platform_device_count=8"
    assert _probe("--xla_force_host_platform_device_count=4") == \
        "4 --xla_force_host_platform_device_count=4"
