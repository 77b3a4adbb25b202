"""Angular power spectra of masked flat-sky maps: the pseudo-C_ℓ of a square map times a mask,
with the mask's mode coupling removed (MASTER on the flat sky).

A map of n x n pixels over a square of side L is taken as periodic (as
:func:`pmpipe.physics.statistics.stats.flat_sky_cl` takes it): its Fourier modes ℓ lie on the grid of
multiples of 2π/L, and the transform of the masked map is the mode-grid convolution of the
field's with the mask's, ŵ(ℓ) = Δθ² Σ w e^{-iℓθ}. A Gaussian field of spectrum C then gives
the masked map's spectrum on average

    spin 0:  <|κ̂_w(ℓ)|²>/A = Σ_ℓ' K(ℓ − ℓ') C(ℓ'),     K = |ŵ|² / A²  (A = L²),
    spin 2:  <|Ê_w|²>/A = Σ_ℓ' K(ℓ − ℓ') [cos² 2(φ − φ') C^EE(ℓ') + sin² 2(φ − φ') C^BB(ℓ')],

φ the angle of ℓ, Ê = cos 2φ γ̂1 + sin 2φ γ̂2 and B̂ = −sin 2φ γ̂1 + cos 2φ γ̂2 (B with cos and
sin exchanged). The mode-grid sums are circular convolutions, made by FFT; cos² 2(φ − φ') =
½(1 + cos 4φ cos 4φ' + sin 4φ sin 4φ') splits the spin-2 kernel into three of them. Binned in
the multipole bins of flat_sky_cl, the couplings of bin to bin (C flat over each bin's modes)
make the matrix whose inverse decouples the binned pseudo-spectra; the couplings to rings of
|ℓ'| (a quarter of the fundamental wide at low ℓ, 2 % of ℓ above) give the bandpower windows through which the decoupled spectra are
unbiased for any C (:func:`couplings`).
"""

from __future__ import annotations

import numpy as np

from pmpipe.physics.mesh import fft


def modes(n: int, fov_deg: float) -> tuple[np.ndarray, np.ndarray]:
    """|ℓ| and the angle φ of ℓ (n, n, FFT order) of an n x n map of side fov_deg degrees."""
    ell = fft.angular_frequencies(n, np.radians(fov_deg) / n)
    lx, ly = ell[:, None], ell[None, :]
    return np.hypot(lx, ly), np.arctan2(ly, lx)


def bin_index(ell: np.ndarray, edges) -> np.ndarray:
    """The bin of every mode (as flat_sky_cl bins them; the mean and modes outside the edges:
    len(edges) - 1)."""
    edges = np.asarray(edges, np.float64)
    index = np.digitize(np.where(ell > 0, ell, -1.0), edges) - 1
    return np.where((index >= 0) & (index < edges.size - 1), index, edges.size - 1)


def kernel(mask, fov_deg: float) -> np.ndarray:
    """The coupling kernel K = |ŵ|²/A² (n, n) over mode differences, FFT order."""
    mask = np.asarray(mask, np.float64)
    n = mask.shape[0]
    pixel = np.radians(fov_deg) / n
    return np.abs(pixel**2 * np.fft.fft2(mask)) ** 2 / (n * pixel) ** 4


RING_FINE = 0.25  # ring width in fundamental multipoles at low ℓ...
RING_RATIO = 0.02  # ...and relative to ℓ above 12.5 fundamentals


def ring_edges(fundamental: float, ell_max: float) -> np.ndarray:
    """Edges of the rings of |ℓ| the windows resolve: RING_FINE fundamentals wide, or
    RING_RATIO times ℓ where that is wider, from 0 past ell_max."""
    edges = [0.0]
    while edges[-1] <= ell_max:
        edges.append(edges[-1] + max(RING_FINE * fundamental, RING_RATIO * edges[-1]))
    return np.array(edges)


def couplings(mask, fov_deg: float, edges) -> dict[str, np.ndarray]:
    """The mask's couplings for the bins ``edges``: 'spin0' (B, B) and 'spin2' (2B, 2B), EE and
    BB stacked, which map the binned spectra (flat over each bin) to the pseudo-spectra;
    'rings' the mean |ℓ'| of the rings (R,) of :func:`ring_edges` (over every mode of the map,
    beyond the last edge too), and 'ring0', 'ring_plus', 'ring_minus' (B, R): the
    pseudo-spectra of a spectrum that is 1 on one ring, spin 0, and for spin 2 cos² and sin²
    weighted (EE to EE, EE to BB)."""
    mask = np.asarray(mask, np.float64)
    n = mask.shape[0]
    ell, phi = modes(n, fov_deg)
    index = bin_index(ell, edges)
    bins = len(edges) - 1
    counts = np.bincount(index.ravel(), minlength=bins + 1)[:bins]
    edges_of_rings = ring_edges(2 * np.pi / np.radians(fov_deg), float(ell.max()))
    ring = np.digitize(ell, edges_of_rings) - 1
    rings = edges_of_rings.size - 1
    k_hat = np.fft.fft2(kernel(mask, fov_deg))
    cos4, sin4 = np.cos(4 * phi), np.sin(4 * phi)

    def convolved(f):
        return np.fft.ifft2(k_hat * np.fft.fft2(f)).real

    def binned(field):  # NaN in bins without modes
        with np.errstate(invalid="ignore", divide="ignore"):
            return np.bincount(index.ravel(), field.ravel(), bins + 1)[:bins] / counts

    rotated = ~_nyquist(n)  # the modes the shear's E and B have

    def spin_parts(indicator):
        spin2 = indicator * rotated
        plain = convolved(spin2)
        plus = 0.5 * (plain + cos4 * convolved(cos4 * spin2) + sin4 * convolved(sin4 * spin2))
        return (
            binned(convolved(indicator)),
            binned(plus * rotated),
            binned((plain - plus) * rotated),
        )

    by_bin = [spin_parts(((index == b) & (ell > 0)).astype(np.float64)) for b in range(bins)]
    by_ring = [spin_parts(((ring == r) & (ell > 0)).astype(np.float64)) for r in range(rings)]
    spin0 = np.stack([p[0] for p in by_bin], axis=1)
    plus, minus = (np.stack([p[i] for p in by_bin], axis=1) for i in (1, 2))
    ring_mean = np.bincount(ring.ravel(), ell.ravel(), rings) / np.maximum(
        np.bincount(ring.ravel(), minlength=rings), 1
    )
    return {
        "spin0": spin0,
        "spin2": np.block([[plus, minus], [minus, plus]]),
        "rings": ring_mean,
        "ring0": np.stack([p[0] for p in by_ring], axis=1),
        "ring_plus": np.stack([p[1] for p in by_ring], axis=1),
        "ring_minus": np.stack([p[2] for p in by_ring], axis=1),
    }


