"""The processes of a job agreeing on whether a step failed, through the key-value store of
jax.distributed's coordination service: unlike a device collective, waiting there for a
partner ends after a timeout, so a process that failed alone learns that its partners cannot
join it (they wait inside a collective for it, or are gone) instead of waiting with them until
the job's time limit."""

from __future__ import annotations

import time

PARTNER_TIMEOUT_S = 600.0  # default wait for the other processes at an agreement
_KEY = "pmpipe/agreement"


class PartnerLost(RuntimeError):
    """Some processes did not reach an agreement within its timeout."""

    def __init__(self, point: str, missing: list[int], timeout_s: float) -> None:
        who = ", ".join(str(p) for p in missing)
        super().__init__(
            f"process{'es' if len(missing) > 1 else ''} {who} did not reach the end of step "
            f"{point} within {timeout_s:g} s (waiting inside a collective for a process "
            "that failed, or gone)"
        )
        self.missing = missing


def agree(point: str, failure: str | None, timeout_s: float = PARTNER_TIMEOUT_S) -> dict[int, str]:
    """Every process's failure at ``point`` (a name that each process reaches once per job,
    in the same order), given this process's own ``failure`` (one line; None: it succeeded).
    Returns {process index: failure line} of the processes that failed, the same on every
    process (empty when all succeeded). Raises PartnerLost, naming the processes missing, when
    some do not reach ``point`` within ``timeout_s`` seconds of this process, or the store
    cannot answer for them (its coordinator gone)."""
    import jax

    if jax.process_count() == 1:
        return {} if failure is None else {0: failure}
    from jax._src import distributed

    client = distributed.global_state.client
    if client is None:
        raise RuntimeError(
            f"{point}: {jax.process_count()} processes but no jax.distributed client"
        )
    me = jax.process_index()
    client.key_value_set(f"{_KEY}/{point}/{me}", "" if failure is None else "!" + failure)
    deadline = time.monotonic() + timeout_s
    failures: dict[int, str] = {} if failure is None else {me: failure}
    missing = []
    for process in range(jax.process_count()):
        if process == me:
            continue
        wait_ms = max(1, int(1000 * (deadline - time.monotonic())))
        try:
            value = client.blocking_key_value_get(f"{_KEY}/{point}/{process}", wait_ms)
        except jax.errors.JaxRuntimeError:  # timed out, or the coordination service is gone
            missing.append(process)
            continue
        if value.startswith("!"):
            failures[process] = value[1:]
    if missing:
        raise PartnerLost(point, missing, timeout_s)
    return dict(sorted(failures.items()))


def one_line(failures: dict[int, str], processes: int) -> str:
    """The failure of a step (``failures`` from :func:`agree`, not empty) as one line: the
    line itself when each of the ``processes`` gave the same one (a failure every process
    computed), else the first failed process's, naming it and how many others failed."""
    first, line = next(iter(sorted(failures.items())))
    if len(failures) == processes and len(set(failures.values())) == 1:
        return line
    others = len(failures) - 1
    more = f" (and {others} other process{'es' if others > 1 else ''})" if others else ""
    return f"process {first}{more}: {line}"
