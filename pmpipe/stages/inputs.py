"""The arrays a stage reads from the run's earlier stages: kept in this process, or read from
their stores."""

from __future__ import annotations

from pathlib import Path

from pmpipe.stages import store_path


def ic_fields(init) -> dict:
    """The arrays of the ICs (simulation.Initial) by their names in ic.zarr."""
    return {"linear_density": init.delta_linear, "displacement": init.disp, "momentum": init.mom}


# Which outputs setting (config.Outputs) decides whether a stage's store holds an array
STORED_BY = {
    "density": "outputs.density",
    "displacement": "outputs.particles",
    "momentum": "outputs.particles",
    "lightcone_density": "outputs.lightcone",
    "lightcone_healpix": "outputs.lightcone",
    "lightcone_healpix_alm": "outputs.lightcone",
    "kappa": "outputs.lightcone",
    "gamma1": "outputs.lightcone",
    "gamma2": "outputs.lightcone",
    "omega": "outputs.lightcone",
    "kappa_born": "outputs.lightcone",
    "gamma1_born": "outputs.lightcone",
    "gamma2_born": "outputs.lightcone",
    "kappa_healpix": "outputs.lightcone",
    "gamma_e_healpix_alm": "outputs.lightcone",
    "gamma_b_healpix_alm": "outputs.lightcone",
    "kappa_healpix_alm": "outputs.lightcone",
    "kappa_born_healpix": "outputs.lightcone",
    "gamma_e_born_healpix_alm": "outputs.lightcone",
    "gamma_b_born_healpix_alm": "outputs.lightcone",
    "kappa_born_healpix_alm": "outputs.lightcone",
}

# The arrays a stage reads from an earlier stage's store, by (stage, earlier stage); those of
# ic.zarr are made again from the seed where it lacks them
READS = {
    ("lensing", "nbody"): ("lightcone_density", "lightcone_healpix_alm"),
    ("summaries", "nbody"): ("density", "displacement"),
    ("summaries", "lensing"): (
        "kappa",
        "omega",
        "kappa_healpix",
        "kappa_healpix_alm",
        "gamma_e_healpix_alm",
        "gamma_b_healpix_alm",
    ),
}


def kept_whole(run, name: str) -> bool:
    """Whether the stores of ``run`` (config.Run) keep the array ``name`` whole: stored, and
    at full resolution."""
    setting = STORED_BY.get(name)
    if setting == "outputs.density":
        return run.density_factor() == 1
    return setting is None or bool(getattr(run.outputs, setting.removeprefix("outputs.")))


def left_out(stage: str, later, run) -> list[str]:
    """What the stages ``later`` read from ``stage``'s store that ``run``'s outputs
    (config.Run) leave out or downsample, one line per reading stage: a stage that reads them
    runs only in the job that makes ``stage`` again."""
    found = []
    for reader in later:
        names = [n for n in READS.get((reader, stage), ()) if not kept_whole(run, n)]
        if names:
            settings = sorted({STORED_BY[n] for n in names})
            found.append(
                f"{reader} reads {', '.join(names)}, which {' and '.join(settings)} "
                f"{'does' if len(settings) == 1 else 'do'} not keep whole"
            )
    return found


class Inputs:
    """The arrays a stage reads from the run's earlier stages (run_dir: the run's folder;
    setup: its :class:`pmpipe.run.derive.RunSetup`).

    An array that an earlier stage ran in this process and kept (``keep``) is handed over
    as it is (a field stays on the devices), once: the next stage takes it without a round
    trip through the store, and whether or not the store keeps it (config.Outputs). Every
    other array, and every attribute, comes from the stage's complete store, made from this
    run's config; ICs that ic.zarr does not keep are made again from the seed."""

    def __init__(self, run_dir: str | Path, setup, keep: bool = False):
        self.run_dir, self.setup = Path(run_dir), setup
        self.run_file, self.mesh = setup.run_file, setup.grid.mesh
        self.keeping = keep
        self._kept: dict[tuple, object] = {}
        self._groups: dict[str, object] = {}

    def keep(self, stage: str, name: str, data, leading: tuple[int, ...] = ()) -> None:
        """Hold ``data`` (``stage``'s array ``name`` at ``leading``) for a later stage."""
        if self.keeping:
            self._kept[stage, name, tuple(leading)] = data

    def store(self, stage: str):
        """The complete store of ``stage`` (zarr group); IncompleteStoreError otherwise."""
        from pmpipe.storage import store

        if stage not in self._groups:
            self._groups[stage] = store.open_complete(
                store_path(self.run_dir, stage), self.run_file.config_hash
            )
        return self._groups[stage]

    def _take(self, stage: str, name: str, leading: tuple[int, ...]):
        """The kept array, else None; ICs the store lacks are made again (and kept) first."""
        key = (stage, name, tuple(leading))
        if key not in self._kept and stage == "ic" and name not in self.store("ic"):
            from pmpipe.run import derive

            init = derive.initial_conditions(self.setup)
            for kept, data in ic_fields(init).items():
                self._kept.setdefault(("ic", kept, ()), data)
        return self._kept.pop(key, None)

    def _stored(self, stage: str, name: str):
        """The stored array; IncompleteStoreError when the store does not keep it whole."""
        group = self.store(stage)
        if name not in group or group[name].attrs.get("downsampled", 1) > 1:  # kept_whole
            from pmpipe.storage import store

            setting = STORED_BY.get(name, "outputs")
            raise store.IncompleteStoreError(
                f"{store_path(self.run_dir, stage)} does not keep {name} at full resolution "
                f"({setting} of the run's config): run the run's stages together, "
                f"pmpipe run all {self.run_dir / 'config.json'}"
            )
        return group[name]

    def field(self, stage: str, name: str, leading: tuple[int, ...] = ()):
        """``stage``'s array ``name`` at ``leading`` as a JAX array sharded over the mesh."""
        from pmpipe.storage import store

        kept = self._take(stage, name, leading)
        if kept is not None:
            return kept
        return store.read_sharded(self._stored(stage, name), self.mesh, leading)

    def array(self, stage: str, name: str, leading: tuple[int, ...] = ()):
        """``stage``'s (small, replicated) array ``name`` at ``leading`` as numpy."""
        kept = self._take(stage, name, leading)
        if kept is not None:
            return kept
        return self._stored(stage, name)[tuple(leading) if leading else slice(None)]

    def made_from(self, stage: str) -> dict[str, int]:
        """The stores of the run's stages before ``stage`` that are complete, by folder name,
        with the checksum of their manifests: what a store of ``stage`` is made from
        (provenance 'upstream')."""
        from pmpipe.stages import run_stages
        from pmpipe.storage import store

        earlier = run_stages(self.run_file.config)
        earlier = earlier[: earlier.index(stage)] if stage in earlier else ()
        return {
            path.name: crc
            for path in (store_path(self.run_dir, s) for s in earlier)
            if (crc := store.manifest_checksum(path)) is not None
        }

    def forget(self) -> None:
        """Drop every kept array and open store."""
        self._kept, self._groups = {}, {}
