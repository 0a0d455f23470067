"""Which host CPU built a machine-code artefact: the cpu kernel's shared library (-march=native) and XLA:CPU's
executables are compiled for this CPU's instruction set, and a cache folder can outlive the machine (a home
directory shared between hosts, an image moved to another instance). Keys that include this fingerprint
never hand an AVX-512 build to a CPU without AVX-512 (an illegal instruction at the first step)."""

from __future__ import annotations

import functools
import hashlib
import platform
from pathlib import Path

CPUINFO = Path("/proc/cpuinfo")
_FIELDS = ("vendor_id", "cpu family", "model", "model name", "flags")  # x86 Linux; other hosts: platform's names


def describe(cpuinfo_text: str | None) -> str:
    """The first processor's identifying fields of /proc/cpuinfo's text (its instruction-set flags sorted), or
    the platform's machine and processor names where there is no such text."""
    if cpuinfo_text:
        first = cpuinfo_text.split("\n\n", 1)[0]
        fields = {}
        for line in first.splitlines():
            name, _, value = line.partition(":")
            if name.strip() in _FIELDS:
                fields[name.strip()] = value.strip()
        if "flags" in fields:
            fields["flags"] = " ".join(sorted(fields["flags"].split()))
        if fields:
            return "|".join(f"{name}={fields.get(name, '')}" for name in _FIELDS)
    return f"{platform.machine()}|{platform.processor()}"


@functools.cache
def fingerprint() -> str:
    """A short digest of this host's CPU (describe()); stable across restarts of the same machine."""
    try:
        text = CPUINFO.read_text(errors="replace")
    except OSError:
        text = None
    return hashlib.sha256(describe(text).encode()).hexdigest()[:12]
