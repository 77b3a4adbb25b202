"""Commands on runs and stores: ``pmpipe run``, ``show`` and ``verify``."""

from __future__ import annotations

from pmpipe.runtime import log

LOG = log.get(__name__)


def run(args) -> int:
    """``pmpipe run STAGE CONFIG...``: one stage of a run, or every stage of several."""
    from pmpipe.run import config
    from pmpipe.stages import registry

    log.configure(stamped=True)  # a stage's log: every line with its time
    if args.stage == "all":
        from pmpipe.job import pipeline

        return pipeline.main(args.config)
    if len(args.config) != 1:
        raise config.ConfigError(
            f"pmpipe run {args.stage} takes one config.json (got {len(args.config)}); "
            "'pmpipe run all' takes several"
        )
    return registry.run_checked(args.stage, args.config[0])


def show(args) -> int:
    """``pmpipe show STORE``: a summary of a store, its state checked (manifest, run config)."""
    from pmpipe.stages import status
    from pmpipe.storage import store

    print(store.describe(args.store, status.run_config_hash(args.store)))
    return 0


def _problems(path, is_part: bool) -> list[str]:
    """What is wrong with a store (store.problems with checksums, against its run's config),
    or with a job's part of the campaign summaries (it reads whole: summary_parts.read_part)."""
    from pmpipe.results import summary_parts
    from pmpipe.stages import status
    from pmpipe.storage import store

    if is_part:
        if summary_parts.read_part(path) is None:
            reason = (
                "does not read as a job's part of the campaign summaries (collect reads "
                "its runs' own stores instead; remove it)"
            )
            return [reason]
        return []
    return store.problems(path, checksums=True, config_hash=status.run_config_hash(path))


def verify(args) -> int:
    """``pmpipe verify PATH...``: every store's shards against its manifest and its config
    and upstream stores against its run's, and each job's part of the campaign summaries
    (it reads whole); a store that fails loses its completion marker (unless --report-only
    or the file system refuses; a part is left as it is), and every store is checked whatever
    the others gave."""
    from pmpipe.results import summary_parts
    from pmpipe.storage import store

    paths = [p for given in args.paths for p in store.stores_under(given)]
    if not paths:
        raise store.IncompleteStoreError(f"no zarr store in {', '.join(map(str, args.paths))}")
    failed = kept = 0
    for path in paths:
        is_part = path.parent.name == summary_parts.PARTS
        try:
            found = _problems(path, is_part)
        except OSError as err:
            found = [f"cannot be read ({err.strerror or err})"]
        note = ""
        if found:
            failed += 1
            if store.has_marker(path) and not args.report_only and not is_part:
                try:
                    store.invalidate(path, found)
                except OSError as err:
                    kept += 1
                    note = f" (completion marker kept: {err.strerror or err})"
        print(
            f"{'FAILED' if found else 'ok':7} {path}"
            + (f": {'; '.join(found)}" if found else "")
            + note
        )
    summary = f"{len(paths)} stores checked, {failed} failed"
    if failed and not args.report_only:
        summary += (
            "; failed stores lost their completion marker: the next snakemake (or "
            "pmpipe run) makes them again"
        )
        if kept:
            summary += f"; {kept} could not be changed (read-only?) and kept theirs"
    LOG.info("%s", summary)
    return 1 if failed else 0
