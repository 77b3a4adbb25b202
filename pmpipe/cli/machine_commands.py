"""``pmpipe doctor``: the command around :mod:`pmpipe.diagnostics.doctor`, which starts JAX only when
the command runs."""

from __future__ import annotations

import json
import sys

from pmpipe.runtime import log

LOG = log.get(__name__)


def doctor(args) -> int:
    """``pmpipe doctor``: the report of this process's machine, and with --check its self-check."""
    from pmpipe.diagnostics import distributed_check, doctor

    if args.distributed:
        return distributed_check.run()
    facts = doctor.report()
    if args.json:
        json.dump(facts, sys.stdout, indent=2)
        sys.stdout.write("\n")
    else:
        print(doctor.table(facts))
    if facts["jax"]["backend_error"]:
        return 2  # the warning above says why and how to fix it
    if not args.check:
        return 0
    problems = doctor.self_check()
    for problem in problems:
        LOG.error("CHECK FAILED: %s", problem)
    if not problems:
        LOG.info(
            "check: every pmpipe module imports; a distributed FFT on %d local devices "
            "agrees with numpy's",
            len(facts["jax"]["local_devices"]),
        )
    return 1 if problems else 0
