"""How the ranks of a job find each other: the store each rank joins, checked to be its job's.

Under torchrun the launcher's store; else a store rank 0 hosts, where every rank must count the
same world size, and which (under SLURM or MPI, whose ids tell jobs apart) a rank of another job
given the same port is refused from.
"""

from __future__ import annotations

import os
import socket
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import timedelta

import torch.distributed as dist

from nlptrain.environments import Environment
from nlptrain.errors import ConfigError


def join(environment: Environment, backend: str, timeout: timedelta) -> None:
    """Start this rank's default process group: through the launcher's store (torchrun) or the
    job's own, which rank 0 hosts at the master address."""
    rank, world = environment.rank, environment.world_size
    _check_host_resolves(environment)
    with _port_taken_said(environment):
        _check_store_answers(environment, timeout)
        store = _attempt_store(environment, timeout) or _job_store(environment, timeout)
        dist.init_process_group(backend, store=store, rank=rank, world_size=world, timeout=timeout)


def _check_host_resolves(environment: Environment) -> None:
    """A rendezvous host name that does not resolve was a timeout blamed on the other ranks
    ("no answer ... --timeout sets how long ranks wait"), torch's warnings above it."""
    host = environment.master_addr
    try:
        socket.getaddrinfo(host, environment.master_port)
    except socket.gaierror as err:
        given = "MASTER_ADDR" if environment.environ.get("MASTER_ADDR") else "rank 0's host"
        raise ConfigError(f"the rendezvous host {host} ({given}) does not resolve "
                          f"({err.strerror}); set MASTER_ADDR to rank 0's host name or "
                          "address") from None  # (the command line names the rank)


def _check_store_answers(environment: Environment, timeout: timedelta) -> None:
    """A rank that joins a store rank 0 or the launcher hosts connects as a client first, in a
    thread bounded by the timeout: torch's client waits without end on a program that takes the
    connection and never answers (an HTTP server at MASTER_PORT), its own timeout unheeded."""
    if environment.rank == 0 and not environment.uses_agent_store:
        return  # it hosts the store itself
    host, port = environment.master_addr, environment.master_port
    outcome: dict[str, BaseException | None] = {}

    def connect() -> None:
        try:  # no world size: a client that no store counts among its ranks
            dist.TCPStore(host, port, None, is_master=False, timeout=timeout)
            outcome["error"] = None
        except BaseException as error:  # said by the rank's thread below
            outcome["error"] = error

    thread = threading.Thread(target=connect, name="nlptrain-rendezvous-check", daemon=True)
    thread.start()
    thread.join(timeout.total_seconds() + 5)
    if thread.is_alive():
        raise _unanswered(environment.rank, host, port, timeout)
    if outcome["error"] is not None:  # no store in time, say: the error the join would give
        raise outcome["error"]


def _unanswered(rank: int, host: str, port: int, timeout: timedelta) -> Exception:
    """Why a client still waits past the timeout: a program there that took the connection and
    never answers, or no listener at all (torch's client retries, with pauses that outlast the
    timeout: rank 0 not started, or ended)."""
    try:
        socket.create_connection((host, port), timeout=5).close()
    except OSError:
        return dist.DistStoreError(f"Timed out after {timeout.total_seconds():g} s waiting for the "
                                   f"job's store at {host}:{port}: nothing listens there (rank 0 "
                                   "not started, or ended)")
    return ConfigError(f"rank {rank}: the rendezvous at {host}:{port} took the connection but "
                       f"never answered in {timeout.total_seconds():g} s: a program other than "
                       "the job's store listens there; give the job a free port (MASTER_PORT)")


def _attempt_store(environment: Environment, timeout: timedelta) -> dist.Store | None:
    """Under torchrun the workers share the launcher's store, and a failed attempt's keys stay in
    it: after `--max-restarts` a new attempt could read the old ranks' addresses and never connect
    (pytorch #135712). The same holds for a second process group made in one attempt (two
    trainers one after the other). Each attempt, and each group in it, gets its own key prefix:
    every rank makes its groups in the same order, so the numbers agree."""
    if not environment.uses_agent_store:
        return None
    store = dist.TCPStore(environment.master_addr, environment.master_port,
                          environment.world_size, is_master=False, timeout=timeout)
    return _group_keys(store, f"attempt-{environment.restart_count}")


_groups_made = 0  # process groups this process made through the launcher's store or a job's


