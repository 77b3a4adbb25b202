"""``python -m pmpipe.job.pipeline`` with failures injected into one process of the job:

    python tests/inject_failure.py PROCESS WHEN RUN:STAGE[,RUN:STAGE...] -- PIPELINE ARGS

On process PROCESS (jax.process_index), the stage STAGE of run RUN (its run id) raises
RuntimeError: after the stage computed and wrote its store (WHEN ``after``: the failure of a
process that the others need no more in that stage) or instead of computing it (``before``:
the others wait for it inside the stage's collectives)."""

import sys

import jax

from pmpipe.job import one_run, pipeline


def main(argv: list[str]) -> int:
    process, when, targets = int(argv[0]), argv[1], argv[2]
    assert argv[3] == "--" and when in ("before", "after"), argv
    failing = {tuple(t.split(":")) for t in targets.split(",")}
    compute = one_run.compute_stage

    def compute_or_fail(stage, setup, inputs):
        target = (setup.run_file.run_id, stage) in failing and jax.process_index() == process
        if target and when == "before":
            raise RuntimeError(f"injected failure before stage {stage}")
        record = compute(stage, setup, inputs)
        if target:
            raise RuntimeError(f"injected failure after stage {stage}")
        return record

    one_run.compute_stage = compute_or_fail
    return pipeline.main(argv[4:])


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
