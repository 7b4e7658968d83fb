"""SLURM's node lists (`node[01-04,07],gpu5`: the host a job's ranks meet on), and its job id."""

from __future__ import annotations

import re
import shutil
import subprocess
from collections.abc import Mapping

from nlptrain.errors import ConfigError


def slurm_job_id(environ: Mapping[str, str]) -> str | None:
    """The SLURM job's id (an array task's own), kept by a requeued job."""
    job = environ.get("SLURM_ARRAY_JOB_ID") or environ.get("SLURM_JOB_ID")
    task = environ.get("SLURM_ARRAY_TASK_ID")
    return f"slurm-{job}" + (f"_{task}" if task else "") if job else None


def first_host(nodelist: str) -> str:
    """The first host of a SLURM node list: `node[01-04,07],gpu5` -> `node01`. `scontrol show
    hostnames` knows every form; without it, the common forms are parsed here."""
    if shutil.which("scontrol"):
        try:
            out = subprocess.run(["scontrol", "show", "hostnames", nodelist], capture_output=True,
                                 text=True, timeout=10)
            if out.returncode == 0 and out.stdout.split():
                return out.stdout.split()[0]
        except (OSError, subprocess.SubprocessError):
            pass
    return _parse_first_host(nodelist)


def _parse_first_host(nodelist: str) -> str:
    """The first host of the first name of a list: each bracket of a name gives its first number,
    zeros kept (`rack[1-2]-n[03-04],b` -> `rack1-n03`)."""
    depth, end = 0, len(nodelist)
    for at, char in enumerate(nodelist):  # the list's commas, not those inside brackets
        depth += (char == "[") - (char == "]")
        if char == "," and depth == 0:
            end = at
            break
    host = re.sub(r"\[([^\]]*)\]", lambda ranges: ranges.group(1).split(",")[0].split("-")[0],
                  nodelist[:end].strip())
    if not host or "[" in host or "]" in host:
        raise ConfigError(f"SLURM node list {nodelist!r}: cannot read its first host")
    return host
