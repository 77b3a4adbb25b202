"""Statistics and lightcone operations on sharded fields move no field across devices: each
device bins or samples its own block, and only bin sums, maps or halo faces cross devices
(besides the distributed FFT's own transposes and the one gather of a force mesh up to
sky.SHELL_GATHER_CELLS whose shell each device samples along its share of the rays). Read
off the compiled programs on 8 CPU devices, with the results equal to one device's."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import references

from pmpipe.bench.collectives import in_program
from pmpipe.physics.evolution import lightcone, sky
from pmpipe.physics.mesh import fft, painting
from pmpipe.physics.statistics import stats
from pmpipe.runtime import parallel

N, BOX = 32, 128.0


def collectives(program) -> list[tuple[str, int]]:
    """(kind, elements) of every collective in a compiled program."""
    return [(kind, elements) for kind, elements, _ in in_program(program.as_text())]


def assert_local(program, largest: int, devices: int = 8):
    """Every collective moves at most ``largest`` elements, but the FFT's transposes
    (all-to-all), which move at most one device's block of the (N, N, N) modes."""
    found = collectives(program)
    assert found, "a program on several devices with no collective at all"
    for kind, size in found:
        limit = N**3 // devices if kind == "all-to-all" else largest
        assert size <= limit, (kind, size, limit, found)


def _field(seed, mesh):
    rho = 1 + 0.3 * np.random.default_rng(seed).normal(size=(N, N, N))
    return jax.device_put(jnp.asarray(rho, jnp.float32), parallel.field_sharding(mesh))