def _group_keys(store: dist.Store, scope: str) -> dist.Store:
    """`store` under a key prefix of this process group's own, within `scope`."""
    global _groups_made
    _groups_made += 1
    return dist.PrefixStore(f"nlptrain/{scope}/group-{_groups_made}", store)

OWNER_KEY = "nlptrain/rendezvous-of"


def _job_store(environment: Environment, timeout: timedelta) -> dist.Store:
    """Rank 0 hosts the rendezvous (as torch's tcp:// would) at a port that another job may have
    been given too (two srun steps of one allocation share its job id's port; a MASTER_PORT
    exported for both). A rank that reached the other job's store would join its rendezvous and
    wait there, silent, for the rest of the timeout. So rank 0 writes whose store it is and the
    other ranks read it before joining: a rank of another job is refused at once. The job's own
    key prefix keeps it off the other job's keys meanwhile. Without a launcher's id (env:// set
    by hand) jobs cannot be told apart, but the ranks' world sizes are still checked."""
    host, port = environment.master_addr, environment.master_port
    # (Not named by its host, which each rank may spell its own way: localhost, an address.)
    job = environment.rendezvous_id or "an env:// job"
    # Rank 0 does not wait for a count of ranks here: a rank that counts others is refused below.
    store = dist.TCPStore(host, port, environment.world_size, is_master=environment.rank == 0,
                          timeout=timeout, multi_tenant=True,  # as torch's tcp:// makes it
                          use_libuv=os.environ.get("USE_LIBUV", "1") == "1", wait_for_workers=False)
    if environment.rank == 0:
        store.set(OWNER_KEY, job)
    elif (owner := store.get(OWNER_KEY).decode()) != job:
        raise ConfigError(
            f"rank {environment.rank} of {_job_name(environment)} reached another job's "
            f"rendezvous at {host}:{port} ({owner}'s); give each job a port of its own "
            "(MASTER_PORT; under SLURM, two steps of one allocation running at once need one each)")
    keys = _group_keys(store, environment.rendezvous_id or "env")
    _check_world_size(keys, environment)
    return keys


def _job_name(environment: Environment) -> str:
    host = environment.master_addr
    return environment.rendezvous_id or \
        f"the job at {f'[{host}]' if ':' in host else host}:{environment.master_port}"


def _check_world_size(store: dist.Store, environment: Environment) -> None:
    """Every rank must count the same ranks (a launcher's variables set by hand, one task of a
    job given another count): else gloo's mesh waits for ranks that never come, past the timeout
    (under env://, the rank that counted fewer waited without end). Each rank writes its count;
    rank 0 reads every other's, the others rank 0's: each rank of a mismatch is refused at once,
    naming both counts."""
    rank, world, job = environment.rank, environment.world_size, _job_name(environment)

    def check(other: int, counted: int) -> None:
        if counted != world:
            raise ConfigError(
                f"rank {rank} counts {world} ranks in {job}, rank {other} "
                f"counts {counted}: every rank of a job needs the same world size; check the "
                f"launcher's settings ({', '.join(environment.variables)})")

    if rank == 0:
        store.set("world-size/0", str(world))
        for other in range(1, world):
            try:
                counted = int(store.get(f"world-size/{other}"))
            except dist.DistStoreError:  # its text names a key: the ranks not come, instead
                absent = [r for r in range(other, world) if not store.check([f"world-size/{r}"])]
                raise dist.DistStoreError(
                    f"Timed out after {store.timeout.total_seconds():g} s waiting for rank(s) "
                    f"{', '.join(map(str, absent))} of {world} to join {job}") from None
            check(other, counted)
    else:  # rank 0's count read before this one is written: rank 0 may end (and its store) then
        counted = int(store.get("world-size/0"))
        store.set(f"world-size/{rank}", str(world))
        check(0, counted)


@contextmanager
def _port_taken_said(environment: Environment) -> Iterator[None]:
    """The rendezvous port in use by another program (often another job's rendezvous): said as
    this rank's own error, with the fix, not taken for a peer's failure (a DistError)."""
    try:
        yield
    except dist.DistNetworkError as err:
        if "EADDRINUSE" not in str(err) and "address already in use" not in str(err):
            raise
        raise ConfigError(
            f"rank {environment.rank} cannot host the job's rendezvous at "
            f"{environment.master_addr}:{environment.master_port}: the port is in use (another "
            "job's?); give this job a free one (MASTER_PORT; torchrun's --master_port or "
            "--rdzv-endpoint HOST:PORT)") from None
