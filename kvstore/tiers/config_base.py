"""What every tier's config model shares: strict (unknown keys are errors) and frozen, a
``kind`` that selects it in the config's tier list, and the eviction policy check. Each tier
kind declares its model in a ``<kind>_config`` module beside it (light: it imports none of the
tier's dependencies), named in :data:`kvstore.tiers.TIER_CONFIGS`."""

from __future__ import annotations


from pydantic import BaseModel, ConfigDict, field_validator

from kvstore.errors import KVStoreError
from kvstore.sizes import Size


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class TierConfigBase(Strict):
    """A tier's config: ``kind``, ``name``, ``capacity`` and ``policy`` at least (each model
    redeclares them with its own defaults, ``kind`` as its literal), and every other setting of
    its tier: the tier's constructor takes the validated model (``Tier.config_model``)."""

    kind: str
    name: str
    capacity: Size
    policy: str

    @field_validator("policy")
    @classmethod
    def _v_policy(cls, spec: str) -> str:
        return check_policy(spec)


def check_policy(spec: str) -> str:
    """A field validator: ``spec`` names an eviction policy that builds."""
    from kvstore.policy import make_policy

    try:
        make_policy(spec, 1)
    except KVStoreError as exc:
        raise ValueError(exc.message) from None
    return spec