def _rotation(n: int) -> tuple[np.ndarray, np.ndarray]:
    """cos 2φ and sin 2φ (n, n) of the modes, 0 on the Nyquist row and column of an even n
    (whose modes have no partner -ℓ on the grid, so that a rotation there would not keep a
    real map real; they lie beyond every bin of flat_sky_cl)."""
    _, phi = modes(n, 1.0)  # the angles do not depend on the map's size
    regular = ~_nyquist(n)
    return np.cos(2 * phi) * regular, np.sin(2 * phi) * regular


def _nyquist(n: int) -> np.ndarray:
    """The modes (n, n) bool on the Nyquist row and column of an even n (none for odd n)."""
    found = np.zeros((n, n), bool)
    if n % 2 == 0:
        found[n // 2, :] = found[:, n // 2] = True
    return found


def masked_modes(kappa, shear, mask) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The maps whose flat_sky_cl spectra are the pseudo-spectra: κ times the mask, and the E
    and B parts of the shear (γ1, γ2) times the mask (Ê = cos 2φ γ̂1 + sin 2φ γ̂2,
    B̂ = −sin 2φ γ̂1 + cos 2φ γ̂2, as maps; none on the Nyquist row and column)."""
    mask = np.asarray(mask, np.float64)
    g1, g2 = (np.fft.fft2(np.asarray(g, np.float64) * mask) for g in shear)
    cos2, sin2 = _rotation(mask.shape[0])
    e = np.fft.ifft2(cos2 * g1 + sin2 * g2).real
    b = np.fft.ifft2(-sin2 * g1 + cos2 * g2).real
    return np.asarray(kappa, np.float64) * mask, e, b


def shear_of(kappa, omega) -> tuple[np.ndarray, np.ndarray]:
    """γ1, γ2 of a periodic map whose E modes are κ's and B modes ω's:
    γ̂1 + iγ̂2 = e^{2iφ}(κ̂ + iω̂) mode by mode (none on the Nyquist row and column)."""
    kappa = np.asarray(kappa, np.float64)
    k_hat, w_hat = np.fft.fft2(kappa), np.fft.fft2(np.asarray(omega, np.float64))
    cos2, sin2 = _rotation(kappa.shape[0])
    return (
        np.fft.ifft2(cos2 * k_hat - sin2 * w_hat).real,
        np.fft.ifft2(sin2 * k_hat + cos2 * w_hat).real,
    )


def _solve(matrix, values) -> np.ndarray:
    """matrix⁻¹ values on the bins whose rows are finite (bins with modes), NaN elsewhere."""
    keep = np.all(np.isfinite(matrix), axis=1)
    out = np.full(values.shape, np.nan)
    out[keep] = np.linalg.solve(matrix[np.ix_(keep, keep)], values[keep])
    return out


def decoupled_spin0(pseudo, coupled: dict) -> np.ndarray:
    """Binned C (B,) from the binned pseudo-spectrum (B,) of a masked scalar map (NaN in bins
    without modes)."""
    return _solve(coupled["spin0"], np.asarray(pseudo, np.float64))


def decoupled_spin2(pseudo_ee, pseudo_bb, coupled: dict) -> tuple[np.ndarray, np.ndarray]:
    """Binned (C^EE, C^BB) from the binned pseudo-spectra of the masked shear's E and B."""
    found = _solve(coupled["spin2"], np.concatenate([pseudo_ee, pseudo_bb]))
    return found[: len(pseudo_ee)], found[len(pseudo_ee) :]


def windows(coupled: dict) -> dict[str, np.ndarray]:
    """Bandpower windows (B, R) over the rings: the decoupled spectra's means are
    windows @ C(rings). '' spin 0, '_ee' C^EE from C^EE, '_bb' C^BB from C^EE (the mask's E
    to B leakage)."""
    bins = coupled["spin0"].shape[0]
    spin2 = _solve(coupled["spin2"], np.concatenate([coupled["ring_plus"], coupled["ring_minus"]]))
    return {
        "": _solve(coupled["spin0"], coupled["ring0"]),
        "_ee": spin2[:bins],
        "_bb": spin2[bins:],
    }
