"""Runs a script on an 8-device CPU mesh in a subprocess.

XLA fixes the device count when jax is first imported, so multi-device tests run their
code in a fresh interpreter with `--xla_force_host_platform_device_count=8`. The script
prints one line `RESULT <json>`; its JSON is returned.
"""
import json
import os
import subprocess
import sys


def run_on_8_devices(script: str, timeout: float = 600, xla_flags: str = '') -> dict:
  """`xla_flags`: more XLA flags (e.g. an HLO dump) after the device count."""
  env = dict(os.environ,
             XLA_FLAGS=f'--xla_force_host_platform_device_count=8 {xla_flags}'.strip(),
             JAX_PLATFORMS='cpu')
  proc = subprocess.run([sys.executable, '-c', script], env=env, capture_output=True,
                        text=True, timeout=timeout)
  assert proc.returncode == 0, proc.stderr[-4000:]
  line = [l for l in proc.stdout.splitlines() if l.startswith('RESULT ')][-1]
  return json.loads(line[len('RESULT '):])