def _power(mesh, cross):
    a, b = _field(1, mesh), _field(2, mesh) if cross else None
    fields, flags, pairs = (
        ((a, b), (True, False), ((0, 1),)) if cross else ((a,), (True,), ((0, 0),))
    )
    program = stats._binned_sums.lower(fields, mesh, N // 2, flags, pairs).compile()
    return (
        np.concatenate(
            stats.power_spectrum(a, mesh, BOX, field2=b, compensate_cic=True, compensate_cic2=False)
        ),
        program,
        3 * (N // 2 + 1),
    )


def _compensation(mesh):
    go = jax.jit(lambda f: fft.c2r(painting.cic_compensation(fft.r2c(f, mesh), mesh, BOX), mesh))
    f = _field(3, mesh)
    return np.asarray(go(f)), go.lower(f).compile(), 1


def _band_limit(mesh):
    f = _field(4, mesh)
    program = lightcone.band_limited_overdensity.lower(f, mesh, BOX, 0.6).compile()
    return np.asarray(lightcone.band_limited_overdensity(f, mesh, BOX, 0.6)), program, 1


TRANSFORM = lightcone.PlaneTransform(axes=(2, 0, 1), flips=(True, False, True), shift=(3, 5, 7))
OBSERVER = (10.0, 20.0, 30.0)


def _shell(mesh, gather: bool):
    """A shell sampled from each device's block or (``gather``, on several devices) from the
    gathered density."""
    rays, gather = 8, gather and mesh.size > 1
    f = _field(5, mesh)
    shell = references.shell_healpix(
        f, mesh, BOX, rays, 60.0, 100.0, OBSERVER, TRANSFORM, gather=gather
    )
    source, scale, offset = lightcone.box_frame(OBSERVER, TRANSFORM, BOX, N)
    n_r = lightcone.ray_samples(40.0, BOX / N, np.inf)
    program = lightcone._shell.lower(
        f,
        np.float32(60),
        np.float32(40 / n_r),
        np.int32(n_r),
        source,
        scale.astype(np.float32),
        offset.astype(np.float32),
        mesh=mesh,
        rays_nside=rays,
        gather=gather,
    ).compile()
    # the density gathered once, or the shell (reduce-scatter) and halo faces
    return np.asarray(shell), program, N**3 if gather else max(12 * rays**2, N * N)


def _flat_plane(mesh):
    f = _field(6, mesh)
    plane = lightcone.flat_plane(f, mesh, BOX, 8, TRANSFORM)
    program = lightcone._flat_plane.lower(
        f,
        np.asarray(TRANSFORM.axes, np.int32),
        np.asarray(TRANSFORM.flips),
        np.asarray(TRANSFORM.shift, np.int32),
        mesh=mesh,
        box_size=BOX,
        n_cells=8,
    ).compile()
    return np.asarray(plane), program, N * N  # the plane


def _flat_cl(mesh):
    n = N
    sharding = jax.sharding.NamedSharding(mesh, parallel.FIELD_SPEC)
    maps = [
        jax.device_put(
            jnp.asarray(np.random.default_rng(s).normal(size=(n, n)), jnp.float32), sharding
        )
        for s in (7, 8)
    ]
    edges = stats.log_bin_edges(100, 3000, 6)
    cl = stats.flat_sky_cl(maps[0], 5.0, edges, maps[1])
    index = jax.device_put(jnp.zeros((n, n), jnp.int32), sharding)
    program = stats._binned_flat_power.lower(*maps, index, bins=6, sharding=sharding).compile()
    return np.concatenate(cl), program, n * n  # the transformed map; the binning: 7 sums


OPERATIONS = {
    "power auto": lambda mesh: _power(mesh, False),
    "power cross": lambda mesh: _power(mesh, True),
    "compensation": _compensation,
    "band limit": _band_limit,
    "shell": lambda mesh: _shell(mesh, False),
    "shell gathered": lambda mesh: _shell(mesh, True),
    "flat plane": _flat_plane,
    "flat-sky C_l": _flat_cl,
}


@pytest.mark.parametrize("pdims", [(2, 4), pytest.param((8, 1), marks=pytest.mark.slow)])
@pytest.mark.parametrize("operation", OPERATIONS)
def test_sharded_operations_move_bounded_data_and_equal_one_device(operation, pdims):
    one, _, _ = OPERATIONS[operation](parallel.make_mesh((1, 1)))
    many, program, largest = OPERATIONS[operation](parallel.make_mesh(pdims))
    assert_local(program, largest)
    finite = np.isfinite(one)
    assert np.array_equal(finite, np.isfinite(many))
    assert np.abs(many - one)[finite].max() <= 1e-5 * np.abs(one)[finite].max()


def test_the_check_finds_a_gathered_field():
    mesh = parallel.make_mesh((2, 4))
    f = _field(9, mesh)
    gathered = jax.jit(
        lambda x: jax.lax.with_sharding_constraint(x, jax.sharding.NamedSharding(mesh, jax.P()))[
            0, 0, :
        ]
    )
    with pytest.raises(AssertionError, match="all-gather"):
        assert_local(gathered.lower(f).compile(), N)


@pytest.mark.slow
def test_ray_directions_are_healpix_pixel_centres():
    import healpy

    for nside in (1, 2, 8, 64):
        ref = np.stack(healpy.pix2vec(nside, np.arange(12 * nside**2)), -1)
        assert np.abs(np.asarray(lightcone.ray_directions(nside)) - ref).max() < 1e-6


def test_each_device_keeps_its_share_of_the_shell_rays():
    """A device holds 1/8 of the rays of a shell, or all of them when the ray count does not
    divide by the devices (12 rays over 8: sampled in each block, as when the density is too
    large to gather, sky.SHELL_GATHER_CELLS). Sampled in its block, the per-ray sums are
    reduce-scattered; from the gathered density, each device sums its own rays alone."""
    mesh, one_mesh = parallel.make_mesh((2, 4)), parallel.make_mesh((1, 1))
    f, f_one = _field(5, mesh), _field(5, one_mesh)
    geometry = (60.0, 100.0, OBSERVER, TRANSFORM)
    one = np.asarray(references.shell_healpix(f_one, one_mesh, BOX, 8, *geometry))
    for gather in (False, True):
        shell = references.shell_healpix(f, mesh, BOX, 8, *geometry, gather=gather)
        assert shell.sharding.shard_shape(shell.shape) == (12 * 8**2 // 8,)
        shell = np.asarray(shell)
        assert np.abs(shell - one).max() <= 1e-5 * np.abs(one).max()
        kinds = [kind for kind, _ in collectives(_shell(mesh, gather)[1])]
        assert ("all-gather" in kinds) == gather and ("reduce-scatter" in kinds) != gather
    assert not sky.shell_gathers(N, 12, 8)  # 12 rays over 8 devices
    whole = references.shell_healpix(f, mesh, BOX, 1, *geometry)
    assert whole.sharding.shard_shape(whole.shape) == (12,)
    one = np.asarray(references.shell_healpix(f_one, one_mesh, BOX, 1, *geometry))
    assert np.abs(np.asarray(whole) - one).max() <= 1e-5 * np.abs(one).max()
