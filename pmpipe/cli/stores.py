"""Commands on runs and stores: ``pmpipe run``, ``show`` and ``verify``."""

from __future__ import annotations

from pmpipe.runtime import log

LOG = log.get(__name__)


def run(args) -> int:
    """``pmpipe run STAGE CONFIG...``: one stage of a run, or every stage of several."""
    from pmpipe.run import config
    from pmpipe.stages import registry

    if args.stage == "all":
        from pmpipe.stages import pipeline

        return pipeline.main(args.config)
    if len(args.config) != 1:
        raise config.ConfigError(
            f"pmpipe run {args.stage} takes one config.json (got {len(args.config)}); "
            "'pmpipe run all' takes several"
        )
    return registry.run_checked(args.stage, args.config[0])


def show(args) -> int:
    """``pmpipe show STORE``: a summary of a store."""
    from pmpipe.storage import store

    print(store.describe(args.store))
    return 0


def verify(args) -> int:
    """``pmpipe verify PATH...``: every store's chunks against its manifest."""
    from pmpipe.storage import store

    paths = [p for given in args.paths for p in store.stores_under(given)]
    if not paths:
        raise store.IncompleteStoreError(f"no zarr store in {', '.join(map(str, args.paths))}")
    failed = 0
    for path in paths:
        found = store.problems(path, checksums=True)
        if found:
            failed += 1
            if store.has_marker(path) and not args.report_only:
                store.invalidate(path, found)
        print(
            f"{'FAILED' if found else 'ok':7} {path}" + (f": {'; '.join(found)}" if found else "")
        )
    summary = f"{len(paths)} stores checked, {failed} failed"
    if failed and not args.report_only:
        summary += (
            "; damaged stores lost their completion marker: the next snakemake (or "
            "pmpipe run) makes them again"
        )
    LOG.info("%s", summary)
    return 1 if failed else 0
