"""The cosmology section of a run: the parameters of its universe, validated."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from pmpipe.physics.theory import background
from pmpipe.physics.theory.background import FIDUCIAL
from pmpipe.run.files import StrictModel

M_NU_MAX = 3.0  # eV: the largest neutrino mass sum a run accepts


class Cosmology(StrictModel):
    """Flat ΛCDM / w0waCDM parameters, with massless or massive neutrinos."""

    Omega_m: float = Field(
        FIDUCIAL["Omega_m"],
        gt=0,
        le=1,
        description="total matter density today (CDM + baryons + massive neutrinos), dimensionless",
    )
    Omega_b: float = Field(
        FIDUCIAL["Omega_b"],
        ge=0,
        lt=1,
        description="baryon density today, dimensionless; must be < Omega_m",
    )
    h: float = Field(FIDUCIAL["h"], gt=0, le=2, description="H0 / (100 km/s/Mpc), dimensionless")
    n_s: float = Field(
        FIDUCIAL["n_s"], gt=0, le=2, description="primordial spectral index, dimensionless"
    )
    sigma8: float | None = Field(
        FIDUCIAL["sigma8"],
        gt=0,
        le=5,
        description="rms linear overdensity of total matter in 8 Mpc/h spheres at a = 1; "
        "exactly one of sigma8 and A_s normalises the power (null when A_s is given)",
    )
    A_s: float | None = Field(
        None,
        gt=0,
        le=1e-7,
        description="primordial scalar amplitude at k = 0.05 /Mpc (power.kind 'camb' or 'class'); "
        "sigma8 is then derived",
    )
    w0: float = Field(
        FIDUCIAL["w0"], ge=-3, le=0, description="dark energy equation of state today"
    )
    wa: float = Field(
        FIDUCIAL["wa"], ge=-3, le=3, description="CPL evolution of w: w(a) = w0 + wa (1 - a)"
    )
    T_cmb: float = Field(
        FIDUCIAL["T_cmb"], ge=0, le=10, description="CMB temperature in K (0: no radiation)"
    )
    N_eff: float = Field(
        FIDUCIAL["N_eff"], ge=0, le=10, description="effective number of neutrino species"
    )
    m_nu: float = Field(
        FIDUCIAL["m_nu"],
        ge=0,
        le=M_NU_MAX,
        description="sum of the neutrino masses in eV: three species carrying 3.044 of N_eff "
        "(0: all massless; power.kind 'camb' or 'class')",
    )
    neutrino_hierarchy: Literal["degenerate", "normal", "inverted"] = Field(
        "degenerate",
        description="how m_nu splits among the three species: equal masses, or the normal or "
        "inverted ordering of the oscillations' mass-squared differences (7.5e-5 and 2.5e-3 "
        "eV^2), which needs m_nu of at least 0.0586603 (normal) or 0.0992443 eV (inverted)",
    )

    @model_validator(mode="before")
    @classmethod
    def _one_normalisation(cls, data):
        """A_s given and sigma8 not: sigma8 is derived (null here, not the fiducial default)."""
        if isinstance(data, dict) and data.get("A_s") is not None:
            if data.get("sigma8") is not None:
                raise ValueError(
                    f"cosmology.sigma8 = {data['sigma8']} and cosmology.A_s = {data['A_s']} are "
                    "both given: give exactly one (the other is derived)"
                )
            data = {**data, "sigma8": None}
        return data

    @model_validator(mode="after")
    def _baryons_below_matter(self):
        if self.sigma8 is None and self.A_s is None:
            raise ValueError("cosmology.sigma8 or cosmology.A_s must be given (exactly one)")
        if self.Omega_b >= self.Omega_m:
            raise ValueError(
                f"cosmology.Omega_b = {self.Omega_b} must be smaller than cosmology.Omega_m = {self.Omega_m}"
            )
        if self.m_nu > 0 and (self.T_cmb == 0 or self.N_eff == 0):
            raise ValueError(
                f"cosmology.m_nu = {self.m_nu} eV needs relic neutrinos: cosmology.T_cmb "
                f"(= {self.T_cmb}) and cosmology.N_eff (= {self.N_eff}) must be above 0"
            )
        smallest = background.minimum_mass_sum(self.neutrino_hierarchy)
        if self.m_nu < smallest:
            raise ValueError(
                f"cosmology.m_nu = {self.m_nu} eV is below the {self.neutrino_hierarchy} "
                f"hierarchy's smallest sum, {smallest:.7f} eV (its lightest neutrino massless): "
                "raise m_nu or choose cosmology.neutrino_hierarchy 'degenerate'"
            )
        omega_cdm = background.omega_cb(self) - self.Omega_b
        if omega_cdm <= 0:
            raise ValueError(
                f"cosmology.m_nu = {self.m_nu} eV makes Omega_nu = {background.omega_nu(self):.4g}, "
                f"which leaves no CDM below cosmology.Omega_m = {self.Omega_m} with Omega_b = "
                f"{self.Omega_b}: lower m_nu or raise Omega_m"
            )
        return self


# The cosmology's numbers (every field but neutrino_hierarchy): what designs may vary
NUMERIC_FIELDS = tuple(
    name
    for name, field in Cosmology.model_fields.items()
    if field.annotation in (float, float | None)
)
